package gateway_test

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// lpEntry is a chat logprobs entry as a client decodes it.
type lpEntry struct {
	Token       string    `json:"token"`
	Logprob     float32   `json:"logprob"`
	Bytes       []int     `json:"bytes"`
	TopLogprobs []lpEntry `json:"top_logprobs"`
}

func entryBytes(es []lpEntry) string {
	var b []byte
	for _, e := range es {
		for _, c := range e.Bytes {
			b = append(b, byte(c))
		}
	}
	return string(b)
}

// TestLogprobsStreamed: streamed, every chunk carries the entries of the
// tokens whose text it is the first to carry; the chunks' entries
// concatenate to the whole answer's, with the values the engine gave
// (the fake's Logprob), in both endpoints' shapes, across n > 1 choices
// and with a stop sequence holding text back.
func TestLogprobsStreamed(t *testing.T) {
	h := newHarness(t, nil)
	for _, tc := range []struct {
		name string
		body map[string]any
		want string // each choice's text
	}{
		{"chat", chatBody(map[string]any{"stream": true, "logprobs": true, "top_logprobs": 3}), gatewaytest.DefaultReply},
		{"chat n=2", chatBody(map[string]any{"stream": true, "logprobs": true, "top_logprobs": 1, "n": 2}), gatewaytest.DefaultReply},
		{"chat stop", chatBody(map[string]any{"stream": true, "logprobs": true, "stop": "page"}), "Hello from "},
		{"completion", map[string]any{"prompt": "Hi", "stream": true, "logprobs": 2}, gatewaytest.DefaultReply},
		{"completion n=3", map[string]any{"prompt": "Hi", "stream": true, "logprobs": 0, "n": 3}, gatewaytest.DefaultReply},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := "/v1/chat/completions"
			if _, ok := tc.body["prompt"]; ok {
				path = "/v1/completions"
			}
			r := h.post(path, keyAlpha, tc.body)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			chat := map[int][]lpEntry{}
			type legacy struct {
				tokens  []string
				lps     []float32
				offsets []int
				top     []map[string]float32
			}
			comp := map[int]*legacy{}
			text := map[int]string{}
			for _, e := range sseEvents(t, r.body) {
				if e == "[DONE]" {
					continue
				}
				var ch struct {
					Choices []struct {
						Index int     `json:"index"`
						Text  *string `json:"text"`
						Delta struct {
							Content *string `json:"content"`
						} `json:"delta"`
						Logprobs *struct {
							Content       []lpEntry            `json:"content"`
							Tokens        []string             `json:"tokens"`
							TokenLogprobs []float32            `json:"token_logprobs"`
							TopLogprobs   []map[string]float32 `json:"top_logprobs"`
							TextOffset    []int                `json:"text_offset"`
						} `json:"logprobs"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(e), &ch); err != nil {
					t.Fatal(err)
				}
				for _, c := range ch.Choices {
					if c.Text != nil {
						text[c.Index] += *c.Text
					}
					if c.Delta.Content != nil {
						text[c.Index] += *c.Delta.Content
					}
					if c.Logprobs == nil {
						continue
					}
					chat[c.Index] = append(chat[c.Index], c.Logprobs.Content...)
					if comp[c.Index] == nil {
						comp[c.Index] = &legacy{}
					}
					l := comp[c.Index]
					l.tokens = append(l.tokens, c.Logprobs.Tokens...)
					l.lps = append(l.lps, c.Logprobs.TokenLogprobs...)
					l.offsets = append(l.offsets, c.Logprobs.TextOffset...)
					l.top = append(l.top, c.Logprobs.TopLogprobs...)
				}
			}
			n := 1
			if v, ok := tc.body["n"].(int); ok {
				n = v
			}
			for i := range n {
				if text[i] != tc.want {
					t.Errorf("choice %d: text %q, want %q", i, text[i], tc.want)
				}
				if path == "/v1/chat/completions" {
					es := chat[i]
					got := entryBytes(es)
					// The stop sequence's tokens have their entries;
					// the text is cut before it.
					stop, _ := tc.body["stop"].(string)
					if got != tc.want+stop {
						t.Errorf("choice %d: entries spell %q, text %q", i, got, tc.want)
					}
					k, _ := tc.body["top_logprobs"].(int)
					for j, e := range es {
						if want := gatewaytest.Logprob(3 + int(e.Bytes[0])).Logprob; e.Logprob != want || len(e.TopLogprobs) != k {
							t.Errorf("choice %d entry %d: %+v, want logprob %v and %d alternatives", i, j, e, want, k)
						}
					}
					continue
				}
				l := comp[i]
				if l == nil || strings.Join(l.tokens, "") != tc.want || len(l.lps) != len(l.tokens) || len(l.top) != len(l.tokens) {
					t.Fatalf("choice %d: legacy logprobs %+v", i, l)
				}
				k := tc.body["logprobs"].(int)
				for j := range l.tokens {
					// The sampled token and k alternatives (the fake's
					// first alternative is the sampled token itself).
					if _, ok := l.top[j][l.tokens[j]]; l.offsets[j] != j || !ok || len(l.top[j]) != max(k, 1) {
						t.Errorf("choice %d token %d: offset %d, top %v", i, j, l.offsets[j], l.top[j])
					}
				}
			}
		})
	}
}

// TestLogprobsToolCall: a constrained tool call with logprobs is still a
// tool call, and its tokens have their entries.
func TestLogprobsToolCall(t *testing.T) {
	reply := `{"name": "f", "arguments": {}}`
	h := newHarness(t, &gatewaytest.Fake{Model: "fake-model", Window: 4096, PageSize: 16, Pages: 1 << 16,
		Behave: func(request.Params) gatewaytest.Behavior { return gatewaytest.Behavior{Reply: reply} }})
	for _, stream := range []bool{false, true} {
		r := h.post("/v1/chat/completions", keyAlpha, chatBody(map[string]any{"logprobs": true, "stream": stream, "tool_choice": "required",
			"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}}))
		if r.status != http.StatusOK {
			t.Fatalf("stream %v: status %d: %s", stream, r.status, r.body)
		}
		if !strings.Contains(string(r.body), `"tool_calls"`) {
			t.Errorf("stream %v: no tool call: %s", stream, r.body)
		}
		var es []lpEntry
		if !stream {
			var body struct {
				Choices []struct {
					Logprobs struct {
						Content []lpEntry `json:"content"`
					} `json:"logprobs"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(r.body, &body); err != nil {
				t.Fatal(err)
			}
			es = body.Choices[0].Logprobs.Content
		} else {
			for _, e := range sseEvents(t, r.body) {
				var ch struct {
					Choices []struct {
						Logprobs *struct {
							Content []lpEntry `json:"content"`
						} `json:"logprobs"`
					} `json:"choices"`
				}
				if e != "[DONE]" && json.Unmarshal([]byte(e), &ch) == nil && len(ch.Choices) > 0 && ch.Choices[0].Logprobs != nil {
					es = append(es, ch.Choices[0].Logprobs.Content...)
				}
			}
		}
		if got := entryBytes(es); got != reply {
			t.Errorf("stream %v: entries spell %q, want %q", stream, got, reply)
		}
	}
}

// TestLogprobsBadStream: a backend that sends a NaN logprob, more
// alternatives than asked, or logprobs nobody asked for breaks the
// stream contract: 500, counted, nothing of it written.
func TestLogprobsBadStream(t *testing.T) {
	for _, tc := range []struct {
		fault gatewaytest.Fault
		body  map[string]any
	}{
		{gatewaytest.FaultLogprobNaN, chatBody(map[string]any{"logprobs": true})},
		{gatewaytest.FaultExtraLogprobs, chatBody(map[string]any{"logprobs": true, "top_logprobs": 2})},
		{gatewaytest.FaultExtraLogprobs, map[string]any{"prompt": "Hi", "logprobs": 20}},
		// A prompt logprob short, echoed or vLLM's: never shown.
		{gatewaytest.FaultShortPromptLogprobs, map[string]any{"prompt": "Hi", "logprobs": 1, "echo": true}},
		{gatewaytest.FaultShortPromptLogprobs, chatBody(map[string]any{"prompt_logprobs": 1})},
	} {
		h := newHarness(t, &gatewaytest.Fake{Model: "fake-model", Window: 4096, PageSize: 16, Pages: 1 << 16,
			Behave: func(request.Params) gatewaytest.Behavior { return gatewaytest.Behavior{Fault: tc.fault, At: 3} }})
		path := "/v1/chat/completions"
		if _, ok := tc.body["prompt"]; ok {
			path = "/v1/completions"
		}
		r := h.post(path, keyAlpha, tc.body)
		if r.status != http.StatusInternalServerError || strings.Contains(string(r.body), "logprob\":") {
			t.Errorf("fault %d: status %d %s", tc.fault, r.status, r.body)
		}
		if v := metricValue(t, h, "pagewarden_gateway_stream_contract_violations_total"); v != "1" {
			t.Errorf("fault %d: stream contract violations %s, want 1", tc.fault, v)
		}
	}
}

// TestBestOf: best_of candidates are generated (seed, seed + 1, ...), the
// n of highest cumulative log-probability come back in order, numbered
// as n choices, and usage counts every candidate's tokens.
func TestBestOf(t *testing.T) {
	replies := []string{"A long and winding answer.", "Short.", "Mid-length one.", "Tiny"}
	// Their cumulative logprobs (the fake's, EOS included): Tiny -2.125,
	// Short. -4.375, Mid-length one. -8, the long one -13.875.
	cum := func(r string) (sum float32) {
		for i := range len(r) {
			sum += gatewaytest.Logprob(3 + int(r[i])).Logprob
		}
		return sum + gatewaytest.Logprob(gatewaytest.EOS).Logprob
	}
	if !(cum(replies[3]) > cum(replies[1]) && cum(replies[1]) > cum(replies[2]) && cum(replies[2]) > cum(replies[0])) {
		t.Fatalf("the fake's cumulative logprobs %v %v %v %v are not in the order the cases expect", cum(replies[0]), cum(replies[1]), cum(replies[2]), cum(replies[3]))
	}
	h := newHarness(t, &gatewaytest.Fake{Model: "fake-model", Window: 4096, PageSize: 16, Pages: 1 << 16,
		Behave: func(p request.Params) gatewaytest.Behavior {
			return gatewaytest.Behavior{Reply: replies[(p.Sampling.Seed-100)%uint64(len(replies))]}
		}})
	for _, tc := range []struct {
		n, bestOf int
		logprobs  bool
		want      []string
	}{
		{1, 4, false, []string{"Tiny"}},
		{2, 4, true, []string{"Tiny", "Short."}},
		{2, 3, false, []string{"Short.", "Mid-length one."}},
		{4, 4, false, replies},
	} {
		t.Run(fmt.Sprintf("n=%d,best_of=%d", tc.n, tc.bestOf), func(t *testing.T) {
			body := map[string]any{"prompt": "Hi", "n": tc.n, "best_of": tc.bestOf, "seed": 100}
			if tc.logprobs {
				body["logprobs"] = 1
			}
			r := h.post("/v1/completions", keyAlpha, body)
			if r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			var out struct {
				Choices []struct {
					Index    int             `json:"index"`
					Text     string          `json:"text"`
					Logprobs json.RawMessage `json:"logprobs"`
				} `json:"choices"`
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal(r.body, &out); err != nil {
				t.Fatal(err)
			}
			if len(out.Choices) != len(tc.want) {
				t.Fatalf("%d choices: %s", len(out.Choices), r.body)
			}
			for i, c := range out.Choices {
				if c.Index != i || c.Text != tc.want[i] || (string(c.Logprobs) == "null") == tc.logprobs {
					t.Errorf("choice %d: index %d text %q logprobs %s; want %q", i, c.Index, c.Text, c.Logprobs, tc.want[i])
				}
			}
			want := 0
			for _, r := range replies[:tc.bestOf] {
				want += len(r) + 1 // and EOS
			}
			if out.Usage.CompletionTokens != want {
				t.Errorf("usage %d completion tokens, want %d (every candidate's)", out.Usage.CompletionTokens, want)
			}
		})
	}
}

// TestAuditRescore: at rate 1 every answer is re-scored teacher-forced
// (the fake returns the forced tokens with the same logprobs) and
// matches; an answer whose recorded logprobs differ from its re-score
// (the fake shifts tenant beta's) is a mismatch: counted, logged at
// ERROR with tenant, request id and positions, and never with text.
func TestAuditRescore(t *testing.T) {
	fake := &gatewaytest.Fake{Model: "fake-model", Window: 4096, PageSize: 16, Pages: 1 << 16,
		Behave: func(p request.Params) gatewaytest.Behavior {
			if p.Owner.Tenant == "beta" {
				return gatewaytest.Behavior{Fault: gatewaytest.FaultShiftLogprobs}
			}
			return gatewaytest.Behavior{}
		}}
	h := newHarness(t, fake, func(c *gateway.Config) { c.AuditRate = 1 })
	for _, key := range []string{keyAlpha, keyBeta} {
		for _, body := range []map[string]any{chatBody(nil), {"prompt": "Hi", "n": 2}, chatBody(map[string]any{"stream": true, "logprobs": true})} {
			path := "/v1/chat/completions"
			if _, ok := body["prompt"]; ok {
				path = "/v1/completions"
			}
			if r := h.post(path, key, body); r.status != http.StatusOK {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
		}
	}
	// 4 answers per tenant.
	eventually(t, "8 re-scores", func() bool {
		return metricValue(t, h, `pagewarden_audit_replays_total{result="match"}`) == "4" &&
			metricValue(t, h, `pagewarden_audit_replays_total{result="mismatch"}`) == "4"
	})
	if v := metricValue(t, h, "pagewarden_audit_mismatches_total"); v != "4" {
		t.Errorf("mismatches %s, want 4", v)
	}
	lines := 0
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if !strings.Contains(l, "replay audit mismatch") {
			continue
		}
		lines++
		for _, want := range []string{`"level":"ERROR"`, `"tenant":"beta"`, `"request_id":"`, `"positions":[0,`, `"max_abs_delta_logprob":0.5`} {
			if !strings.Contains(l, want) {
				t.Errorf("audit line lacks %s: %s", want, l)
			}
		}
		if strings.Contains(l, "Hello") {
			t.Errorf("audit line carries text: %s", l)
		}
	}
	if lines != 4 {
		t.Errorf("%d ERROR lines, want 4", lines)
	}
}

// TestAuditRescoreIsOnePrefill: the re-score the audit submits is one
// prefill — the answer's prompt and every answer token but the last as
// its prompt, prompt logprobs asked with the audit's alternatives, the
// last token forced, max_tokens 1, as the audit tenant at the lowest
// priority with a salt of its own — and a backend that answers it with
// one prompt logprob short fails the replay (not a verdict: no match, no
// mismatch).
func TestAuditRescoreIsOnePrefill(t *testing.T) {
	for _, short := range []bool{false, true} {
		var mu sync.Mutex
		var replays []request.Params
		var orig request.Params
		fake := &gatewaytest.Fake{Model: "fake-model", Window: 4096, PageSize: 16, Pages: 1 << 16,
			Behave: func(p request.Params) gatewaytest.Behavior {
				if p.Owner.Tenant != gateway.AuditTenant {
					mu.Lock()
					orig = p
					mu.Unlock()
					return gatewaytest.Behavior{}
				}
				mu.Lock()
				replays = append(replays, p)
				mu.Unlock()
				if short {
					return gatewaytest.Behavior{Fault: gatewaytest.FaultShortPromptLogprobs}
				}
				return gatewaytest.Behavior{}
			}}
		h := newHarness(t, fake, func(c *gateway.Config) { c.AuditRate = 1 })
		r := h.post("/v1/completions", keyAlpha, map[string]any{"prompt": "Hi", "max_tokens": 5})
		if r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		want := "match"
		if short {
			want = "failed"
		}
		eventually(t, "the re-score", func() bool {
			return metricValue(t, h, fmt.Sprintf(`pagewarden_audit_replays_total{result=%q}`, want)) == "1"
		})
		mu.Lock()
		if len(replays) != 1 {
			t.Fatalf("%d replays", len(replays))
		}
		p := replays[0]
		mu.Unlock()
		answer, _ := fake.Tokenize(gatewaytest.DefaultReply[:5], false, false)
		seq := append(append([]int(nil), orig.Prompt...), answer[:4]...)
		s := p.Sampling
		if !slices.Equal(p.Prompt, seq) || p.MaxTokens != 1 || !slices.Equal(s.Forced, answer[4:]) || !s.PromptLogprobs || s.PromptTopLogprobs != 5 ||
			!s.Logprobs || s.TopLogprobs != 5 || p.Priority != math.MinInt32 || !strings.HasPrefix(p.CacheSalt, "audit|") {
			t.Errorf("short %v: re-score params %+v; want the prompt %v", short, p, seq)
		}
		if v := metricValue(t, h, "pagewarden_audit_mismatches_total"); v != "0" {
			t.Errorf("short %v: mismatches %s", short, v)
		}
	}
}

// TestAuditTolerance: with AuditTolerance, a re-score within it matches
// (nodes computing with other kernels), one beyond it does not.
func TestAuditTolerance(t *testing.T) {
	for _, tc := range []struct {
		tol    float64
		result string
	}{{0.25, "mismatch"}, {0.75, "match"}} {
		fake := &gatewaytest.Fake{Model: "fake-model", Window: 4096, PageSize: 16, Pages: 1 << 16,
			Behave: func(p request.Params) gatewaytest.Behavior {
				if p.Owner.Tenant != gateway.AuditTenant {
					return gatewaytest.Behavior{Fault: gatewaytest.FaultShiftLogprobs} // 0.5 off
				}
				return gatewaytest.Behavior{}
			}}
		h := newHarness(t, fake, func(c *gateway.Config) { c.AuditRate, c.AuditTolerance = 1, tc.tol })
		if r := h.post("/v1/chat/completions", keyAlpha, chatBody(nil)); r.status != http.StatusOK {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
		eventually(t, "the re-score", func() bool {
			return metricValue(t, h, fmt.Sprintf(`pagewarden_audit_replays_total{result=%q}`, tc.result)) == "1"
		})
	}
	if _, err := gateway.New(gateway.Config{Backend: gatewaytest.NewFake(), Tenants: testTenants(tenants.Limits{}, tenants.Limits{}), AuditTolerance: -1}); err == nil || !strings.Contains(err.Error(), "audit tolerance") {
		t.Errorf("AuditTolerance -1: %v", err)
	}
}

// TestEchoLogprobs: completions' echo with logprobs, in OpenAI's shape —
// the prompt tokens' entries first (BOS, H, i: the first with null
// logprob and top_logprobs, the others the engine's prompt logprobs),
// then the answer's, offsets counting the echoed text before the
// answer's (a BOS the tokenizer added is not in it); streamed, the echo's
// chunk carries the prompt's entries and the later chunks the answer's,
// concatenating to the same lists; with n = 2, each choice has them.
func TestEchoLogprobs(t *testing.T) {
	h := newHarness(t, nil)
	reply := gatewaytest.DefaultReply
	wantTokens := append([]string{string(h.fake.TokenPiece(gatewaytest.BOS)), "H", "i"}, strings.Split(reply, "")...)
	wantOffsets := []int{0, 0, 1}
	for i := range reply {
		wantOffsets = append(wantOffsets, 2+i)
	}
	type legacy struct {
		Tokens        []string             `json:"tokens"`
		TokenLogprobs []*float32           `json:"token_logprobs"`
		TopLogprobs   []map[string]float32 `json:"top_logprobs"`
		TextOffset    []int                `json:"text_offset"`
	}
	check := func(what string, text string, l legacy) {
		t.Helper()
		if text != "Hi"+reply {
			t.Errorf("%s: text %q", what, text)
		}
		if !slices.Equal(l.Tokens, wantTokens) || !slices.Equal(l.TextOffset, wantOffsets) || len(l.TokenLogprobs) != len(wantTokens) || len(l.TopLogprobs) != len(wantTokens) {
			t.Fatalf("%s: %+v", what, l)
		}
		if l.TokenLogprobs[0] != nil || l.TopLogprobs[0] != nil {
			t.Errorf("%s: the first prompt token has logprob %v, top %v; want null", what, l.TokenLogprobs[0], l.TopLogprobs[0])
		}
		for i := 1; i < len(wantTokens); i++ {
			id := 3 + int(wantTokens[i][0])
			if want := gatewaytest.Logprob(id).Logprob; l.TokenLogprobs[i] == nil || *l.TokenLogprobs[i] != want || len(l.TopLogprobs[i]) != 2 || l.TopLogprobs[i][wantTokens[i]] != want {
				t.Errorf("%s: entry %d (%q): %v %v, want %v and 2 alternatives", what, i, wantTokens[i], l.TokenLogprobs[i], l.TopLogprobs[i], want)
			}
		}
	}
	r := h.post("/v1/completions", keyAlpha, map[string]any{"prompt": "Hi", "echo": true, "logprobs": 2, "n": 2})
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var out struct {
		Choices []struct {
			Text     string `json:"text"`
			Logprobs legacy `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(r.body, &out); err != nil || len(out.Choices) != 2 {
		t.Fatalf("%s: %v", r.body, err)
	}
	for i, c := range out.Choices {
		check(fmt.Sprintf("choice %d", i), c.Text, c.Logprobs)
	}
	if p := h.fake.LastParams(); !p.Sampling.PromptLogprobs || p.Sampling.PromptTopLogprobs != 2 {
		t.Errorf("submitted %+v: the prompt not scored", p.Sampling)
	}

	r = h.post("/v1/completions", keyAlpha, map[string]any{"prompt": "Hi", "echo": true, "logprobs": 2, "stream": true})
	if r.status != http.StatusOK {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	var text string
	var all legacy
	first := true
	for _, e := range sseEvents(t, r.body) {
		if e == "[DONE]" {
			continue
		}
		var ch struct {
			Choices []struct {
				Text     string  `json:"text"`
				Logprobs *legacy `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &ch); err != nil || len(ch.Choices) != 1 {
			t.Fatalf("%s: %v", e, err)
		}
		c := ch.Choices[0]
		if first && (c.Text != "Hi" || c.Logprobs == nil || len(c.Logprobs.Tokens) != 3) {
			t.Fatalf("the echo's chunk %s: want the prompt and its 3 entries", e)
		}
		first = false
		text += c.Text
		if l := c.Logprobs; l != nil {
			all.Tokens = append(all.Tokens, l.Tokens...)
			all.TokenLogprobs = append(all.TokenLogprobs, l.TokenLogprobs...)
			all.TopLogprobs = append(all.TopLogprobs, l.TopLogprobs...)
			all.TextOffset = append(all.TextOffset, l.TextOffset...)
		}
	}
	check("streamed", text, all)
}
