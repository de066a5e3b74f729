package gateway

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
	"pgregory.net/rapid"
)

func TestTextStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pieces []string
		stops  []string
		want   []string // released text per push, then finish
		stop   bool
	}{
		{"plain", []string{"ab", "c"}, nil, []string{"ab", "c", ""}, false},
		{"split rune", []string{"\xc3", "\xa9x"}, nil, []string{"", "éx", ""}, false},
		{"split 4-byte rune", []string{"\xf0\x9f", "\x98", "\x80"}, nil, []string{"", "", "😀", ""}, false},
		{"dangling at end", []string{"a\xe2\x82"}, nil, []string{"a", "\uFFFD"}, false},
		{"invalid byte", []string{"a\xffb"}, nil, []string{"a\uFFFDb", ""}, false},
		{"stop in one piece", []string{"abSTOPcd"}, []string{"STOP"}, []string{"ab"}, true},
		{"stop across pieces", []string{"ab S", "T", "OP x"}, []string{"STOP"}, []string{"ab ", "", ""}, true},
		{"false start released", []string{"ab S", "x"}, []string{"STOP"}, []string{"ab ", "Sx", ""}, false},
		{"held tail at end", []string{"ab ST"}, []string{"STOP"}, []string{"ab ", "ST"}, false},
		{"earliest of several", []string{"xyBAz"}, []string{"z", "BA"}, []string{"xy"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := &textStream{stops: tc.stops}
			var got []string
			stopped := false
			for _, p := range tc.pieces {
				out, s := ts.push([]byte(p))
				got = append(got, out)
				if s {
					stopped = true
					break
				}
			}
			if !stopped {
				got = append(got, ts.finish())
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") || stopped != tc.stop {
				t.Errorf("got %q stop=%v, want %q stop=%v", got, stopped, tc.want, tc.stop)
			}
		})
	}
}

// TestTextStreamProperties: however a byte string is cut into pieces, the
// released text is valid UTF-8, equals the whole text cut at the first stop
// sequence, and never shows any stop sequence.
func TestTextStreamProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		alphabet := []byte("abST\xc3\xa9\xe2\x82\xac")
		data := rapid.SliceOfN(rapid.SampledFrom(alphabet), 0, 40).Draw(t, "data")
		stops := rapid.SliceOfN(rapid.StringMatching(`[abST]{1,3}`), 0, 3).Draw(t, "stops")
		ts := &textStream{stops: stops}
		var out strings.Builder
		rest := data
		stopped := false
		for len(rest) > 0 && !stopped {
			n := rapid.IntRange(1, len(rest)).Draw(t, "cut")
			s, st := ts.push(rest[:n])
			out.WriteString(s)
			stopped = st
			rest = rest[n:]
		}
		if !stopped {
			out.WriteString(ts.finish())
		}
		whole := strings.ToValidUTF8(string(data), "\uFFFD")
		cut := len(whole)
		for _, s := range stops {
			if i := strings.Index(whole, s); i >= 0 && i < cut {
				cut = i
			}
		}
		want := whole[:cut]
		got := out.String()
		if !utf8.ValidString(got) {
			t.Fatalf("invalid UTF-8 %q", got)
		}
		// Invalid bytes at a cut can split into two U+FFFD where the whole
		// string has one; compare only when the data is valid UTF-8.
		if utf8.Valid(data) && got != want {
			t.Fatalf("got %q, want %q (stops %q)", got, want, stops)
		}
		for _, s := range stops {
			if strings.Contains(got, s) {
				t.Fatalf("output %q shows stop %q", got, s)
			}
		}
	})
}

func FuzzChatRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"system","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null}],"stop":["x","y"],"temperature":0.5,"top_p":0.9,"seed":-1}`,
		`{"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":-100,"07":3},"stop_token_ids":[3],"ignore_eos":true,"presence_penalty":-2}`,
		`{"messages":[{"role":"user","content":"x"}],"tool_choice":"none","response_format":{"type":"text"},"modalities":["text"],"n":1.0}`,
		`{"messages":[],"n":2}`, `[]`, `{"messages":[{"role":"user","content":"\ud800"}]}`, "{\"messages\":\"\xff\"}",
		`{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":20}`, `{"messages":[{"role":"user","content":"x"}],"prompt_logprobs":20}`, `{"messages":[{"role":"user","content":"x"}],"top_logprobs":1}`,
		`{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","strict":true,"schema":{"type":"object","properties":{"a":{"enum":[1,"b"]}},"required":["a"],"additionalProperties":false}}}}`,
		`{"messages":[{"role":"user","content":"x"}],"guided_json":"{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/x\"},\"$defs\":{\"x\":{\"type\":[\"string\",\"null\"]}}}"}`,
		`{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"required","parallel_tool_calls":false}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		g, msgs, _, e := parseChat(body)
		if e != nil {
			if e.Status != 400 || e.Message == "" || e.Type == "" {
				t.Fatalf("bad error %+v", e)
			}
			return
		}
		if len(msgs) == 0 || g.maxTokens < 0 || len(g.stop) > maxStops {
			t.Fatalf("accepted invalid request: %+v %+v", g, msgs)
		}
		bias := g.sampling.LogitBias
		if len(bias) > request.MaxLogitBias || len(g.stopTokens) > request.MaxStopTokens ||
			!slices.IsSortedFunc(bias, func(a, b request.TokenBias) int { return a.Token - b.Token }) {
			t.Fatalf("accepted unbounded lists: %+v", g)
		}
		for i, b := range bias {
			if b.Token < 0 || b.Bias < -request.MaxBias || b.Bias > request.MaxBias || (i > 0 && b.Token == bias[i-1].Token) {
				t.Fatalf("accepted logit bias %+v", bias)
			}
		}
		for _, m := range msgs {
			if m.Role != "system" && m.Role != "user" && m.Role != "assistant" && m.Role != "tool" {
				t.Fatalf("role %q", m.Role)
			}
			if m.Role == "tool" && m.ToolCallID == "" || m.Role != "assistant" && m.ToolCalls != nil {
				t.Fatalf("message %+v", m)
			}
		}
		// A constraint comes with the field it came from, and a tool call
		// is a ToolCall grammar.
		if (g.sampling.Grammar != nil) != (g.constraint != "") || g.toolCall && g.sampling.Grammar.Spec().Kind != grammar.ToolCall {
			t.Fatalf("constraint %v from %q, tool call %v", g.sampling.Grammar, g.constraint, g.toolCall)
		}
		checkLogprobParams(t, g)
	})
}

func FuzzCompletionRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"once","max_tokens":16,"stop":"x"}`, `{"prompt":[1,2,3]}`, `{"prompt":[[1,2]]}`, `{"prompt":["a"]}`,
		`{"prompt":["a","b"]}`, `{"prompt":[[1],[2,3]],"n":3,"echo":true}`, `{"prompt":[-1]}`, `{"prompt":"x","logprobs":1}`, `{"prompt":null}`, `7`,
		`{"prompt":"x","logprobs":20,"best_of":3,"n":2}`, `{"prompt":["a","b"],"best_of":64}`, `{"prompt":"x","logprobs":2,"echo":true}`,
		`{"prompt":"x","prompt_logprobs":3,"logprobs":1,"echo":true,"n":2}`, `{"prompt":"x","prompt_logprobs":0,"stream":true}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		g, ps, e := parseCompletion(body)
		if e != nil {
			if e.Status != 400 || e.Message == "" {
				t.Fatalf("bad error %+v", e)
			}
			return
		}
		if len(ps) == 0 || len(ps)*g.n > maxN || g.n < 1 {
			t.Fatalf("%d prompts × n = %d accepted", len(ps), g.n)
		}
		for _, p := range ps {
			for _, id := range p.ids {
				if id < 0 {
					t.Fatalf("negative id accepted")
				}
			}
		}
		if g.sampling.Temperature < 0 || g.sampling.Temperature > 2 {
			t.Fatalf("temperature %v", g.sampling.Temperature)
		}
		checkLogprobParams(t, g)
		// best_of: n = best_of candidates, keep the n asked for, never
		// streamed; echo with logprobs shows the prompt's entries.
		if g.keep < 0 || (g.keep > 0 && (g.keep >= g.n || g.stream || !g.sampling.Logprobs)) || (g.echo && g.logprobs) != g.echoLogprobs {
			t.Fatalf("accepted best_of/echo %+v", g)
		}
	})
}

// checkLogprobParams: whatever the parser accepts, the engine is asked
// for at most request.MaxTopLogprobs alternatives, at least what the
// response shows, and only when something needs them.
func checkLogprobParams(t *testing.T, g genParams) {
	t.Helper()
	s := g.sampling
	if g.topLogprobs < 0 || g.topLogprobs > request.MaxTopLogprobs || (g.topLogprobs > 0 && !g.logprobs) ||
		s.TopLogprobs < g.topLogprobs || s.TopLogprobs > request.MaxTopLogprobs || (g.logprobs && !s.Logprobs) ||
		(s.Logprobs && !g.logprobs && g.keep == 0) || s.Forced != nil {
		t.Fatalf("logprobs: shown %v/%d, asked %v/%d (keep %d, forced %v)", g.logprobs, g.topLogprobs, s.Logprobs, s.TopLogprobs, g.keep, s.Forced)
	}
	// The prompt is scored exactly when a response shows it (echo with
	// logprobs, prompt_logprobs), with at least the alternatives shown,
	// at most request.MaxTopLogprobs; prompt_logprobs never streamed.
	if s.PromptLogprobs != (g.echoLogprobs || g.promptLogprobs) || s.PromptTopLogprobs < 0 || s.PromptTopLogprobs > request.MaxTopLogprobs ||
		(s.PromptTopLogprobs > 0 && !s.PromptLogprobs) || (g.echoLogprobs && s.PromptTopLogprobs < g.topLogprobs) ||
		(g.promptLogprobs && (g.stream || s.PromptTopLogprobs < g.promptTop)) || g.promptTop < 0 || g.promptTop > request.MaxTopLogprobs {
		t.Fatalf("prompt logprobs: echo %v, prompt_logprobs %v/%d, asked %v/%d, stream %v", g.echoLogprobs, g.promptLogprobs, g.promptTop,
			s.PromptLogprobs, s.PromptTopLogprobs, g.stream)
	}
}

// FuzzCharge drives the admission arithmetic with arbitrary client and
// operator numbers: whatever it accepts fits the window and the page
// budget, and nothing it returns is negative or wrapped (a wrapped sum
// once refilled a tenant's token bucket).
func FuzzCharge(f *testing.F) {
	f.Add(2, int64(90), 2048, 16, 0)
	f.Add(2, int64(1<<63-1), 2048, 16, 4)
	f.Add(100, int64(0), 128, 16, 3)
	f.Add(5, int64(1<<30), 1<<30+6, 1, 1<<62)
	f.Fuzz(func(t *testing.T, prompt int, maxTokens int64, window, pageSize, budget int) {
		if window < 2 || pageSize < 0 || prompt < 0 || budget < 0 {
			return // the server refuses such limits at start-up
		}
		s := &Server{limits: Limits{MaxContext: window, MaxPromptTokens: window - 1, PageSize: pageSize}}
		body := []byte(`{"prompt":"x"}`)
		if maxTokens != 0 {
			body = []byte(`{"prompt":"x","max_tokens":` + strconv.FormatInt(maxTokens, 10) + `}`)
		}
		g, _, e := parseCompletion(body)
		if e != nil {
			if maxTokens >= 1 && maxTokens <= maxMaxTokens {
				t.Fatalf("max_tokens %d refused at parse: %v", maxTokens, e)
			}
			return
		}
		mt, pages, e := s.charge(prompt, "prompt", &g, budget)
		if e != nil {
			if e.Status != 400 || e.Param == "" {
				t.Fatalf("refusal without a 400 naming a field: %+v", e)
			}
			return
		}
		if prompt < 1 || mt < 1 || mt > window-prompt {
			t.Fatalf("accepted prompt %d + max_tokens %d in window %d", prompt, mt, window)
		}
		if pages < 0 || (budget > 0 && pages > budget) {
			t.Fatalf("pages %d with budget %d", pages, budget)
		}
		if pageSize > 0 && pages != request.MaxKVPages(prompt, mt, pageSize) {
			t.Fatalf("pages %d disagree with request.MaxKVPages", pages)
		}
	})
}

// FuzzChargeN is FuzzCharge for several choices and prompts: whatever
// chargeN accepts, every prompt's choices fit the window, all of them
// together fit the page budget, and the token charge is exactly the
// prompts + n × max_tokens each, never wrapped.
func FuzzChargeN(f *testing.F) {
	f.Add(2, 30, 4, 0, int64(90), 2048, 16, 0)
	f.Add(2, 1, 128, 1, int64(0), 2048, 16, 64)
	f.Add(100, 3, 2, 5, int64(1<<30), 128, 16, 3)
	f.Add(5, 5, 1, 128, int64(0), 1<<30+6, 1, 1<<62)
	f.Fuzz(func(t *testing.T, p0, p1, n, extra int, maxTokens int64, window, pageSize, budget int) {
		if window < 2 || pageSize < 0 || p0 < 0 || p1 < 0 || budget < 0 || extra < 0 || extra > maxN {
			return
		}
		s := &Server{limits: Limits{MaxContext: window, MaxPromptTokens: window - 1, PageSize: pageSize}}
		body := `{"prompt":"x","n":` + strconv.Itoa(n)
		if maxTokens != 0 {
			body += `,"max_tokens":` + strconv.FormatInt(maxTokens, 10)
		}
		g, _, e := parseCompletion([]byte(body + "}"))
		if e != nil {
			return
		}
		// Prompt lengths only: chargeN never reads the ids.
		prompts := [][]int{make([]int, min(p0, 1<<16)), make([]int, min(p1, 1<<16))}
		for range extra % 3 {
			prompts = append(prompts, make([]int, min(p0, 1<<16)))
		}
		if len(prompts)*g.n > maxN {
			return // parseCompletion refuses such batches
		}
		mt, pages, tokens, all, e := s.chargeN(prompts, "prompt", &g, budget)
		if e != nil {
			if e.Status != 400 || e.Param == "" {
				t.Fatalf("refusal without a 400 naming a field: %+v", e)
			}
			return
		}
		wantTokens, wantPages := 0, 0
		for i, p := range prompts {
			if len(p) < 1 || mt < 1 || mt > window-len(p) {
				t.Fatalf("accepted prompt %d + max_tokens %d in window %d", len(p), mt, window)
			}
			if pageSize > 0 && pages[i] != request.MaxKVPages(len(p), mt, pageSize) {
				t.Fatalf("pages %d disagree with request.MaxKVPages", pages[i])
			}
			wantTokens += len(p) + g.n*mt
			wantPages += g.n * pages[i]
		}
		if tokens != wantTokens || all != wantPages || tokens < 0 || all < 0 || (budget > 0 && all > budget) {
			t.Fatalf("tokens %d pages %d (want %d, %d) with budget %d", tokens, all, wantTokens, wantPages, budget)
		}
	})
}

// FuzzParseCalls: whatever a model writes, parsing its "auto" answer (in
// either syntax) never panics, and every call it returns names an offered
// function with arguments that are a JSON object.
func FuzzParseCalls(f *testing.F) {
	for _, s := range []string{
		"Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
		"<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {}}",
		"<tool_call>{\"name\": \"x\"}</tool_call>", "<tool_call>", "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", "plain",
		`{"name": "f", "parameters": {"a": [1]}}; {"name": "g"}`, ` {"name": "f", "arguments": {}} x`,
		`[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "x"}]`, `[{"name": "g"}] y`,
	} {
		f.Add(s)
	}
	names := []string{"f", "g"}
	f.Fuzz(func(t *testing.T, text string) {
		for _, syntax := range []string{syntaxHermes, syntaxLlama3, syntaxMistral} {
			checkCalls(t, syntax, text, names)
		}
	})
}

// checkCalls checks parseCalls's promises on one text.
func checkCalls(t *testing.T, syntax, text string, names []string) {
	t.Helper()
	content, calls, ok := parseCalls(syntax, text, names)
	if !ok {
		if content != text || calls != nil {
			t.Fatalf("%s: no calls, yet %q %v", syntax, content, calls)
		}
		return
	}
	if len(calls) == 0 || syntax == syntaxHermes && !strings.Contains(text, hermesOpen) || syntax != syntaxHermes && content != "" {
		t.Fatalf("%s: ok without a call in %q", syntax, text)
	}
	for _, c := range calls {
		var args map[string]any
		if !slices.Contains(names, c.name) || json.Unmarshal([]byte(c.args), &args) != nil {
			t.Fatalf("%s: call %+v from %q", syntax, c, text)
		}
	}
}
