package sched

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched/ownerecho"
)

// TestSubmitRefusals: every refusal at submission leaves the core and the
// pool as they were.
func TestSubmitRefusals(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 8,
		policy: map[request.Tenant]TenantPolicy{"small": {MaxPages: 2, MaxQueued: 1}}})
	other, err := ComputeLimits(ModelShape{ContextLength: 16}, ownerecho.Layout(4), 16, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	mk := func(tenant request.Tenant, prompt, max int) Admitted {
		a, err := h.lim.Admit(h.mkParams(tenant, prompt, max))
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	foreign, err := other.Admit(h.mkParams("a", 2, 2))
	if err != nil {
		t.Fatal(err)
	}
	dup := mk("a", 2, 2)
	if err := h.core.Submit(dup); err != nil {
		t.Fatal(err)
	}
	if err := h.core.Submit(mk("small", 2, 2)); err != nil { // fills small's queue of 1
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		a    Admitted
		want error
	}{
		{"zero value", Admitted{}, ErrNotAdmitted},
		{"other limits", foreign, ErrLimitsMismatch},
		{"duplicate", dup, ErrDuplicate},
		{"over the tenant's page cap", mk("small", 8, 8), request.ErrQuota},
		{"tenant queue full", mk("small", 2, 2), request.ErrOverloaded},
	} {
		before, stats := h.pool.Stats(), h.core.Stats()
		if err := h.core.Submit(tc.a); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		if diff := cmp.Diff(before, h.pool.Stats()); diff != "" {
			t.Errorf("%s changed the pool:\n%s", tc.name, diff)
		}
		if got := h.core.Stats(); got.Queued != stats.Queued || got.Running != stats.Running || got.Submitted != stats.Submitted {
			t.Errorf("%s changed the core: %+v -> %+v", tc.name, stats, got)
		}
	}
	h.core.Shutdown()
	if err := h.core.Submit(mk("a", 2, 2)); !errors.Is(err, request.ErrShuttingDown) {
		t.Errorf("after shutdown: %v", err)
	}
	h.drain(t)
	for o, r := range h.results {
		if r.Reason != request.FinishAbort || !errors.Is(r.Err, request.ErrShuttingDown) {
			t.Errorf("%v after shutdown: %+v", o, r)
		}
	}
	h.checkFree(t)
}

// TestAdmissionBoundaryTable runs DESIGN.md's table through admission and
// the core: accepted exactly when prompt + max_tokens ≤ W, the pool's
// counters unchanged after every rejection, and every accepted request
// generates exactly max_tokens tokens (nothing is ever truncated).
func TestAdmissionBoundaryTable(t *testing.T) {
	const W, ps = 32, 4
	h := newHarness(t, harnessOpts{window: W, pageSize: ps, pages: 2 * W / ps, batchTokens: 16})
	for _, prompt := range []int{0, 1, ps - 1, ps, ps + 1, W - 1, W, W + 1, 2 * W} {
		for _, maxTok := range []int{1, 2, ps, W - prompt, W - prompt + 1, W} {
			if maxTok < 1 {
				continue
			}
			p := h.mkParams("a", prompt, maxTok)
			before := h.pool.Stats()
			err := h.submitParams(p)
			accept := prompt >= 1 && prompt+maxTok <= W
			if (err == nil) != accept {
				t.Errorf("prompt %d + max_tokens %d (W %d): err %v, want accepted=%v", prompt, maxTok, W, err, accept)
			}
			if err != nil {
				if diff := cmp.Diff(before, h.pool.Stats()); diff != "" {
					t.Errorf("rejection of prompt %d + %d changed the pool:\n%s", prompt, maxTok, diff)
				}
				if prompt >= 1 && !errors.Is(err, request.ErrContextLength) {
					t.Errorf("prompt %d + %d: %v, want ErrContextLength", prompt, maxTok, err)
				}
				continue
			}
			h.drain(t)
			res := h.results[p.Owner]
			if res.Reason != request.FinishLength || len(h.tokens[p.Owner]) != maxTok || res.Usage.CompletionTokens != maxTok {
				t.Errorf("prompt %d + %d: %s with %d tokens, want length with %d", prompt, maxTok, res.Reason, len(h.tokens[p.Owner]), maxTok)
			}
		}
	}
	h.checkFree(t)
}

func TestAbortIsScopedToTheTenant(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 8})
	o := h.submit(t, "alice", 4, 8)
	h.step(t)
	before := h.pool.Stats()
	for _, intruder := range []request.Owner{{Tenant: "bob", ID: o.ID}, {Tenant: "alic", ID: o.ID}, {Tenant: "alice", ID: request.NewID()}} {
		if err := h.core.Abort(intruder); !errors.Is(err, request.ErrNotFound) {
			t.Errorf("abort as %v: %v, want ErrNotFound", intruder, err)
		}
	}
	if st, _ := h.core.State(o); st != StateDecoding || !cmp.Equal(before, h.pool.Stats()) {
		t.Fatalf("a refused abort changed something: state %s", st)
	}
	if err := h.core.Abort(o); err != nil {
		t.Fatal(err)
	}
	if err := h.core.Abort(o); err != nil {
		t.Errorf("second abort before delivery: %v (abort is idempotent)", err)
	}
	h.drain(t)
	if err := h.core.Abort(o); !errors.Is(err, request.ErrNotFound) {
		t.Errorf("abort after delivery: %v", err)
	}
	if r := h.results[o]; r.Reason != request.FinishAbort || h.nres[o] != 1 {
		t.Errorf("result %+v (%d results)", r, h.nres[o])
	}
	h.checkFree(t)
}

