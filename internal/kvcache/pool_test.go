package kvcache_test

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

var smallLayout = kvcache.Layout{Layers: 2, KVHeads: 2, HeadDim: 4, PageSize: 4}

func newPool(t testing.TB, cfg kvcache.Config) *kvcache.Pool {
	t.Helper()
	if cfg.Layout == (kvcache.Layout{}) {
		cfg.Layout = smallLayout
	}
	if cfg.Pages == 0 {
		cfg.Pages = 8
	}
	p, err := kvcache.NewPool(cfg)
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	return p
}

// lenient turns strict invariants off for a test that provokes violations
// on purpose (positive controls), and restores the setting afterwards.
func lenient(t *testing.T) {
	prev := invariants.SetStrict(false)
	t.Cleanup(func() { invariants.SetStrict(prev) })
}

func audit(t *testing.T, p *kvcache.Pool) {
	t.Helper()
	if err := p.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// step reserves, begins, fills every new position of every layer with val
// and commits.
func step(t *testing.T, p *kvcache.Pool, s *kvcache.Sequence, n int, val float32) {
	t.Helper()
	if err := p.Reserve(s, n); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	v, err := p.Begin(s, n)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	fillWindow(v, val)
	if err := p.Commit(v); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func fillWindow(v *kvcache.View, val float32) {
	l := v.Layout()
	ps, kvd := l.PageSize, l.KVDim()
	for pos := v.Start(); pos < v.Start()+v.N(); pos++ {
		pg, off := pos/ps, (pos%ps)*kvd
		for layer := range l.Layers {
			for e := range kvd {
				if l.DType == kvcache.F32 {
					v.K(layer, pg)[off+e] = val
					v.V(layer, pg)[off+e] = -val
				} else {
					v.K16(layer, pg)[off+e] = uint16(val)
					v.V16(layer, pg)[off+e] = uint16(val) + 1
				}
			}
		}
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  kvcache.Config
		ok   bool
	}{
		{"default page size", kvcache.Config{Layout: kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: 1}, Pages: 1}, true},
		{"no pages", kvcache.Config{Layout: smallLayout}, false},
		{"negative pages", kvcache.Config{Layout: smallLayout, Pages: -1}, false},
		{"bad layout", kvcache.Config{Layout: kvcache.Layout{Layers: 0, KVHeads: 1, HeadDim: 1}, Pages: 1}, false},
		{"none without opt-in", kvcache.Config{Layout: smallLayout, Pages: 1, Scrub: kvcache.ScrubNone}, false},
		{"none with opt-in", kvcache.Config{Layout: smallLayout, Pages: 1, Scrub: kvcache.ScrubNone, AllowNoScrub: true}, true},
		{"verify without scrub", kvcache.Config{Layout: smallLayout, Pages: 1, Scrub: kvcache.ScrubNone, AllowNoScrub: true, VerifyScrub: true}, false},
		{"unknown policy", kvcache.Config{Layout: smallLayout, Pages: 1, Scrub: 9}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := kvcache.NewPool(tc.cfg)
			if (err == nil) != tc.ok {
				t.Fatalf("NewPool: %v, want ok=%v", err, tc.ok)
			}
			if err != nil {
				if !errors.Is(err, kvcache.ErrConfig) && !errors.Is(err, kvcache.ErrLayout) {
					t.Errorf("error %v wraps neither ErrConfig nor ErrLayout", err)
				}
				return
			}
			if p.Layout().PageSize < 1 || p.TotalPages() != tc.cfg.Pages || p.FreePages() != tc.cfg.Pages {
				t.Errorf("pool: layout %+v, %d total, %d free", p.Layout(), p.TotalPages(), p.FreePages())
			}
		})
	}
}

func TestParseScrubPolicy(t *testing.T) {
	for _, pol := range []kvcache.ScrubPolicy{kvcache.ScrubZero, kvcache.ScrubPoison, kvcache.ScrubNone} {
		got, err := kvcache.ParseScrubPolicy(pol.String())
		if err != nil || got != pol {
			t.Errorf("ParseScrubPolicy(%q) = %v, %v", pol.String(), got, err)
		}
	}
	if _, err := kvcache.ParseScrubPolicy("Zero"); !errors.Is(err, kvcache.ErrConfig) {
		t.Errorf("ParseScrubPolicy(Zero): %v", err)
	}
}

