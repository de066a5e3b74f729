package gateway_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// weatherTool is the shared cases' tool, in the client's key order (the
// template writes it with tojson, in that order).
var weatherTool = json.RawMessage(`{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
	"parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}`)

// TestToolsReachTheTemplate: tools and a tool-call conversation (an
// assistant's tool_calls with arguments as OpenAI's JSON string, then the
// tool's result) are rendered by the model's chat template exactly as
// Hugging Face renders them (Qwen 2.5's template and its reference
// rendering from shared/testdata).
func TestToolsReachTheTemplate(t *testing.T) {
	dir := testdata.Path(t, "templates")
	src, err := os.ReadFile(filepath.Join(dir, "Qwen-Qwen2.5-7B-Instruct.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	var want string
	f, err := os.Open(filepath.Join(dir, "Qwen-Qwen2.5-7B-Instruct.expected.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for sc := bufio.NewScanner(f); sc.Scan(); {
		var l struct{ Case, Output string }
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Case == "tool-call-and-result" {
			want = l.Output
		}
	}
	fake := gatewaytest.NewFake()
	fake.Template = string(src)
	fake.Window = 4096
	h := newHarness(t, fake)
	r := h.post("/v1/chat/completions", keyAlpha, map[string]any{
		"tools": []any{weatherTool}, "tool_choice": "none", "max_tokens": 4,
		"messages": []any{
			map[string]any{"role": "user", "content": "What's the weather in Paris?"},
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_0001", "type": "function",
				"function": map[string]any{"name": "get_weather", "arguments": `{"city": "Paris", "unit": "celsius"}`}}}},
			map[string]any{"role": "tool", "tool_call_id": "call_0001", "name": "get_weather", "content": `{"temp": 18}`},
		}})
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	// The fake's tokenizer puts its BOS first; the template writes none.
	if got := strings.TrimPrefix(promptText(t, h.fake.LastParams()), "<s>"); got != want {
		t.Errorf("prompt:\n%q\nwant (Hugging Face):\n%q", got, want)
	}
	if h.fake.LastParams().Sampling.Grammar != nil {
		t.Error("tool_choice none set a constraint")
	}
}

// TestToolRefusals: what the server cannot do with tools is a 400 naming
// the field, before anything is submitted.
func TestToolRefusals(t *testing.T) {
	h := newHarness(t, nil)
	tools := []any{weatherTool}
	msgs := []any{map[string]any{"role": "user", "content": "x"}}
	for _, tc := range []struct {
		name        string
		body        map[string]any
		param, code string
		mentions    string
	}{
		{"auto by default", map[string]any{"tools": tools}, "tool_choice", "unsupported_parameter", "auto"},
		{"auto", map[string]any{"tools": tools, "tool_choice": "auto"}, "tool_choice", "unsupported_parameter", "auto"},
		{"choice without tools", map[string]any{"tool_choice": "required"}, "tool_choice", "", ""},
		{"named, not in tools", map[string]any{"tools": tools, "tool_choice": map[string]any{"type": "function", "function": map[string]any{"name": "nope"}}}, "tool_choice", "", "nope"},
		{"bad choice", map[string]any{"tools": tools, "tool_choice": "sometimes"}, "tool_choice", "", ""},
		{"unsupported keyword", map[string]any{"tool_choice": "required", "tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"d": map[string]any{"type": "string", "format": "date"}}}}}}},
			"tools", "unsupported_parameter", "'format'"},
		{"strict without additionalProperties", map[string]any{"tool_choice": "required", "tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "strict": true,
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "string"}}, "required": []string{"a"}}}}}},
			"tools", "unsupported_parameter", "additionalProperties"},
		{"not a function", map[string]any{"tools": []any{map[string]any{"type": "code_interpreter"}}}, "tools[0].type", "unsupported_parameter", ""},
		{"bad name", map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "a b"}}}}, "tools[0].function.name", "", ""},
		{"two of a name", map[string]any{"tools": []any{weatherTool, weatherTool}, "tool_choice": "required"}, "tools[1].function.name", "", ""},
		{"with response_format", map[string]any{"tools": tools, "tool_choice": "required", "response_format": map[string]any{"type": "json_object"}}, "tool_choice", "", ""},
		{"with ignore_eos", map[string]any{"tools": tools, "tool_choice": "required", "ignore_eos": true}, "ignore_eos", "", ""},
		{"parallel not a boolean", map[string]any{"tools": tools, "tool_choice": "none", "parallel_tool_calls": "yes"}, "parallel_tool_calls", "", ""},
		{"tool message without id", map[string]any{"messages": append(msgs, map[string]any{"role": "tool", "content": "r"})}, "messages[1].tool_call_id", "", ""},
		{"tool_calls not calls", map[string]any{"messages": append(msgs, map[string]any{"role": "assistant", "tool_calls": []any{map[string]any{"type": "function"}}})}, "messages[1].tool_calls", "", ""},
		{"tool_calls on a user", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x", "tool_calls": []any{}}}}, "messages[0].tool_calls", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := h.fake.Submits()
			r := h.post("/v1/chat/completions", keyAlpha, chatBody(tc.body))
			if r.status != 400 || errorParam(t, r.body) != tc.param {
				t.Fatalf("status %d %s; want 400 naming %s", r.status, r.body, tc.param)
			}
			if tc.code != "" && errorCode(t, r.body) != tc.code {
				t.Errorf("code %q, want %q", errorCode(t, r.body), tc.code)
			}
			if !strings.Contains(string(r.body), tc.mentions) {
				t.Errorf("%s does not mention %s", r.body, tc.mentions)
			}
			if h.fake.Submits() != before {
				t.Error("a refused request was submitted")
			}
		})
	}
	// required and a named function constrain the output to a call.
	for choice, want := range map[string]any{
		"required": "required",
		"named":    map[string]any{"type": "function", "function": map[string]any{"name": "get_weather"}},
	} {
		r := h.post("/v1/chat/completions", keyAlpha, chatBody(map[string]any{"tools": tools, "tool_choice": want, "parallel_tool_calls": false}))
		if r.status != 200 {
			t.Fatalf("%s: status %d %s", choice, r.status, r.body)
		}
		if g := h.fake.LastParams().Sampling.Grammar; g == nil || g.Spec().Kind != grammar.ToolCall {
			t.Errorf("%s: constraint %v, want a tool call", choice, g)
		}
	}
}

