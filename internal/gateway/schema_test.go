package gateway_test

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
)

// The request schema, field by field. openAIChatFields and
// openAICompletionFields are every field of OpenAI's chat completion and
// (legacy) completion requests, from the API reference and the official
// clients' request types; a field OpenAI adds belongs here, and then in the
// gateway's tables (fields.go), which TestRequestSchema checks against
// these lists and against its own rows.
var (
	openAIChatFields = []string{
		"messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
		"max_completion_tokens", "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls", "prediction",
		"presence_penalty", "prompt_cache_key", "prompt_cache_retention", "reasoning_effort", "response_format",
		"safety_identifier", "seed", "service_tier", "stop", "store", "stream", "stream_options", "temperature",
		"tool_choice", "tools", "top_logprobs", "top_p", "user", "verbosity", "web_search_options",
	}
	openAICompletionFields = []string{
		"model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
		"presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature", "top_p", "user",
	}
)

// fieldCase is one known field of one endpoint.
type fieldCase struct {
	field string
	use   string // "honoured", "accepted" or "refused"
	// value is sent as the field: for a honoured field one whose effect
	// check sees; for an accepted one any valid value; for a refused one a
	// value that is refused.
	value any
	// extra fields sent along (stream_options needs stream).
	extra map[string]any
	// check shows a honoured field's effect: in the params that reached
	// the backend, compared with those of the same request without the
	// field (base), or in the response.
	check func(t *testing.T, base, p request.Params, r response)
	// defaults are values of a refused field that are accepted (null
	// always is): they ask for what the server does anyway.
	defaults []any
	// submits is how many requests a 200 submits (n); 0 means 1.
	submits int
}

// b is the fake's token id of byte c.
func b(c byte) int { return 3 + int(c) }

// moves checks that the field changed exactly what edit changes in the
// base params.
func moves(edit func(*request.Params)) func(*testing.T, request.Params, request.Params, response) {
	return func(t *testing.T, base, p request.Params, _ response) {
		t.Helper()
		want := base
		want.Owner = p.Owner
		edit(&want)
		if diff := cmp.Diff(want, p); diff != "" {
			t.Errorf("params (-want +got):\n%s", diff)
		}
	}
}

// constrains checks that the field set an output constraint of kind and
// schema (compact JSON) and changed nothing else.
func constrains(kind grammar.Kind, schema string) func(*testing.T, request.Params, request.Params, response) {
	return func(t *testing.T, base, p request.Params, r response) {
		t.Helper()
		g := p.Sampling.Grammar
		if g == nil {
			t.Fatal("no constraint reached the backend")
		}
		if sp := g.Spec(); sp.Kind != kind || string(sp.Schema) != schema {
			t.Errorf("constraint %d %s; want %d %s", sp.Kind, sp.Schema, kind, schema)
		}
		p.Sampling.Grammar = nil
		moves(func(*request.Params) {})(t, base, p, r)
	}
}