// TestLifecycle walks one sequence through reserve, steps, and release,
// checking lengths, view windows and the ledger along the way.
func TestLifecycle(t *testing.T) {
	p := newPool(t, kvcache.Config{})
	s := p.NewSequence(owner("a", 1))
	if err := p.Reserve(s, 10); err != nil {
		t.Fatal(err)
	}
	// Reserved is not written (I3).
	if s.Len() != 0 || s.NumPages() != 3 || s.Capacity() != 12 {
		t.Fatalf("after Reserve(10): Len %d, pages %d, capacity %d", s.Len(), s.NumPages(), s.Capacity())
	}
	audit(t, p)
	v, err := p.Begin(s, 6)
	if err != nil {
		t.Fatal(err)
	}
	// The window reaches two pages; the third (reserved) is not in it.
	if v.Start() != 0 || v.N() != 6 || v.NumPages() != 2 || v.PageSize() != 4 {
		t.Fatalf("view start %d n %d pages %d", v.Start(), v.N(), v.NumPages())
	}
	kvd := smallLayout.KVDim()
	if got := [2]int{len(v.K(0, 0)), len(v.V(1, 1))}; got != [2]int{4 * kvd, 2 * kvd} {
		t.Fatalf("page slices %v, want full page then 2 positions", got)
	}
	if v.K16(0, 0) != nil {
		t.Fatal("K16 of an F32 pool is not nil")
	}
	fillWindow(v, 3)
	if err := p.Commit(v); err != nil {
		t.Fatal(err)
	}
	audit(t, p)
	if s.Len() != 6 {
		t.Fatalf("Len after commit %d", s.Len())
	}
	var filled []int
	for _, id := range s.Pages() {
		info, ok := p.Page(id)
		if !ok || info.State != kvcache.PageOwned || info.Owner != owner("a", 1) {
			t.Fatalf("page %d: %+v", id, info)
		}
		filled = append(filled, info.Filled)
	}
	if diff := cmp.Diff([]int{4, 2, 0}, filled); diff != "" {
		t.Fatalf("filled (-want +got):\n%s", diff)
	}
	// A decode step reads the 6 written positions and the new one, and
	// nothing else.
	v, err = p.Begin(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if v.Start() != 6 || len(v.K(0, 1)) != 3*kvd || v.K(0, 0)[0] != 3 || v.V(1, 1)[2*kvd-1] != -3 {
		t.Fatalf("decode view: start %d, page 1 has %d elements", v.Start(), len(v.K(0, 1)))
	}
	st := p.Stats()
	if st.OwnedPages != 3 || st.FreePages != 5 || st.TenantPages["a"] != 3 || st.Sequences != 1 {
		t.Fatalf("stats %+v", st)
	}
	p.Release(s)
	p.Release(s) // idempotent
	audit(t, p)
	if st := p.Stats(); st.FreePages != 8 || st.Scrubs != 3 || len(st.TenantPages) != 0 || st.Sequences != 0 {
		t.Fatalf("after release: %+v", st)
	}
	if err := p.Commit(v); !errors.Is(err, kvcache.ErrReleased) {
		t.Fatalf("Commit after release: %v", err)
	}
}

// TestViewBounds: reading beyond the written positions or the window is an
// index panic, never a stale read.
func TestViewBounds(t *testing.T) {
	p := newPool(t, kvcache.Config{})
	s := p.NewSequence(owner("a", 1))
	if err := p.Reserve(s, 32); err != nil { // 8 pages reserved
		t.Fatal(err)
	}
	v, err := p.Begin(s, 1) // the incident: 8 reserved, 1 written
	if err != nil {
		t.Fatal(err)
	}
	kvd := smallLayout.KVDim()
	for _, tc := range []struct {
		name string
		read func()
	}{
		{"position past the window in page 0", func() { _ = v.K(0, 0)[kvd] }},
		{"reslice past the window", func() { k := v.K(0, 0); _ = k[:kvd+1] }},
		{"reserved page 1", func() { _ = v.K(0, 1) }},
		{"reserved page 7", func() { _ = v.V(1, 7) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("read succeeded")
				}
			}()
			tc.read()
		})
	}
}

