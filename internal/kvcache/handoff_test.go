package kvcache_test

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

func handoffPool(t *testing.T, dt kvcache.DType, pages int) *kvcache.Pool {
	t.Helper()
	l := kvcache.Layout{Layers: 3, KVHeads: 2, HeadDim: 4, PageSize: 4, DType: dt}
	p, err := kvcache.NewPool(kvcache.Config{Layout: l, Pages: pages, Scrub: kvcache.ScrubZero, VerifyScrub: true, ModelDigest: [32]byte{7}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// kvValue is what the test writes at (layer, position, element, k or v):
// distinct everywhere and never the scrub pattern.
func kvValue(seed, layer, pos, j int, v bool) float32 {
	x := float32(1 + seed*100000 + layer*10000 + pos*100 + j)
	if v {
		x = -x
	}
	return x / 8
}

// writeSeq writes n positions into s with kvValue, in steps of step.
func writeSeq(t *testing.T, p *kvcache.Pool, s *kvcache.Sequence, seed, n, step int) {
	t.Helper()
	l := p.Layout()
	dim := l.KVDim()
	for s.Len() < n {
		k := min(step, n-s.Len())
		if err := p.Reserve(s, k); err != nil {
			t.Fatal(err)
		}
		view, err := p.Begin(s, k)
		if err != nil {
			t.Fatal(err)
		}
		for pos := view.Start(); pos < view.Start()+k; pos++ {
			pg, row := pos/l.PageSize, pos%l.PageSize
			for layer := range l.Layers {
				for j := range dim {
					kv, vv := kvValue(seed, layer, pos, j, false), kvValue(seed, layer, pos, j, true)
					if l.DType == kvcache.F32 {
						view.K(layer, pg)[row*dim+j], view.V(layer, pg)[row*dim+j] = kv, vv
					} else {
						view.K16(layer, pg)[row*dim+j], view.V16(layer, pg)[row*dim+j] = f16(kv), f16(vv)
					}
				}
			}
		}
		if err := p.Commit(view); err != nil {
			t.Fatal(err)
		}
	}
}

// f16 converts small exact values (multiples of 1/8 below 2^10) to F16.
func f16(x float32) uint16 {
	b := math.Float32bits(x)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	return sign | uint16(exp)<<10 | uint16(b>>13&0x3ff)
}

// readAll returns every position's K and V of s through a View, as the
// forward pass would see them.
func readAll(t *testing.T, p *kvcache.Pool, s *kvcache.Sequence) []float32 {
	t.Helper()
	if err := p.Reserve(s, 1); err != nil {
		t.Fatal(err)
	}
	view, err := p.Begin(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	l := p.Layout()
	var out []float32
	for layer := range l.Layers {
		for pg := range view.NumPages() {
			if l.DType == kvcache.F32 {
				out = append(out, view.K(layer, pg)...)
				out = append(out, view.V(layer, pg)...)
			} else {
				for _, x := range append(view.K16(layer, pg), view.V16(layer, pg)...) {
					out = append(out, float32(x))
				}
			}
		}
	}
	return out
}

// exportAll exports every written page of s.
func exportAll(t *testing.T, p *kvcache.Pool, s *kvcache.Sequence) (pages [][]byte, filled []int) {
	t.Helper()
	ps := p.Layout().PageSize
	for i := 0; i*ps < s.Len(); i++ {
		b, f, err := p.ExportPage(nil, s, i)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != p.Layout().HandoffPageBytes(f) {
			t.Fatalf("page %d: %d bytes for %d positions", i, len(b), f)
		}
		pages, filled = append(pages, b), append(filled, f)
	}
	return pages, filled
}

// TestHandoffRoundTrip: pages exported from one pool and imported into
// another hold, through a View, exactly what the first pool's View showed.
func TestHandoffRoundTrip(t *testing.T) {
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
		for _, n := range []int{1, 3, 4, 5, 10, 12} {
			src, dst := handoffPool(t, dt, 8), handoffPool(t, dt, 8)
			// Another tenant's sequence in dst first, so that the
			// imported sequence does not start at page 1.
			other := dst.NewSequence(owner("other", 9))
			writeSeq(t, dst, other, 9, 6, 6)

			a := src.NewSequence(owner("acme", 1))
			writeSeq(t, src, a, 1, n, 3)
			pages, filled := exportAll(t, src, a)
			all, allFilled, err := src.ExportPages(a)
			if err != nil || fmt.Sprint(all, allFilled) != fmt.Sprint(pages, filled) {
				t.Fatalf("ExportPages differs from ExportPage page by page (%v)", err)
			}

			b := dst.NewSequence(owner("acme", 1))
			if err := dst.Reserve(b, n); err != nil {
				t.Fatal(err)
			}
			// Out of order, as a network may deliver them.
			for i := len(pages) - 1; i >= 0; i-- {
				if err := dst.ImportPage(b, i, filled[i], pages[i]); err != nil {
					t.Fatalf("%v n=%d: import %d: %v", dt, n, i, err)
				}
			}
			if b.Len() != 0 {
				t.Fatalf("imported pages count before the commit: Len %d", b.Len())
			}
			if err := dst.CommitImport(b, n); err != nil {
				t.Fatalf("%v n=%d: %v", dt, n, err)
			}
			if b.Len() != n {
				t.Fatalf("Len %d after committing %d", b.Len(), n)
			}
			want, got := readAll(t, src, a), readAll(t, dst, b)
			if len(want) != len(got) {
				t.Fatalf("%v n=%d: %d values, want %d", dt, n, len(got), len(want))
			}
			for i := range want {
				if math.Float32bits(want[i]) != math.Float32bits(got[i]) {
					t.Fatalf("%v n=%d: value %d is %v, want %v", dt, n, i, got[i], want[i])
				}
			}
			if err := dst.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestHandoffCommitRefusesMismatch: CommitImport accepts only pages that
// make up exactly the reserved sequence, and a refused handoff's pages go
// back scrubbed (VerifyScrub would quarantine them on reuse otherwise).
func TestHandoffCommitRefusesMismatch(t *testing.T) {
	const ps = 4
	src := handoffPool(t, kvcache.F32, 16)
	a := src.NewSequence(owner("acme", 1))
	writeSeq(t, src, a, 1, 10, 10)
	pages, filled := exportAll(t, src, a) // 4 + 4 + 2

	for _, tc := range []struct {
		name     string
		reserve  int   // positions reserved
		imports  []int // pages imported, by index into pages
		tokens   int   // positions committed
		importOK bool
	}{
		// The incident: 8 pages reserved, 1 page sent and committed as if
		// the sequence were what was reserved.
		{"incident: reserved 8 pages, 1 sent", 8 * ps, []int{0}, 8 * ps, true},
		{"incident: reserved 8 pages, 1 sent, 1 page committed", 8 * ps, []int{0}, ps, true},
		{"page missing", 10, []int{0, 2}, 10, true},
		{"more reserved than committed", 14, []int{0, 1, 2}, 10, true},
		{"total disagrees with last page", 10, []int{0, 1, 2}, 11, true},
		{"total shorter than pages", 10, []int{0, 1, 2}, 9, true},
		{"nothing imported", 10, nil, 10, true},
		{"zero tokens", 10, []int{0, 1, 2}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := handoffPool(t, kvcache.F32, 16)
			b := dst.NewSequence(owner("acme", 1))
			if err := dst.Reserve(b, tc.reserve); err != nil {
				t.Fatal(err)
			}
			for _, i := range tc.imports {
				if err := dst.ImportPage(b, i, filled[i], pages[i]); err != nil {
					t.Fatalf("import %d: %v", i, err)
				}
			}
			if err := dst.CommitImport(b, tc.tokens); !errors.Is(err, kvcache.ErrHandoff) {
				t.Fatalf("CommitImport: %v, want ErrHandoff", err)
			}
			if b.Len() != 0 {
				t.Fatalf("refused handoff left Len %d", b.Len())
			}
			if _, err := dst.Begin(b, 1); err != nil {
				t.Fatalf("Begin after a refused commit: %v", err) // length 0: nothing readable
			}
			dst.Release(b)
			// Every page is scrubbed: a fresh sequence over the whole
			// pool allocates them all, and VerifyScrub would have
			// quarantined any that kept imported bytes.
			c := dst.NewSequence(owner("next", 2))
			if err := dst.Reserve(c, 16*ps); err != nil {
				t.Fatal(err)
			}
			if v := dst.Violations(); v != 0 {
				t.Fatalf("%d violations: imported bytes survived the release", v)
			}
		})
	}
}

// TestHandoffImportRefusesBadPages: the page-level checks of ImportPage.
func TestHandoffImportRefusesBadPages(t *testing.T) {
	src := handoffPool(t, kvcache.F32, 16)
	a := src.NewSequence(owner("acme", 1))
	writeSeq(t, src, a, 1, 10, 10)
	pages, filled := exportAll(t, src, a)
	dst := handoffPool(t, kvcache.F32, 16)
	b := dst.NewSequence(owner("acme", 1))
	if err := dst.Reserve(b, 10); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		i, f   int
		data   []byte
		target error
	}{
		{"index past the reservation", 3, 4, pages[0], kvcache.ErrHandoff},
		{"negative index", -1, 4, pages[0], kvcache.ErrHandoff},
		{"no positions", 0, 0, nil, kvcache.ErrHandoff},
		{"more positions than a page", 0, 5, pages[0], kvcache.ErrHandoff},
		{"bytes short of the positions", 0, 4, pages[0][:len(pages[0])-1], kvcache.ErrHandoff},
		{"bytes of another fill", 2, 3, pages[2], kvcache.ErrHandoff},
	} {
		if err := dst.ImportPage(b, tc.i, tc.f, tc.data); !errors.Is(err, tc.target) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.target)
		}
	}
	// Valid imports still go through, and commit.
	for i := range pages {
		if err := dst.ImportPage(b, i, filled[i], pages[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := dst.CommitImport(b, 10); err != nil {
		t.Fatal(err)
	}
	// Nothing is imported into a committed sequence.
	if err := dst.ImportPage(b, 0, filled[0], pages[0]); !errors.Is(err, kvcache.ErrInvalid) {
		t.Errorf("import after commit: %v", err)
	}
	if err := dst.CommitImport(b, 10); !errors.Is(err, kvcache.ErrInvalid) {
		t.Errorf("second commit: %v", err)
	}
}

// TestHandoffReimportShorterScrubsTail: a page imported twice keeps only the
// second import's rows; the first one's longer tail is scrubbed.
func TestHandoffReimportShorterScrubsTail(t *testing.T) {
	src := handoffPool(t, kvcache.F32, 8)
	a := src.NewSequence(owner("acme", 1))
	writeSeq(t, src, a, 1, 4, 4)
	full, _ := exportAll(t, src, a)
	c := src.NewSequence(owner("acme", 2))
	writeSeq(t, src, c, 2, 2, 2)
	short, _ := exportAll(t, src, c)

	dst := handoffPool(t, kvcache.F32, 8)
	b := dst.NewSequence(owner("acme", 1))
	if err := dst.Reserve(b, 2); err != nil {
		t.Fatal(err)
	}
	if err := dst.ImportPage(b, 0, 4, full[0]); err != nil {
		t.Fatal(err)
	}
	if err := dst.ImportPage(b, 0, 2, short[0]); err != nil {
		t.Fatal(err)
	}
	if err := dst.CommitImport(b, 2); err != nil {
		t.Fatal(err)
	}
	dst.Release(b)
	d := dst.NewSequence(owner("next", 3))
	if err := dst.Reserve(d, 8*4); err != nil {
		t.Fatal(err)
	}
	if v := dst.Violations(); v != 0 {
		t.Fatalf("%d violations", v)
	}
}

// TestHandoffExportOnlyWritten: reserved positions are never exported
// (I3), and an export checks the sequence against the ledger first (I2).
func TestHandoffExportOnlyWritten(t *testing.T) {
	p := handoffPool(t, kvcache.F32, 8)
	a := p.NewSequence(owner("acme", 1))
	writeSeq(t, p, a, 1, 5, 5)
	if err := p.Reserve(a, 7); err != nil { // pages 2 and 3 reserved, unwritten
		t.Fatal(err)
	}
	if _, f, err := p.ExportPage(nil, a, 1); err != nil || f != 1 {
		t.Fatalf("page 1: filled %d, %v", f, err)
	}
	for _, i := range []int{2, 3, -1} {
		if _, _, err := p.ExportPage(nil, a, i); !errors.Is(err, kvcache.ErrInvalid) {
			t.Errorf("export of reserved page %d: %v", i, err)
		}
	}

	// A block table that names another tenant's page: the export is a
	// violation, nothing is returned, and the sequence's pages are
	// quarantined.
	lenient(t)
	victim := p.NewSequence(owner("victim", 2))
	writeSeq(t, p, victim, 2, 4, 4)
	kvcache.InjectPage(a, 0, victim, 0, false)
	b, _, err := p.ExportPage(nil, a, 0)
	if !errors.Is(err, kvcache.ErrViolation) || len(b) != 0 {
		t.Fatalf("export through a foreign page: %d bytes, %v", len(b), err)
	}
	if !a.Released() || p.Violations() != 1 {
		t.Fatalf("released %v, violations %d", a.Released(), p.Violations())
	}
}

// TestHandoffImportIntoForeignPage: a block table that names a page the
// sequence does not own is never written through (positive control of the
// ownership check in ImportPage).
func TestHandoffImportIntoForeignPage(t *testing.T) {
	lenient(t)
	p := handoffPool(t, kvcache.F32, 8)
	victim := p.NewSequence(owner("victim", 2))
	writeSeq(t, p, victim, 2, 4, 4)
	before := readAll(t, p, victim)

	src := handoffPool(t, kvcache.F32, 8)
	a := src.NewSequence(owner("acme", 1))
	writeSeq(t, src, a, 1, 4, 4)
	pages, filled := exportAll(t, src, a)

	b := p.NewSequence(owner("acme", 1))
	if err := p.Reserve(b, 4); err != nil {
		t.Fatal(err)
	}
	kvcache.InjectPage(b, 0, victim, 0, false)
	if err := p.ImportPage(b, 0, filled[0], pages[0]); !errors.Is(err, kvcache.ErrViolation) {
		t.Fatalf("import into a foreign page: %v", err)
	}
	after := readAll(t, p, victim)
	for i := range before {
		if before[i] != after[i] {
			t.Fatalf("victim's value %d changed from %v to %v", i, before[i], after[i])
		}
	}
}
