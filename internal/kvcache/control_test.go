package kvcache_test

// Positive controls: each test re-introduces, through a test-only hook, a
// bug that an invariant exists to stop, and shows that the check catches
// it. A check that cannot fail is a defect.

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// Control (a): a page of tenant A in tenant B's block table (I1/I2).
func TestControlForeignPage(t *testing.T) {
	for _, keepEpoch := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepEpoch=%v", keepEpoch), func(t *testing.T) {
			lenient(t)
			p := newPool(t, kvcache.Config{})
			a := p.NewSequence(owner("org_a", 1))
			step(t, p, a, 4, 11)
			b := p.NewSequence(owner("org_b", 1))
			step(t, p, b, 4, 22)
			bPage := b.Pages()[0]

			kvcache.InjectPage(b, 0, a, 0, keepEpoch)
			if err := p.CheckInvariants(); err == nil {
				t.Fatal("audit missed a foreign page in a block table")
			}
			v, err := p.Begin(b, 1)
			if !errors.Is(err, kvcache.ErrViolation) || v != nil {
				t.Fatalf("Begin with a foreign page: view %v, err %v", v, err)
			}
			// The request is aborted, its own page quarantined (found by
			// the orphan sweep, since its table no longer names it), the
			// violation counted; A is untouched and carries on.
			if !b.Released() || p.Violations() != 1 {
				t.Fatalf("released %v, violations %d", b.Released(), p.Violations())
			}
			if got := p.Quarantined(); len(got) != 1 || got[0] != bPage {
				t.Fatalf("quarantined %v, want B's page %d", got, bPage)
			}
			audit(t, p)
			if err := p.Reserve(a, 1); err != nil {
				t.Fatal(err)
			}
			va, err := p.Begin(a, 1)
			if err != nil {
				t.Fatal(err)
			}
			if va.K(0, 0)[0] != 11 {
				t.Fatalf("A's data changed: %v", va.K(0, 0)[0])
			}
		})
	}
	t.Run("release", func(t *testing.T) {
		// Release with a corrupted table must not free A's page.
		lenient(t)
		p := newPool(t, kvcache.Config{})
		a := p.NewSequence(owner("org_a", 1))
		step(t, p, a, 4, 11)
		b := p.NewSequence(owner("org_b", 1))
		step(t, p, b, 4, 22)
		kvcache.InjectPage(b, 0, a, 0, false)
		p.Release(b)
		if p.Violations() != 1 || len(p.Quarantined()) != 1 {
			t.Fatalf("violations %d, quarantined %v", p.Violations(), p.Quarantined())
		}
		if info, _ := p.Page(a.Pages()[0]); info.State != kvcache.PageOwned || info.Owner != owner("org_a", 1) {
			t.Fatalf("A's page after B's release: %+v", info)
		}
		audit(t, p)
	})
	t.Run("own page, other epoch", func(t *testing.T) {
		// Owner and sequence match; only the epoch tells the entry
		// names a page it was not given under that entry.
		lenient(t)
		p := newPool(t, kvcache.Config{})
		s := p.NewSequence(owner("org_a", 1))
		step(t, p, s, 8, 11)
		if err := p.Reserve(s, 1); err != nil {
			t.Fatal(err)
		}
		kvcache.InjectPage(s, 1, s, 0, true)
		if _, err := p.Begin(s, 1); !errors.Is(err, kvcache.ErrViolation) {
			t.Fatalf("Begin: %v", err)
		}
	})
	t.Run("shared page, other epoch", func(t *testing.T) {
		// Same tenant, a live shared page: only the epoch differs.
		lenient(t)
		p := newPool(t, kvcache.Config{Pages: 16})
		prompt := seqTokens(9, 1)
		a := prefill(t, p, owner("org_a", 1), prompt, "")
		b := p.NewSequence(owner("org_a", 2))
		if got := p.AttachPrefix(b, prompt, ""); got != 8 {
			t.Fatalf("attach %d", got)
		}
		if err := p.Reserve(b, 1); err != nil {
			t.Fatal(err)
		}
		kvcache.InjectPage(b, 0, a, 1, true)
		kvcache.InjectPage(b, 1, a, 0, true)
		if _, err := p.Begin(b, 1); !errors.Is(err, kvcache.ErrViolation) {
			t.Fatalf("Begin: %v", err)
		}
	})
	t.Run("shared page of another tenant", func(t *testing.T) {
		// A's cached page in B's shared entry, with A's epoch: state,
		// refs and epoch all match; only the tenant does not.
		lenient(t)
		p := newPool(t, kvcache.Config{Pages: 16})
		prompt := seqTokens(9, 1)
		a := prefill(t, p, owner("org_a", 1), prompt, "")
		prefill(t, p, owner("org_b", 1), prompt, "")
		b := p.NewSequence(owner("org_b", 2))
		if got := p.AttachPrefix(b, prompt, ""); got != 8 {
			t.Fatalf("attach %d", got)
		}
		if err := p.Reserve(b, 1); err != nil {
			t.Fatal(err)
		}
		kvcache.InjectPage(b, 0, a, 0, false)
		if _, err := p.Begin(b, 1); !errors.Is(err, kvcache.ErrViolation) {
			t.Fatalf("Begin: %v", err)
		}
		audit(t, p)
	})
	t.Run("stale epoch", func(t *testing.T) {
		// A page released and reallocated to someone else: the old
		// entry's epoch no longer matches, even for the same owner.
		lenient(t)
		p := newPool(t, kvcache.Config{Pages: 2})
		a := p.NewSequence(owner("org_a", 1))
		step(t, p, a, 4, 11)
		stale := p.NewSequence(owner("org_a", 1))
		step(t, p, stale, 4, 11)
		kvcache.InjectPage(stale, 0, a, 0, false)
		p.Release(a) // the page is free now; 'stale' still names it
		if p.Violations() != 0 {
			t.Fatal("release counted a violation")
		}
		c := p.NewSequence(owner("org_a", 1)) // same owner, new allocation
		step(t, p, c, 4, 33)
		if _, err := p.Begin(stale, 1); !errors.Is(err, kvcache.ErrViolation) {
			t.Fatalf("Begin through a stale entry: %v", err)
		}
	})
}

