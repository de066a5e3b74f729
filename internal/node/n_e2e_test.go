package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
)

// n > 1 end to end: the gateway fans a request out into n child requests
// on the real node, which share the prompt's pages through the tenant's
// prefix cache. Released pages are poisoned (the harness default), so a
// child that read a page after it was freed would give other text than
// its single-choice twin.

// nChoice is one choice of a non-streamed chat or completion response.
type nChoice struct {
	Index   int    `json:"index"`
	Text    string `json:"text"`
	Message struct {
		Content string `json:"content"`
	} `json:"message"`
	FinishReason string `json:"finish_reason"`
}

func (c nChoice) out() string { return c.Text + c.Message.Content }

type nBody struct {
	Choices []nChoice  `json:"choices"`
	Usage   *usageBody `json:"usage"`
}

// nPrompt spans several 16-token pages, so that the siblings' hits are
// visible.
var nPrompt = strings.Repeat("A long prompt that several choices share. ", 6)

func withBody(base map[string]any, kv ...any) map[string]any {
	b := maps.Clone(base)
	for i := 0; i+1 < len(kv); i += 2 {
		b[kv[i].(string)] = kv[i+1]
	}
	return b
}

// postN posts body and checks the shape every n-choice answer has:
// choices 0..n-1 in order, each with a finish reason, and usage.
func (s *e2eServer) postN(key, path string, body map[string]any, n int) nBody {
	s.t.Helper()
	var r nBody
	s.postOK(key, path, body, &r)
	if len(r.Choices) != n || r.Usage == nil {
		s.t.Fatalf("%d choices (usage %v), want %d", len(r.Choices), r.Usage, n)
	}
	for i, c := range r.Choices {
		if c.Index != i || (c.FinishReason != "stop" && c.FinishReason != "length") {
			s.t.Errorf("choice %d: index %d finish %q", i, c.Index, c.FinishReason)
		}
	}
	return r
}

