package kvcache_test

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"pgregory.net/rapid"
)

var harnessConfigs = []harnessConfig{
	{dtype: kvcache.F32, scrub: kvcache.ScrubZero, pageSize: 4, pages: 20},
	{dtype: kvcache.F32, scrub: kvcache.ScrubPoison, pageSize: 4, pages: 16},
	{dtype: kvcache.F16, scrub: kvcache.ScrubZero, pageSize: 2, pages: 24},
	{dtype: kvcache.F16, scrub: kvcache.ScrubPoison, pageSize: 1, pages: 24},
}

func (hc harnessConfig) String() string {
	return fmt.Sprintf("%v/%v/ps%d/pages%d", hc.dtype, hc.scrub, hc.pageSize, hc.pages)
}

// TestPoolProperties drives the pool with rapid (which shrinks a failing
// sequence of operations to a minimal one) in every configuration.
func TestPoolProperties(t *testing.T) {
	for _, hc := range harnessConfigs {
		t.Run(hc.String(), func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				h := newHarness(rt, rapidChooser{rt}, hc)
				actions := map[string]func(*rapid.T){}
				for name, fn := range h.actions() {
					actions[name] = func(*rapid.T) { fn() }
				}
				actions[""] = func(*rapid.T) { h.check() }
				rt.Repeat(actions)
			})
		})
	}
}

// seedT prefixes failures with the seed that reproduces them.
type seedT struct {
	*testing.T
	seed uint64
}

func (s seedT) Fatalf(format string, args ...any) {
	s.T.Helper()
	s.T.Fatalf("seed %d: "+format, append([]any{s.seed}, args...)...)
}

// TestSimulation runs many seeded random operation sequences: less
// shrinking than rapid, more volume. A failing seed replays identically.
func TestSimulation(t *testing.T) {
	seeds, steps := 1200, 250
	if testing.Short() {
		seeds = 60
	}
	var total kvcache.Stats
	for seed := range uint64(seeds) {
		hc := harnessConfigs[seed%uint64(len(harnessConfigs))]
		r := rand.New(rand.NewPCG(seed, 0x6b76))
		h := newHarness(seedT{t, seed}, randChooser{r}, hc)
		acts := h.actions()
		names := make([]string, 0, len(acts))
		for name := range acts {
			names = append(names, name)
		}
		sort.Strings(names) // map order is random; the seed must decide alone
		for range steps {
			acts[names[r.IntN(len(names))]]()
			h.check()
		}
		for _, x := range h.seqs {
			h.p.Release(x.s)
		}
		h.seqs = nil
		h.p.EvictCached(-1)
		if _, err := h.p.ScrubQuarantined(); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		h.check()
		st := h.p.Stats()
		total.Allocations += st.Allocations
		total.PrefixHitPages += st.PrefixHitPages
		total.PrefixMissPages += st.PrefixMissPages
		total.PublishedPages += st.PublishedPages
		total.Evictions += st.Evictions
		total.Quarantines += st.Quarantines
		total.Scrubs += st.Scrubs
		if st.FreePages != st.TotalPages {
			t.Fatalf("seed %d: after releasing everything %d of %d pages are free", seed, st.FreePages, st.TotalPages)
		}
	}
	t.Logf("%d seeds x %d operations: %d allocations, %d scrubs, %d evictions, %d quarantines, prefix %d published / %d hit / %d missed pages",
		seeds, steps, total.Allocations, total.Scrubs, total.Evictions, total.Quarantines, total.PublishedPages, total.PrefixHitPages, total.PrefixMissPages)
	// The simulation is only worth something if it reaches every path.
	if !testing.Short() && (total.Evictions == 0 || total.Quarantines == 0 || total.PrefixHitPages == 0 || total.PublishedPages == 0) {
		t.Errorf("simulation did not reach eviction, quarantine and prefix hits: %+v", total)
	}
}

// TestSimulationFaults adds block-table corruption to the simulation: each
// one must be caught and contained, and everything else must hold.
func TestSimulationFaults(t *testing.T) {
	lenient(t)
	seeds, steps := 300, 250
	if testing.Short() {
		seeds = 30
	}
	caught := uint64(0)
	for seed := range uint64(seeds) {
		hc := harnessConfigs[seed%uint64(len(harnessConfigs))]
		r := rand.New(rand.NewPCG(seed, 0xfa17))
		h := newHarness(seedT{t, seed}, randChooser{r}, hc)
		acts := h.actions()
		acts["corrupt"] = h.opCorrupt
		names := make([]string, 0, len(acts))
		for name := range acts {
			names = append(names, name)
		}
		sort.Strings(names)
		for range steps {
			acts[names[r.IntN(len(names))]]()
			h.check()
		}
		caught += h.violations
	}
	t.Logf("%d seeds: %d corruptions caught", seeds, caught)
	if caught == 0 {
		t.Fatal("no corruption was injected")
	}
}
