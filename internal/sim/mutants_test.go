//go:build pw_mutants

package sim

import (
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

var (
	simMutant = flag.String("sim.mutant", "", "run only the mutant whose name starts with this (with -sim.seed, replay it)")
	simAll    = flag.Bool("sim.all", false, "run every seed of the budget and report how many catch each mutant")
)

// mutant is one bug of the incident's class, re-introduced through the
// owning packages' build-tagged hooks. Where the system checks a promise
// at more than one layer (the handoff's page count is checked by the
// receiver, by the pool's CommitImport and by the scheduler), the mutant
// removes the check at every layer, as the bug would be in a system that
// had only one.
type mutant struct {
	name string
	set  []func() (restore func())
	// catch are the invariants that may catch it (the package comment's
	// names).
	catch []string
}

var mutants = []mutant{
	{"a incident: abort not terminal, placeholder queued",
		[]func() func(){sched.IncidentForControls},
		[]string{invAbort, invSched, invEcho, invRead}},
	{"a2 incident, first half: abort in a side table, the request runs on",
		[]func() func(){sched.AbortSideTableForControls},
		[]string{invAbort}},
	{"b no page-count check in the handoff",
		[]func() func(){transfer.DisablePageCountCheckForControls, kvcache.SkipHandoffCheckForControls, sched.TrustReservationForControls},
		[]string{invRead, invEcho}},
	{"c free without writer fence",
		[]func() func(){transfer.DisableDrainCheckForControls},
		[]string{invWriter}},
	{"d no scrub on release",
		[]func() func(){kvcache.SkipScrubForControls},
		[]string{invPool}},
	{"e tenant missing from the prefix-cache key",
		[]func() func(){kvcache.KeyOmitsTenantForControls},
		[]string{invPool, invRead, invEcho}},
	{"f HTTP 200 on abort",
		[]func() func(){gateway.OKOnAbortForControls},
		[]string{invHTTP}},
	{"g filled taken from the reservation instead of the transfer",
		[]func() func(){transfer.DisableFilledCheckForControls, kvcache.SkipHandoffCheckForControls, sched.TrustReservationForControls},
		[]string{invRead, invEcho}},
}

// TestMutantsCaught is the simulation's positive control: each mutant must
// break an invariant, the one expected, within 1,000 seeds. It reports the
// first catching seed and how to replay it.
func TestMutantsCaught(t *testing.T) {
	const budget = 1000
	for _, m := range mutants {
		if *simMutant != "" && !strings.HasPrefix(m.name, *simMutant) {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			var restores []func()
			for _, set := range m.set {
				restores = append(restores, set())
			}
			defer func() {
				for _, r := range slices.Backward(restores) {
					r()
				}
			}()
			first, n := uint64(1), uint64(budget)
			if *simSeed != 0 {
				first, n = *simSeed, 1
			}
			seed, w, err, stats := runSeeds(first, n, !*simAll)
			if err == nil {
				t.Fatalf("not caught in seeds %d..%d", first, first+n-1)
			}
			var v *violation
			if !errors.As(err, &v) || !slices.Contains(m.catch, v.invariant) {
				t.Fatalf("seed %d caught it by an unexpected oracle (want one of %q): %v", seed, m.catch, err)
			}
			if *simLog && w != nil {
				t.Log(strings.Join(w.log, "\n"))
			}
			t.Logf("caught at seed %d by %q: %s\nreplay: %s -sim.mutant=%q", seed, v.invariant, v.detail,
				replayCommand("TestMutantsCaught", seed, "pw_mutants"), m.name[:1])
			if *simAll {
				t.Logf("caught in %d of %d seeds", int(n)-stats["seeds passed"], n)
			}
		})
	}
}