func TestStaleView(t *testing.T) {
	lenient(t)
	p := newPool(t, kvcache.Config{})
	s := p.NewSequence(owner("a", 1))
	step(t, p, s, 2, 1)
	if err := p.Reserve(s, 1); err != nil {
		t.Fatal(err)
	}
	v1, err := p.Begin(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	// A failed step is begun again: the first view is stale.
	v2, err := p.Begin(s, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(v1); !errors.Is(err, kvcache.ErrStaleView) {
		t.Fatalf("Commit of a superseded view: %v", err)
	}
	if err := p.Commit(v2); err != nil {
		t.Fatal(err)
	}
	// Reading through a view after its commit is a violation: in
	// production the slice is nil (an index panic at the caller), in
	// tests a panic.
	if k := v2.K(0, 0); k != nil {
		t.Fatal("stale view returned data")
	}
	if p.Violations() != 1 {
		t.Fatalf("violations %d, want 1", p.Violations())
	}
	invariants.SetStrict(true)
	defer func() {
		var viol *invariants.Violation
		if r := recover(); r == nil || !errors.As(r.(error), &viol) {
			t.Fatalf("strict stale read: recovered %v", r)
		}
	}()
	_ = v1.V(0, 0)
}

func TestReserveAllOrNothing(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 4})
	a := p.NewSequence(owner("a", 1))
	if err := p.Reserve(a, 12); err != nil {
		t.Fatal(err)
	}
	b := p.NewSequence(owner("b", 1))
	if err := p.Reserve(b, 8); !errors.Is(err, kvcache.ErrNoPages) {
		t.Fatalf("Reserve beyond free pages: %v", err)
	}
	if b.NumPages() != 0 || p.FreePages() != 1 {
		t.Fatalf("failed Reserve left %d pages on b, %d free", b.NumPages(), p.FreePages())
	}
	for _, n := range []int{-1} {
		if err := p.Reserve(b, n); !errors.Is(err, kvcache.ErrInvalid) {
			t.Errorf("Reserve(%d): %v", n, err)
		}
	}
	if err := p.Reserve(b, math.MaxInt); !errors.Is(err, kvcache.ErrNoPages) {
		t.Errorf("Reserve(MaxInt): %v", err)
	}
	if err := p.Reserve(b, 0); err != nil || b.NumPages() != 0 {
		t.Errorf("Reserve(0): %v, %d pages", err, b.NumPages())
	}
	audit(t, p)
}

func TestBeginArguments(t *testing.T) {
	p := newPool(t, kvcache.Config{})
	q := newPool(t, kvcache.Config{})
	s := p.NewSequence(owner("a", 1))
	if err := p.Reserve(s, 4); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Begin(s, 0); !errors.Is(err, kvcache.ErrInvalid) {
		t.Errorf("Begin(0): %v", err)
	}
	if _, err := q.Begin(s, 1); !errors.Is(err, kvcache.ErrWrongPool) {
		t.Errorf("Begin on another pool: %v", err)
	}
	if _, err := p.Begin(nil, 1); !errors.Is(err, kvcache.ErrInvalid) {
		t.Errorf("Begin(nil): %v", err)
	}
	if err := p.Commit(nil); !errors.Is(err, kvcache.ErrInvalid) {
		t.Errorf("Commit(nil): %v", err)
	}
	if p.Violations() != 0 {
		t.Fatalf("argument errors counted as violations: %d", p.Violations())
	}
}

// TestBeginPastReservation: a window beyond what was reserved is a
// violation (the scheduler must reserve first), never a write into pages
// the sequence does not hold.
func TestBeginPastReservation(t *testing.T) {
	lenient(t)
	p := newPool(t, kvcache.Config{})
	s := p.NewSequence(owner("a", 1))
	step(t, p, s, 3, 1)
	_, err := p.Begin(s, 2) // 3+2 > 4 reserved positions
	if !errors.Is(err, kvcache.ErrViolation) {
		t.Fatalf("Begin past the reservation: %v", err)
	}
	if !s.Released() || p.Stats().QuarantinedPages != 1 || p.Violations() != 1 {
		t.Fatalf("after violation: released %v, stats %+v", s.Released(), p.Stats())
	}
	audit(t, p)
}

func TestFreshPagesReadScrubPattern(t *testing.T) {
	for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
		for _, pol := range []kvcache.ScrubPolicy{kvcache.ScrubZero, kvcache.ScrubPoison} {
			t.Run(dt.String()+"/"+pol.String(), func(t *testing.T) {
				l := smallLayout
				l.DType = dt
				p := newPool(t, kvcache.Config{Layout: l, Pages: 2, Scrub: pol})
				// Never-used pages, then pages released by another
				// tenant, must both read as the pattern.
				for round := range 2 {
					s := p.NewSequence(owner("b", uint32(round)))
					if err := p.Reserve(s, 8); err != nil {
						t.Fatal(err)
					}
					v, err := p.Begin(s, 8)
					if err != nil {
						t.Fatal(err)
					}
					for layer := range l.Layers {
						for pg := range 2 {
							if !isPattern(v, layer, pg, pol) {
								t.Fatalf("round %d layer %d page %d does not read as %v", round, layer, pg, pol)
							}
						}
					}
					fillWindow(v, 7)
					if err := p.Commit(v); err != nil {
						t.Fatal(err)
					}
					p.Release(s)
				}
			})
		}
	}
}