// autoCase is an "auto" answer and what it must come back as.
type autoCase struct {
	name, reply, content, finish string
	calls                        []string // name(arguments)
}

// TestToolAuto: with tool_choice "auto" and a template that teaches a call
// syntax (Hermes' <tool_call>, Llama 3's JSON), calls in the answer come
// back as tool_calls (the text before them as content), streamed and not;
// an answer without a well-formed call of an offered function stays text.
func TestToolAuto(t *testing.T) {
	t.Run("hermes", func(t *testing.T) {
		testToolAuto(t, "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", nil, []autoCase{
			{"one call", "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "Let me check.", "tool_calls",
				[]string{`get_weather({"city":"Paris"})`}},
			{"two calls, no text", "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}</tool_call>\n<tool_call>\n{\"arguments\": {}, \"name\": \"get_weather\"}\n", "", "tool_calls",
				[]string{`get_weather({"city":"A"})`, `get_weather({})`}},
			{"text only", "It is sunny in <b>Paris</b>.", "It is sunny in <b>Paris</b>.", "stop", nil},
			{"unknown function", "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>", "<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>", "stop", nil},
			{"malformed", "<tool_call>{\"name\": \"get_weather\", \"arguments\": {</tool_call>", "<tool_call>{\"name\": \"get_weather\", \"arguments\": {</tool_call>", "stop", nil},
		})
	})
	t.Run("llama3", func(t *testing.T) {
		testToolAuto(t, "meta-llama-Llama-3.1-8B-Instruct.jinja", nil, []autoCase{
			{"one call", `{"name": "get_weather", "parameters": {"city": "Paris"}}`, "", "tool_calls", []string{`get_weather({"city":"Paris"})`}},
			{"two calls", " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"A\"}}; {\"name\": \"get_weather\", \"arguments\": {}}\n", "", "tool_calls",
				[]string{`get_weather({"city":"A"})`, `get_weather({})`}},
			{"text only", "It is sunny {mostly}.", "It is sunny {mostly}.", "stop", nil},
			{"unknown function", `{"name": "rm", "parameters": {}}`, `{"name": "rm", "parameters": {}}`, "stop", nil},
			{"call after text", `Answer: {"name": "get_weather", "parameters": {}}`, `Answer: {"name": "get_weather", "parameters": {}}`, "stop", nil},
			{"trailing text", `{"name": "get_weather", "parameters": {}} done`, `{"name": "get_weather", "parameters": {}} done`, "stop", nil},
		})
	})
	t.Run("mistral", func(t *testing.T) {
		testToolAuto(t, "mistralai-Mistral-Nemo-Instruct-2407.jinja", nil, []autoCase{
			{"calls", `[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123def"}, {"name": "get_weather", "arguments": {}}]`, "", "tool_calls",
				[]string{`get_weather({"city":"Paris"})`, `get_weather({})`}},
			{"marker as text", `[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "A"}}]`, "", "tool_calls", []string{`get_weather({"city":"A"})`}},
			{"text only", "[1] is a footnote.", "[1] is a footnote.", "stop", nil},
			{"unknown function", `[{"name": "rm", "arguments": {}}]`, `[{"name": "rm", "arguments": {}}]`, "stop", nil},
			{"empty list", `[]`, `[]`, "stop", nil},
		})
	})
	t.Run("parallel_tool_calls false", func(t *testing.T) {
		testToolAuto(t, "meta-llama-Llama-3.1-8B-Instruct.jinja", map[string]any{"parallel_tool_calls": false}, []autoCase{
			{"first of two calls", `{"name": "get_weather", "parameters": {"city": "A"}}; {"name": "get_weather", "parameters": {}}`, "", "tool_calls",
				[]string{`get_weather({"city":"A"})`}},
		})
	})
}

