// Package grammar constrains generation to JSON: it compiles OpenAI's
// response_format (json_object, or json_schema with a JSON Schema subset)
// into a byte-level pushdown automaton, and computes, for an automaton
// state, the mask of vocabulary tokens whose bytes keep the output a valid
// prefix of a value the schema accepts. A sampler that draws only masked
// tokens, and an end-of-generation token only when Complete, produces text
// that parses as JSON and validates against the schema (or is a prefix of
// such text when max_tokens cuts it short).
//
// Supported schema keywords: type (object, array, string, number, integer,
// boolean, null, or a list of them), properties, required,
// additionalProperties (absent or false where properties are given),
// items, minItems and maxItems (up to MaxItemsBound), enum, const, anyOf
// and oneOf (when their branches begin with
// different bytes, so that the first byte decides), $ref to "#/$defs/NAME"
// or "#/definitions/NAME" (inlined; a cycle is refused), and the
// annotations title, description, default, examples, $schema, $id,
// $comment, deprecated, readOnly, writeOnly. Every other keyword (pattern,
// format, minLength, minimum, uniqueItems, patternProperties, allOf, ...) is
// refused with a *SchemaError naming it: a constraint we cannot enforce
// must not be silently dropped.
//
// The output's shape is fixed where JSON allows choice: properties come in
// the schema's order (as OpenAI's strict mode writes them), optional ones
// may be left out, no other property is written, and at most one space
// (0x20) may stand at each place JSON allows whitespace, so that a model
// cannot loop on whitespace forever. Strings and numbers are bounded only
// by max_tokens. Nesting is bounded by MaxDepth.
//
// The automaton's State is a small value (a stack of frames), so a mask is
// computed by walking a trie of the vocabulary's token bytes with copies of
// the state, pruning every subtree whose prefix the automaton refuses; the
// masks are cached per state, which makes the common states (inside a
// string, between digits) cost one map lookup after their first token.
package grammar
