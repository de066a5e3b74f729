//go:build pw_mutants

package sched

import (
	"errors"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// catchViolation runs f and returns the invariant violation it panicked
// with, if any.
func catchViolation(t *testing.T, f func()) (v *invariants.Violation) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			err, ok := p.(error)
			if !ok || !errors.As(err, &v) {
				panic(p)
			}
		}
	}()
	f()
	return nil
}

// TestIncidentPlaceholderRejected reproduces the incident inside the core:
// a request aborted mid-prefill, its abort written to a side table, shrunk
// to a 1-token placeholder and put back in the queue with its state still
// "running". The queue accepts only Admitted requests holding no pages, so
// the re-queue is a broken invariant, caught at once. The same abort without
// the mutant is an ordinary transition to Aborted.
func TestIncidentPlaceholderRejected(t *testing.T) {
	for _, mut := range []mutant{mutantNone, mutantPlaceholderQueued} {
		h := newHarness(t, harnessOpts{window: 64, pageSize: 4, pages: 64, batchTokens: 8})
		o := h.submit(t, "victim", 40, 8)
		h.step(t) // first 8-token chunk: Prefilling, pages held
		if st, _ := h.core.State(o); st != StatePrefilling {
			t.Fatalf("state %s, want Prefilling", st)
		}
		h.core.setMutant(mut)
		v := catchViolation(t, func() { _ = h.core.Abort(o) })
		if mut == mutantNone {
			if v != nil {
				t.Fatalf("plain abort: %v", v)
			}
			h.drain(t)
			if r := h.results[o]; r.Reason != request.FinishAbort || !errors.Is(r.Err, request.ErrAborted) {
				t.Errorf("plain abort result: %+v", r)
			}
			h.checkFree(t)
			continue
		}
		if v == nil || !strings.Contains(v.Msg, "enqueue") || !strings.Contains(v.Msg, "Prefilling") {
			t.Fatalf("the placeholder re-queue was not rejected: %v", v)
		}
	}
}

// TestMutantsCaughtBySimulation is the positive control for the
// simulation's oracles: each re-introduction of the incident's bug class is
// caught, by the mechanism named.
func TestMutantsCaughtBySimulation(t *testing.T) {
	for _, tc := range []struct {
		name string
		mut  mutant
		want string // the oracle that must fire
	}{
		{"abort in a side table", mutantSideTable, "was aborted but reports success"},
		{"placeholder re-queued without a transition", mutantPlaceholderQueued, "enqueue of"},
		{"placeholder through a legal preemption", mutantPlaceholderPreempted, "it read KV that is not its own"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const seeds = 100
			caught := 0
			for seed := uint64(1); seed <= seeds; seed++ {
				_, err := runSeed(seed, tc.mut)
				if err == nil {
					continue
				}
				caught++
				// A request scoring its prompt (every fifth) shrunk to a
				// placeholder is caught first by its prompt logprobs'
				// count: the placeholder scored one prompt position.
				if !strings.Contains(err.Error(), tc.want) && !strings.Contains(err.Error(), "reports success") &&
					!strings.Contains(err.Error(), "prompt logprobs for") {
					t.Errorf("seed %d caught by an unexpected oracle: %v", seed, err)
				}
			}
			// A seed escapes only when no abort ever lands on a running
			// request; nearly all must catch it.
			if caught < seeds*9/10 {
				t.Errorf("mutant caught in %d of %d seeds", caught, seeds)
			}
		})
	}
}