// TestContinuousBatchingAcrossTenants: one step carries the decode tokens of
// every running sequence of every tenant.
func TestContinuousBatchingAcrossTenants(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 64, pageSize: 4, pages: 64, batchTokens: 64})
	var owners []request.Owner
	for _, tenant := range []request.Tenant{"a", "b", "c"} {
		for range 2 {
			owners = append(owners, h.submit(t, tenant, 5, 10))
		}
	}
	h.step(t) // all six prefills in one batch
	if len(h.last) != 6 {
		t.Fatalf("first batch %v, want six prefills", h.last)
	}
	h.step(t)
	want := []string{"a:1", "a:1", "b:1", "b:1", "c:1", "c:1"}
	got := slices.Clone(h.last)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("decode batch (-want +got)\n%s", diff)
	}
	h.drain(t)
	for _, o := range owners {
		if len(h.tokens[o]) != 10 {
			t.Errorf("%v: %d tokens", o, len(h.tokens[o]))
		}
	}
}

// TestChunkedPrefillDoesNotStallDecode: a long prompt is computed in chunks
// within the step budget while a running sequence decodes every step.
func TestChunkedPrefillDoesNotStallDecode(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 64, pageSize: 4, pages: 64, batchTokens: 8})
	a := h.submit(t, "a", 3, 20)
	h.step(t)
	b := h.submit(t, "b", 40, 2)
	var trace []string
	for range 6 {
		h.step(t)
		trace = append(trace, strings.Join(h.last, " "))
	}
	want := []string{"a:1 b:7", "a:1 b:7", "a:1 b:7", "a:1 b:7", "a:1 b:7", "a:1 b:5"}
	if diff := cmp.Diff(want, trace); diff != "" {
		t.Errorf("steps (-want +got)\n%s", diff)
	}
	h.step(t) // delivers the last step's tokens
	if len(h.tokens[a]) != 7 || len(h.tokens[b]) != 1 {
		t.Errorf("a has %d tokens (want 7), b %d (want 1)", len(h.tokens[a]), len(h.tokens[b]))
	}
	h.drain(t)
}

// TestPreemptionPicksLowestPriorityMostRecent: when the pool runs out while
// sequences grow, the lowest-priority, most recently started sequence gives
// its pages back and is recomputed later, with the same output.
func TestPreemptionPicksLowestPriorityMostRecent(t *testing.T) {
	// 12 pages of 2 tokens; three requests of 2+12 positions cannot all
	// finish at once.
	h := newHarness(t, harnessOpts{window: 16, pageSize: 2, pages: 12, batchTokens: 64,
		policy: map[request.Tenant]TenantPolicy{"gold": {Priority: 1}}})
	low1 := h.submit(t, "free", 2, 13)
	gold := h.submit(t, "gold", 2, 13)
	low2 := h.submit(t, "free", 2, 13)
	var preempted []request.Owner
	for i := 0; !h.core.Idle(); i++ {
		if i > 1000 {
			t.Fatal("no quiescence")
		}
		rd := h.step(t)
		preempted = append(preempted, rd.Preempted...)
	}
	if len(preempted) == 0 || preempted[0] != low2 {
		t.Fatalf("preempted %v, want %v first", preempted, low2)
	}
	if slices.Contains(preempted, gold) {
		t.Errorf("the gold request was preempted: %v", preempted)
	}
	for _, o := range []request.Owner{low1, gold, low2} {
		if r := h.results[o]; r.Reason != request.FinishLength || len(h.tokens[o]) != 13 {
			t.Errorf("%v: %s with %d tokens", o, r.Reason, len(h.tokens[o]))
		}
	}
	h.checkFree(t)
}