// TestControlForkSameOwnerPartialPage: a fork whose owner equals its
// parent's (same tenant, same request id), with the parent's partial last
// page put in the child's block table under the parent's epoch. State,
// owner, epoch and filled count all agree with the ledger; only the
// owning sequence differs, so the sequence-serial check is all that keeps
// the child from writing into, or freeing, its parent's page.
func TestControlForkSameOwnerPartialPage(t *testing.T) {
	setup := func(t *testing.T) (p *kvcache.Pool, parent, child *kvcache.Sequence, childPage kvcache.PageID) {
		lenient(t)
		p = newPool(t, kvcache.Config{})
		o := owner("org_a", 1)
		parent = p.NewSequence(o)
		step(t, p, parent, 6, 5) // one full page, one with 2 positions
		child, err := p.Fork(parent, o)
		if err != nil {
			t.Fatal(err)
		}
		childPage = child.Pages()[1]
		kvcache.InjectPage(child, 1, parent, 1, false)
		if err := p.CheckInvariants(); err == nil {
			t.Fatal("audit missed the parent's page in the child's block table")
		}
		return p, parent, child, childPage
	}
	parentIntact := func(t *testing.T, p *kvcache.Pool, parent *kvcache.Sequence) {
		t.Helper()
		if info, _ := p.Page(parent.Pages()[1]); info.State != kvcache.PageOwned || info.Filled != 2 {
			t.Fatalf("parent's partial page: %+v", info)
		}
		step(t, p, parent, 1, 6) // the parent carries on
		audit(t, p)
	}
	t.Run("begin", func(t *testing.T) {
		p, parent, child, childPage := setup(t)
		if v, err := p.Begin(child, 1); !errors.Is(err, kvcache.ErrViolation) || v != nil {
			t.Fatalf("Begin of the child: view %v, err %v", v, err)
		}
		if !child.Released() || p.Violations() != 1 {
			t.Fatalf("released %v, violations %d", child.Released(), p.Violations())
		}
		if got := p.Quarantined(); len(got) != 1 || got[0] != childPage {
			t.Fatalf("quarantined %v, want the child's own page %d", got, childPage)
		}
		parentIntact(t, p, parent)
	})
	t.Run("release", func(t *testing.T) {
		p, parent, child, _ := setup(t)
		p.Release(child)
		if p.Violations() != 1 {
			t.Fatalf("violations %d", p.Violations())
		}
		parentIntact(t, p, parent)
	})
}

