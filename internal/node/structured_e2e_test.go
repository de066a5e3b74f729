package node_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/tokenizer"
)

// Structured output end to end: response_format through the real gateway,
// scheduler, executor and sampler on builtin:tiny, whose random weights
// write anything but JSON unless constrained.

const petSchema = `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"pet":{"enum":["cat","dog",null]},"ok":{"type":"boolean"},
"tags":{"type":"array","items":{"enum":["a","b"]}}},"required":["name","age","pet","ok","tags"],"additionalProperties":false}`

// pet is petSchema's value; checkPet validates a decoded one strictly.
type pet struct {
	Name *string   `json:"name"`
	Age  *int64    `json:"age"`
	Pet  *string   `json:"pet"`
	OK   *bool     `json:"ok"`
	Tags *[]string `json:"tags"`
}

// checkStructured checks text against kind/schema: a whole value when
// finish is "stop" (parsed, and for petSchema validated field by field),
// a prefix the grammar accepts when "length".
func checkStructured(t *testing.T, kind grammar.Kind, schema, text, finish string) {
	t.Helper()
	var sb []byte
	if schema != "" {
		sb = []byte(schema)
	}
	g, err := grammar.Compile(grammar.Spec{Kind: kind, Strict: true, Schema: sb})
	if err != nil {
		t.Fatal(err)
	}
	st := g.Start()
	if !g.Feed(&st, []byte(text)) {
		t.Fatalf("output %q is not a prefix the schema allows", text)
	}
	switch finish {
	case "length":
		return
	case "stop":
	default:
		t.Fatalf("finish %q for %q", finish, text)
	}
	if !g.Complete(&st) {
		t.Fatalf("finish stop on an incomplete value %q", text)
	}
	if kind == grammar.JSONObject {
		var m map[string]any
		if err := json.Unmarshal([]byte(text), &m); err != nil {
			t.Fatalf("json_object output %q: %v", text, err)
		}
		return
	}
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	var p pet
	if err := dec.Decode(&p); err != nil {
		t.Fatalf("output %q does not decode as the schema's object: %v", text, err)
	}
	if p.Name == nil || p.Age == nil || p.OK == nil || p.Tags == nil || !strings.Contains(text, `"pet"`) {
		t.Fatalf("output %q lacks a required property", text)
	}
	if p.Pet != nil && *p.Pet != "cat" && *p.Pet != "dog" {
		t.Fatalf("output %q: pet %q not in the enum", text, *p.Pet)
	}
	for _, tag := range *p.Tags {
		if tag != "a" && tag != "b" {
			t.Fatalf("output %q: tag %q not in the enum", text, tag)
		}
	}
}

func jsonSchemaFormat(schema string) map[string]any {
	return map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "pet", "strict": true, "schema": json.RawMessage(schema)}}
}

// TestE2EStructuredOutput: json_object and json_schema, streamed and not,
// greedy and sampled, always give output the schema accepts (whole when
// finish is stop); the served tokens are those the engine's own generator
// draws under the same constraint; and the same requests without
// response_format do not parse (the positive control).
func TestE2EStructuredOutput(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	msgs := []map[string]any{{"role": "user", "content": "Describe a pet as JSON."}}
	stops := 0
	for _, tc := range []struct {
		name   string
		kind   grammar.Kind
		schema string
	}{
		{"json_object", grammar.JSONObject, ""},
		{"json_schema", grammar.JSONSchema, petSchema},
	} {
		format := map[string]any{"type": "json_object"}
		if tc.kind == grammar.JSONSchema {
			format = jsonSchemaFormat(tc.schema)
		}
		for _, knobs := range []map[string]any{
			{"temperature": 0},
			{"temperature": 1, "seed": 3},
			{"temperature": 1.5, "seed": 8, "top_p": 0.9, "presence_penalty": 1},
		} {
			body := func(stream bool) map[string]any {
				b := map[string]any{"messages": msgs, "max_tokens": 120, "response_format": format}
				for k, v := range knobs {
					b[k] = v
				}
				return b
			}
			t.Run(fmt.Sprint(tc.name, knobs), func(t *testing.T) {
				var c chatBody
				s.postOK(e2eKeyA, "/v1/chat/completions", body(false), &c)
				text, finish := c.Choices[0].Message.Content, *c.Choices[0].FinishReason
				t.Logf("%s %q", finish, text)
				checkStructured(t, tc.kind, tc.schema, text, finish)
				if finish == "stop" {
					stops++
				}
				st := s.stream(e2eKeyA, "/v1/chat/completions", body(true))
				_, stext, sfinish, _, _ := chatStream(t, st)
				if !st.done || stext != text || sfinish != finish {
					t.Errorf("streamed %q %q (done %v), not streamed %q %q", stext, sfinish, st.done, text, finish)
				}
				// Without the constraint: not JSON.
				plain := body(false)
				delete(plain, "response_format")
				s.postOK(e2eKeyA, "/v1/chat/completions", plain, &c)
				if p := c.Choices[0].Message.Content; json.Valid([]byte(p)) {
					t.Errorf("unconstrained output %q is JSON: the control shows nothing", p)
				}
			})
		}
	}
	if stops == 0 {
		t.Error("no output finished: nothing was checked whole")
	}
	s.waitAllFree()
	s.checkMustBeZero()
}