// TestTenantCapsAndFairness: a tenant never runs over its caps, and a tenant
// that arrives later starts before the first tenant's backlog.
func TestTenantCapsAndFairness(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 16, pageSize: 4, pages: 64, batchTokens: 64, maxRunning: 3,
		policy: map[request.Tenant]TenantPolicy{"greedy": {MaxRunning: 2, MaxPages: 5}}})
	var greedy []request.Owner
	for range 6 {
		greedy = append(greedy, h.submit(t, "greedy", 8, 4))
	}
	h.step(t)
	if diff := cmp.Diff([]string{"greedy:8", "greedy:8"}, h.last); diff != "" {
		t.Errorf("greedy is capped at 2 running:\n%s", diff)
	}
	polite := h.submit(t, "polite", 4, 4)
	h.step(t)
	if !slices.Contains(h.last, "polite:4") {
		t.Errorf("the second tenant did not start next: %v", h.last)
	}
	h.drain(t)
	for _, o := range append(greedy, polite) {
		if len(h.tokens[o]) != 4 {
			t.Errorf("%v: %d tokens", o, len(h.tokens[o]))
		}
	}
}

// TestStarvationRelief: a tenant holding more than its share with several
// sequences gives one back when another tenant has nothing running.
func TestStarvationRelief(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 16, pageSize: 2, pages: 16, batchTokens: 64, maxRunning: 8})
	for range 4 {
		h.submit(t, "hog", 4, 12)
	}
	for range 3 {
		h.step(t)
	}
	late := h.submit(t, "late", 4, 2)
	var preempted []request.Owner
	started := false
	for range 3 {
		rd := h.step(t)
		preempted = append(preempted, rd.Preempted...)
		started = started || slices.Contains(h.last, "late:4")
	}
	if !started || len(preempted) == 0 || preempted[0].Tenant != "hog" {
		t.Fatalf("late tenant started %v, preempted %v", started, preempted)
	}
	h.drain(t)
	if len(h.tokens[late]) != 2 {
		t.Errorf("late: %d tokens", len(h.tokens[late]))
	}
	h.checkFree(t)
}

// TestAbortInFlightKeepsPagesUntilAdvance: an abort while a batch runs ends
// the request at once, but its pages go back only after the executor is
// done with them (I7: writers before free).
func TestAbortInFlightKeepsPagesUntilAdvance(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 8})
	o := h.submit(t, "a", 6, 8)
	rd := h.ready(t)
	if err := h.core.Abort(o); err != nil {
		t.Fatal(err)
	}
	if st, _ := h.core.State(o); st != StateAborted {
		t.Fatalf("state %s after abort", st)
	}
	if owned := h.pool.Stats().OwnedPages; owned == 0 {
		t.Fatal("pages were freed while the batch still runs")
	}
	h.finish(t, rd)
	h.ready(t)
	h.checkFree(t)
	if r := h.results[o]; r.Reason != request.FinishAbort || len(h.tokens[o]) != 0 {
		t.Errorf("result %+v, %d tokens (the in-flight sample must be dropped)", r, len(h.tokens[o]))
	}
}

func TestQueueTimeout(t *testing.T) {
	layout := ownerecho.Layout(4)
	lim, err := ComputeLimits(ModelShape{ContextLength: 16, Vocab: harnessVocab}, layout, 4, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kvcache.NewPool(kvcache.Config{Layout: layout, Pages: 4})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewCore(Config{Limits: lim, Pool: pool, MaxQueueWait: time.Second, WatermarkPages: -1})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(100, 0)
	c.Tick(t0)
	submit := func(id byte) request.Owner {
		o := request.Owner{Tenant: "a", ID: request.ID{id}}
		a, err := lim.Admit(request.Params{Owner: o, Prompt: make([]int, 12), MaxTokens: 4})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Submit(a); err != nil {
			t.Fatal(err)
		}
		return o
	}
	first, second := submit(1), submit(2)
	rd := c.Ready() // first takes 3 of 4 pages; second waits
	if rd.Batch == nil || len(rd.Batch.Items) != 1 || rd.Batch.Items[0].Owner != first {
		t.Fatalf("batch %+v", rd.Batch)
	}
	c.Tick(t0.Add(time.Second))
	if st, _ := c.State(second); st != StateAdmitted {
		t.Fatalf("second after exactly the limit: %s", st)
	}
	c.Tick(t0.Add(time.Second + 1))
	if st, _ := c.State(second); st != StateRejected {
		t.Fatalf("second after the limit: %s", st)
	}
	rd2 := c.Ready()
	if len(rd2.Results) != 1 || !errors.Is(rd2.Results[0].Err, request.ErrOverloaded) {
		t.Fatalf("results %+v", rd2.Results)
	}
	if err := c.Advance(rd.Batch, []Outcome{{Owner: rd.Batch.Items[0].Owner, Token: 1}}, nil); err != nil {
		t.Fatal(err)
	}
}

// TestExecutorFailures: an item error fails only its request; a batch
// error fails every request of the batch; wrong outcome counts and tokens
// outside the vocabulary are errors too. Pages always come back.
func TestExecutorFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		outs func(o []Outcome) ([]Outcome, error) // edits the echo model's outcomes
		fail []int                                // indexes of items whose request must fail
	}{
		{"item error", func(o []Outcome) ([]Outcome, error) {
			o[1].Err = errors.New("boom")
			return o, nil
		}, []int{1}},
		{"batch error", func([]Outcome) ([]Outcome, error) { return nil, errors.New("device lost") }, []int{0, 1, 2}},
		{"short outcomes", func(o []Outcome) ([]Outcome, error) { return o[:1], nil }, []int{0, 1, 2}},
		{"token outside vocab", func(o []Outcome) ([]Outcome, error) {
			o[2].Token = harnessVocab
			return o, nil
		}, []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 32, batchTokens: 64})
			var owners []request.Owner
			for i := range 3 {
				owners = append(owners, h.submit(t, request.Tenant(fmt.Sprint("t", i)), 3, 4))
			}
			rd := h.ready(t)
			echo, err := h.exec.Execute(nil, rd.Batch)
			if err != nil {
				t.Fatal(err)
			}
			outs, err := tc.outs(echo)
			if err := h.core.Advance(rd.Batch, outs, err); err != nil {
				t.Fatal(err)
			}
			if err := h.core.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
			h.drain(t)
			for i, o := range owners {
				r := h.results[o]
				failed := slices.Contains(tc.fail, i)
				if failed != (r.Reason == request.FinishError) || failed && !errors.Is(r.Err, request.ErrInternal) {
					t.Errorf("item %d: %+v, want failed=%v", i, r, failed)
				}
			}
			h.checkFree(t)
		})
	}
}