// TestControlCommitRechecksOwnership: a block-table entry swapped between
// Begin and Commit (a scheduler bug racing the forward pass) must not have
// the step recorded on the page it now names. Commit checks the window's
// pages again.
func TestControlCommitRechecksOwnership(t *testing.T) {
	for _, tc := range []struct {
		name      string
		thief     request.Owner
		keepEpoch bool
	}{
		{"other tenant", owner("org_b", 1), false},
		{"other tenant, own epoch", owner("org_b", 1), true},
		{"same owner, other sequence", owner("org_a", 1), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lenient(t)
			p := newPool(t, kvcache.Config{})
			victim := p.NewSequence(owner("org_a", 1))
			step(t, p, victim, 2, 11)
			s := p.NewSequence(tc.thief)
			step(t, p, s, 2, 22)
			sPage, vPage := s.Pages()[0], victim.Pages()[0]

			v, err := p.Begin(s, 1)
			if err != nil {
				t.Fatal(err)
			}
			kvcache.InjectPage(s, 0, victim, 0, tc.keepEpoch)
			if err := p.Commit(v); !errors.Is(err, kvcache.ErrViolation) {
				t.Fatalf("Commit after a swap: %v", err)
			}
			if !s.Released() || p.Violations() != 1 {
				t.Fatalf("released %v, violations %d", s.Released(), p.Violations())
			}
			if info, _ := p.Page(vPage); info.State != kvcache.PageOwned || info.Filled != 2 {
				t.Fatalf("victim's page after the failed commit: %+v", info)
			}
			if got := p.Quarantined(); len(got) != 1 || got[0] != sPage {
				t.Fatalf("quarantined %v, want the sequence's own page %d", got, sPage)
			}
			audit(t, p)
			step(t, p, victim, 1, 12)
		})
	}
}

// Control (b): a page marked filled beyond what was written (I3).
func TestControlFilledBeyondWritten(t *testing.T) {
	setup := func(t *testing.T, pol kvcache.ScrubPolicy) (*kvcache.Pool, *kvcache.Sequence) {
		p := newPool(t, kvcache.Config{Pages: 8, Scrub: pol})
		s := p.NewSequence(owner("org_b", 1))
		if err := p.Reserve(s, 32); err != nil { // 8 pages reserved
			t.Fatal(err)
		}
		step(t, p, s, 1, 5) // 1 position written
		return p, s
	}
	t.Run("length from reservation", func(t *testing.T) {
		// The incident: decode took the length from the 8 reserved pages.
		lenient(t)
		p, s := setup(t, kvcache.ScrubZero)
		kvcache.SetLength(s, 31)
		if _, err := p.Begin(s, 1); !errors.Is(err, kvcache.ErrViolation) {
			t.Fatalf("Begin: %v", err)
		}
		if p.Violations() != 1 || len(p.Quarantined()) != 8 {
			t.Fatalf("violations %d, quarantined %d", p.Violations(), len(p.Quarantined()))
		}
		audit(t, p)
	})
	t.Run("ledger filled", func(t *testing.T) {
		lenient(t)
		p, s := setup(t, kvcache.ScrubZero)
		kvcache.SetFilled(p, s.Pages()[3], 4)
		if _, err := p.Begin(s, 1); !errors.Is(err, kvcache.ErrViolation) {
			t.Fatalf("Begin: %v", err)
		}
		if p.Violations() != 1 {
			t.Fatalf("violations %d", p.Violations())
		}
	})
	t.Run("consistent lie caught by poison", func(t *testing.T) {
		// Length and ledger both lie, consistently: the ownership check
		// has nothing to compare against, and the scrub is the last line.
		// Under poison every unwritten position reads NaN, so the
		// attention output is non-finite.
		p, s := setup(t, kvcache.ScrubPoison)
		kvcache.SetLength(s, 8)
		kvcache.SetFilled(p, s.Pages()[0], 4)
		kvcache.SetFilled(p, s.Pages()[1], 4)
		v, err := p.Begin(s, 1)
		if err != nil {
			t.Fatal(err)
		}
		sum := float32(0)
		for pg := range 2 {
			for _, x := range v.K(0, pg) {
				sum += x
			}
		}
		if !math.IsNaN(float64(sum)) {
			t.Fatalf("reading unwritten positions gave finite %v", sum)
		}
	})
}

