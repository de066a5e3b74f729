package kvcache_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// TestDropBefore checks which pages DropBefore gives back: the full,
// written pages wholly before pos, never the page holding the end nor a
// reserved one, each freed (and scrubbed: VerifyScrub re-checks the
// pattern when the page is handed out again), with the block table keeping
// its length so that positions and Reserve are unchanged.
func TestDropBefore(t *testing.T) {
	const ps = 4 // smallLayout
	cases := []struct {
		length, reserve, pos int
		want                 int // pages given back
	}{
		{length: 0, pos: 0, want: 0},
		{length: 10, pos: 0, want: 0},
		{length: 10, pos: 3, want: 0},  // page 0 still holds position 3
		{length: 10, pos: 4, want: 1},  // page 0 is [0,4)
		{length: 10, pos: 7, want: 1},  // page 1 holds 7
		{length: 10, pos: 8, want: 2},  // pages 0 and 1
		{length: 10, pos: 10, want: 2}, // page 2 holds the end (8, 9)
		{length: 12, pos: 12, want: 3}, // all written: the last full page too
		{length: 12, pos: 99, want: 3}, // never past what was written
		{length: 8, reserve: 8, pos: 16, want: 2},
		{length: 10, pos: -5, want: 0},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("len%d+%d/pos%d", tc.length, tc.reserve, tc.pos), func(t *testing.T) {
			p := newPool(t, kvcache.Config{Scrub: kvcache.ScrubPoison, VerifyScrub: true})
			s := p.NewSequence(owner("a", 1))
			if tc.length > 0 {
				step(t, p, s, tc.length, 3)
			}
			if err := p.Reserve(s, tc.reserve); err != nil {
				t.Fatal(err)
			}
			pages, free := s.NumPages(), p.FreePages()
			n, err := p.DropBefore(s, tc.pos)
			if err != nil || n != tc.want {
				t.Fatalf("DropBefore(%d) = %d, %v; want %d pages", tc.pos, n, err, tc.want)
			}
			if s.NumPages() != pages || s.HeldPages() != pages-n || s.DroppedPages() != n || p.FreePages() != free+n || s.Len() != tc.length {
				t.Fatalf("after: %d pages in the table (was %d), %d held, %d dropped, %d free (was %d), length %d",
					s.NumPages(), pages, s.HeldPages(), s.DroppedPages(), p.FreePages(), free, s.Len())
			}
			audit(t, p)
			// Again with the same bound: nothing more to give back.
			if n, err := p.DropBefore(s, tc.pos); n != 0 || err != nil {
				t.Fatalf("second DropBefore = %d, %v", n, err)
			}
			// The sequence goes on: a step after the drop, then the
			// freed pages are handed out again (scrub checked).
			step(t, p, s, 1, 5)
			other := p.NewSequence(owner("b", 2))
			if err := p.Reserve(other, p.FreePages()*ps); err != nil {
				t.Fatal(err)
			}
			if p.Violations() != 0 {
				t.Fatalf("%d violations: a page given back was not scrubbed", p.Violations())
			}
			p.Release(s)
			p.Release(other)
			audit(t, p)
			if p.FreePages() != p.TotalPages() {
				t.Fatalf("%d of %d pages free after release", p.FreePages(), p.TotalPages())
			}
		})
	}
}

// TestDroppedPageIsNeverRead checks that a View hands out nothing of the
// pages given back (the page may be another sequence's by now): an empty,
// non-nil slice, so that indexing it panics, while probing it still tells
// an F32 pool (K non-nil) from an F16 one and a live view from a stale one.
func TestDroppedPageIsNeverRead(t *testing.T) {
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
		t.Run(dt.String(), func(t *testing.T) {
			layout := smallLayout
			layout.DType = dt
			p := newPool(t, kvcache.Config{Layout: layout})
			s := p.NewSequence(owner("a", 1))
			step(t, p, s, 9, 1)
			if _, err := p.DropBefore(s, 8); err != nil {
				t.Fatal(err)
			}
			if err := p.Reserve(s, 1); err != nil {
				t.Fatal(err)
			}
			v, err := p.Begin(s, 1)
			if err != nil {
				t.Fatal(err)
			}
			if v.FirstPage() != 2 || v.NumPages() != 3 {
				t.Fatalf("view: first page %d, %d pages; want 2, 3", v.FirstPage(), v.NumPages())
			}
			f32 := dt == kvcache.F32
			for page := range 3 {
				k, k16, val, v16 := v.K(1, page), v.K16(1, page), v.V(0, page), v.V16(0, page)
				if (k != nil) != f32 || (val != nil) != f32 || (k16 != nil) == f32 || (v16 != nil) == f32 {
					t.Fatalf("page %d: K nil %v, K16 nil %v in a %v pool", page, k == nil, k16 == nil, dt)
				}
				n := max(len(k), len(k16), len(val), len(v16))
				if dropped := page < 2; dropped != (n == 0) {
					t.Errorf("page %d (given back %v) reads %d values", page, dropped, n)
				}
			}
			if p.Violations() != 0 {
				t.Fatalf("%d violations", p.Violations())
			}
			p.Release(s)
			audit(t, p)
		})
	}
}