// promptLPEntry is an entry of vLLM's prompt_logprobs.
type promptLPEntry struct {
	Logprob      float32 `json:"logprob"`
	Rank         *int    `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

func movesSampling(edit func(*request.Sampling)) func(*testing.T, request.Params, request.Params, response) {
	return moves(func(p *request.Params) { edit(&p.Sampling) })
}

// replyText is the text and finish reason of a non-streamed chat or
// completion response.
func replyText(t *testing.T, r response) (text, finish string) {
	t.Helper()
	var body struct {
		Choices []struct {
			Text    *string `json:"text"`
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil || len(body.Choices) != 1 {
		t.Fatalf("response %s: %v", r.body, err)
	}
	c := body.Choices[0]
	if c.Text != nil {
		return *c.Text, c.FinishReason
	}
	return c.Message.Content, c.FinishReason
}

func replies(text, finish string) func(*testing.T, request.Params, request.Params, response) {
	return func(t *testing.T, _, _ request.Params, r response) {
		t.Helper()
		if gt, gf := replyText(t, r); gt != text || gf != finish {
			t.Errorf("reply %q finish %q; want %q %q", gt, gf, text, finish)
		}
	}
}

func both(a, b func(*testing.T, request.Params, request.Params, response)) func(*testing.T, request.Params, request.Params, response) {
	return func(t *testing.T, base, p request.Params, r response) {
		t.Helper()
		a(t, base, p, r)
		b(t, base, p, r)
	}
}

// promptText is the fake's text of the prompt the backend got.
func promptText(t *testing.T, p request.Params) string {
	t.Helper()
	s, err := gatewaytest.NewFake().Detokenize(p.Prompt)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type completionLP struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// chatLogprobCount checks a chat answer's logprobs: n entries of k
// alternatives, each entry's token the bytes it names.
func chatLogprobCount(n, k int) func(*testing.T, request.Params, request.Params, response) {
	return func(t *testing.T, _, _ request.Params, r response) {
		t.Helper()
		var body struct {
			Choices []struct {
				Logprobs struct {
					Content []struct {
						Token       string  `json:"token"`
						Logprob     float32 `json:"logprob"`
						Bytes       []byte  `json:"-"`
						RawBytes    []int   `json:"bytes"`
						TopLogprobs []struct {
							Token   string  `json:"token"`
							Logprob float32 `json:"logprob"`
						} `json:"top_logprobs"`
					} `json:"content"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(r.body, &body); err != nil || len(body.Choices) != 1 {
			t.Fatalf("%s: %v", r.body, err)
		}
		var text []byte
		content := body.Choices[0].Logprobs.Content
		for _, e := range content {
			if len(e.TopLogprobs) != k || e.Logprob > 0 {
				t.Errorf("entry %+v: want %d alternatives", e, k)
			}
			for _, c := range e.RawBytes {
				text = append(text, byte(c))
			}
		}
		if len(content) != n || string(text) != gatewaytest.DefaultReply {
			t.Errorf("%d entries of text %q, want %d of %q", len(content), text, n, gatewaytest.DefaultReply)
		}
	}
}

func refusedField(name string, value any, defaults ...any) fieldCase {
	return fieldCase{field: name, use: "refused", value: value, defaults: defaults}
}

func acceptedField(name string, value any) fieldCase {
	return fieldCase{field: name, use: "accepted", value: value}
}

