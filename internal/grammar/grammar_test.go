package grammar

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func mustCompile(t testing.TB, kind Kind, strict bool, schema string) *Grammar {
	t.Helper()
	g, err := Compile(Spec{Kind: kind, Strict: strict, Schema: []byte(schema)})
	if err != nil {
		t.Fatalf("Compile(%s): %v", schema, err)
	}
	return g
}

// accepts reports whether text is a complete value of g, and whether it
// is a valid prefix.
func accepts(g *Grammar, text string) (prefix, complete bool) {
	s := g.Start()
	if !g.Feed(&s, []byte(text)) {
		return false, false
	}
	return true, g.Complete(&s)
}

const personSchema = `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
	"tags":{"type":"array","items":{"type":"string","enum":["a","b"]}},
	"kind":{"enum":["cat","dog",1,null]},"ok":{"type":"boolean"},"score":{"type":["number","null"]}},
	"required":["name","age","tags","kind","ok","score"],"additionalProperties":false}`

func TestAutomaton(t *testing.T) {
	for _, tc := range []struct {
		name, schema string
		kind         Kind
		complete     []string // whole values
		prefix       []string // valid prefixes, not whole
		refused      []string // not even a prefix
	}{
		{name: "json_object", kind: JSONObject,
			complete: []string{`{}`, `{"a":1}`, `{ "a": [1, {"b": null}], "c": "x\u00e9\n" }`, `{"a":-0.5e+3,"b":true}`, `{"é":"日本"}`},
			prefix:   []string{``, `{`, `{"a"`, `{"a":1`, `{"a":1.`, `{"a":"\u00`},
			refused: []string{`[]`, ` {}`, `{}x`, `{} `, `{"a":01}`, `{"a":1.}`, `{"a"  :1}`, `{"a":  1}`, `{"a":tru}`, `{"a":"` + "\n",
				`{"a":"\x"}`, "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}", `{,}`, `{"a":1,}`, `{"a":[1,]}`, `{'a':1}`}},
		{name: "person", kind: JSONSchema, schema: personSchema,
			complete: []string{`{"name":"x","age":3,"tags":["a"],"kind":"cat","ok":true,"score":null}`,
				`{ "name": "", "age": -12, "tags": [], "kind": 1, "ok": false, "score": 1.5 }`},
			prefix: []string{`{"name":"x","age":3`, `{"na`},
			refused: []string{`{"age":3`, `{"name":"x","age":3.5`, `{"name":"x","age":3,"tags":["c"]`, `{"name":"x","age":3,"tags":[],"kind":"cow"`,
				`{"name":"x","age":3,"tags":[],"kind":1,"ok":true,"score":null,"extra":1}`, `{"name":"x","age":3,"tags":[],"kind":1,"ok":true}`,
				`{"name":"x","extra"`}},
		{name: "optional properties in order", kind: JSONSchema,
			schema:   `{"properties":{"a":{"type":"integer"},"ab":{"type":"integer"},"b":{"type":"string"}},"required":["b"]}`,
			complete: []string{`{"b":""}`, `{"a":1,"b":""}`, `{"ab":1,"b":""}`, `{"a":1,"ab":2,"b":"x"}`},
			refused:  []string{`{}`, `{"a":1}`, `{"b":"","a":1}`, `{"ab":1,"a":1`}},
		{name: "top-level number may go on", kind: JSONSchema, schema: `{"type":"number"}`,
			complete: []string{`0`, `-1`, `12.5`, `1e9`, `1E-2`}, prefix: []string{`-`, `1.`, `1e`, `1e+`},
			refused: []string{`01`, `+1`, `.5`, `1 `}},
		{name: "enum prefixes", kind: JSONSchema, schema: `{"enum":[1,12,"x"]}`,
			complete: []string{`1`, `12`, `"x"`}, refused: []string{`123`, `2`, `"y`}},
		{name: "anyOf string or object", kind: JSONSchema,
			schema:   `{"anyOf":[{"type":"string"},{"type":"object","properties":{"a":{"const":true}},"required":["a"],"additionalProperties":false}]}`,
			complete: []string{`"s"`, `{"a":true}`}, refused: []string{`{"a":false}`, `1`}},
		{name: "refs inlined", kind: JSONSchema,
			schema:   `{"$defs":{"p":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"],"additionalProperties":false}},"type":"array","items":{"$ref":"#/$defs/p"}}`,
			complete: []string{`[]`, `[{"x":1}, {"x":2}]`}, refused: []string{`[{"y":1}]`, `[1]`}},
		{name: "item counts", kind: JSONSchema, schema: `{"type":"array","items":{"type":"integer"},"minItems":1,"maxItems":2}`,
			complete: []string{`[1]`, `[1, 2]`, `[ 3 ]`}, prefix: []string{`[`, `[1,`, `[1, 2`},
			refused: []string{`[]`, `[ ]`, `[1,2,`, `[1, 2, 3`}},
		{name: "exactly zero items", kind: JSONSchema, schema: `{"type":"array","maxItems":0}`,
			complete: []string{`[]`, `[ ]`}, refused: []string{`[1`}},
		{name: "closed empty object", kind: JSONSchema, schema: `{"type":"object","additionalProperties":false}`,
			complete: []string{`{}`, `{ }`}, refused: []string{`{"a"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := mustCompile(t, tc.kind, false, tc.schema)
			for _, s := range tc.complete {
				if p, c := accepts(g, s); !p || !c {
					t.Errorf("%s: prefix %v complete %v, want a whole value", s, p, c)
				}
			}
			for _, s := range tc.prefix {
				if p, c := accepts(g, s); !p || c {
					t.Errorf("%s: prefix %v complete %v, want a prefix only", s, p, c)
				}
			}
			for _, s := range tc.refused {
				if p, _ := accepts(g, s); p {
					t.Errorf("%q: accepted as a prefix, want refused", s)
				}
			}
		})
	}
}

func TestSchemaRefusals(t *testing.T) {
	for _, tc := range []struct {
		schema  string
		strict  bool
		keyword string
	}{
		{`{"type":"string","pattern":"a+"}`, false, "pattern"},
		{`{"type":"string","format":"date"}`, false, "format"},
		{`{"type":"string","minLength":1}`, false, "minLength"},
		{`{"type":"integer","minimum":0}`, false, "minimum"},
		{`{"type":"object","patternProperties":{"a":{}}}`, false, "patternProperties"},
		{`{"type":"array","minItems":-1}`, false, "minItems"},
		{`{"type":"array","maxItems":1.5}`, false, "maxItems"},
		{`{"type":"array","minItems":3,"maxItems":2}`, false, "minItems"},
		{`{"type":"array","uniqueItems":true}`, false, "uniqueItems"},
		{`{"allOf":[{}]}`, false, "allOf"},
		{`{"type":"object","properties":{"a":{}},"additionalProperties":{"type":"string"}}`, false, "additionalProperties"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"additionalProperties":false}`, true, "required"},
		{`{"type":"object","properties":{"a":{"type":"string"}},"required":["a"]}`, true, "additionalProperties"},
		{`{"$defs":{"n":{"type":"object","properties":{"c":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`, false, "$ref"},
		{`{"$ref":"#"}`, false, "$ref"},
		{`{"$ref":"http://example.com/s.json"}`, false, "$ref"},
		{`{"anyOf":[{"type":"integer"},{"type":"number"}]}`, false, "anyOf"},
		{`{"type":["object","object"]}`, false, "type"},
		{`{"type":"decimal"}`, false, "type"},
		{`{"type":"object","required":["x"],"properties":{}}`, false, "required"},
		{`false`, false, "false"},
	} {
		_, err := Compile(Spec{Kind: JSONSchema, Strict: tc.strict, Schema: []byte(tc.schema)})
		var se *SchemaError
		if !errors.As(err, &se) || se.Keyword != tc.keyword {
			t.Errorf("%s: err %v, want a SchemaError naming %q", tc.schema, err, tc.keyword)
		}
	}
	for _, bad := range []string{``, `{`, `{"type":"string"} x`, `{"a":1,"a":2}`, strings.Repeat("[", 200) + strings.Repeat("]", 200)} {
		if _, err := Compile(Spec{Kind: JSONSchema, Schema: []byte(bad)}); err == nil {
			t.Errorf("%q compiled", bad)
		}
	}
	if _, err := Compile(Spec{Kind: JSONSchema, Schema: make([]byte, MaxSchemaBytes+1)}); err == nil {
		t.Error("an oversized schema compiled")
	}
}

// testVocab is a small byte-level vocabulary with multi-byte tokens of the
// kinds real ones have (structure glued to text, spaces in front), and an
// end token (id 0).
func testVocab() (*Vocab, [][]byte) {
	pieces := [][]byte{nil, nil} // 0: end, 1: a control token
	for b := 1; b < 256; b++ {
		pieces = append(pieces, []byte{byte(b)})
	}
	for _, s := range []string{`{"`, `":`, `", "`, `"}`, `true`, `false`, `null`, ` "`, `name`, `age`, `tags`, `kind`, `ok`, `score`,
		`12`, `0.`, `e-`, `cat`, `dog`, `": "`, `"]`, `["`, `}]`, `"},`, `hello`, ` world`, "\n", `\n`, `\u00`, "é", "日本", "\xe6", `[]`, `{}`, `},{"`, `1,`, `x`, `":[`} {
		pieces = append(pieces, []byte(s))
	}
	v := NewVocab(len(pieces), func(id int) []byte { return pieces[id] }, func(id int) bool { return id == 0 })
	return v, pieces
}

// TestMaskMatchesBruteForce checks the trie walk against feeding every
// token on its own, in states reached by constrained random walks.
func TestMaskMatchesBruteForce(t *testing.T) {
	v, pieces := testVocab()
	for _, schema := range []string{"", personSchema, `{"type":"number"}`, `{"enum":[1,12,"x"]}`} {
		kind := JSONSchema
		if schema == "" {
			kind = JSONObject
		}
		b := mustCompile(t, kind, false, schema).Bind(v)
		rng := rand.New(rand.NewPCG(1, 2))
		for walk := 0; walk < 20; walk++ {
			m := b.NewMatcher()
			for step := 0; step < 40 && !m.ended; step++ {
				mask := m.Mask()
				var allowed []int
				for id := range pieces {
					st := m.st
					want := false
					if id == 0 {
						want = b.g.Complete(&st)
					} else if len(pieces[id]) > 0 {
						want = b.g.Feed(&st, pieces[id])
					}
					if got := Allowed(mask, id); got != want {
						t.Fatalf("schema %s, state after %d tokens, token %q: mask %v, brute force %v", schema, step, pieces[id], got, want)
					}
					if want {
						allowed = append(allowed, id)
					}
				}
				if len(allowed) == 0 {
					t.Fatalf("schema %s: no token allowed after %d tokens", schema, step)
				}
				if err := m.Accept(allowed[rng.IntN(len(allowed))]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// generate draws tokens uniformly from the mask (or, unconstrained, from
// the whole vocabulary) until an end token or limit tokens.
func generate(t *rapid.T, b *Bound, pieces [][]byte, limit int, constrained bool) (string, bool) {
	m := b.NewMatcher()
	var out []byte
	for range limit {
		var id int
		if constrained {
			mask := m.Mask()
			var allowed []int
			for i := range pieces {
				if Allowed(mask, i) {
					allowed = append(allowed, i)
				}
			}
			if len(allowed) == 0 {
				t.Fatalf("no token allowed after %q", out)
			}
			// Prefer ending when allowed, so that many walks finish.
			if Allowed(mask, 0) && rapid.Bool().Draw(t, "end") {
				return string(out), true
			}
			id = rapid.SampledFrom(allowed).Draw(t, "token")
			if err := m.Accept(id); err != nil {
				t.Fatal(err)
			}
		} else {
			id = rapid.IntRange(0, len(pieces)-1).Draw(t, "token")
		}
		if id == 0 {
			return string(out), true
		}
		out = append(out, pieces[id]...)
	}
	return string(out), false
}

var propertySchemas = []string{
	personSchema,
	`{"type":"array","items":{"anyOf":[{"type":"string"},{"type":"integer"},{"type":"null"}]}}`,
	`{"type":"object","properties":{"a":{"type":"object","properties":{"b":{"type":"array","items":{"type":"boolean"}}},"required":["b"],"additionalProperties":false},"c":{"const":{"k":[1,"2"]}}},"required":["c"]}`,
	`{"type":"object"}`,
	`{"type":"array","items":{"type":"array","items":{"enum":[1,2]},"minItems":2,"maxItems":3},"maxItems":2}`,
}

// TestOutputsValidate is the property: whatever the mask lets through,
// once ended, parses and validates against the schema.
func TestOutputsValidate(t *testing.T) {
	v, pieces := testVocab()
	for i, schema := range append([]string{""}, propertySchemas...) {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			kind := JSONSchema
			if schema == "" {
				kind = JSONObject
				schema = `{"type":"object"}`
			}
			var spec []byte
			if kind == JSONSchema {
				spec = []byte(schema)
			}
			g, err := Compile(Spec{Kind: kind, Schema: spec})
			if err != nil {
				t.Fatal(err)
			}
			b := g.Bind(v)
			sch, err := decode(schema)
			if err != nil {
				t.Fatal(err)
			}
			ended := 0
			// With -short rapid draws 20 walks, and for the deeper schemas
			// all of them can hit the piece limit before the document ends;
			// draw again (fresh seeds) until some walk ended.
			for round := 0; ended == 0 && round < 10; round++ {
				rapid.Check(t, func(t *rapid.T) {
					out, end := generate(t, b, pieces, 60, true)
					if !end {
						return // cut by the limit: only a prefix
					}
					ended++
					got, err := decode(out)
					if err != nil {
						t.Fatalf("output %q does not parse: %v", out, err)
					}
					if err := validate(sch, sch, got); err != nil {
						t.Fatalf("output %q does not validate: %v", out, err)
					}
				})
			}
			if ended == 0 {
				t.Fatal("no walk ended: the property checked nothing")
			}
			t.Logf("%d walks ended and validated", ended)
		})
	}
}

// TestUnconstrainedFails is the positive control: the same walks without
// the mask produce text that does not parse or validate.
func TestUnconstrainedFails(t *testing.T) {
	v, pieces := testVocab()
	b := mustCompile(t, JSONSchema, false, personSchema).Bind(v)
	sch, _ := decode(personSchema)
	bad := 0
	rapid.Check(t, func(rt *rapid.T) {
		out, _ := generate(rt, b, pieces, 30, false)
		got, err := decode(out)
		if err != nil || validate(sch, sch, got) != nil {
			bad++
		}
	})
	if bad > 0 {
		return
	}
	t.Fatal("unconstrained output always validated: the property test could not fail")
}

// validate is an independent check of the supported subset (on the
// decoded schema, not the automaton).
func validate(root, schema, v any) error {
	s, ok := schema.(map[string]any)
	if !ok {
		return nil // true
	}
	if ref, ok := s["$ref"].(string); ok {
		parts := strings.Split(strings.TrimPrefix(ref, "#/"), "/")
		return validate(root, root.(map[string]any)[parts[0]].(map[string]any)[parts[1]], v)
	}
	if c, ok := s["const"]; ok {
		if !reflect.DeepEqual(c, v) {
			return fmt.Errorf("%v is not const %v", v, c)
		}
		return nil
	}
	if e, ok := s["enum"].([]any); ok {
		for _, x := range e {
			if reflect.DeepEqual(x, v) {
				return nil
			}
		}
		return fmt.Errorf("%v not in enum %v", v, e)
	}
	if a, ok := s["anyOf"].([]any); ok {
		for _, br := range a {
			if validate(root, br, v) == nil {
				return nil
			}
		}
		return fmt.Errorf("%v matches no branch", v)
	}
	types := []any{s["type"]}
	if l, ok := s["type"].([]any); ok {
		types = l
	}
	var last error
	for _, t := range types {
		if last = validateType(root, s, t, v); last == nil {
			return nil
		}
	}
	return last
}

func validateType(root any, s map[string]any, typ, v any) error {
	switch typ {
	case nil:
		return nil
	case "string":
		if _, ok := v.(string); !ok {
			return fmt.Errorf("%v is not a string", v)
		}
	case "number":
		if _, ok := v.(json.Number); !ok {
			return fmt.Errorf("%v is not a number", v)
		}
	case "integer":
		if n, ok := v.(json.Number); !ok || strings.ContainsAny(string(n), ".eE") {
			return fmt.Errorf("%v is not an integer", v)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%v is not a boolean", v)
		}
	case "null":
		if v != nil {
			return fmt.Errorf("%v is not null", v)
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%v is not an array", v)
		}
		if n, ok := s["minItems"].(json.Number); ok && len(a) < mustInt(n) {
			return fmt.Errorf("%v has fewer than %v items", v, n)
		}
		if n, ok := s["maxItems"].(json.Number); ok && len(a) > mustInt(n) {
			return fmt.Errorf("%v has more than %v items", v, n)
		}
		for _, e := range a {
			if err := validate(root, s["items"], e); err != nil {
				return err
			}
		}
	case "object":
		o, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%v is not an object", v)
		}
		props, _ := s["properties"].(map[string]any)
		for _, r := range asList(s["required"]) {
			if _, ok := o[r.(string)]; !ok {
				return fmt.Errorf("%v lacks %v", v, r)
			}
		}
		for k, e := range o {
			ps, ok := props[k]
			if !ok {
				if s["additionalProperties"] == false {
					return fmt.Errorf("%v has %q", v, k)
				}
				continue
			}
			if err := validate(root, ps, e); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("type %v", typ)
	}
	return nil
}

// decode parses JSON keeping numbers as written (1E310 is valid JSON,
// though no float64).
func decode(text string) (any, error) {
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	if d.More() {
		return nil, fmt.Errorf("trailing data in %q", text)
	}
	return v, nil
}

func mustInt(n json.Number) int {
	i, err := n.Int64()
	if err != nil {
		panic(err)
	}
	return int(i)
}

func asList(v any) []any { l, _ := v.([]any); return l }

// FuzzAutomaton feeds arbitrary bytes after arbitrary schemas: Compile
// either refuses or builds a grammar, and whatever bytes the automaton
// takes to completion parse as JSON.
func FuzzAutomaton(f *testing.F) {
	f.Add(personSchema, []byte(`{"name":"x","age":3,"tags":["a"],"kind":"cat","ok":true,"score":null}`))
	f.Add(`{"type":"object"}`, []byte(`{"a":[1,{"b":"\u00e9"}]}`))
	f.Add(`{"enum":[1,12]}`, []byte(`12`))
	f.Fuzz(func(t *testing.T, schema string, text []byte) {
		g, err := Compile(Spec{Kind: JSONSchema, Schema: []byte(schema)})
		if err != nil {
			return
		}
		s := g.Start()
		if !g.Feed(&s, text) || !g.Complete(&s) {
			return
		}
		if !json.Valid(text) {
			t.Fatalf("schema %s took %q to completion, which is not JSON", schema, text)
		}
	})
}

var testTools = []Tool{
	{Name: "get_weather", Parameters: []byte(`{"type":"object","properties":{"city":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false}`), Strict: true},
	{Name: "add", Parameters: []byte(`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"]}`)},
	{Name: "ping"},
}

// TestToolCall: a call names one of the functions and its arguments are
// what that function's parameters accept; unknown names, another
// function's arguments and unsupported parameter keywords are refused.
func TestToolCall(t *testing.T) {
	g, err := Compile(ToolCallSpec(testTools))
	if err != nil {
		t.Fatal(err)
	}
	for _, ok := range []string{
		`{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}`,
		`{"name": "add", "arguments": {"a": 1, "b": -2}}`,
		`{"name": "ping", "arguments": {"x": [1]}}`,
	} {
		if p, c := accepts(g, ok); !p || !c {
			t.Errorf("%s: prefix %v complete %v", ok, p, c)
		}
	}
	for _, bad := range []string{`{"name": "sub"`, `{"name":"add"`, `{"name": "add", "arguments": {"city"`, `{"name": "add", "arguments": {"a": 1, "b": 2} }`,
		`{"name": "get_weather", "arguments": {"city": "x", "unit": "k"`, `[`} {
		if p, _ := accepts(g, bad); p {
			t.Errorf("%q accepted as a prefix", bad)
		}
	}
	if p, c := accepts(g, `{"name": "add", "arguments": {"a": 1`); !p || c {
		t.Errorf("a call cut short: prefix %v complete %v", p, c)
	}
	for _, tc := range []struct {
		tools   []Tool
		keyword string
	}{
		{[]Tool{{Name: "f", Parameters: []byte(`{"type":"object","properties":{"a":{"type":"string","format":"email"}}}`)}}, "format"},
		{[]Tool{{Name: "f"}, {Name: "f"}}, "name"},
		{[]Tool{{Name: ""}}, "name"},
		{nil, "tools"},
		{[]Tool{{Name: "f", Parameters: []byte(`{"type":"object","properties":{"a":{"type":"string"}}}`), Strict: true}}, "additionalProperties"},
	} {
		_, err := Compile(ToolCallSpec(tc.tools))
		var se *SchemaError
		if !errors.As(err, &se) || se.Keyword != tc.keyword {
			t.Errorf("%+v: %v, want a SchemaError naming %q", tc.tools, err, tc.keyword)
		}
	}
}

// TestToolCallOutputsValidate: the property for tool calls: any ended
// output parses, names a function, and its arguments validate against
// that function's parameters.
func TestToolCallOutputsValidate(t *testing.T) {
	v, pieces := testVocab()
	g, err := Compile(ToolCallSpec(testTools))
	if err != nil {
		t.Fatal(err)
	}
	b := g.Bind(v)
	schemas := map[string]any{}
	for _, tool := range testTools {
		s := any(true)
		if len(tool.Parameters) > 0 {
			if s, err = decode(string(tool.Parameters)); err != nil {
				t.Fatal(err)
			}
		}
		schemas[tool.Name] = s
	}
	ended := 0
	rapid.Check(t, func(t *rapid.T) {
		out, end := generate(t, b, pieces, 80, true)
		if !end {
			return
		}
		ended++
		var call struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}
		if err := json.Unmarshal([]byte(out), &call); err != nil {
			t.Fatalf("%q: %v", out, err)
		}
		sch, ok := schemas[call.Name]
		if !ok {
			t.Fatalf("%q names no function", out)
		}
		args, err := decode(string(call.Arguments))
		if err != nil {
			t.Fatal(err)
		}
		if err := validate(sch, sch, args); err != nil {
			t.Fatalf("%q: %v", out, err)
		}
	})
	if ended == 0 {
		t.Fatal("no walk ended")
	}
	t.Logf("%d calls ended and validated", ended)
}

// TestMaskCache: a state's mask is computed once and then served from the
// cache (the same slice); inside a string the state does not change from
// token to token, so a long string costs one computation.
func TestMaskCache(t *testing.T) {
	v, pieces := testVocab()
	b := mustCompile(t, JSONObject, false, "").Bind(v)
	m := b.NewMatcher()
	id := func(s string) int {
		for i, p := range pieces {
			if string(p) == s {
				return i
			}
		}
		t.Fatalf("no token %q", s)
		return -1
	}
	for _, s := range []string{`{"`, `name`, `":`, ` "`} {
		if err := m.Accept(id(s)); err != nil {
			t.Fatal(err)
		}
	}
	first := m.Mask()
	for _, s := range []string{`hello`, ` world`, `x`, `cat`} {
		if err := m.Accept(id(s)); err != nil {
			t.Fatal(err)
		}
		if got := m.Mask(); &got[0] != &first[0] {
			t.Fatalf("after %q inside the string the mask was computed again", s)
		}
	}
	if hits, misses := b.CacheStats(); hits != 4 || misses != 1 {
		t.Errorf("hits %d misses %d, want 4 and 1", hits, misses)
	}
}