func TestE2ENChoices(t *testing.T) {
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}})
	page := s.node.Limits().PageSize
	for _, ep := range []struct {
		name, path string
		body       map[string]any
	}{
		{"completions", "/v1/completions", map[string]any{"prompt": nPrompt}},
		{"chat", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": nPrompt}}}},
	} {
		t.Run(ep.name, func(t *testing.T) {
			// A salt of this subtest's own: the first request misses.
			base := withBody(ep.body, "max_tokens", 12, "temperature", 1, "cache_salt", "n-"+ep.name)
			const n = 4
			hits := s.stats().Pool.PrefixHitPages
			first := s.postN(e2eKeyA, ep.path, withBody(base, "n", n, "seed", 42), n)
			s.waitAllFree()
			fullPages := (first.Usage.PromptTokens - 1) / page
			if fullPages < 3 {
				t.Fatalf("prompt of %d tokens is too short for %d-token pages", first.Usage.PromptTokens, page)
			}
			// Child 0 computed the prompt; each sibling, submitted after
			// child 0's first token, attached its full pages.
			if got := s.stats().Pool.PrefixHitPages - hits; got < uint64((n-1)*fullPages) {
				t.Errorf("prefix-cache hits %d pages, want at least %d (%d siblings × %d full prompt pages)", got, (n-1)*fullPages, n-1, fullPages)
			}
			if first.Usage.cached() != 0 {
				t.Errorf("cached_tokens %d: child 0 of a fresh salt must miss", first.Usage.cached())
			}
			again := s.postN(e2eKeyA, ep.path, withBody(base, "n", n, "seed", 42), n)
			s.waitAllFree()
			if c := again.Usage.cached(); c != fullPages*page {
				t.Errorf("repeat: cached_tokens %d, want %d", c, fullPages*page)
			}
			distinct := map[string]bool{}
			sum := 0
			for i := range n {
				if first.Choices[i].out() != again.Choices[i].out() {
					t.Errorf("choice %d differs between two runs with seed 42: %q vs %q", i, first.Choices[i].out(), again.Choices[i].out())
				}
				// Choice i is the single answer with seed 42 + i.
				one := s.postN(e2eKeyA, ep.path, withBody(base, "seed", 42+i), 1)
				if one.Choices[0].out() != first.Choices[i].out() || one.Choices[0].FinishReason != first.Choices[i].FinishReason {
					t.Errorf("choice %d %q (%s); the single answer with seed %d is %q (%s)", i, first.Choices[i].out(),
						first.Choices[i].FinishReason, 42+i, one.Choices[0].out(), one.Choices[0].FinishReason)
				}
				sum += one.Usage.CompletionTokens
				distinct[first.Choices[i].out()] = true
			}
			if len(distinct) < 2 {
				t.Errorf("4 sampled choices with seeds 42..45 are all %q", first.Choices[0].out())
			}
			if u := first.Usage; u.PromptTokens != again.Usage.PromptTokens || u.CompletionTokens != sum || u.TotalTokens != u.PromptTokens+sum {
				t.Errorf("usage %+v: want completion_tokens %d, the singles' sum", *u, sum)
			}

			greedy := s.postN(e2eKeyA, ep.path, withBody(base, "n", 3, "temperature", 0), 3)
			for i, c := range greedy.Choices {
				if c.out() != greedy.Choices[0].out() {
					t.Errorf("greedy choice %d %q differs from choice 0 %q", i, c.out(), greedy.Choices[0].out())
				}
			}
			if greedy.Usage.CompletionTokens%3 != 0 {
				t.Errorf("greedy usage %+v: three equal choices", *greedy.Usage)
			}

			// Streamed: the same choices, interleaved by index, each
			// with its finish reason, then one usage chunk.
			st := s.stream(e2eKeyA, ep.path, withBody(base, "n", n, "seed", 42, "stream_options", map[string]any{"include_usage": true}))
			texts, finishes, usage := nEvents(t, st, n)
			for i := range n {
				if texts[i] != first.Choices[i].out() || finishes[i] != first.Choices[i].FinishReason {
					t.Errorf("streamed choice %d %q (%s), non-streamed %q (%s)", i, texts[i], finishes[i], first.Choices[i].out(), first.Choices[i].FinishReason)
				}
			}
			if usage == nil || usage.CompletionTokens != sum || usage.PromptTokens != first.Usage.PromptTokens {
				t.Errorf("streamed usage %+v, want completion_tokens %d", usage, sum)
			}
			s.waitAllFree()
		})
	}
	s.checkMustBeZero()
}