// TestDropBeforeOwnership checks that DropBefore checks the sequence
// against the ledger first, like Begin: a block table naming someone
// else's page gives back nothing of the other's, quarantines s's pages and
// ends s with ErrViolation.
func TestDropBeforeOwnership(t *testing.T) {
	lenient(t)
	p := newPool(t, kvcache.Config{})
	a, b := p.NewSequence(owner("a", 1)), p.NewSequence(owner("b", 2))
	step(t, p, a, 12, 1)
	step(t, p, b, 12, 2)
	kvcache.InjectPage(a, 0, b, 0, false)
	if _, err := p.DropBefore(a, 8); !errors.Is(err, kvcache.ErrViolation) {
		t.Fatalf("DropBefore over a foreign page: %v, want ErrViolation", err)
	}
	if !a.Released() || b.Released() || b.HeldPages() != 3 {
		t.Fatalf("a released %v, b released %v holding %d pages", a.Released(), b.Released(), b.HeldPages())
	}
	if err := p.Reserve(b, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Begin(b, 1); err != nil {
		t.Fatalf("b after a's violation: %v", err)
	}
	// a's three pages: the two its table names and the first, which
	// the corrupted entry orphaned; none of b's.
	if got := len(p.Quarantined()); got != 3 {
		t.Errorf("%d pages quarantined, want a's own 3", got)
	}
	audit(t, p)
}

// TestDropBeforeShared checks a windowed sequence that started from the
// prefix cache: giving back a shared page drops its reference and leaves
// it cached for the tenant's next request; publishing skips pages given
// back; and a sequence that gave pages back can be neither forked nor
// exported (a handoff carries the whole prompt).
func TestDropBeforeShared(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 12})
	prompt := seqTokens(13, 0)
	first := p.NewSequence(owner("a", 1))
	step(t, p, first, 13, 1)
	if n := p.PublishPrefix(first, prompt, ""); n != 3 {
		t.Fatalf("published %d pages, want 3", n)
	}
	p.Release(first)

	s := p.NewSequence(owner("a", 2))
	if got := p.AttachPrefix(s, prompt, ""); got != 12 {
		t.Fatalf("attached %d positions, want 12", got)
	}
	step(t, p, s, 1, 2)
	if n, err := p.DropBefore(s, 9); n != 2 || err != nil {
		t.Fatalf("DropBefore = %d, %v", n, err)
	}
	audit(t, p)
	if st := p.Stats(); st.CachedPages != 2 || st.SharedPages != 3 {
		t.Fatalf("%d cached of %d shared pages, want 2 of 3", st.CachedPages, st.SharedPages)
	}
	if n := p.PublishPrefix(s, prompt, ""); n != 0 {
		t.Fatalf("publish after the drop indexed %d pages", n)
	}
	audit(t, p)
	if _, err := p.Fork(s, owner("a", 3)); !errors.Is(err, kvcache.ErrInvalid) {
		t.Errorf("Fork of a sequence with pages given back: %v, want ErrInvalid", err)
	}
	if _, _, err := p.ExportPages(s); !errors.Is(err, kvcache.ErrInvalid) {
		t.Errorf("ExportPages: %v, want ErrInvalid", err)
	}
	if _, _, err := p.ExportPage(nil, s, 0); !errors.Is(err, kvcache.ErrInvalid) {
		t.Errorf("ExportPage of a page given back: %v, want ErrInvalid", err)
	}
	if _, _, err := p.ExportPage(nil, s, 2); err != nil {
		t.Errorf("ExportPage of a page still held: %v", err)
	}
	// The next request of the tenant still finds the whole prefix.
	next := p.NewSequence(owner("a", 4))
	if got := p.AttachPrefix(next, prompt, ""); got != 12 {
		t.Fatalf("next request attached %d positions, want 12", got)
	}
	p.Release(s)
	p.Release(next)
	audit(t, p)
}

// TestWindowedGenerationHoldsFewPages is the property a windowed model's
// scheduler relies on: a sequence that gives back, after every step, the
// pages before Len()-window+1 never holds more than ceil(window/page)+1
// pages for its next one-token step, however long it runs, and every step
// still reads the last window positions (their values are checked).
func TestWindowedGenerationHoldsFewPages(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for range 40 {
		ps := 1 + r.IntN(6)
		w := 1 + r.IntN(20)
		prompt := 1 + r.IntN(30)
		layout := kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: 2, PageSize: ps}
		p := newPool(t, kvcache.Config{Layout: layout, Pages: (prompt+ps-1)/ps + (w+ps-1)/ps + 2, Scrub: kvcache.ScrubPoison, VerifyScrub: true})
		s := p.NewSequence(owner("a", 1))
		bound := (w+ps-1)/ps + 1
		step(t, p, s, prompt, 1)
		for pos := prompt; pos < prompt+200; pos++ {
			if _, err := p.DropBefore(s, s.Len()-w+1); err != nil {
				t.Fatal(err)
			}
			if err := p.Reserve(s, 1); err != nil {
				t.Fatalf("page %d, window %d, position %d: %v (holding %d)", ps, w, pos, err, s.HeldPages())
			}
			if s.HeldPages() > bound {
				t.Fatalf("page %d, window %d, position %d: holding %d pages, bound %d", ps, w, pos, s.HeldPages(), bound)
			}
			v, err := p.Begin(s, 1)
			if err != nil {
				t.Fatal(err)
			}
			// Every key the window sees is readable and written.
			for k := max(0, pos-w+1); k < pos; k++ {
				if x := v.K(0, k/ps)[k%ps*2]; x != 1 {
					t.Fatalf("position %d reads %v at key %d", pos, x, k)
				}
			}
			v.K(0, pos/ps)[pos%ps*2] = 1
			if err := p.Commit(v); err != nil {
				t.Fatal(err)
			}
		}
		audit(t, p)
		p.Release(s)
		if p.FreePages() != p.TotalPages() || p.Violations() != 0 {
			t.Fatalf("after release: %d of %d free, %d violations", p.FreePages(), p.TotalPages(), p.Violations())
		}
	}
}