// sharedCases hold for both endpoints. The fake's reply is
// gatewaytest.DefaultReply, "Hello from pagewarden.", then EOS.
var sharedCases = []fieldCase{
	{field: "model", use: "honoured", value: "fake-model", check: func(t *testing.T, _, _ request.Params, r response) {
		if m, _ := decodeBody(t, r.body)["model"].(string); m != "fake-model" {
			t.Errorf("model %q", m)
		}
	}},
	{field: "max_tokens", use: "honoured", value: 7, check: both(moves(func(p *request.Params) { p.MaxTokens = 7 }), replies("Hello f", "length"))},
	{field: "max_completion_tokens", use: "honoured", value: 5, check: both(moves(func(p *request.Params) { p.MaxTokens = 5 }), replies("Hello", "length"))},
	{field: "temperature", use: "honoured", value: 0.5, check: movesSampling(func(s *request.Sampling) { s.Temperature = 0.5 })},
	{field: "top_p", use: "honoured", value: 0.5, check: movesSampling(func(s *request.Sampling) { s.TopP = 0.5 })},
	{field: "top_k", use: "honoured", value: 7, check: movesSampling(func(s *request.Sampling) { s.TopK = 7 })},
	{field: "min_p", use: "honoured", value: 0.25, check: movesSampling(func(s *request.Sampling) { s.MinP = 0.25 })},
	{field: "repetition_penalty", use: "honoured", value: 1.25, check: movesSampling(func(s *request.Sampling) { s.RepetitionPenalty = 1.25 })},
	{field: "presence_penalty", use: "honoured", value: 0.5, check: movesSampling(func(s *request.Sampling) { s.PresencePenalty = 0.5 })},
	{field: "frequency_penalty", use: "honoured", value: -1.5, check: movesSampling(func(s *request.Sampling) { s.FrequencyPenalty = -1.5 })},
	{field: "logit_bias", use: "honoured", value: map[string]any{"104": -100, "3": 2.5, "1": 0}, check: movesSampling(func(s *request.Sampling) {
		s.LogitBias = []request.TokenBias{{Token: 1, Bias: 0}, {Token: 3, Bias: 2.5}, {Token: 104, Bias: -100}}
	})},
	{field: "seed", use: "honoured", value: 42, check: movesSampling(func(s *request.Sampling) { s.Seed = 42 })},
	{field: "stop", use: "honoured", value: []string{" from"}, check: both(moves(func(*request.Params) {}), replies("Hello", "stop"))},
	{field: "stream", use: "honoured", value: true, check: func(t *testing.T, _, _ request.Params, r response) {
		if s := summarize(t, r.body); !s.done || s.text != gatewaytest.DefaultReply || s.usage != nil {
			t.Errorf("stream %+v", s)
		}
	}},
	{field: "stream_options", use: "honoured", value: map[string]any{"include_usage": true}, extra: map[string]any{"stream": true},
		check: func(t *testing.T, _, _ request.Params, r response) {
			if s := summarize(t, r.body); !s.done || s.usage == nil {
				t.Errorf("stream without usage: %+v", s)
			}
		}},
	// The fake draws EOS past its reply up to max_tokens; EOS is never shown.
	{field: "ignore_eos", use: "honoured", value: true, extra: map[string]any{"max_tokens": 30},
		check: both(moves(func(p *request.Params) { p.IgnoreEOS, p.MaxTokens = true, 30 }), replies(gatewaytest.DefaultReply, "length"))},
	// The stop token ends the reply and, as in vLLM, is not shown.
	{field: "stop_token_ids", use: "honoured", value: []int{b('f'), b('!')},
		check: both(moves(func(p *request.Params) { p.StopTokens = []int{b('f'), b('!')} }), replies("Hello ", "stop"))},
	{field: "cache_salt", use: "honoured", value: "s1", check: func(t *testing.T, base, p request.Params, r response) {
		if !strings.HasSuffix(p.CacheSalt, "|s1") || strings.TrimSuffix(p.CacheSalt, "s1") != base.CacheSalt {
			t.Errorf("cache salt %q, without the field %q", p.CacheSalt, base.CacheSalt)
		}
	}},
	acceptedField("user", "user-1"),
	// Two choices: two submits, the second (the last submitted: the
	// siblings wait for child 0's first token) with seed + 1.
	{field: "n", use: "honoured", value: 2, submits: 2,
		check: both(movesSampling(func(s *request.Sampling) { s.Seed++ }), func(t *testing.T, _, _ request.Params, r response) {
			var body struct {
				Choices []struct {
					Index int `json:"index"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(r.body, &body); err != nil || len(body.Choices) != 2 || body.Choices[0].Index != 0 || body.Choices[1].Index != 1 {
				t.Errorf("want choices 0 and 1: %s (%v)", r.body, err)
			}
		})},
	{field: "guided_json", use: "honoured", value: map[string]any{"type": "object", "properties": map[string]any{"a": map[string]any{"type": "integer"}}},
		check: constrains(grammar.JSONSchema, `{"properties":{"a":{"type":"integer"}},"type":"object"}`)},
	refusedField("guided_regex", "a+"),
	refusedField("guided_choice", []string{"a", "b"}),
	refusedField("guided_grammar", "root ::= \"a\""),
	refusedField("guided_decoding_backend", "xgrammar"),
	refusedField("guided_whitespace_pattern", " "),
	refusedField("structured_outputs", map[string]any{"regex": "a"}),
	refusedField("grammar", "root ::= \"a\""),
	refusedField("json_schema", map[string]any{"type": "object"}),
	refusedField("min_tokens", 3, 0),
	refusedField("use_beam_search", true, false),
	refusedField("length_penalty", 0.5, 1),
	refusedField("allowed_token_ids", []int{5}),
	refusedField("bad_words", []string{"x"}, []string{}),
	refusedField("include_stop_str_in_output", true, false),
	// vLLM's shape: null, then per prompt token its entry and the
	// alternatives, keyed by id (the fake's prompt logprob is its
	// Logprob of the token).
	{field: "prompt_logprobs", use: "honoured", value: 1,
		check: both(movesSampling(func(s *request.Sampling) { s.PromptLogprobs, s.PromptTopLogprobs = true, 1 }),
			func(t *testing.T, _, p request.Params, r response) {
				var body struct {
					PromptLogprobs []map[string]promptLPEntry `json:"prompt_logprobs"`
					Choices        []struct {
						PromptLogprobs []map[string]promptLPEntry `json:"prompt_logprobs"`
					} `json:"choices"`
				}
				if err := json.Unmarshal(r.body, &body); err != nil || len(body.Choices) != 1 {
					t.Fatalf("%s: %v", r.body, err)
				}
				got := body.PromptLogprobs // chat: the response's
				if got == nil {
					got = body.Choices[0].PromptLogprobs // completions: the choice's
				}
				if len(got) != len(p.Prompt) || got[0] != nil {
					t.Fatalf("prompt_logprobs %v for %d prompt tokens", got, len(p.Prompt))
				}
				for q := 1; q < len(p.Prompt); q++ {
					e, ok := got[q][strconv.Itoa(p.Prompt[q])]
					// The fake's first alternative is the token itself.
					if !ok || len(got[q]) != 1 || e.Logprob != gatewaytest.Logprob(p.Prompt[q]).Logprob || e.Rank == nil || *e.Rank != 1 {
						t.Errorf("prompt token %d (%d): %+v", q, p.Prompt[q], got[q])
					}
				}
			})},
	refusedField("truncate_prompt_tokens", 4),
}

var chatCases = []fieldCase{
	{field: "messages", use: "honoured", value: []any{map[string]any{"role": "user", "content": "Tell"}}, check: func(t *testing.T, base, p request.Params, _ response) {
		if got := promptText(t, p); !strings.Contains(got, "user\nTell") || strings.Contains(promptText(t, base), "Tell") {
			t.Errorf("prompt %q", got)
		}
	}},
	{field: "add_generation_prompt", use: "honoured", value: false, check: func(t *testing.T, base, p request.Params, _ response) {
		const gen = "<|im_start|>assistant\n"
		if got := promptText(t, p); strings.HasSuffix(got, gen) || !strings.HasSuffix(promptText(t, base), gen) {
			t.Errorf("prompt %q", got)
		}
	}},
	acceptedField("metadata", map[string]any{"team": "search"}),
	acceptedField("prompt_cache_key", "key-1"),
	acceptedField("prompt_cache_retention", "24h"),
	acceptedField("safety_identifier", "hashed-user"),
	refusedField("store", true, false),
	// Every shown token's entry: the reply's 22 bytes (EOS is not shown).
	{field: "logprobs", use: "honoured", value: true,
		check: both(movesSampling(func(s *request.Sampling) { s.Logprobs = true }), chatLogprobCount(22, 0))},
	{field: "top_logprobs", use: "honoured", value: 2, extra: map[string]any{"logprobs": true},
		check: both(movesSampling(func(s *request.Sampling) { s.Logprobs, s.TopLogprobs = true, 2 }), chatLogprobCount(22, 2))},
	{field: "tools", use: "honoured", value: []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}},
		extra: map[string]any{"tool_choice": "required"}, check: constrains(grammar.ToolCall, `[{"name":"f"}]`)},
	{field: "tool_choice", use: "honoured", value: map[string]any{"type": "function", "function": map[string]any{"name": "g"}},
		extra: map[string]any{"tools": []any{
			map[string]any{"type": "function", "function": map[string]any{"name": "f"}},
			map[string]any{"type": "function", "function": map[string]any{"name": "g", "parameters": map[string]any{"type": "object"}}},
		}},
		check: constrains(grammar.ToolCall, `[{"name":"g","parameters":{"type":"object"}}]`)},
	// Its effect (an "auto" answer's calls cut to the first) needs a
	// template with a call syntax: TestToolAuto shows it; here, that a
	// constrained call is the same one call.
	{field: "parallel_tool_calls", use: "honoured", value: false,
		extra: map[string]any{"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}, "tool_choice": "required"},
		check: constrains(grammar.ToolCall, `[{"name":"f"}]`)},
	refusedField("functions", []any{map[string]any{"name": "f"}}, []any{}),
	refusedField("function_call", "auto", "none"),
	{field: "response_format", use: "honoured", value: map[string]any{"type": "json_schema", "json_schema": map[string]any{
		"name": "n", "strict": true, "schema": map[string]any{"type": "object", "properties": map[string]any{"b": map[string]any{"type": "boolean"}},
			"required": []string{"b"}, "additionalProperties": false}}},
		check: constrains(grammar.JSONSchema, `{"additionalProperties":false,"properties":{"b":{"type":"boolean"}},"required":["b"],"type":"object"}`)},
	refusedField("modalities", []string{"text", "audio"}, []string{"text"}),
	refusedField("audio", map[string]any{"voice": "alloy", "format": "wav"}),
	refusedField("prediction", map[string]any{"type": "content", "content": "Hello"}),
	refusedField("reasoning_effort", "low"),
	refusedField("verbosity", "low"),
	refusedField("web_search_options", map[string]any{}),
	refusedField("service_tier", "flex", "auto", "default"),
	refusedField("echo", true, false),
	refusedField("continue_final_message", true, false),
	refusedField("chat_template", "{{ messages }}"),
	refusedField("chat_template_kwargs", map[string]any{"enable_thinking": true}),
	refusedField("documents", []any{map[string]any{"title": "a", "text": "b"}}),
}

var completionCases = []fieldCase{
	{field: "prompt", use: "honoured", value: "Tell", check: func(t *testing.T, _, p request.Params, _ response) {
		if want := []int{gatewaytest.BOS, b('T'), b('e'), b('l'), b('l')}; !slices.Equal(p.Prompt, want) {
			t.Errorf("prompt %v, want %v", p.Prompt, want)
		}
	}},
	{field: "logprobs", use: "honoured", value: 3, check: both(movesSampling(func(s *request.Sampling) { s.Logprobs, s.TopLogprobs = true, 3 }),
		func(t *testing.T, _, _ request.Params, r response) {
			var body struct {
				Choices []struct {
					Logprobs completionLP `json:"logprobs"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(r.body, &body); err != nil || len(body.Choices) != 1 {
				t.Fatalf("%s: %v", r.body, err)
			}
			lp := body.Choices[0].Logprobs
			if strings.Join(lp.Tokens, "") != gatewaytest.DefaultReply || len(lp.TokenLogprobs) != 22 || len(lp.TopLogprobs) != 22 || len(lp.TextOffset) != 22 {
				t.Errorf("logprobs %+v", lp)
			}
			for i, top := range lp.TopLogprobs {
				// The fake's alternatives are distinct bytes: 3 and the
				// sampled one (its own first alternative).
				if len(top) != 3 || top[lp.Tokens[i]] != lp.TokenLogprobs[i] || lp.TextOffset[i] != i {
					t.Errorf("entry %d: top %v, logprob %v, offset %d", i, top, lp.TokenLogprobs[i], lp.TextOffset[i])
				}
			}
		})},
	refusedField("top_logprobs", 2),
	// The prompt's text before the answer's, and nothing else changed.
	{field: "echo", use: "honoured", value: true,
		check: both(moves(func(*request.Params) {}), replies("Hi"+gatewaytest.DefaultReply, "stop"))},
	// Two candidates (seed, seed + 1), one choice: the more likely.
	{field: "best_of", use: "honoured", value: 2, submits: 2, check: both(movesSampling(func(s *request.Sampling) { s.Seed++; s.Logprobs = true }),
		replies(gatewaytest.DefaultReply, "stop"))},
	// The prompt wrapped in the fill-in-the-middle markers, the suffix
	// after it.
	{field: "suffix", use: "honoured", value: "end", check: func(t *testing.T, _, p request.Params, _ response) {
		want := []int{gatewaytest.BOS, 200, b('H'), b('i'), 201, b('e'), b('n'), b('d'), 202}
		if !slices.Equal(p.Prompt, want) {
			t.Errorf("prompt %v, want %v", p.Prompt, want)
		}
	}},
}

// TestRequestSchema goes through every known field of both endpoints: the
// gateway's table names every OpenAI field and exactly the rows here; a
// honoured field shows its effect (the params that reached the backend
// differ from the same request's without it in exactly that knob, or the
// response does); an accepted one changes nothing; a refused one is a
// 400 unsupported_parameter naming it, before anything is submitted,
// while null and its defaults are accepted and change nothing; an unknown
// field is accepted and changes nothing.
func TestRequestSchema(t *testing.T) {
	for _, ep := range []struct {
		name, path string
		openAI     []string
		cases      []fieldCase
		base       func() map[string]any
	}{
		{"chat", "/v1/chat/completions", openAIChatFields, slices.Concat(sharedCases, chatCases),
			func() map[string]any { return chatBody(map[string]any{"seed": 1}) }},
		{"completions", "/v1/completions", openAICompletionFields, slices.Concat(sharedCases, completionCases),
			func() map[string]any { return map[string]any{"model": "fake-model", "prompt": "Hi", "seed": 1} }},
	} {
		t.Run(ep.name, func(t *testing.T) {
			known := gateway.KnownFields(ep.name)
			rows := map[string]string{}
			for _, c := range ep.cases {
				if _, dup := rows[c.field]; dup {
					t.Errorf("two rows for %q", c.field)
				}
				rows[c.field] = c.use
			}
			if diff := cmp.Diff(known, rows); diff != "" {
				t.Errorf("the gateway's table (-) and this test's rows (+) differ:\n%s", diff)
			}
			for _, f := range ep.openAI {
				if _, ok := known[f]; !ok {
					t.Errorf("OpenAI's field %q is not in the gateway's table", f)
				}
			}

			// The fake's model has fill-in-the-middle tokens, so that
			// suffix can show its effect (without them it is refused:
			// TestSuffix).
			fake := gatewaytest.NewFake()
			fake.FIMTokens = []int{200, 201, 202}
			h := newHarness(t, fake)
			post := func(t *testing.T, body map[string]any, submits ...int) (response, request.Params) {
				t.Helper()
				before := h.fake.Submits()
				r := h.post(ep.path, keyAlpha, body)
				if r.status != 200 {
					return r, request.Params{}
				}
				want := 1
				if len(submits) > 0 && submits[0] > 0 {
					want = submits[0]
				}
				if h.fake.Submits() != before+want {
					t.Fatalf("answered 200 with %d submits, want %d", h.fake.Submits()-before, want)
				}
				return r, h.fake.LastParams()
			}
			r, base := post(t, ep.base())
			if r.status != 200 {
				t.Fatalf("base request: %d %s", r.status, r.body)
			}
			unchanged := func(t *testing.T, p request.Params) {
				t.Helper()
				p.Owner = base.Owner
				if diff := cmp.Diff(base, p); diff != "" {
					t.Errorf("params changed (-without the field +with it):\n%s", diff)
				}
			}
			for _, c := range ep.cases {
				t.Run(c.field, func(t *testing.T) {
					body := ep.base()
					maps.Copy(body, c.extra)
					body[c.field] = c.value
					before := h.fake.Submits()
					r, p := post(t, body, c.submits)
					switch c.use {
					case "honoured":
						if r.status != 200 {
							t.Fatalf("status %d: %s", r.status, r.body)
						}
						c.check(t, base, p, r)
					case "accepted":
						if r.status != 200 {
							t.Fatalf("status %d: %s", r.status, r.body)
						}
						unchanged(t, p)
					case "refused":
						if r.status != 400 || errorCode(t, r.body) != "unsupported_parameter" || errorParam(t, r.body) != c.field {
							t.Errorf("%v: status %d %s; want 400 unsupported_parameter naming it", c.value, r.status, r.body)
						}
						if h.fake.Submits() != before {
							t.Errorf("a refused request was submitted")
						}
						for _, v := range append([]any{nil}, c.defaults...) {
							body[c.field] = v
							r, p := post(t, body)
							if r.status != 200 {
								t.Errorf("%s: %v refused: %d %s", c.field, v, r.status, r.body)
								continue
							}
							unchanged(t, p)
						}
					default:
						t.Fatalf("use %q", c.use)
					}
				})
			}
			t.Run("unknown field", func(t *testing.T) {
				body := ep.base()
				body["frobnicate"] = map[string]any{"temperature": 2}
				r, p := post(t, body)
				if r.status != 200 {
					t.Fatalf("status %d: %s", r.status, r.body)
				}
				unchanged(t, p)
			})
		})
	}
}

// TestKnobBounds: the honoured knobs' values outside OpenAI's (or vLLM's)
// ranges are a 400 naming the field, before anything is submitted.
func TestKnobBounds(t *testing.T) {
	h := newHarness(t, nil)
	many := map[string]any{}
	for i := range request.MaxLogitBias + 1 {
		many[strconv.Itoa(i)] = 1
	}
	manyIDs := make([]int, request.MaxStopTokens+1)
	for i := range manyIDs {
		manyIDs[i] = b('a')
	}
	for _, tc := range []struct {
		name  string
		field string
		value any
	}{
		{"presence above 2", "presence_penalty", 2.5},
		{"frequency below -2", "frequency_penalty", -2.01},
		{"bias not an object", "logit_bias", []int{1}},
		{"bias key not an id", "logit_bias", map[string]any{"a": 1}},
		{"bias key negative", "logit_bias", map[string]any{"-3": 1}},
		{"bias key signed", "logit_bias", map[string]any{"+3": 1}},
		{"bias key beyond int32", "logit_bias", map[string]any{"4294967299": 1}},
		{"bias key out of vocabulary", "logit_bias", map[string]any{"5000": 1}},
		{"bias key twice", "logit_bias", map[string]any{"7": 1, "007": 2}},
		{"bias above 100", "logit_bias", map[string]any{"7": 100.5}},
		{"bias below -100", "logit_bias", map[string]any{"7": -101}},
		{"bias null", "logit_bias", map[string]any{"7": nil}},
		{"bias a string", "logit_bias", map[string]any{"7": "1"}},
		{"too many biases", "logit_bias", many},
		{"stop id negative", "stop_token_ids", []int{-1}},
		{"stop id out of vocabulary", "stop_token_ids", []int{b('a'), gatewaytest.VocabSize}},
		{"too many stop ids", "stop_token_ids", manyIDs},
		{"stop ids not ints", "stop_token_ids", []any{1.5}},
		{"ignore_eos not a boolean", "ignore_eos", "yes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := h.fake.Submits()
			for _, path := range []string{"/v1/chat/completions", "/v1/completions"} {
				body := chatBody(map[string]any{tc.field: tc.value, "prompt": "x"})
				r := h.post(path, keyAlpha, body)
				if r.status != 400 || errorParam(t, r.body) != tc.field {
					t.Errorf("%s: status %d %s; want 400 naming %s", path, r.status, r.body, tc.field)
				}
			}
			if h.fake.Submits() != before {
				t.Error("a refused request was submitted")
			}
		})
	}
	// The edges are in range.
	for _, v := range []map[string]any{
		{"presence_penalty": -2, "frequency_penalty": 2, "logit_bias": map[string]any{"3": -100, "258": 100}},
		{"logit_bias": map[string]any{}, "stop_token_ids": []int{}, "ignore_eos": false},
		{"stop_token_ids": manyIDs[1:]},
	} {
		if r := h.post("/v1/chat/completions", keyAlpha, chatBody(v)); r.status != 200 {
			t.Errorf("%v: status %d %s", v, r.status, r.body)
		}
	}
}