// nEvents reads a finished n-choice stream: each choice's text and finish
// reason, and the usage chunk. It checks that the stream ended with
// [DONE], every chunk names one choice, a finish reason comes once per
// choice and last for it, and usage comes once, last.
func nEvents(t *testing.T, st sseStream, n int) (texts, finishes []string, usage *usageBody) {
	t.Helper()
	if st.status != 200 || !st.done || st.errEv != nil {
		t.Fatalf("stream: status %d done %v error %+v", st.status, st.done, st.errEv)
	}
	texts, finishes = make([]string, n), make([]string, n)
	for k, ev := range st.events {
		var ch struct {
			Choices []struct {
				Index int    `json:"index"`
				Text  string `json:"text"`
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usageBody `json:"usage"`
		}
		if err := json.Unmarshal(ev, &ch); err != nil {
			t.Fatalf("event %s: %v", ev, err)
		}
		if usage != nil {
			t.Errorf("event after the usage chunk: %s", ev)
		}
		if ch.Usage != nil {
			if len(ch.Choices) != 0 || k != len(st.events)-1 {
				t.Errorf("usage chunk with choices, or not last: %s", ev)
			}
			usage = ch.Usage
			continue
		}
		if len(ch.Choices) != 1 || ch.Choices[0].Index < 0 || ch.Choices[0].Index >= n {
			t.Fatalf("chunk %s: want one choice of index 0..%d", ev, n-1)
		}
		c := ch.Choices[0]
		if finishes[c.Index] != "" {
			t.Errorf("chunk for choice %d after its finish: %s", c.Index, ev)
		}
		texts[c.Index] += c.Text
		if c.Delta.Content != nil {
			texts[c.Index] += *c.Delta.Content
		}
		if c.FinishReason != nil {
			finishes[c.Index] = *c.FinishReason
		}
	}
	for i, f := range finishes {
		if f == "" {
			t.Errorf("choice %d never finished", i)
		}
	}
	return texts, finishes, usage
}

// TestE2ENRefusals: n × the pages of one choice must fit the tenant's
// page budget (a 400 naming n, nothing submitted); an omitted max_tokens
// is shared among the choices.
func TestE2ENRefusals(t *testing.T) {
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}, limits: map[string]tenants.Limits{"a": {MaxKVPages: 8}}})
	body := map[string]any{"prompt": "Hello", "max_tokens": 40, "temperature": 0} // 3 pages each
	code, _, out := s.post(e2eKeyA, "/v1/completions", withBody(body, "n", 3))
	var e struct {
		Error struct {
			Param string `json:"param"`
			Code  string `json:"code"`
		} `json:"error"`
	}
	if code != 400 || json.Unmarshal(out, &e) != nil || e.Error.Param != "n" || e.Error.Code != "kv_page_limit_exceeded" {
		t.Errorf("n=3 × 3 pages over a budget of 8: %d %s", code, out)
	}
	if s.rec.submits() != 0 {
		t.Errorf("a refused request was submitted")
	}
	s.postN(e2eKeyA, "/v1/completions", withBody(body, "n", 2), 2)
	// Without max_tokens each of 4 choices gets 2 pages' worth.
	r := s.postN(e2eKeyA, "/v1/completions", map[string]any{"prompt": "Hello", "n": 4, "temperature": 0, "ignore_eos": true}, 4)
	if r.Usage.CompletionTokens == 0 || r.Usage.PromptTokens+r.Usage.CompletionTokens/4 > 2*s.node.Limits().PageSize+1 {
		t.Errorf("usage %+v: each of 4 choices must fit 2 pages", *r.Usage)
	}
	s.waitAllFree()
}

