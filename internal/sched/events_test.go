package sched

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

// errorEvent is one of the error events, applied around a target
// request r.
type errorEvent struct {
	name  string
	apply func(t *testing.T, h *harness, r request.Owner, inFlight bool)
}

var errorEvents = []errorEvent{
	{"client-abort", func(t *testing.T, h *harness, r request.Owner, _ bool) {
		if err := h.core.Abort(r); err != nil && !errors.Is(err, request.ErrNotFound) {
			t.Fatalf("abort: %v", err)
		}
	}},
	{"admission-reject", func(t *testing.T, h *harness, r request.Owner, _ bool) {
		// A duplicate of r and an over-long request: both refused,
		// neither touches r.
		// (The core forgets a request once its result is out; ids are
		// unguessable and never reused by the gateway.)
		if _, known := h.core.State(r); known {
			if err := h.submitParams(h.params[r]); !errors.Is(err, ErrDuplicate) && !errors.Is(err, request.ErrShuttingDown) {
				t.Fatalf("duplicate: %v", err)
			}
		}
		if err := h.submitParams(h.mkParams(r.Tenant, h.lim.MaxContext, 1)); !errors.Is(err, request.ErrContextLength) {
			t.Fatalf("over-long request: %v", err)
		}
	}},
	{"out-of-pages", func(t *testing.T, h *harness, _ request.Owner, _ bool) {
		for range 2 {
			if err := h.submitParams(h.mkParams("hog", 20, 10)); err != nil && !errors.Is(err, request.ErrShuttingDown) {
				t.Fatal(err)
			}
		}
	}},
	{"preemption", func(t *testing.T, h *harness, r request.Owner, inFlight bool) {
		if rr := h.core.reqs[r]; rr != nil && rr.life.State().Running() && !rr.inFlight {
			h.core.preempt(rr)
		}
	}},
	{"internal-error", func(t *testing.T, h *harness, r request.Owner, _ bool) {
		h.failNext[r] = true
	}},
	{"shutdown", func(t *testing.T, h *harness, _ request.Owner, _ bool) {
		h.core.Shutdown()
	}},
}

// TestErrorEventSequences applies every sequence of up to three error
// events to a request that is queued, prefilling, decoding, or in a batch
// in flight, then runs to quiescence: the request ends in exactly one
// terminal state, an abort or shutdown that found it running makes it an
// abort (never a success, never overwritten), and every page comes back.
func TestErrorEventSequences(t *testing.T) {
	var seqs [][]int
	for n := 1; n <= 3; n++ {
		var rec func(prefix []int)
		rec = func(prefix []int) {
			if len(prefix) == n {
				seqs = append(seqs, append([]int(nil), prefix...))
				return
			}
			for e := range errorEvents {
				rec(append(prefix, e))
			}
		}
		rec(nil)
	}
	for _, phase := range []string{"queued", "prefilling", "decoding", "in-flight"} {
		for _, seq := range seqs {
			var names []string
			for _, e := range seq {
				names = append(names, errorEvents[e].name)
			}
			name := phase + "/" + strings.Join(names, ",")
			t.Run(name, func(t *testing.T) { runErrorSequence(t, phase, seq) })
		}
	}
}

func runErrorSequence(t *testing.T, phase string, seq []int) {
	h := newHarness(t, harnessOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 8})
	r := h.submit(t, "r", 12, 12)
	var pending Ready
	switch phase {
	case "prefilling":
		h.step(t)
	case "decoding":
		h.step(t)
		h.step(t)
	case "in-flight":
		h.step(t)
		h.step(t)
		pending = h.ready(t)
	}
	if st, _ := h.core.State(r); st != map[string]State{"queued": StateAdmitted, "prefilling": StatePrefilling, "decoding": StateDecoding, "in-flight": StateDecoding}[phase] {
		t.Fatalf("setup reached %s", st)
	}
	var wantCause error // the first abort-like event that found r live
	for i, e := range seq {
		st, known := h.core.State(r)
		live := known && !st.Terminal()
		errorEvents[e].apply(t, h, r, pending.Batch != nil)
		switch errorEvents[e].name {
		case "client-abort":
			if live && wantCause == nil {
				wantCause = request.ErrAborted
			}
		case "shutdown":
			if live && wantCause == nil {
				wantCause = request.ErrShuttingDown
			}
		}
		if i == 0 && pending.Batch != nil {
			h.finish(t, pending)
			pending = Ready{}
			continue
		}
		h.step(t)
	}
	h.finish(t, pending)
	h.drain(t)

	if n := h.nres[r]; n != 1 {
		t.Fatalf("%d results", n)
	}
	res := h.results[r]
	switch {
	case wantCause != nil:
		if res.Reason != request.FinishAbort || !errors.Is(res.Err, wantCause) {
			t.Errorf("result %s %v, want abort with %v", res.Reason, res.Err, wantCause)
		}
	case h.failed[r]:
		if res.Reason != request.FinishError || !errors.Is(res.Err, request.ErrInternal) {
			t.Errorf("result %s %v after an internal error", res.Reason, res.Err)
		}
	default:
		if res.Reason != request.FinishLength || len(h.tokens[r]) != 12 {
			t.Errorf("result %s %v with %d tokens, want length with 12", res.Reason, res.Err, len(h.tokens[r]))
		}
	}
	if res.Reason.Success() != (res.Err == nil) {
		t.Errorf("result %s with error %v", res.Reason, res.Err)
	}
	if _, known := h.core.State(r); known {
		t.Error("the core still holds the request after delivering its result")
	}
	h.checkFree(t)
	if s := fmt.Sprint(h.core.Stats().AbortedButCompleted); s != "0" {
		t.Errorf("aborted but completed: %s", s)
	}
}