// Control (c): a release that skips the scrub (I8).
func TestControlSkipScrub(t *testing.T) {
	t.Run("VerifyScrub", func(t *testing.T) {
		lenient(t)
		kvcache.SkipScrub(t)
		p := newPool(t, kvcache.Config{Pages: 2, VerifyScrub: true})
		a := p.NewSequence(owner("org_a", 1))
		step(t, p, a, 4, 11)
		leaked := a.Pages()[0]
		p.Release(a)
		b := p.NewSequence(owner("org_b", 1))
		if err := p.Reserve(b, 4); err != nil {
			t.Fatal(err)
		}
		if p.Violations() != 1 || b.Pages()[0] == leaked || len(p.Quarantined()) != 1 || p.Quarantined()[0] != leaked {
			t.Fatalf("violations %d, b got %v, quarantined %v (leaked page %d)", p.Violations(), b.Pages(), p.Quarantined(), leaked)
		}
		audit(t, p)
	})
	t.Run("fresh read", func(t *testing.T) {
		// Without VerifyScrub, the property harness's fresh-page check
		// is what catches it.
		kvcache.SkipScrub(t)
		hc := harnessConfigs[0]
		hc.noVerify = true
		err := runHarness(hc, 7, 300)
		if err == nil {
			t.Fatal("harness missed unscrubbed pages")
		}
		t.Logf("caught: %v", err)
	})
	hc := harnessConfigs[0]
	hc.noVerify = true
	if err := runHarness(hc, 7, 300); err != nil {
		t.Fatalf("harness fails without the hook: %v", err)
	}
}

// Control (d): prefix-cache keys without the tenant (I9).
func TestControlKeyWithoutTenant(t *testing.T) {
	t.Run("attach", func(t *testing.T) {
		lenient(t)
		kvcache.KeyOmitsTenant(t)
		p := newPool(t, kvcache.Config{Pages: 8})
		prompt := seqTokens(9, 1)
		prefill(t, p, owner("org_a", 1), prompt, "")
		b := p.NewSequence(owner("org_b", 1))
		// B's key now finds A's page; the ledger's tenant check refuses it.
		if got := p.AttachPrefix(b, prompt, ""); got != 0 || b.NumPages() != 0 {
			t.Fatalf("tenant B attached %d tokens of tenant A", got)
		}
		if p.Violations() != 1 {
			t.Fatalf("violations %d", p.Violations())
		}
		audit(t, p)
	})
	t.Run("key vectors", func(t *testing.T) {
		kvcache.KeyOmitsTenant(t)
		a := kvcache.PrefixKey("org_1", [32]byte{}, "", []int{1}, nil)
		b := kvcache.PrefixKey("org_2", [32]byte{}, "", []int{1}, nil)
		if a != b {
			t.Fatal("hook had no effect")
		}
	})
	t.Run("harness", func(t *testing.T) {
		lenient(t)
		kvcache.KeyOmitsTenant(t)
		err := runHarness(harnessConfigs[0], 3, 400)
		if err == nil {
			t.Fatal("harness missed cross-tenant prefix hits")
		}
		t.Logf("caught: %v", err)
	})
	t.Run("without hook", func(t *testing.T) {
		p := newPool(t, kvcache.Config{Pages: 8})
		prompt := seqTokens(9, 1)
		prefill(t, p, owner("org_a", 1), prompt, "")
		if got := p.AttachPrefix(p.NewSequence(owner("org_b", 1)), prompt, ""); got != 0 || p.Violations() != 0 {
			t.Fatalf("attach %d, violations %d", got, p.Violations())
		}
	})
}

// recorder is a fataler that turns the harness's first failure into an
// error, so that a control can assert the harness fails.
type recorder struct{ err error }

type harnessFailed struct{}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.err = fmt.Errorf(format, args...)
	panic(harnessFailed{})
}

// runHarness runs seeds 0..seeds-1 of the simulation and returns the first
// failure.
func runHarness(hc harnessConfig, seeds, steps int) (err error) {
	rec := &recorder{}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(harnessFailed); !ok {
				panic(r)
			}
			err = rec.err
		}
	}()
	for seed := range uint64(seeds) {
		r := rand.New(rand.NewPCG(seed, 1))
		h := newHarness(rec, randChooser{r}, hc)
		acts := h.actions()
		names := make([]string, 0, len(acts))
		for name := range acts {
			names = append(names, name)
		}
		sort.Strings(names)
		for range steps {
			acts[names[r.IntN(len(names))]]()
			h.check()
		}
	}
	return nil
}
