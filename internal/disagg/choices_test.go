package disagg

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
)

// TestDisaggregatedChoices: n > 1 through the gateway in front of the
// split (two prefill and two decode nodes): choice i is the single answer
// with seed + i, usage counts the prompt once and every choice, the
// siblings hit the prefill nodes' prefix cache, and every pool comes back.
func TestDisaggregatedChoices(t *testing.T) {
	o := nodeOptions()
	o.PrefixCache = true // as serve runs it
	l := startLocal(t, LocalConfig{Prefill: 2, Decode: 2, Node: o})
	post := apiClient(t, l)
	type answer struct {
		Choices []struct {
			Index        int    `json:"index"`
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	prompt := "Once upon a time there was a little dog who lived in a small house by the sea, and every morning"
	complete := func(body map[string]any) answer {
		t.Helper()
		body["prompt"], body["temperature"], body["max_tokens"] = prompt, 1, 12
		code, out := post("/v1/completions", body)
		var a answer
		if code != 200 || json.Unmarshal(out, &a) != nil {
			t.Fatalf("status %d: %s", code, out)
		}
		return a
	}
	many := complete(map[string]any{"n": 4, "seed": 40})
	if len(many.Choices) != 4 {
		t.Fatalf("%d choices, want 4", len(many.Choices))
	}
	// The siblings reused the first choice's prompt pages on the prefill
	// node that computed them (the singles below may hit too: counted
	// before them).
	var hits uint64
	for _, n := range l.Prefills {
		st, err := n.Sched().Stats(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		hits += st.Pool.PrefixHitPages
	}
	if hits == 0 {
		t.Error("no prefix-cache hit on the prefill nodes: the siblings recomputed the prompt")
	}

	completion := 0
	for i, c := range many.Choices {
		single := complete(map[string]any{"seed": 40 + i})
		if c.Index != i || c.Text != single.Choices[0].Text || c.FinishReason != single.Choices[0].FinishReason {
			t.Errorf("choice %d: %q (%s), the single answer with seed %d: %q (%s)", i, c.Text, c.FinishReason, 40+i, single.Choices[0].Text, single.Choices[0].FinishReason)
		}
		if many.Usage.PromptTokens != single.Usage.PromptTokens {
			t.Errorf("prompt tokens %d, single %d", many.Usage.PromptTokens, single.Usage.PromptTokens)
		}
		completion += single.Usage.CompletionTokens
	}
	if many.Usage.CompletionTokens != completion {
		t.Errorf("completion tokens %d, the singles' sum %d", many.Usage.CompletionTokens, completion)
	}
	checkBaseline(t, l)
}

// apiClient serves the OpenAI API in front of l for one tenant and
// returns how to POST a JSON body to a path with its key.
func apiClient(t *testing.T, l *Local) func(path string, body map[string]any) (int, []byte) {
	t.Helper()
	const key = "sk-split-http"
	srv, err := gateway.New(gateway.Config{Backend: l, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Tenants: &tenants.Config{Tenants: []tenants.Tenant{{ID: "acme", APIKeySHA256: []string{tenants.HashKey(key)}}}}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return func(path string, body map[string]any) (int, []byte) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", ts.URL+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, out
	}
}