func isPattern(v *kvcache.View, layer, pg int, pol kvcache.ScrubPolicy) bool {
	if v.Layout().DType == kvcache.F32 {
		for _, a := range [][]float32{v.K(layer, pg), v.V(layer, pg)} {
			for _, x := range a {
				if pol == kvcache.ScrubPoison && !math.IsNaN(float64(x)) || pol == kvcache.ScrubZero && math.Float32bits(x) != 0 {
					return false
				}
			}
		}
		return true
	}
	want := uint16(0)
	if pol == kvcache.ScrubPoison {
		want = 0x7E00 // an F16 quiet NaN
	}
	for _, a := range [][]uint16{v.K16(layer, pg), v.V16(layer, pg)} {
		for _, x := range a {
			if x != want {
				return false
			}
		}
	}
	return true
}

// TestScrubNone: without scrub a released page keeps its data; the policy
// exists for measurement and needs the explicit opt-in.
func TestScrubNone(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 1, Scrub: kvcache.ScrubNone, AllowNoScrub: true})
	a := p.NewSequence(owner("a", 1))
	step(t, p, a, 4, 42)
	p.Release(a)
	b := p.NewSequence(owner("b", 1))
	if err := p.Reserve(b, 4); err != nil {
		t.Fatal(err)
	}
	v, err := p.Begin(b, 4)
	if err != nil {
		t.Fatal(err)
	}
	if v.K(0, 0)[0] != 42 || p.Stats().Scrubs != 0 {
		t.Fatalf("ScrubNone scrubbed: read %v, %d scrubs", v.K(0, 0)[0], p.Stats().Scrubs)
	}
}

func TestAbortQuarantinesOnViolation(t *testing.T) {
	p := newPool(t, kvcache.Config{})
	a := p.NewSequence(owner("a", 1))
	step(t, p, a, 6, 9)
	b := p.NewSequence(owner("a", 2))
	step(t, p, b, 2, 9)

	p.Abort(b, request.ErrAborted) // an ordinary abort frees
	if st := p.Stats(); st.QuarantinedPages != 0 || st.FreePages != 6 {
		t.Fatalf("ordinary abort: %+v", st)
	}
	ids := a.Pages()
	p.Abort(a, kvcache.ErrViolation)
	audit(t, p)
	if diff := cmp.Diff(ids, p.Quarantined()); diff != "" {
		t.Fatalf("quarantined (-want +got):\n%s", diff)
	}
	info, _ := p.Page(ids[0])
	if info.State != kvcache.PageQuarantined || info.Owner != owner("a", 1) {
		t.Fatalf("quarantined page keeps its last owner for forensics: %+v", info)
	}
	// Quarantined pages are not allocatable until scrubbed.
	if p.FreePages() != 6 {
		t.Fatalf("quarantined pages counted as free: %d", p.FreePages())
	}
	n, err := p.ScrubQuarantined(ids[0], 99)
	if n != 1 || !errors.Is(err, kvcache.ErrNotQuarantined) {
		t.Fatalf("ScrubQuarantined(%d, 99): %d, %v", ids[0], n, err)
	}
	if n, err := p.ScrubQuarantined(); n != 1 || err != nil {
		t.Fatalf("ScrubQuarantined(): %d, %v", n, err)
	}
	if p.FreePages() != 8 || len(p.Quarantined()) != 0 {
		t.Fatalf("after scrub: %d free, quarantined %v", p.FreePages(), p.Quarantined())
	}
	audit(t, p)
}