// TestE2EStructuredMatchesEngine: the served tokens are exactly what
// engine.Generate draws under the same constraint (one sampler and mask
// path for the run command and the server), here on a completions
// request with guided_json.
func TestE2EStructuredMatchesEngine(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	tok := s.node.Model().Tokenizer
	prompt := tok.Encode("Once upon a time, there was a dog named Max.", true, true)
	g, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONSchema, Schema: []byte(petSchema)})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []request.Sampling{{Grammar: g}, {Grammar: g, Temperature: 1, Seed: 42}} {
		extra := map[string]any{"guided_json": json.RawMessage(petSchema), "temperature": cfg.Temperature, "seed": cfg.Seed}
		text, finish, n := s.complete(prompt, 80, extra)
		want := reference(t, prompt, 80, cfg)
		// Decoded as the gateway does: a character cut by max_tokens
		// ends as U+FFFD.
		d := tokenizer.NewStreamDecoder(tok, prompt[len(prompt)-1])
		var wantText string
		for _, id := range want {
			wantText += d.Add(id)
		}
		wantText += d.Flush()
		if text != wantText || n != len(want) {
			t.Errorf("served %q (%s, %d tokens), engine %q (%d tokens)", text, finish, n, wantText, len(want))
		}
		checkStructured(t, grammar.JSONSchema, petSchema, text, finish)
	}
}

