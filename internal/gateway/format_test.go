package gateway_test

import (
	"strings"
	"testing"
)

// TestStructuredOutputRefusals: a response_format or guided_json the
// server cannot enforce is a 400 naming the parameter (and, for a schema
// keyword outside the supported subset, the keyword), before anything is
// submitted.
func TestStructuredOutputRefusals(t *testing.T) {
	h := newHarness(t, nil)
	schema := func(s map[string]any) map[string]any {
		return map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "schema": s}}
	}
	obj := func(props map[string]any) map[string]any {
		return map[string]any{"type": "object", "properties": props}
	}
	for _, tc := range []struct {
		name   string
		body   map[string]any
		chat   bool // response_format is a chat field
		param  string
		code   string
		inText string
	}{
		{"pattern", map[string]any{"response_format": schema(obj(map[string]any{"a": map[string]any{"type": "string", "pattern": "^a"}}))}, true,
			"response_format", "unsupported_parameter", "'pattern'"},
		{"format", map[string]any{"response_format": schema(map[string]any{"type": "string", "format": "email"})}, true,
			"response_format", "unsupported_parameter", "'format'"},
		{"patternProperties", map[string]any{"response_format": schema(map[string]any{"type": "object", "patternProperties": map[string]any{}})}, true,
			"response_format", "unsupported_parameter", "'patternProperties'"},
		{"ref cycle", map[string]any{"response_format": schema(map[string]any{"$defs": map[string]any{"n": obj(map[string]any{"n": map[string]any{"$ref": "#/$defs/n"}})}, "$ref": "#/$defs/n"})}, true,
			"response_format", "unsupported_parameter", "recursive"},
		{"strict without required", map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "x", "strict": true,
			"schema": map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "string"}}, "additionalProperties": false}}}}, true,
			"response_format", "unsupported_parameter", "'required'"},
		{"unknown type", map[string]any{"response_format": map[string]any{"type": "regex"}}, true, "response_format", "unsupported_parameter", "regex"},
		{"no type", map[string]any{"response_format": map[string]any{}}, true, "response_format.type", "", ""},
		{"not an object", map[string]any{"response_format": "json"}, true, "response_format", "invalid_type", ""},
		{"no json_schema", map[string]any{"response_format": map[string]any{"type": "json_schema"}}, true, "response_format.json_schema", "", ""},
		{"bad name", map[string]any{"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "a b", "schema": map[string]any{}}}}, true,
			"response_format.json_schema.name", "", ""},
		{"both", map[string]any{"response_format": map[string]any{"type": "json_object"}, "guided_json": map[string]any{"type": "object"}}, true,
			"response_format", "", ""},
		{"ignore_eos", map[string]any{"response_format": map[string]any{"type": "json_object"}, "ignore_eos": true}, true, "ignore_eos", "", ""},
		{"guided_json minimum", map[string]any{"guided_json": map[string]any{"type": "integer", "minimum": 0}}, false, "guided_json", "unsupported_parameter", "'minimum'"},
		{"guided_json string not JSON", map[string]any{"guided_json": "{"}, false, "guided_json", "", ""},
		{"guided_json anyOf ambiguous", map[string]any{"guided_json": map[string]any{"anyOf": []any{map[string]any{"type": "integer"}, map[string]any{"type": "number"}}}}, false,
			"guided_json", "unsupported_parameter", "'anyOf'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := h.fake.Submits()
			paths := []string{"/v1/chat/completions"}
			if !tc.chat {
				paths = append(paths, "/v1/completions")
			}
			for _, path := range paths {
				tc.body["prompt"] = "x"
				r := h.post(path, keyAlpha, chatBody(tc.body))
				if r.status != 400 || errorParam(t, r.body) != tc.param {
					t.Fatalf("%s: status %d %s; want 400 naming %s", path, r.status, r.body, tc.param)
				}
				if tc.code != "" && errorCode(t, r.body) != tc.code {
					t.Errorf("%s: code %q, want %q", path, errorCode(t, r.body), tc.code)
				}
				if !strings.Contains(string(r.body), tc.inText) {
					t.Errorf("%s: %s does not mention %s", path, r.body, tc.inText)
				}
			}
			if h.fake.Submits() != before {
				t.Error("a refused request was submitted")
			}
		})
	}
	// What is supported is accepted: json_object, a schema with every
	// supported keyword, a guided_json string, and text.
	for _, v := range []map[string]any{
		{"response_format": map[string]any{"type": "json_object"}},
		{"response_format": map[string]any{"type": "text"}},
		{"response_format": schema(nil)},
		{"response_format": schema(map[string]any{"$defs": map[string]any{"p": map[string]any{"enum": []any{"a", 1, nil}}},
			"type": "object", "title": "t", "description": "d", "additionalProperties": false, "required": []string{"a"},
			"properties": map[string]any{"a": map[string]any{"$ref": "#/$defs/p"}, "b": map[string]any{"type": "array", "items": map[string]any{"const": true}},
				"c": map[string]any{"anyOf": []any{map[string]any{"type": "string"}, map[string]any{"type": "null"}}}, "d": map[string]any{"type": []string{"integer", "boolean"}}}})},
		{"guided_json": `{"type":"array","items":{"type":"number"}}`},
	} {
		if r := h.post("/v1/chat/completions", keyAlpha, chatBody(v)); r.status != 200 {
			t.Errorf("%v: status %d %s", v, r.status, r.body)
		}
	}
}
