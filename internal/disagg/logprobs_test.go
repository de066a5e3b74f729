package disagg

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
)

type lpStream interface {
	Tokens() <-chan request.Token
	Result() request.Result
}

func collectLogprobs(t *testing.T, st lpStream) ([]int, []*request.Logprobs) {
	t.Helper()
	var ids []int
	var lps []*request.Logprobs
	for tok := range st.Tokens() {
		ids = append(ids, tok.ID)
		lps = append(lps, tok.Logprobs)
	}
	if res := st.Result(); !res.Reason.Success() {
		t.Fatalf("%v: %v", res.Reason, res.Err)
	}
	return ids, lps
}

// TestDisaggregatedLogprobs: logprobs cross the handoff and the wire —
// the first token's from the prefill node in the manifest, the others'
// from the decode node in Tokens frames — and come out bit for bit those
// of one node, as does a teacher-forced re-score through the split.
func TestDisaggregatedLogprobs(t *testing.T) {
	single := startSingle(t)
	l := startLocal(t, LocalConfig{})
	ctx := context.Background()
	for i, prompt := range prompts(t, single)[:3] {
		p := request.Params{Prompt: prompt, MaxTokens: 10, IgnoreEOS: true,
			Sampling: request.Sampling{Temperature: 0.9, Seed: uint64(i), Logprobs: true, TopLogprobs: 4}}
		p.Owner = request.Owner{Tenant: "acme", ID: request.NewID()}
		st, err := single.Submit(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		wantIDs, want := collectLogprobs(t, st)
		p.Owner.ID = request.NewID()
		st2, err := l.Submit(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		ids, got := collectLogprobs(t, st2)
		if diff := cmp.Diff(wantIDs, ids); diff != "" {
			t.Fatalf("prompt %d: tokens (-one node +split):\n%s", i, diff)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("prompt %d: logprobs (-one node +split):\n%s", i, diff)
		}
		p.Owner = request.Owner{Tenant: gateway.AuditTenant, ID: request.NewID()}
		p.Sampling = request.Sampling{Logprobs: true, TopLogprobs: 4, Forced: ids}
		st3, err := l.Submit(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		forced, again := collectLogprobs(t, st3)
		if diff := cmp.Diff(ids, forced); diff != "" {
			t.Fatalf("prompt %d: forced tokens (-forced +emitted):\n%s", i, diff)
		}
		if diff := cmp.Diff(want, again); diff != "" {
			t.Errorf("prompt %d: re-score logprobs (-generated +re-scored):\n%s", i, diff)
		}
	}
	checkBaseline(t, l)
}

// TestDisaggregatedAuditHTTP: through the gateway at audit rate 1, every
// answer over the split (chat with logprobs, streamed or not; completions
// with n and best_of) is re-scored teacher-forced and matches exactly.
func TestDisaggregatedAuditHTTP(t *testing.T) {
	l := startLocal(t, LocalConfig{Prefill: 2, Decode: 2, Node: nodeOptions()})
	const key = "sk-split-audit"
	srv, err := gateway.New(gateway.Config{Backend: l, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), AuditRate: 1,
		Tenants: &tenants.Config{Tenants: []tenants.Tenant{{ID: "acme", APIKeySHA256: []string{tenants.HashKey(key)}}}}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	post := func(path, body string) string {
		req, _ := http.NewRequest("POST", ts.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", body, resp.StatusCode, out)
		}
		return string(out)
	}
	answers := 0
	chat := `{"messages":[{"role":"user","content":"Tell me a story about a cat"}],"max_tokens":12,"temperature":1,"logprobs":true,"top_logprobs":2`
	out := post("/v1/chat/completions", chat+`}`)
	var body struct {
		Choices []struct {
			Logprobs struct {
				Content []json.RawMessage `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(out), &body); err != nil || len(body.Choices) != 1 || len(body.Choices[0].Logprobs.Content) == 0 {
		t.Fatalf("chat with logprobs over the split: %s (%v)", out, err)
	}
	answers++
	post("/v1/chat/completions", chat+`,"stream":true}`)
	answers++
	post("/v1/completions", `{"prompt":"Once upon a time","max_tokens":8,"temperature":1,"n":3,"logprobs":1}`)
	answers += 3
	post("/v1/completions", `{"prompt":"Once upon a time","max_tokens":8,"temperature":1,"best_of":3,"n":2}`)
	answers += 3
	deadline := time.Now().Add(30 * time.Second)
	for replays(t, srv, "match")+replays(t, srv, "mismatch")+replays(t, srv, "failed") < float64(answers) {
		if time.Now().After(deadline) {
			t.Fatalf("re-scores did not finish")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if m := replays(t, srv, "match"); m != float64(answers) {
		t.Fatalf("%v of %d re-scores matched (mismatch %v, failed %v)", m, answers,
			replays(t, srv, "mismatch"), replays(t, srv, "failed"))
	}
	checkBaseline(t, l)
}

// replays is the gateway's pagewarden_audit_replays_total{result}.
func replays(t *testing.T, srv *gateway.Server, result string) float64 {
	t.Helper()
	mfs, err := srv.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pagewarden_audit_replays_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestLocalQuarantineAnswer: the split remembers an answer's pages on the
// prefill node that computed its prompt and the decode node that
// generated it; asked after a mismatch, each names its pages and epochs
// and withdraws those still alive (the prompt's pages in the prefill
// node's prefix cache); an unknown answer has none.
func TestLocalQuarantineAnswer(t *testing.T) {
	o := nodeOptions()
	o.PrefixCache = true
	l := startLocal(t, LocalConfig{Node: o})
	ctx := context.Background()
	prompt := prompts(t, l.Prefills[0])[2] // over one page
	owner := request.Owner{Tenant: "acme", ID: request.NewID()}
	st, err := l.Submit(ctx, request.Params{Owner: owner, Prompt: prompt, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	collectLogprobs(t, st)
	got := l.QuarantineAnswer(ctx, owner)
	nodes := map[string]int{}
	for _, a := range got {
		if len(a.Pages) == 0 {
			t.Errorf("%s: no pages", a.Node)
		}
		nodes[a.Node] = a.Quarantined + a.Withdrawn
	}
	if _, ok := nodes["prefill-0"]; !ok {
		t.Errorf("the prefill node does not account for the answer: %+v", got)
	}
	if _, ok := nodes["decode-0"]; !ok {
		t.Errorf("the decode node does not account for the answer: %+v", got)
	}
	if full := len(prompt) / o.PageSize; nodes["prefill-0"] != full {
		t.Errorf("prefill node withdrew %d pages, want the prompt's %d full pages in its cache", nodes["prefill-0"], full)
	}
	if a := l.QuarantineAnswer(ctx, request.Owner{Tenant: "acme", ID: request.NewID()}); len(a) != 0 {
		t.Errorf("an unknown answer: %+v", a)
	}
	for _, n := range append(append([]*node.Node(nil), l.Prefills...), l.Decodes...) {
		if _, err := n.Sched().ScrubQuarantined(ctx); err != nil {
			t.Fatal(err)
		}
	}
	checkBaseline(t, l)
}

// TestReplayRunsElsewhere: an audit re-score (gateway.WithReplayOf) runs
// on a prefill and a decode node other than those that generated its
// answer, when the split has another of each.
func TestReplayRunsElsewhere(t *testing.T) {
	l := startLocal(t, LocalConfig{Prefill: 2, Decode: 2, Node: nodeOptions()})
	ctx := context.Background()
	prompt := prompts(t, l.Prefills[0])[1]
	for i := range 4 {
		orig := request.Owner{Tenant: "acme", ID: request.NewID()}
		st, err := l.Submit(ctx, request.Params{Owner: orig, Prompt: prompt, MaxTokens: 3, Sampling: request.Sampling{Seed: uint64(i)}})
		if err != nil {
			t.Fatal(err)
		}
		collectLogprobs(t, st)
		replay := request.Owner{Tenant: gateway.AuditTenant, ID: request.NewID()}
		st, err = l.Submit(gateway.WithReplayOf(ctx, orig), request.Params{Owner: replay, Prompt: prompt, MaxTokens: 3})
		if err != nil {
			t.Fatal(err)
		}
		collectLogprobs(t, st)
		p1, d1, ok1 := l.servedOf(orig)
		p2, d2, ok2 := l.servedOf(replay)
		if !ok1 || !ok2 || p1 == p2 || d1 == d2 {
			t.Errorf("answer on %s/%s, its re-score on %s/%s: want other nodes", p1, d1, p2, d2)
		}
	}
	checkBaseline(t, l)
}

// TestDisaggregatedPromptLogprobs: prompt logprobs computed by the prefill
// node cross the handoff in the manifest and reach the gateway with the
// first token in a Tokens frame, bit for bit those of one node; the
// audit's prefill re-score through the split (prompt+answer as a prompt,
// its last token forced) equals the answer's logprobs.
func TestDisaggregatedPromptLogprobs(t *testing.T) {
	single := startSingle(t)
	l := startLocal(t, LocalConfig{})
	ctx := context.Background()
	run := func(b gateway.Backend, p request.Params) ([]int, []*request.Logprobs, []request.Logprobs) {
		t.Helper()
		p.Owner.ID = request.NewID()
		st, err := b.Submit(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int
		var lps []*request.Logprobs
		var prompt []request.Logprobs
		for tok := range st.Tokens() {
			if tok.Index == 0 {
				prompt = tok.Prompt
			} else if tok.Prompt != nil {
				t.Fatalf("token %d carries prompt logprobs", tok.Index)
			}
			ids = append(ids, tok.ID)
			lps = append(lps, tok.Logprobs)
		}
		if res := st.Result(); !res.Reason.Success() {
			t.Fatalf("%v: %v", res.Reason, res.Err)
		}
		return ids, lps, prompt
	}
	for i, prompt := range prompts(t, single)[:3] {
		p := request.Params{Owner: request.Owner{Tenant: "acme"}, Prompt: prompt, MaxTokens: 8, IgnoreEOS: true,
			Sampling: request.Sampling{Temperature: 0.9, Seed: uint64(i), Logprobs: true, TopLogprobs: 4, PromptLogprobs: true, PromptTopLogprobs: 2}}
		wantIDs, wantLP, want := run(single, p)
		ids, _, got := run(l, p)
		if diff := cmp.Diff(wantIDs, ids); diff != "" {
			t.Fatalf("prompt %d: tokens (-one node +split):\n%s", i, diff)
		}
		if len(want) != len(prompt)-1 {
			t.Fatalf("prompt %d: %d prompt logprobs for %d tokens", i, len(want), len(prompt))
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("prompt %d: prompt logprobs (-one node +split):\n%s", i, diff)
		}
		seq := append(append([]int(nil), prompt...), ids[:len(ids)-1]...)
		r := request.Params{Owner: request.Owner{Tenant: gateway.AuditTenant}, Prompt: seq, MaxTokens: 1,
			Sampling: request.Sampling{Logprobs: true, TopLogprobs: 4, PromptLogprobs: true, PromptTopLogprobs: 4, Forced: ids[len(ids)-1:]}}
		last, lastLP, pl := run(l, r)
		if len(last) != 1 || last[0] != ids[len(ids)-1] || len(pl) != len(seq)-1 {
			t.Fatalf("prompt %d: re-score gave %v and %d prompt logprobs", i, last, len(pl))
		}
		rescored := append([]request.Logprobs(nil), pl[len(prompt)-1:]...)
		rescored = append(rescored, *lastLP[0])
		for k := range wantLP {
			if diff := cmp.Diff(*wantLP[k], rescored[k]); diff != "" {
				t.Errorf("prompt %d: answer position %d: (-generated +prefill re-score over the split):\n%s", i, k, diff)
			}
		}
	}
}