// TestOpenAINodeClientStructured runs the official openai npm client
// (internal/gateway/testdata/openai-client/structured.mjs) against the
// real node: response_format json_schema (strict) and json_object,
// streamed and not, each finished answer validated by Ajv, an independent
// JSON Schema validator; a cut one must be a prefix the schema allows;
// an unsupported keyword is a BadRequestError naming response_format; and
// the client's runTools, streamed and not, parses a named tool_choice's
// tool_calls and calls the function with arguments Ajv validates.
// Like TestOpenAINodeClientRealNode it runs when PAGEWARDEN_NODE_TESTS=1
// and `npm install` has been run there (test.sh does both).
func TestOpenAINodeClientStructured(t *testing.T) {
	if os.Getenv("PAGEWARDEN_NODE_TESTS") != "1" {
		t.Skip("set PAGEWARDEN_NODE_TESTS=1 (and npm install in internal/gateway/testdata/openai-client) to run")
	}
	dir := filepath.Join("..", "gateway", "testdata", "openai-client")
	for _, pkg := range []string{"openai", "ajv"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg)); err != nil {
			t.Skipf("run `npm install` in internal/gateway/testdata/openai-client first (%s is missing)", pkg)
		}
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	s := startE2E(t, e2eConfig{})
	cmd := exec.Command(nodeBin, "structured.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PW_BASE_URL="+s.url+"/v1", "PW_API_KEY="+e2eKeyA, "PW_MODEL="+s.node.ModelID())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node client: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res struct {
		OK      bool `json:"ok"`
		Results struct {
			Schema        string
			Finished, Cut int
			Answers       []struct {
				Format, Content, Finish string
			}
			Refused struct {
				Status      int
				Param, Code string
			}
			Calls  []json.RawMessage
			Pinged int
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || !res.OK {
		t.Fatalf("output %s: %v", out, err)
	}
	r := res.Results
	if r.Finished == 0 || r.Finished+r.Cut != 20 || len(r.Answers) != 20 {
		t.Fatalf("%d finished, %d cut, %d answers; want 20 with some finished", r.Finished, r.Cut, len(r.Answers))
	}
	// A cut answer is a prefix its format allows.
	for _, a := range r.Answers {
		if a.Finish != "length" {
			continue
		}
		spec := grammar.Spec{Kind: grammar.JSONObject}
		if a.Format == "json_schema" {
			spec = grammar.Spec{Kind: grammar.JSONSchema, Strict: true, Schema: []byte(r.Schema)}
		}
		g, err := grammar.Compile(spec)
		if err != nil {
			t.Fatal(err)
		}
		if st := g.Start(); !g.Feed(&st, []byte(a.Content)) {
			t.Errorf("%s answer %q cut by max_tokens is not a prefix the format allows", a.Format, a.Content)
		}
	}
	if r.Refused.Status != 400 || r.Refused.Param != "response_format" || r.Refused.Code != "unsupported_parameter" {
		t.Errorf("unsupported keyword: %+v", r.Refused)
	}
	// The client's runTools parsed the tool_calls and called the function
	// with arguments Ajv validated, streamed and not.
	if len(r.Calls) != 6 || r.Pinged == 0 {
		t.Errorf("runTools: %d runs, %d calls made: %s", len(r.Calls), r.Pinged, lines[len(lines)-1])
	}
	t.Logf("%d of 20 answers finished and validated with Ajv, %d cut by max_tokens; runTools called the function %d of 6 times", r.Finished, r.Cut, r.Pinged)
}

// TestE2EToolCalls: tool_choice "required" (two functions) and a named
// function on builtin:tiny, streamed and not: the answer is OpenAI's
// tool_calls (finish "tool_calls"), naming an offered function, with
// arguments that parse and validate against its parameters; the streamed
// deltas (id, type and name first, then arguments) add up to the same
// call.
func TestE2EToolCalls(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	tools := []any{
		json.RawMessage(`{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"unit":{"enum":["c","f"]},"days":{"type":"integer"}},"required":["unit","days"],"additionalProperties":false},"strict":true}}`),
		json.RawMessage(`{"type":"function","function":{"name":"ping","parameters":{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}}}`),
	}
	type call struct {
		ID       string `json:"id"`
		Type     string `json:"type"`
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	}
	calls := 0
	for _, choice := range []any{"required", map[string]any{"type": "function", "function": map[string]any{"name": "ping"}}} {
		for _, seed := range []int{1, 2, 3} {
			body := func() map[string]any {
				return map[string]any{"messages": []map[string]any{{"role": "user", "content": "Weather?"}}, "max_tokens": 120,
					"temperature": 1, "seed": seed, "tools": tools, "tool_choice": choice}
			}
			code, _, out := s.post(e2eKeyA, "/v1/chat/completions", body())
			if code != 200 {
				t.Fatalf("status %d: %s", code, out)
			}
			var resp struct {
				Choices []struct {
					Message struct {
						Content   *string `json:"content"`
						ToolCalls []call  `json:"tool_calls"`
					} `json:"message"`
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(out, &resp); err != nil || len(resp.Choices) != 1 {
				t.Fatalf("%s: %v", out, err)
			}
			ch := resp.Choices[0]
			t.Logf("%v seed %d: %s %+v", choice, seed, ch.FinishReason, ch.Message.ToolCalls)
			if ch.FinishReason == "length" {
				continue // cut: checked as a prefix by the grammar's own tests
			}
			if ch.FinishReason != "tool_calls" || ch.Message.Content != nil || len(ch.Message.ToolCalls) != 1 {
				t.Fatalf("answer %s", out)
			}
			c := ch.Message.ToolCalls[0]
			if !strings.HasPrefix(c.ID, "call_") || c.Type != "function" {
				t.Errorf("call %+v", c)
			}
			var args map[string]any
			if err := json.Unmarshal([]byte(c.Function.Arguments), &args); err != nil {
				t.Fatalf("arguments %q: %v", c.Function.Arguments, err)
			}
			switch c.Function.Name {
			case "get_weather":
				if choice != "required" || len(args) != 2 || (args["unit"] != "c" && args["unit"] != "f") {
					t.Errorf("get_weather(%s)", c.Function.Arguments)
				}
				if d, ok := args["days"].(float64); !ok || d != float64(int64(d)) {
					t.Errorf("get_weather(%s): days not an integer", c.Function.Arguments)
				}
			case "ping":
				if _, ok := args["ok"].(bool); !ok {
					t.Errorf("ping(%s)", c.Function.Arguments)
				}
			default:
				t.Errorf("call of %q, not an offered function", c.Function.Name)
			}
			calls++
			// Streamed: the same call in deltas.
			st := s.stream(e2eKeyA, "/v1/chat/completions", body())
			var got call
			finish := ""
			for _, ev := range st.events {
				var chunk struct {
					Choices []struct {
						Delta struct {
							ToolCalls []call `json:"tool_calls"`
						} `json:"delta"`
						FinishReason *string `json:"finish_reason"`
					} `json:"choices"`
				}
				if err := json.Unmarshal(ev, &chunk); err != nil {
					t.Fatal(err)
				}
				for _, sc := range chunk.Choices {
					for _, d := range sc.Delta.ToolCalls {
						if d.ID != "" {
							got.ID, got.Type, got.Function.Name = d.ID, d.Type, d.Function.Name
						}
						got.Function.Arguments += d.Function.Arguments
					}
					if sc.FinishReason != nil {
						finish = *sc.FinishReason
					}
				}
			}
			if !st.done || finish != "tool_calls" || got.Function.Name != c.Function.Name || got.Function.Arguments != c.Function.Arguments || got.Type != "function" || got.ID == "" {
				t.Errorf("streamed %+v finish %q; not streamed %+v", got, finish, c)
			}
		}
	}
	if calls == 0 {
		t.Error("no call finished: nothing was checked whole")
	}
}
