package sched

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/request"
)

// startWithViolation runs the first step of the requests queued so far
// plus one of tenant "victim" (prompt tokens), whose item fails with an
// isolation violation: its pages are quarantined. before runs between
// planning the step and advancing it.
func startWithViolation(t *testing.T, h *harness, prompt int, before func()) {
	t.Helper()
	v := h.submit(t, "victim", prompt, 4)
	h.failNext[v] = true
	h.failErr = errEngineViolation
	rd := h.ready(t)
	if before != nil {
		before()
	}
	h.finish(t, rd)
	if q := h.pool.Quarantined(); len(q) != h.lim.PagesFor(prompt) {
		t.Fatalf("quarantined %v, want the victim's %d pages", q, h.lim.PagesFor(prompt))
	}
}

// TestDegradedPoolShedsWhatCanNoLongerFit: with part of the pool
// quarantined and no reaper, a request that needs more than the rest is
// refused (a retryable overload), whether it arrives now or was already
// waiting; and it does not hold up the other tenants, whose requests fit.
func TestDegradedPoolShedsWhatCanNoLongerFit(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 20, pageSize: 4, pages: 6, batchTokens: 64})
	hog := h.submit(t, "hog", 4, 8)
	var waiting request.Owner
	startWithViolation(t, h, 5, func() {
		waiting = h.submit(t, "big", 17, 3) // up to 5 pages: fitted 6, not 4
	})
	if err := h.submitParams(h.mkParams("big", 17, 3)); !errors.Is(err, ErrPoolDegraded) || !errors.Is(err, request.ErrOverloaded) {
		t.Errorf("submission needing 5 of 4 pages: %v, want ErrPoolDegraded (an overload)", err)
	}
	var small []request.Owner
	for range 3 {
		small = append(small, h.submit(t, "small", 3, 2))
	}
	h.drain(t)
	if r := h.results[waiting]; r.Reason != request.FinishError || !errors.Is(r.Err, ErrPoolDegraded) {
		t.Errorf("the waiting request that no longer fits: %s %v", r.Reason, r.Err)
	}
	for _, o := range append(small, hog) {
		if r := h.results[o]; r.Reason != request.FinishLength {
			t.Errorf("%v: %+v", o, r)
		}
	}
	if _, err := h.core.ScrubQuarantined(); err != nil {
		t.Fatal(err)
	}
	h.checkFree(t)
}

// TestDegradedPoolEndsGrowthThatCannotFit: a running request that must
// grow beyond what the quarantine left ends with ErrPoolDegraded once it
// gets there, instead of preempting itself and starting over for ever;
// the tokens it produced stand.
func TestDegradedPoolEndsGrowthThatCannotFit(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 20, pageSize: 4, pages: 6, batchTokens: 64})
	long := h.submit(t, "long", 4, 16) // up to 5 pages
	startWithViolation(t, h, 5, nil)
	other := h.submit(t, "other", 3, 4)
	h.drain(t)
	r := h.results[long]
	if r.Reason != request.FinishError || !errors.Is(r.Err, ErrPoolDegraded) {
		t.Fatalf("long request: %s %v", r.Reason, r.Err)
	}
	if n := r.Usage.CompletionTokens; n != len(h.tokens[long]) || n < 12 {
		t.Errorf("long request ended after %d tokens (%d delivered), want it to run until it needed a 5th page", n, len(h.tokens[long]))
	}
	if r := h.results[other]; r.Reason != request.FinishLength {
		t.Errorf("other tenant: %+v", r)
	}
	if st := h.core.Stats(); st.Preemptions != 0 {
		t.Errorf("%d preemptions, want none: growing past the pool cannot be helped by preempting", st.Preemptions)
	}
}

// TestReaperWaitDoesNotHoldUpOtherTenants: with a reaper, a request that
// needs quarantined pages waits for them, but the other tenants' requests
// that fit run meanwhile instead of queueing behind it.
func TestReaperWaitDoesNotHoldUpOtherTenants(t *testing.T) {
	const after = time.Minute
	h := newHarness(t, harnessOpts{window: 20, pageSize: 4, pages: 6, batchTokens: 64, reapAfter: after})
	t0 := time.Unix(1000, 0)
	h.core.Tick(t0)
	startWithViolation(t, h, 5, nil)
	h.ready(t) // the victim's result
	big := h.submit(t, "big", 17, 3)
	small := h.submit(t, "small", 3, 2)
	h.step(t)
	if !slices.Contains(h.last, "small:3") {
		t.Fatalf("batch %v: the small request waits behind one that needs quarantined pages", h.last)
	}
	for h.results[small].Reason == request.FinishNone {
		h.step(t)
	}
	if st, _ := h.core.State(big); st != StateAdmitted {
		t.Fatalf("big request %s before the reaper ran, want it waiting", st)
	}
	h.core.Tick(t0.Add(after))
	h.drain(t)
	if r := h.results[big]; r.Reason != request.FinishLength {
		t.Errorf("big request after the reaper: %+v", r)
	}
	h.checkFree(t)
}
