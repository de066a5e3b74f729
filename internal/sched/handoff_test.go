package sched

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// prefillOn runs p as a prefill-only request on h and returns its export.
func prefillOn(t *testing.T, h *harness, p request.Params) Export {
	t.Helper()
	a, err := h.lim.Admit(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.core.SubmitPrefill(a); err != nil {
		t.Fatal(err)
	}
	h.params[p.Owner] = p
	var exports []Export
	for i := 0; !h.core.Idle(); i++ {
		if i > 1000 {
			t.Fatal("prefill never finished")
		}
		rd := h.ready(t)
		exports = append(exports, rd.Exports...)
		h.finish(t, rd)
	}
	if len(exports) != 1 || exports[0].Owner != p.Owner {
		t.Fatalf("exports %+v", exports)
	}
	if res := h.results[p.Owner]; res.Reason != request.FinishLength || len(h.tokens[p.Owner]) != 1 {
		t.Fatalf("prefill result %+v, tokens %v", res, h.tokens[p.Owner])
	}
	h.checkFree(t)
	return exports[0]
}

// TestPrefillThenImport: a prompt prefilled on one core and imported into
// another decodes exactly what one core computing everything would (the
// owner-echo model checks every token against the history it must have
// read), with usage counting the first token once.
func TestPrefillThenImport(t *testing.T) {
	for _, tc := range []struct{ prompt, max, batch int }{{1, 5, 64}, {7, 4, 3}, {16, 3, 64}, {21, 6, 5}, {40, 1, 64}} {
		o := harnessOpts{window: 64, pageSize: 8, pages: 24, batchTokens: tc.batch, maxRunning: 8}
		pre, dec := newHarness(t, o), newHarness(t, o)
		p := pre.mkParams("acme", tc.prompt, tc.max)
		ex := prefillOn(t, pre, p)
		if ex.Tokens != tc.prompt || len(ex.Pages) != pre.lim.PagesFor(tc.prompt) || ex.FirstToken != pre.tokens[p.Owner][0] {
			t.Fatalf("export: %d tokens, %d pages, first %d", ex.Tokens, len(ex.Pages), ex.FirstToken)
		}

		a, err := dec.lim.Admit(p)
		if err != nil {
			t.Fatal(err)
		}
		pages, err := dec.core.Reserve(a)
		if err != nil {
			t.Fatal(err)
		}
		dec.params[p.Owner] = p
		if len(pages) != len(ex.Pages) {
			t.Fatalf("reserved %d pages for %d exported", len(pages), len(ex.Pages))
		}
		// Nothing runs while the import is pending.
		if rd := dec.ready(t); rd.Batch != nil {
			t.Fatalf("a batch ran before the import: %v", dec.last)
		}
		for i := len(ex.Pages) - 1; i >= 0; i-- {
			if err := dec.core.ImportPage(p.Owner, i, ex.Filled[i], ex.Pages[i]); err != nil {
				t.Fatal(err)
			}
		}
		if err := dec.core.CommitImport(p.Owner, ex.Tokens, ex.FirstToken, ex.FirstLogprobs); err != nil {
			t.Fatal(err)
		}
		dec.drain(t)
		res := dec.results[p.Owner]
		if !res.Reason.Success() || len(dec.tokens[p.Owner]) != res.Usage.CompletionTokens || res.Usage.PromptTokens != tc.prompt {
			t.Fatalf("decode result %+v, %d tokens", res, len(dec.tokens[p.Owner]))
		}
		if res.Reason == request.FinishLength && res.Usage.CompletionTokens != tc.max {
			t.Fatalf("%d tokens for max_tokens %d", res.Usage.CompletionTokens, tc.max)
		}
		dec.checkFree(t)
	}
}

// TestImportMismatchNeverDecodes: an import that is not exactly the
// reserved prompt (the incident: 8 pages reserved, 1 sent) ends the
// request with an error before a single token; its pages come back
// scrubbed (the pool verifies the scrub on reuse).
func TestImportMismatchNeverDecodes(t *testing.T) {
	o := harnessOpts{window: 128, pageSize: 8, pages: 40, batchTokens: 64, maxRunning: 8}
	pre := newHarness(t, o)
	short := pre.mkParams("acme", 8, 4) // one page
	ex := prefillOn(t, pre, short)

	for _, tc := range []struct {
		name    string
		reserve int   // prompt tokens of the reservation
		pages   []int // which exported pages to import
		tokens  int
		first   int
	}{
		{"incident: 1 page for 8 reserved", 64, []int{0}, 8, ex.FirstToken},
		{"incident, committed at the reserved length", 64, []int{0}, 64, ex.FirstToken},
		{"nothing imported", 64, nil, 64, ex.FirstToken},
		{"nothing imported, one page", 8, nil, 8, ex.FirstToken},
		{"first token outside the vocabulary", 8, []int{0}, 8, harnessVocab},
		{"negative first token", 8, []int{0}, 8, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := newHarness(t, o)
			p := dec.mkParams("acme", tc.reserve, 4)
			p.Owner = short.Owner
			if tc.reserve == len(short.Prompt) {
				p = short
			}
			a, err := dec.lim.Admit(p)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := dec.core.Reserve(a); err != nil {
				t.Fatal(err)
			}
			dec.params[p.Owner] = p
			for _, i := range tc.pages {
				if err := dec.core.ImportPage(p.Owner, i, ex.Filled[i], ex.Pages[i]); err != nil {
					t.Fatal(err)
				}
			}
			if err := dec.core.CommitImport(p.Owner, tc.tokens, tc.first, nil); !errors.Is(err, kvcache.ErrHandoff) {
				t.Fatalf("CommitImport: %v, want kvcache.ErrHandoff", err)
			}
			dec.drain(t)
			res := dec.results[p.Owner]
			if res.Reason != request.FinishError || !errors.Is(res.Err, kvcache.ErrHandoff) || len(dec.tokens[p.Owner]) != 0 {
				t.Fatalf("result %+v after %d tokens", res, len(dec.tokens[p.Owner]))
			}
			dec.checkFree(t)
			// The scrub is real: allocate the whole pool again.
			full := dec.pool.NewSequence(dec.owner("next"))
			if err := dec.pool.Reserve(full, 40*8); err != nil {
				t.Fatal(err)
			}
			if v := dec.pool.Violations(); v != 0 {
				t.Fatalf("%d pages kept the handoff's bytes", v)
			}
			// No second commit or page for an ended request.
			if err := dec.core.CommitImport(p.Owner, 8, ex.FirstToken, nil); !errors.Is(err, ErrHandoff) {
				t.Fatalf("commit after the end: %v", err)
			}
		})
	}
}