func TestAdvanceRejectsOtherBatches(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 32, batchTokens: 64})
	h.submit(t, "a", 3, 4)
	if err := h.core.Advance(&Batch{}, nil, nil); !errors.Is(err, ErrBatch) {
		t.Errorf("advance with no batch in flight: %v", err)
	}
	rd := h.ready(t)
	if err := h.core.Advance(&Batch{Step: rd.Batch.Step}, nil, nil); !errors.Is(err, ErrBatch) {
		t.Errorf("advance of a look-alike batch: %v", err)
	}
	if rd2 := h.core.Ready(); rd2.Batch != nil {
		t.Error("a second batch was planned while one is in flight")
	}
	h.finish(t, rd)
	h.drain(t)
}

// TestStopTokens: a request's stop tokens and the model's end tokens end
// generation with reason stop; the stop token is counted and emitted (the
// gateway hides end-of-generation text), so usage equals what was sent.
func TestStopTokens(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 32, batchTokens: 64})
	p := h.mkParams("a", 3, 10)
	// The echo model's third token for this prompt becomes a stop token.
	hist := slices.Clone(p.Prompt)
	for range 2 {
		hist = append(hist, echoNext(p.Owner, "", hist, harnessVocab))
	}
	p.StopTokens = []int{echoNext(p.Owner, "", hist, harnessVocab)}
	if slices.Contains(hist[3:], p.StopTokens[0]) {
		t.Skip("the stop token occurs earlier for this prompt")
	}
	if err := h.submitParams(p); err != nil {
		t.Fatal(err)
	}
	h.drain(t)
	r := h.results[p.Owner]
	if r.Reason != request.FinishStop || len(h.tokens[p.Owner]) != 3 || r.Usage.CompletionTokens != 3 {
		t.Errorf("result %+v with %d tokens, want stop after 3 emitted and counted", r, len(h.tokens[p.Owner]))
	}
}

// TestPrefixCacheServesSameTenantOnly: a second request of the same tenant
// with the same prompt is served from the cache; another tenant's is not.
func TestPrefixCacheServesSameTenantOnly(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 64, pageSize: 4, pages: 64, batchTokens: 64, prefix: true})
	p := h.mkParams("a", 17, 2)
	if err := h.submitParams(p); err != nil {
		t.Fatal(err)
	}
	h.drain(t)
	same, other := p, p
	same.Owner, other.Owner = h.owner("a"), h.owner("b")
	for _, q := range []request.Params{same, other} {
		if err := h.submitParams(q); err != nil {
			t.Fatal(err)
		}
	}
	h.drain(t)
	if got := h.results[same.Owner].Usage.CachedTokens; got != 16 {
		t.Errorf("same tenant cached %d tokens, want 16", got)
	}
	if got := h.results[other.Owner].Usage.CachedTokens; got != 0 {
		t.Errorf("other tenant cached %d tokens, want 0", got)
	}
	if !slices.Equal(h.tokens[same.Owner], h.tokens[p.Owner]) {
		t.Errorf("cached run differs: %v vs %v", h.tokens[same.Owner], h.tokens[p.Owner])
	}
	h.checkFree(t)
}
