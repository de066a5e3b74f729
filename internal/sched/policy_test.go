package sched

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched/ownerecho"
)

// TestReloadRaisesCapsOfABusyTenant: the incident's two-limits class
// across a reload. The gateway admits under the reloaded budget; the core
// must not refuse the same request under the budget the tenant had when it
// became active.
func TestReloadRaisesCapsOfABusyTenant(t *testing.T) {
	policy := map[request.Tenant]TenantPolicy{"a": {MaxPages: 2, MaxRunning: 1}}
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 32, batchTokens: 64, policy: policy})
	busy := h.submit(t, "a", 4, 4) // up to 2 pages
	h.step(t)

	policy["a"] = TenantPolicy{MaxPages: 6, MaxRunning: 2}
	h.core.UpdatePolicies()
	p := h.mkParams("a", 12, 8) // up to 5 pages
	if err := h.submitParams(p); err != nil {
		t.Fatalf("a request within the reloaded budget: %v", err)
	}
	h.step(t)
	if st, _ := h.core.State(p.Owner); !st.Running() {
		t.Fatalf("the new request is %s beside a running one, want it started (max_concurrent raised to 2)", st)
	}
	h.drain(t)
	for _, o := range []request.Owner{busy, p.Owner} {
		if r := h.results[o]; r.Reason != request.FinishLength {
			t.Errorf("%v: %+v", o, r)
		}
	}
	h.checkFree(t)
}

// TestReloadChangesPriorityOfABusyTenant: a raised priority orders the
// tenant's next request first although the tenant was already active.
func TestReloadChangesPriorityOfABusyTenant(t *testing.T) {
	policy := map[request.Tenant]TenantPolicy{}
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 32, batchTokens: 64, maxRunning: 3, policy: policy})
	h.submit(t, "a", 4, 20)
	h.submit(t, "b", 12, 20) // b holds more pages: a goes first on a tie
	h.step(t)
	a2 := h.submit(t, "a", 4, 4)
	policy["b"] = TenantPolicy{Priority: 5}
	h.core.UpdatePolicies()
	b2 := h.submit(t, "b", 4, 4)
	h.step(t) // one free slot
	if st, _ := h.core.State(b2); !st.Running() {
		t.Errorf("b's request is %s, want it started first (priority 5)", st)
	}
	if st, _ := h.core.State(a2); st != StateAdmitted {
		t.Errorf("a's request is %s, want it waiting", st)
	}
	h.drain(t)
	h.checkFree(t)
}

// TestReloadLowersCapsOfABusyTenant: lowered caps hold from the next step
// (the excess sequence is preempted, not failed), and a waiting request
// that can no longer fit the tenant's page cap ends with ErrQuota instead
// of running past it.
func TestReloadLowersCapsOfABusyTenant(t *testing.T) {
	policy := map[request.Tenant]TenantPolicy{"a": {MaxPages: 8, MaxRunning: 2}}
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 32, batchTokens: 64, policy: policy})
	a1 := h.submit(t, "a", 4, 12)
	a2 := h.submit(t, "a", 4, 12)
	h.step(t)
	a3 := h.submit(t, "a", 12, 9) // up to 5 pages: fits 8, not 4
	policy["a"] = TenantPolicy{MaxPages: 4, MaxRunning: 1}
	h.core.UpdatePolicies()
	if rd := h.step(t); !slices.Equal(rd.Preempted, []request.Owner{a2}) {
		t.Errorf("preempted %v, want the most recent sequence %v", rd.Preempted, a2)
	}
	h.drain(t)
	for _, o := range []request.Owner{a1, a2} {
		if r := h.results[o]; r.Reason != request.FinishLength {
			t.Errorf("%v: %+v", o, r)
		}
	}
	if r := h.results[a3]; r.Reason != request.FinishError || !errors.Is(r.Err, request.ErrQuota) {
		t.Errorf("request beyond the lowered cap: %s %v, want ErrQuota", r.Reason, r.Err)
	}
	h.checkFree(t)
}

