package sched

import (
	"errors"
	"testing"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// TestCrossedOutcomesAreCaught is the positive control of the owner echo:
// an executor that hands tenant a's outcome to tenant b's item (and back)
// must not get either delivered. Both requests end aborted with an internal
// error, their pages are quarantined, and the mismatch is counted.
func TestCrossedOutcomesAreCaught(t *testing.T) {
	defer invariants.SetStrict(invariants.SetStrict(false))
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 32, batchTokens: 64})
	a := h.submit(t, "a", 3, 6)
	b := h.submit(t, "b", 3, 6)
	rd := h.ready(t)
	if rd.Batch == nil || len(rd.Batch.Items) != 2 {
		t.Fatalf("want one batch with both requests, got %+v", rd.Batch)
	}
	outs, err := h.exec.Execute(nil, rd.Batch)
	if err != nil {
		t.Fatal(err)
	}
	outs[0], outs[1] = outs[1], outs[0]
	if err := h.core.Advance(rd.Batch, outs, nil); err != nil {
		t.Fatal(err)
	}
	h.drain(t)
	for _, o := range []request.Owner{a, b} {
		res := h.results[o]
		if res.Reason.Success() || !errors.Is(res.Err, request.ErrInternal) || !errors.Is(res.Err, kvcache.ErrViolation) {
			t.Errorf("%v ended %v (%v); want an internal error wrapping the violation", o, res.Reason, res.Err)
		}
		if n := len(h.tokens[o]); n != 0 {
			t.Errorf("%v was delivered %d tokens from a crossed batch", o, n)
		}
	}
	if st := h.core.Stats(); st.OwnerMismatches != 2 {
		t.Errorf("OwnerMismatches = %d, want 2", st.OwnerMismatches)
	}
	if q := h.pool.Stats().QuarantinedPages; q == 0 {
		t.Errorf("no page quarantined after crossed outcomes")
	}
}
