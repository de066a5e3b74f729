package sched

import (
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

// TestWindowGivesBackPages runs one long generation of a sliding-window
// model (the echo model reading the last W positions) and checks, after
// every step, that the sequence holds no more pages than its window needs
// (ceil(W/page)+1, plus a prefill chunk's), that the tenant is charged
// exactly those, that every token is the one the window's positions give
// (the executor also checks it never needs a page given back), and that
// every page comes back at the end. Without a window the same request
// holds every page it wrote.
func TestWindowGivesBackPages(t *testing.T) {
	const ps, prompt, gen = 4, 23, 80
	for _, tc := range []struct{ window, batch int }{{1, 64}, {3, 64}, {4, 64}, {5, 64}, {9, 64}, {9, 5}, {30, 7}, {0, 64}} {
		t.Run(fmt.Sprintf("window%d/batch%d", tc.window, tc.batch), func(t *testing.T) {
			h := newHarness(t, harnessOpts{window: 128, pageSize: ps, pages: 40, batchTokens: tc.batch, maxRunning: 4, attnWindow: tc.window})
			o := h.submit(t, "a", prompt, gen)
			most := 0
			for i := 0; !h.core.Idle(); i++ {
				if i > 1000 {
					t.Fatal("no end")
				}
				h.step(t)
				r := h.core.reqs[o]
				if r == nil || r.seq == nil {
					continue
				}
				held := r.seq.HeldPages()
				most = max(most, held)
				if r.pages != held || r.tenant.pages != held {
					t.Fatalf("holding %d pages, request charged %d, tenant %d", held, r.pages, r.tenant.pages)
				}
				bound := h.lim.PagesFor(r.seq.Len()) // no window: everything
				if tc.window > 0 {
					// The window's positions and a chunk beyond.
					bound = (tc.window-1+min(tc.batch, prompt)+ps-1)/ps + 1
				}
				if held > bound {
					t.Fatalf("length %d: holding %d pages, the window needs %d", r.seq.Len(), held, bound)
				}
			}
			if res := h.results[o]; res.Err != nil || res.Reason != request.FinishLength || len(h.tokens[o]) != gen {
				t.Fatalf("result %+v after %d tokens", res, len(h.tokens[o]))
			}
			if tc.window == 0 && most != h.lim.PagesFor(prompt+gen-1) {
				t.Fatalf("without a window the sequence held at most %d pages, want all %d", most, h.lim.PagesFor(prompt+gen-1))
			}
			if tc.window > 0 && most > (tc.window+ps-1)/ps+1+(min(tc.batch, prompt)+ps-1)/ps {
				t.Fatalf("held up to %d pages", most)
			}
			if v := h.pool.Violations(); v != 0 {
				t.Fatalf("%d violations", v)
			}
			h.checkFree(t)
		})
	}
}

// TestWindowRunsMoreAtOnce shows what giving pages back buys: requests
// whose full length would need most of the pool run side by side, with no
// preemption, when the model's window is short; the same requests without
// a window must take turns (preempting each other). Admission is the same
// in both (it sizes a request at its full length).
func TestWindowRunsMoreAtOnce(t *testing.T) {
	const ps, pages = 4, 24
	run := func(window int) Stats {
		h := newHarness(t, harnessOpts{window: 80, pageSize: ps, pages: pages, batchTokens: 64, maxRunning: 8, attnWindow: window})
		var owners []request.Owner
		for i := range 4 {
			owners = append(owners, h.submit(t, request.Tenant(fmt.Sprintf("t%d", i)), 6, 60))
		}
		h.drain(t)
		for _, o := range owners {
			if res := h.results[o]; res.Err != nil || len(h.tokens[o]) != 60 {
				t.Fatalf("window %d: %v ended with %+v after %d tokens", window, o, res, len(h.tokens[o]))
			}
		}
		h.checkFree(t)
		return h.core.Stats()
	}
	if st := run(8); st.Preemptions != 0 {
		t.Errorf("window 8: %d preemptions; 4 sequences of at most 4 pages fit %d pages", st.Preemptions, pages)
	}
	if st := run(0); st.Preemptions == 0 {
		t.Errorf("no window: 4 sequences of 66 positions (17 pages each) ran in %d pages with no preemption: the test has no power", pages)
	}
}

// TestWindowPrefixCache runs windowed requests of one tenant that share a
// prompt longer than the window, in one prefill step or in chunks (so the
// first pages are given back before the prompt is done): the first
// publishes its prompt's pages, in chunks before it gives them back; later
// ones attach the cached prefix, give back what their window leaves
// behind, and compute the same tokens.
func TestWindowPrefixCache(t *testing.T) {
	const ps, window, prompt = 4, 6, 30
	for _, batch := range []int{64, 8, 5} {
		t.Run(fmt.Sprintf("batch%d", batch), func(t *testing.T) {
			h := newHarness(t, harnessOpts{window: 128, pageSize: ps, pages: 40, batchTokens: batch, maxRunning: 4, attnWindow: window, prefix: true})
			base := h.mkParams("a", prompt, 10)
			var owners []request.Owner
			for i := range 3 {
				p := base
				p.Owner = h.owner("a")
				if err := h.submitParams(p); err != nil {
					t.Fatal(err)
				}
				owners = append(owners, p.Owner)
				if i == 0 {
					h.drain(t) // the first computes and publishes alone
				}
			}
			h.drain(t)
			for _, o := range owners[1:] {
				if fmt.Sprint(h.tokens[o]) != fmt.Sprint(h.tokens[owners[0]]) {
					t.Fatalf("%v generated %v, the first %v", o, h.tokens[o], h.tokens[owners[0]])
				}
				// Every full page of the prompt but the one holding
				// its last token, which is always computed.
				if got, want := h.results[o].Usage.CachedTokens, (prompt-1)/ps*ps; got != want {
					t.Errorf("%v: %d cached prompt tokens, want %d", o, got, want)
				}
			}
			if v := h.pool.Violations(); v != 0 {
				t.Fatalf("%d violations", v)
			}
			h.checkFree(t)
		})
	}
}

// TestWindowPrefillOnlyKeepsPages checks the handoff side: a prefill-only
// request of a windowed model gives nothing back, since its export carries
// every page of the prompt (the decode node commits an import only when
// every reserved page arrived), however long the prompt is next to the
// window.
func TestWindowPrefillOnlyKeepsPages(t *testing.T) {
	const ps, window, prompt = 4, 5, 37
	h := newHarness(t, harnessOpts{window: 128, pageSize: ps, pages: 40, batchTokens: 8, maxRunning: 4, attnWindow: window})
	p := h.mkParams("a", prompt, 4)
	a, err := h.lim.Admit(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.core.SubmitPrefill(a); err != nil {
		t.Fatal(err)
	}
	h.params[p.Owner] = p
	var exports int
	for i := 0; !h.core.Idle(); i++ {
		if i > 100 {
			t.Fatal("no end")
		}
		rd := h.ready(t)
		for _, ex := range rd.Exports {
			exports++
			if ex.Tokens != prompt || len(ex.Pages) != h.lim.PagesFor(prompt) {
				t.Fatalf("export of %d positions in %d pages, want %d in %d", ex.Tokens, len(ex.Pages), prompt, h.lim.PagesFor(prompt))
			}
		}
		h.finish(t, rd)
		if r := h.core.reqs[p.Owner]; r != nil && r.seq != nil && r.seq.DroppedPages() != 0 {
			t.Fatalf("a prefill-only sequence gave back %d pages", r.seq.DroppedPages())
		}
	}
	if exports != 1 {
		t.Fatalf("%d exports", exports)
	}
	h.checkFree(t)
}
