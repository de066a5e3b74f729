package kvcache_test

import (
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// TestQuarantineAnswer: after an answer's sequence ended, the pool names
// the pages and epochs it held; of those, the prefix-cache pages still
// alive with the same epoch are withdrawn (quarantined when nobody reads
// them, out of the index when someone does: no new attach), pages reused
// since are left alone, and an owner the pool never saw is not known.
func TestQuarantineAnswer(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 8})
	prompt := seqTokens(8, 1) // two full pages of 4
	a := p.NewSequence(owner("t", 1))
	step(t, p, a, 10, 1) // pages 0 and 1 full, page 2 partial
	if n := p.PublishPrefix(a, prompt, ""); n != 2 {
		t.Fatalf("published %d pages", n)
	}
	p.Release(a)
	// Another sequence of the tenant reads the first cached page.
	b := p.NewSequence(owner("t", 2))
	if got := p.AttachPrefix(b, append(prompt[:4:4], 99), ""); got != 4 {
		t.Fatalf("attach %d", got)
	}
	audit(t, p)

	pages, quarantined, withdrawn, ok := p.QuarantineAnswer(owner("t", 1))
	if !ok || len(pages) != 3 {
		t.Fatalf("pages %v, ok %v; want the 3 the answer held", pages, ok)
	}
	if quarantined != 1 || withdrawn != 1 {
		t.Fatalf("quarantined %d, withdrawn %d; want 1 (unread cached page) and 1 (page b reads)", quarantined, withdrawn)
	}
	if st := p.Stats(); st.QuarantinedPages != 1 {
		t.Fatalf("stats %+v", st)
	}
	audit(t, p)
	// Nothing of the answer is attachable any more.
	c := p.NewSequence(owner("t", 3))
	if got := p.AttachPrefix(c, append(prompt[:8:8], 99), ""); got != 0 {
		t.Fatalf("a suspect page was attached again: %d tokens", got)
	}
	p.Release(b)
	p.Release(c)
	audit(t, p)
	if st := p.Stats(); st.QuarantinedPages != 1 || st.SharedPages != 0 {
		t.Fatalf("after the readers ended: %+v", st)
	}
	// Asked again: the quarantined page is no longer shared, the freed
	// ones reused or free; nothing more to withdraw.
	if _, q, w, ok := p.QuarantineAnswer(owner("t", 1)); !ok || q+w != 0 {
		t.Fatalf("second call: %d quarantined, %d withdrawn", q, w)
	}
	if _, _, _, ok := p.QuarantineAnswer(owner("t", 99)); ok {
		t.Fatal("an owner the pool never saw is known")
	}
	if n, err := p.ScrubQuarantined(); n != 1 || err != nil {
		t.Fatalf("scrub: %d, %v", n, err)
	}
	audit(t, p)
}

// TestRecentSequencesBounded: the pool remembers a bounded number of
// ended sequences, forgetting the oldest first.
func TestRecentSequencesBounded(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 8})
	for i := range kvcache.RecentSequences + 10 {
		s := p.NewSequence(owner("t", uint32(i)))
		step(t, p, s, 1, 1)
		p.Release(s)
	}
	for _, tc := range []struct {
		i    int
		want bool
	}{{0, false}, {9, false}, {10, true}, {kvcache.RecentSequences + 9, true}} {
		if _, _, _, ok := p.QuarantineAnswer(owner("t", uint32(tc.i))); ok != tc.want {
			t.Errorf("sequence %d remembered %v, want %v", tc.i, ok, tc.want)
		}
	}
}