// TestRecycledTenantIDStartsAfresh: an id handed to another customer does
// not give the new holder the previous holder's queue or caps. The
// previous holder's requests drain under the policy they had.
func TestRecycledTenantIDStartsAfresh(t *testing.T) {
	policy := map[request.Tenant]TenantPolicy{"a": {MaxRunning: 1, MaxQueued: 1, Customer: "x"}}
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 32, batchTokens: 64, policy: policy})
	x1 := h.submit(t, "a", 4, 10)
	h.step(t)
	x2 := h.submit(t, "a", 4, 4) // waits: x runs one at a time, and fills x's queue
	policy["a"] = TenantPolicy{MaxRunning: 1, MaxQueued: 1, Customer: "y"}
	h.core.UpdatePolicies()
	p := h.mkParams("a", 4, 4)
	if err := h.submitParams(p); err != nil {
		t.Fatalf("the new holder refused on the previous holder's queue: %v", err)
	}
	h.step(t)
	if st, _ := h.core.State(p.Owner); !st.Running() {
		t.Errorf("the new holder's request is %s, want it running beside the previous holder's", st)
	}
	if st, _ := h.core.State(x2); st != StateAdmitted {
		t.Errorf("the previous holder's second request is %s, want it waiting under its own cap", st)
	}
	h.drain(t)
	for _, o := range []request.Owner{x1, x2, p.Owner} {
		if r := h.results[o]; r.Reason != request.FinishLength {
			t.Errorf("%v: %+v", o, r)
		}
	}
	h.checkFree(t)
}

// TestNodeAppliesReloadedPolicy: the Node re-reads the policies when
// PolicyGeneration moves, before the submission that follows, so a request
// admitted under a raised budget is accepted while its tenant is busy.
func TestNodeAppliesReloadedPolicy(t *testing.T) {
	layout := ownerecho.Layout(4)
	lim, err := ComputeLimits(ModelShape{ContextLength: 32, Vocab: harnessVocab}, layout, 32, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kvcache.NewPool(kvcache.Config{Layout: layout, Pages: 32, Scrub: kvcache.ScrubPoison, VerifyScrub: true})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu     sync.Mutex
		budget = 2
		gen    atomic.Uint64
	)
	g := &gatedExecutor{echo: &echoExecutor{vocab: harnessVocab}, gate: make(chan struct{}), entered: make(chan struct{}, 1024)}
	n, err := NewNode(NodeConfig{
		Core: Config{Limits: lim, Pool: pool, MaxBatchTokens: 64, WatermarkPages: -1,
			Policy: func(request.Tenant) TenantPolicy {
				mu.Lock()
				defer mu.Unlock()
				return TenantPolicy{MaxPages: budget}
			}},
		Executor:         g,
		PolicyGeneration: gen.Load,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	busy := testParams("a", 4, 4, 1)
	s1, err := n.Submit(context.Background(), busy)
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered // the tenant is active, its first batch in flight
	mu.Lock()
	budget = 6
	mu.Unlock()
	gen.Add(1)
	big := testParams("a", 12, 8, 2) // up to 5 pages
	res := make(chan error, 1)
	var s2 *Stream
	go func() {
		var err error
		s2, err = n.Submit(context.Background(), big)
		res <- err
	}()
	for len(n.events) < 1 {
		runtime.Gosched() // the submission waits for the loop, busy still running
	}
	go func() {
		for {
			select {
			case g.gate <- struct{}{}:
			case <-ctx.Done():
				return
			}
		}
	}()
	if err := <-res; err != nil {
		t.Fatalf("a request within the reloaded budget: %v", err)
	}
	for _, c := range []struct {
		s *Stream
		p request.Params
	}{{s1, busy}, {s2, big}} {
		if _, r := collect(t, c.s, c.p); r.Reason != request.FinishLength {
			t.Errorf("%v: %+v", c.p.Owner, r)
		}
	}
}