// TestE2ENFailures: a child the node aborts mid-answer fails the whole
// response (an error, never a 200 with a choice missing) and its siblings
// are aborted; a client that hangs up mid-stream aborts every child. Each
// time every page comes back.
func TestE2ENFailures(t *testing.T) {
	const failSeed = 1002 // child 2 of seed 1000
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}, abortAfter: func(p request.Params) int {
		if p.Sampling.Seed == failSeed {
			return 3
		}
		return 0
	}})
	body := map[string]any{"prompt": nPrompt, "max_tokens": 200, "temperature": 1, "seed": 1000, "n": 4, "ignore_eos": true}
	code, _, out := s.post(e2eKeyA, "/v1/completions", body)
	if code < 500 || !bytes.Contains(out, []byte(`"error"`)) {
		t.Errorf("a failed choice: status %d %s, want a 5xx error", code, out)
	}
	s.waitAllFree()
	st := s.stream(e2eKeyA, "/v1/completions", withBody(body))
	if st.status != 200 || st.done || st.errEv == nil {
		t.Errorf("a failed choice mid-stream: status %d done %v error %+v, want an error event and no [DONE]", st.status, st.done, st.errEv)
	}
	s.waitAllFree()

	// Hang up after a few chunks of a long answer.
	long := withBody(body, "seed", 7, "stream", true)
	delete(long, "max_tokens") // the whole window
	b, _ := json.Marshal(long)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+e2eKeyA)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	seen := map[string]bool{}
	for sc.Scan() && len(seen) < 4 {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			var ch struct {
				Choices []struct {
					Index int `json:"index"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(d), &ch) == nil && len(ch.Choices) == 1 {
				seen[fmt.Sprint(ch.Choices[0].Index)] = true
			}
		}
	}
	cancel()
	resp.Body.Close()
	if len(seen) < 4 {
		t.Errorf("saw chunks of %d choices before hanging up", len(seen))
	}
	s.waitAllFree()
	s.checkMustBeZero()
}

// TestE2ENTenants: two tenants' n-choice requests at once, on poisoned
// pages, give what each gives alone; the siblings only ever hit their own
// tenant's prefix pages (the positive control: the same prompt and salt
// from the other tenant gets cached_tokens 0, the same tenant's repeat a
// hit).
func TestE2ENTenants(t *testing.T) {
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}})
	reqs := []struct {
		key  string
		body map[string]any
	}{
		{e2eKeyA, map[string]any{"prompt": nPrompt, "max_tokens": 16, "temperature": 1, "seed": 5, "n": 3}},
		{e2eKeyB, map[string]any{"prompt": nPrompt + "Other.", "max_tokens": 16, "temperature": 0.9, "seed": 9, "n": 4}},
		{e2eKeyA, map[string]any{"prompt": "Short one", "max_tokens": 20, "temperature": 0, "n": 2}},
		{e2eKeyB, map[string]any{"prompt": nPrompt, "max_tokens": 10, "temperature": 1.1, "seed": 5, "n": 2}},
	}
	solo := make([]nBody, len(reqs))
	for i, r := range reqs {
		solo[i] = s.postN(r.key, "/v1/completions", withBody(r.body, "cache_salt", fmt.Sprint("solo", i)), r.body["n"].(int))
		s.waitAllFree()
	}
	for round := range 2 {
		var wg sync.WaitGroup
		got := make([]nBody, len(reqs))
		for i, r := range reqs {
			wg.Go(func() {
				var b nBody
				code, _, out := s.post(r.key, "/v1/completions", withBody(r.body, "cache_salt", fmt.Sprint("together", round)))
				if code != 200 || json.Unmarshal(out, &b) != nil {
					t.Errorf("request %d: %d %s", i, code, out)
				}
				got[i] = b
			})
		}
		wg.Wait()
		for i := range reqs {
			if len(got[i].Choices) != len(solo[i].Choices) {
				continue
			}
			for j, c := range got[i].Choices {
				if c.out() != solo[i].Choices[j].out() {
					t.Errorf("round %d request %d choice %d: %q together, %q alone", round, i, j, c.out(), solo[i].Choices[j].out())
				}
			}
		}
		s.waitAllFree()
	}

	// The positive control. a publishes the prompt under salt "x" ...
	base := map[string]any{"prompt": nPrompt, "max_tokens": 4, "temperature": 0, "n": 2, "cache_salt": "x"}
	s.postN(e2eKeyA, "/v1/completions", base, 2)
	s.waitAllFree()
	// ... b's child 0 misses it, and its sibling hits b's own pages, just
	// published, never a's: the node counts one sibling's worth of hits.
	hits := s.stats().Pool.PrefixHitPages
	r := s.postN(e2eKeyB, "/v1/completions", base, 2)
	if r.Usage.cached() != 0 {
		t.Errorf("tenant b: cached_tokens %d on tenant a's prompt and salt, want 0", r.Usage.cached())
	}
	s.waitAllFree()
	if got, want := s.stats().Pool.PrefixHitPages-hits, uint64((r.Usage.PromptTokens-1)/s.node.Limits().PageSize); got != want {
		t.Errorf("tenant b's two choices hit %d prefix pages, want %d (the sibling's, on b's own pages)", got, want)
	}
	// ... and a's repeat hits: the check above can fail.
	if r := s.postN(e2eKeyA, "/v1/completions", base, 2); r.Usage.cached() == 0 {
		t.Errorf("tenant a's repeat: no cached tokens; the control would not see a cross-tenant hit")
	}
	s.waitAllFree()
	s.checkMustBeZero()
}

// TestOpenAINodeClientChoices runs the official openai npm client
// (internal/gateway/testdata/openai-client/choices.mjs) against the real
// node: n = 4 for chat and completions, streamed and not, each choice the
// single answer with seed + i, usage summed, and n = 129 a typed
// BadRequestError naming n. Like TestOpenAINodeClientRealNode it runs when
// PAGEWARDEN_NODE_TESTS=1 and `npm install` has been run there (test.sh
// does both).
func TestOpenAINodeClientChoices(t *testing.T) {
	if os.Getenv("PAGEWARDEN_NODE_TESTS") != "1" {
		t.Skip("set PAGEWARDEN_NODE_TESTS=1 (and npm install in internal/gateway/testdata/openai-client) to run")
	}
	dir := filepath.Join("..", "gateway", "testdata", "openai-client")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai")); err != nil {
		t.Skip("run `npm install` in internal/gateway/testdata/openai-client first")
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}})
	cmd := exec.Command(nodeBin, "choices.mjs")
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
			Chat, Completions struct {
				Texts    []string
				Usage    usageBody
				Distinct int
			}
			Refused struct {
				Status int
				Param  string
			}
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil || !res.OK {
		t.Fatalf("output %s: %v", out, err)
	}
	r := res.Results
	for name, ep := range map[string]struct {
		Texts    []string
		Usage    usageBody
		Distinct int
	}{"chat": r.Chat, "completions": r.Completions} {
		if len(ep.Texts) != 4 || ep.Usage.CompletionTokens == 0 || ep.Distinct < 2 {
			t.Errorf("%s: %+v; want 4 choices, not all the same", name, ep)
		}
	}
	if r.Refused.Status != 400 || r.Refused.Param != "n" {
		t.Errorf("n = 129: %+v", r.Refused)
	}
	s.waitAllFree()
}

// TestE2ENBatchAndEcho: a list of prompts is a batch, choice k*n + i
// being prompt k's answer with seed + i, as text or as token ids, usage
// summed over the prompts; echo puts each choice's prompt before its text
// (streamed: as the choice's first delta).
func TestE2ENBatchAndEcho(t *testing.T) {
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}})
	tok := s.node.Model().Tokenizer
	texts := []string{nPrompt, "The dog ran", "Short"}
	base := map[string]any{"max_tokens": 10, "temperature": 1, "seed": 7}
	const n = 2
	batch := s.postN(e2eKeyA, "/v1/completions", withBody(base, "prompt", texts, "n", n), len(texts)*n)
	var ids [][]int
	prompt, completion := 0, 0
	for k, text := range texts {
		ids = append(ids, tok.Encode(text, true, true))
		for i := range n {
			one := s.postN(e2eKeyA, "/v1/completions", withBody(base, "prompt", text, "seed", 7+i), 1)
			if got := batch.Choices[k*n+i]; got.out() != one.Choices[0].out() || got.FinishReason != one.Choices[0].FinishReason {
				t.Errorf("prompt %d choice %d: %q, the single answer %q", k, i, got.out(), one.Choices[0].out())
			}
			completion += one.Usage.CompletionTokens
			if i == 0 {
				prompt += one.Usage.PromptTokens
			}
		}
	}
	if u := batch.Usage; u.PromptTokens != prompt || u.CompletionTokens != completion || u.TotalTokens != prompt+completion {
		t.Errorf("batch usage %+v, want prompt %d completion %d", *u, prompt, completion)
	}
	byIDs := s.postN(e2eKeyA, "/v1/completions", withBody(base, "prompt", ids, "n", n), len(texts)*n)
	for j := range byIDs.Choices {
		if byIDs.Choices[j].out() != batch.Choices[j].out() {
			t.Errorf("choice %d from token ids %q, from text %q", j, byIDs.Choices[j].out(), batch.Choices[j].out())
		}
	}
	s.waitAllFree()

	// echo, alone and with a batch, streamed and not.
	echoed := s.postN(e2eKeyA, "/v1/completions", withBody(base, "prompt", texts[1:], "n", n, "echo", true), 2*n)
	for j, c := range echoed.Choices {
		if want := texts[1+j/n] + batch.Choices[n+j].out(); c.out() != want {
			t.Errorf("echo choice %d: %q, want %q", j, c.out(), want)
		}
	}
	one := s.postN(e2eKeyA, "/v1/completions", withBody(base, "prompt", texts[2], "echo", true), 1)
	if want := texts[2] + batch.Choices[2*n].out(); one.Choices[0].out() != want {
		t.Errorf("echo with one choice: %q, want %q", one.Choices[0].out(), want)
	}
	st := s.stream(e2eKeyA, "/v1/completions", withBody(base, "prompt", texts[1:], "n", n, "echo", true))
	got, _, _ := nEvents(t, st, 2*n)
	firsts := map[int]string{}
	for _, ev := range st.events {
		var ch struct {
			Choices []struct {
				Index int    `json:"index"`
				Text  string `json:"text"`
			} `json:"choices"`
		}
		if json.Unmarshal(ev, &ch) == nil && len(ch.Choices) == 1 {
			if _, ok := firsts[ch.Choices[0].Index]; !ok {
				firsts[ch.Choices[0].Index] = ch.Choices[0].Text
			}
		}
	}
	for j := range 2 * n {
		if got[j] != echoed.Choices[j].out() || firsts[j] != texts[1+j/n] {
			t.Errorf("streamed echo choice %d: %q (first delta %q), want %q starting with the prompt", j, got[j], firsts[j], echoed.Choices[j].out())
		}
	}
	s.waitAllFree()
	s.checkMustBeZero()
}

// TestE2ENAuditAndConstraints: the replay audit replays every choice of
// an n-choice answer like any answer (all match); an output constraint
// and a tool call hold per choice.
func TestE2ENAuditAndConstraints(t *testing.T) {
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}, auditRate: 1})
	s.postN(e2eKeyA, "/v1/completions", map[string]any{"prompt": nPrompt, "max_tokens": 12, "temperature": 1, "seed": 3, "n": 3}, 3)
	s.waitReplays(3)
	if m := s.metricValue("pagewarden_audit_mismatches_total"); m != 0 {
		t.Errorf("%v replay mismatches", m)
	}

	format := map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "pet", "strict": true, "schema": json.RawMessage(petSchema)}}
	r := s.postN(e2eKeyA, "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "A pet."}},
		"max_tokens": 120, "temperature": 1, "seed": 5, "n": 3, "response_format": format}, 3)
	for _, c := range r.Choices {
		checkStructured(t, grammar.JSONSchema, petSchema, c.out(), c.FinishReason)
	}

	tools := []any{json.RawMessage(`{"type":"function","function":{"name":"ping","parameters":{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"],"additionalProperties":false}}}`)}
	code, _, out := s.post(e2eKeyA, "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "ping"}},
		"max_tokens": 60, "temperature": 1, "seed": 1, "n": 3, "tools": tools, "tool_choice": "required"})
	var resp struct {
		Choices []struct {
			Index   int `json:"index"`
			Message struct {
				ToolCalls []struct {
					Function struct {
						Name, Arguments string
					} `json:"function"`
				} `json:"tool_calls"`
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
	}
	if code != 200 || json.Unmarshal(out, &resp) != nil || len(resp.Choices) != 3 {
		t.Fatalf("tools: %d %s", code, out)
	}
	called := 0
	for i, c := range resp.Choices {
		if c.Index != i || (c.FinishReason != "tool_calls" && c.FinishReason != "length") {
			t.Errorf("choice %d: %s", i, out)
		}
		if c.FinishReason == "tool_calls" {
			var args map[string]bool
			if len(c.Message.ToolCalls) != 1 || c.Message.ToolCalls[0].Function.Name != "ping" ||
				json.Unmarshal([]byte(c.Message.ToolCalls[0].Function.Arguments), &args) != nil {
				t.Errorf("choice %d: %s", i, out)
			}
			called++
		}
	}
	if called == 0 {
		t.Errorf("no choice finished its call: %s", out)
	}
	s.waitReplays(9) // every choice of the three requests, tool calls included
	if m := s.metricValue("pagewarden_audit_mismatches_total"); m != 0 {
		t.Errorf("%v replay mismatches", m)
	}
	s.waitAllFree()
	s.checkMustBeZero()
}

// TestE2ENPreemption: four choices that together need more KV pages than
// the pool holds (20 pages; each choice grows to 8) preempt each other,
// on poisoned pages, and each still equals its single answer (seed + i),
// computed alone without preemption; every page comes back.
func TestE2ENPreemption(t *testing.T) {
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config
	m.Close()
	pageBytes := kvcache.Layout{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: kvcache.DefaultPageSize}.PageBytes()
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true, MaxContext: 128, KVMemory: 20 * pageBytes}})
	base := map[string]any{"prompt": "Hello there friend", "max_tokens": 100, "ignore_eos": true, "temperature": 1, "seed": 1}
	before := s.stats().Core.Preemptions
	for _, stream := range []bool{false, true} {
		var texts []string
		if stream {
			st := s.stream(e2eKeyA, "/v1/completions", withBody(base, "n", 4))
			texts, _, _ = nEvents(t, st, 4)
		} else {
			for _, ch := range s.postN(e2eKeyA, "/v1/completions", withBody(base, "n", 4), 4).Choices {
				texts = append(texts, ch.out())
			}
		}
		s.waitAllFree()
		for i, got := range texts {
			one := s.postN(e2eKeyA, "/v1/completions", withBody(base, "seed", 1+i), 1)
			if got != one.Choices[0].out() {
				t.Errorf("stream %v choice %d: %q; alone with seed %d: %q", stream, i, got, 1+i, one.Choices[0].out())
			}
		}
		s.waitAllFree()
	}
	if p := s.stats().Core.Preemptions - before; p == 0 {
		t.Errorf("no preemption: the test did not test it")
	} else {
		t.Logf("%d preemptions", p)
	}
	s.checkMustBeZero()
}

// BenchmarkNChoices: four sampled answers to one long prompt on
// builtin:135m-q8_0 (serve's defaults: prefix cache on), as one n = 4
// request (the fan-out: the prompt computed once, the siblings attaching
// its pages) and as four concurrent single requests with distinct cache
// salts (the prompt computed four times). Each iteration uses a fresh
// salt, so the first computation is always a miss. Reports the prompt
// tokens computed per request (prompt tokens less the node's prefix-cache
// hits).
//
//	go test -run '^$' -bench BenchmarkNChoices -benchtime 3x ./internal/node
func BenchmarkNChoices(b *testing.B) {
	s := startE2E(b, e2eConfig{model: "135m-q8_0", node: benchNodeOptions(), direct: true, scrubAsGiven: true})
	prompt := strings.Repeat("Summarise the following notes about the meeting. ", 12)
	page := s.node.Limits().PageSize
	const n, maxTokens = 4, 8
	for _, mode := range []string{"fanout-n4", "four-singles"} {
		b.Run(mode, func(b *testing.B) {
			hits := s.stats().Pool.PrefixHitPages
			promptTokens := 0
			for it := range b.N {
				body := map[string]any{"prompt": prompt, "max_tokens": maxTokens, "temperature": 1, "seed": 1}
				salt := fmt.Sprintf("%s-%d", mode, it)
				if mode == "fanout-n4" {
					var r nBody
					s.postOK(e2eKeyA, "/v1/completions", withBody(body, "n", n, "cache_salt", salt), &r)
					if len(r.Choices) != n {
						b.Fatalf("%d choices", len(r.Choices))
					}
					promptTokens += n * r.Usage.PromptTokens
					continue
				}
				var wg sync.WaitGroup
				var mu sync.Mutex
				for i := range n {
					wg.Go(func() {
						var r nBody
						s.postOK(e2eKeyA, "/v1/completions", withBody(body, "seed", 1+i, "cache_salt", fmt.Sprint(salt, "-", i)), &r)
						mu.Lock()
						promptTokens += r.Usage.PromptTokens
						mu.Unlock()
					})
				}
				wg.Wait()
			}
			b.StopTimer()
			s.waitAllFree()
			saved := int(s.stats().Pool.PrefixHitPages-hits) * page
			b.ReportMetric(float64(promptTokens-saved)/float64(b.N), "prompt-tokens-computed/op")
		})
	}
}