// TestReserveNeverQueues: a reservation is granted now or refused with
// nothing held, and a pending import is neither scheduled nor preempted,
// however short the pool runs.
func TestReserveNeverQueues(t *testing.T) {
	o := harnessOpts{window: 64, pageSize: 8, pages: 10, batchTokens: 64, maxRunning: 8}
	h := newHarness(t, o)
	p := h.mkParams("acme", 40, 8) // five pages
	a, _ := h.lim.Admit(p)
	pages, err := h.core.Reserve(a)
	if err != nil || len(pages) != 5 {
		t.Fatalf("reserve: %v, %d pages", err, len(pages))
	}
	h.params[p.Owner] = p
	q := h.mkParams("beta", 48, 8) // six pages: no room
	b, _ := h.lim.Admit(q)
	if _, err := h.core.Reserve(b); !errors.Is(err, request.ErrOverloaded) {
		t.Fatalf("second reserve: %v", err)
	}
	if _, known := h.core.State(q.Owner); known {
		t.Fatal("a refused reservation is still known")
	}
	// A local request that needs the whole pool must not take the
	// reservation's pages by preemption.
	r := h.submit(t, "beta", 30, 30)
	for range 20 {
		h.step(t)
	}
	if st, _ := h.core.State(p.Owner); st != StatePrefilling {
		t.Fatalf("reservation in state %v", st)
	}
	if err := h.core.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	// The client aborts the reservation: pages back, the other request
	// can now run.
	if err := h.core.Abort(p.Owner); err != nil {
		t.Fatal(err)
	}
	h.drain(t)
	if res := h.results[p.Owner]; res.Reason != request.FinishAbort {
		t.Fatalf("aborted reservation: %+v", res)
	}
	if res := h.results[r]; !res.Reason.Success() {
		t.Fatalf("local request: %+v", res)
	}
	h.checkFree(t)
}

// TestAbortWithViolationQuarantines: a reservation whose handoff could not
// be drained is ended with a violation cause, and its pages are
// quarantined, not freed.
func TestAbortWithViolationQuarantines(t *testing.T) {
	defer invariants.SetStrict(invariants.SetStrict(false))
	o := harnessOpts{window: 64, pageSize: 8, pages: 10, batchTokens: 64, maxRunning: 8}
	h := newHarness(t, o)
	p := h.mkParams("acme", 20, 4)
	a, _ := h.lim.Admit(p)
	if _, err := h.core.Reserve(a); err != nil {
		t.Fatal(err)
	}
	h.params[p.Owner] = p
	cause := fmt.Errorf("%w: a writer could not be drained", kvcache.ErrViolation)
	if err := h.core.abort(p.Owner, cause); err != nil {
		t.Fatal(err)
	}
	h.drain(t)
	if res := h.results[p.Owner]; res.Reason != request.FinishError {
		t.Fatalf("result %+v", res)
	}
	if st := h.pool.Stats(); st.QuarantinedPages != 3 {
		t.Fatalf("pool %+v, want the 3 reserved pages quarantined", st)
	}
}
