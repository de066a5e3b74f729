package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/pagewarden/pagewarden/internal/grammar"
)

// Structured output: response_format (OpenAI) and guided_json (vLLM)
// become a grammar.Grammar in request.Sampling, which the engine turns into
// a token mask before every draw. The schema subset is package grammar's;
// anything outside it is a 400 naming the parameter and the keyword.

// schemaNameRe is OpenAI's rule for json_schema.name.
var schemaNameRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// parseResponseFormat accepts null, {"type":"text"}, {"type":"json_object"}
// and {"type":"json_schema","json_schema":{"name","schema","strict",
// "description"}}.
func parseResponseFormat(raw json.RawMessage) (*grammar.Grammar, *apiError) {
	const param = "response_format"
	if isNull(raw) {
		return nil, nil
	}
	var rf struct {
		Type       *string `json:"type"`
		JSONSchema *struct {
			Name        *string         `json:"name"`
			Description *string         `json:"description"`
			Schema      json.RawMessage `json:"schema"`
			Strict      *bool           `json:"strict"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &rf); err != nil {
		e := badRequest(param, "'response_format' must be an object such as {\"type\": \"json_object\"}.")
		e.Code, e.Err = "invalid_type", err
		return nil, e
	}
	if rf.Type == nil {
		return nil, badRequest(param+".type", "'response_format.type' is required: text, json_object or json_schema.")
	}
	switch *rf.Type {
	case "text":
		return nil, nil
	case "json_object":
		g, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONObject})
		if err != nil {
			return nil, internalError(err)
		}
		return g, nil
	case "json_schema":
	default:
		return nil, unsupported(param, fmt.Sprintf("'response_format' of type %q (only text, json_object and json_schema)", truncate(*rf.Type, 40)))
	}
	js := rf.JSONSchema
	if js == nil {
		return nil, badRequest(param+".json_schema", "'response_format.json_schema' is required when the type is json_schema.")
	}
	if js.Name == nil || !schemaNameRe.MatchString(*js.Name) {
		return nil, badRequest(param+".json_schema.name", "'response_format.json_schema.name' is required: 1 to 64 letters, digits, underscores or dashes.")
	}
	if isNull(js.Schema) {
		// No schema constrains only the syntax: a JSON object, as
		// json_object does.
		g, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONObject})
		if err != nil {
			return nil, internalError(err)
		}
		return g, nil
	}
	return compileSchema(param+".json_schema.schema", "response_format", js.Schema, js.Strict != nil && *js.Strict)
}

// parseGuidedJSON accepts vLLM's guided_json: a schema, as an object or as
// a string holding one.
func parseGuidedJSON(raw json.RawMessage) (*grammar.Grammar, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	schema := []byte(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		schema = []byte(s)
	}
	return compileSchema("guided_json", "guided_json", schema, false)
}

// compileSchema compiles a JSON Schema; param is where the schema was,
// field the request field to name in an unsupported_parameter refusal.
func compileSchema(param, field string, schema []byte, strict bool) (*grammar.Grammar, *apiError) {
	var compact bytes.Buffer
	if err := json.Compact(&compact, schema); err != nil {
		e := badRequest(param, "'%s' must be a JSON Schema (a JSON object).", param)
		e.Err = err
		return nil, e
	}
	g, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONSchema, Strict: strict, Schema: compact.Bytes()})
	var se *grammar.SchemaError
	switch {
	case errors.As(err, &se):
		e := badRequest(field, "In '%s' at %q: %s (keyword '%s').",
			param, cmpOr(se.Path, "/"), truncate(se.Msg, 300), truncate(se.Keyword, 64))
		e.Code, e.Err = "unsupported_parameter", err
		return nil, e
	case err != nil:
		e := badRequest(param, "'%s' is not a usable JSON Schema: %s", param, truncate(err.Error(), 200))
		e.Err = err
		return nil, e
	}
	return g, nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