func TestFork(t *testing.T) {
	p := newPool(t, kvcache.Config{})
	parent := p.NewSequence(owner("a", 1))
	step(t, p, parent, 6, 5) // one full page, one with 2 positions
	if err := p.Reserve(parent, 8); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Fork(parent, owner("b", 2)); !errors.Is(err, kvcache.ErrTenant) {
		t.Fatalf("fork across tenants: %v", err)
	}
	child, err := p.Fork(parent, owner("a", 2))
	if err != nil {
		t.Fatal(err)
	}
	audit(t, p)
	if child.Len() != 6 || child.NumPages() != 2 || child.Pages()[0] != parent.Pages()[0] || child.Pages()[1] == parent.Pages()[1] {
		t.Fatalf("child pages %v, parent %v", child.Pages(), parent.Pages())
	}
	if info, _ := p.Page(parent.Pages()[0]); info.State != kvcache.PageShared || info.Refs != 2 {
		t.Fatalf("full page after fork: %+v", info)
	}
	// Both continue independently from the copied partial page.
	step(t, p, child, 3, 8)
	step(t, p, parent, 1, 6)
	v, err := p.Begin(child, 1)
	if err != nil {
		t.Fatal(err)
	}
	kvd := smallLayout.KVDim()
	if got := []float32{v.K(0, 0)[0], v.K(1, 1)[kvd], v.K(1, 1)[2*kvd]}; !cmp.Equal(got, []float32{5, 5, 8}) {
		t.Fatalf("child reads %v, want parent's 5s then its own 8", got)
	}
	p.Release(parent)
	audit(t, p)
	if info, _ := p.Page(child.Pages()[0]); info.State != kvcache.PageShared || info.Refs != 1 {
		t.Fatalf("shared page after parent release: %+v", info)
	}
	p.Release(child)
	audit(t, p)
	if st := p.Stats(); st.FreePages != 8 || st.SharedPages != 0 {
		t.Fatalf("after releasing both: %+v", st)
	}
}

// TestStrictViolationPanics: in strict mode (tests) a violation is a panic
// carrying *invariants.Violation, raised after the pool is consistent.
func TestStrictViolationPanics(t *testing.T) {
	p := newPool(t, kvcache.Config{})
	s := p.NewSequence(owner("a", 1))
	step(t, p, s, 1, 1)
	kvcache.SetLength(s, 4)
	func() {
		defer func() {
			var viol *invariants.Violation
			r := recover()
			if err, ok := r.(error); !ok || !errors.As(err, &viol) {
				t.Fatalf("recovered %v, want *invariants.Violation", r)
			}
		}()
		_, _ = p.Begin(s, 1)
	}()
	audit(t, p)
	if p.Violations() != 1 || len(p.Quarantined()) != 1 {
		t.Fatalf("violations %d, quarantined %v", p.Violations(), p.Quarantined())
	}
}

// TestConcurrentViews: forward-pass workers write and read the views of
// several sequences at once (run with -race); the driver commits after
// they finish.
func TestConcurrentViews(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 32})
	var seqs []*kvcache.Sequence
	for i := range 4 {
		s := p.NewSequence(owner(request.Tenant(fmt.Sprint("t", i)), uint32(i)))
		step(t, p, s, 5, float32(i+1))
		seqs = append(seqs, s)
	}
	for round := range 3 {
		views := make([]*kvcache.View, len(seqs))
		for i, s := range seqs {
			if err := p.Reserve(s, 3); err != nil {
				t.Fatal(err)
			}
			v, err := p.Begin(s, 3)
			if err != nil {
				t.Fatal(err)
			}
			views[i] = v
		}
		var wg sync.WaitGroup
		errs := make([]error, len(views))
		for i, v := range views {
			for layer := range smallLayout.Layers {
				wg.Go(func() {
					// Each worker owns one layer of one sequence: it
					// writes the new positions and reads all others.
					l := v.Layout()
					kvd := l.KVDim()
					for pos := v.Start(); pos < v.Start()+v.N(); pos++ {
						k := v.K(layer, pos/l.PageSize)
						k[(pos%l.PageSize)*kvd] = float32(i + 1)
					}
					for pos := range v.Start() {
						if got := v.K(layer, pos/l.PageSize)[(pos%l.PageSize)*kvd]; got != float32(i+1) {
							errs[i] = fmt.Errorf("round %d seq %d pos %d: %v", round, i, pos, got)
						}
					}
				})
			}
		}
		wg.Wait()
		for i, v := range views {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if err := p.Commit(v); err != nil {
				t.Fatal(err)
			}
		}
		audit(t, p)
	}
}

// TestCountsIsStatsWithoutTenants: Counts, which the scheduler loop takes
// after every step for metrics, agrees with Stats and allocates nothing.
func TestCountsIsStatsWithoutTenants(t *testing.T) {
	p := newPool(t, kvcache.Config{})
	a := p.NewSequence(owner("a", 1))
	step(t, p, a, 6, 1)
	b := p.NewSequence(owner("b", 1))
	step(t, p, b, 2, 2)
	p.Release(b)
	want := p.Stats()
	want.TenantPages = nil
	if diff := cmp.Diff(want, p.Counts()); diff != "" {
		t.Fatalf("Counts (-Stats +Counts):\n%s", diff)
	}
	if n := testing.AllocsPerRun(10, func() { _ = p.Counts() }); n != 0 {
		t.Fatalf("Counts allocates %v times", n)
	}
}