func testToolAuto(t *testing.T, template string, extra map[string]any, cases []autoCase) {
	src, err := os.ReadFile(filepath.Join(testdata.Path(t, "templates"), template))
	if err != nil {
		t.Fatal(err)
	}
	fake := gatewaytest.NewFake()
	fake.Template = string(src)
	fake.Window = 8192
	var reply string
	fake.Behave = func(request.Params) gatewaytest.Behavior { return gatewaytest.Behavior{Reply: reply} }
	h := newHarness(t, fake)
	type call struct {
		Index    int
		ID, Type string
		Function struct{ Name, Arguments string }
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reply = tc.reply
			body := map[string]any{"messages": []any{map[string]any{"role": "user", "content": "Weather in Paris?"}}, "tools": []any{weatherTool}}
			for k, v := range extra {
				body[k] = v
			}
			r := h.post("/v1/chat/completions", keyAlpha, body)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			var resp struct {
				Choices []struct {
					Message struct {
						Content   *string
						ToolCalls []call `json:"tool_calls"`
					}
					FinishReason string `json:"finish_reason"`
				}
			}
			if err := json.Unmarshal(r.body, &resp); err != nil {
				t.Fatal(err)
			}
			m := resp.Choices[0].Message
			var got []string
			for _, c := range m.ToolCalls {
				if !strings.HasPrefix(c.ID, "call_") || c.Type != "function" {
					t.Errorf("call %+v", c)
				}
				got = append(got, c.Function.Name+"("+c.Function.Arguments+")")
			}
			content := ""
			if m.Content != nil {
				content = *m.Content
			}
			if content != tc.content || strings.Join(got, ";") != strings.Join(tc.calls, ";") || resp.Choices[0].FinishReason != tc.finish {
				t.Errorf("content %q calls %v finish %q; want %q %v %q", content, got, resp.Choices[0].FinishReason, tc.content, tc.calls, tc.finish)
			}
			if tc.calls != nil && m.Content == nil && tc.content != "" {
				t.Error("content null")
			}
			// Streamed: the text before the first call as content, then
			// each call whole.
			body["stream"] = true
			r = h.post("/v1/chat/completions", keyAlpha, body)
			var scontent string
			var scalls []string
			finish := ""
			for _, ev := range sseEvents(t, r.body) {
				if ev == "[DONE]" {
					continue
				}
				var chunk struct {
					Choices []struct {
						Delta struct {
							Content   *string
							ToolCalls []call `json:"tool_calls"`
						}
						FinishReason *string `json:"finish_reason"`
					}
				}
				if err := json.Unmarshal([]byte(ev), &chunk); err != nil {
					t.Fatalf("%s: %v", ev, err)
				}
				for _, ch := range chunk.Choices {
					if ch.Delta.Content != nil {
						scontent += *ch.Delta.Content
					}
					for _, c := range ch.Delta.ToolCalls {
						if c.Index != len(scalls) || c.ID == "" {
							t.Errorf("streamed call %+v after %d", c, len(scalls))
						}
						scalls = append(scalls, c.Function.Name+"("+c.Function.Arguments+")")
					}
					if ch.FinishReason != nil {
						finish = *ch.FinishReason
					}
				}
			}
			if strings.TrimSpace(scontent) != tc.content || strings.Join(scalls, ";") != strings.Join(tc.calls, ";") || finish != tc.finish {
				t.Errorf("streamed content %q calls %v finish %q; want %q %v %q", scontent, scalls, finish, tc.content, tc.calls, tc.finish)
			}
		})
	}
}
