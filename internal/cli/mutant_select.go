//go:build pw_mutants

package cli

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// This file exists only with -tags pw_mutants: a pagewarden binary built
// with the tag can be started as one of docs/assurance.md's mutants, so
// that checks which see only a running server from outside (the probe,
// internal/cli TestProbeCatchesMutants) can be shown to fire on each bug.
// A release build has neither the variable nor the hooks it switches on
// (TestReleaseBinaryHasNoMutants checks the symbols).

// mutantEnv names the mutant a tagged binary starts as (docs/assurance.md's
// letters: a, a2, b, c, d, e, f, g). It is read once, when the process
// starts, before any core or pool runs: the hooks are process-wide and
// not meant to change under a running server.
const mutantEnv = "PAGEWARDEN_MUTANT"

// mutantSwitch is one mutant: what it breaks and the hooks that break it.
// Where a promise is checked at more than one layer the mutant removes it
// at each, as internal/sim's table does.
type mutantSwitch struct {
	what string
	on   []func() (restore func())
}

var mutantSwitches = map[string]mutantSwitch{
	"a":  {"the incident: abort not terminal, 1-token placeholder queued", []func() func(){sched.IncidentForControls}},
	"a2": {"the incident's first half: abort in a side table, the request runs on", []func() func(){sched.AbortSideTableForControls}},
	"b": {"no page-count check in the handoff", []func() func(){transfer.DisablePageCountCheckForControls,
		kvcache.SkipHandoffCheckForControls, sched.TrustReservationForControls}},
	"c": {"free without writer fence", []func() func(){transfer.DisableDrainCheckForControls}},
	"d": {"no scrub on release", []func() func(){kvcache.SkipScrubForControls}},
	"e": {"tenant missing from the prefix-cache key", []func() func(){kvcache.KeyOmitsTenantForControls}},
	"e2": {"tenant missing from the prefix-cache key at every layer (the pool's key and the gateway's salt)",
		[]func() func(){kvcache.KeyOmitsTenantForControls, gateway.SaltOmitsNamespaceForControls}},
	"f": {"HTTP 200 on abort", []func() func(){gateway.OKOnAbortForControls}},
	"g": {"filled taken from the reservation, not the transfer", []func() func(){transfer.DisableFilledCheckForControls,
		kvcache.SkipHandoffCheckForControls, sched.TrustReservationForControls}},
}

// switchOnMutant switches on the named mutant's hooks for the rest of the
// process. An unknown name is an error naming the known ones: a typo must
// not start a correct server that a test then takes for a mutant that
// escaped.
func switchOnMutant(name string) (mutantSwitch, error) {
	m, ok := mutantSwitches[name]
	if !ok {
		names := make([]string, 0, len(mutantSwitches))
		for n := range mutantSwitches {
			names = append(names, n)
		}
		sort.Strings(names)
		return mutantSwitch{}, fmt.Errorf("unknown mutant %q: want one of %s", name, strings.Join(names, ", "))
	}
	for _, on := range m.on {
		on() // never restored: the process is the mutant until it exits
	}
	return m, nil
}

// mutantFaultEnv names a handoff fault for serve's in-process cluster, the
// kind the whole-system simulation injects, so that a mutant whose bug
// only matters when a handoff goes wrong can show from outside, and its
// control (the same fault, no mutant) shows the checks that hold:
//
//	giveup=N  the prefill node gives up every Nth handoff: an Abort
//	          where the Manifest would go, its Commit never sent (the
//	          request ends aborted by the server: mutant f's trigger)
//	torn=N    every Nth handoff of two pages or more arrives torn: only
//	          its first page, and a manifest that announces one page
//	          and that page's positions (the incident's 1-page manifest
//	          for a longer reservation: mutant b's trigger)
//	short=N   every Nth handoff arrives short: its last page holds one
//	          position fewer, consistently in the page, the manifest's
//	          filled count, digest and total (mutant g's trigger)
const mutantFaultEnv = "PAGEWARDEN_MUTANT_FAULT"

// parseHandoffFault reads mutantFaultEnv's value.
func parseHandoffFault(s string) (kind string, every int, err error) {
	kind, n, ok := strings.Cut(strings.TrimSpace(s), "=")
	every, perr := strconv.Atoi(n)
	if !ok || (kind != "giveup" && kind != "torn" && kind != "short") || perr != nil || every < 1 {
		return "", 0, fmt.Errorf("%q: want giveup=N, torn=N or short=N with N >= 1", s)
	}
	return kind, every, nil
}

// handoffFault wraps the prefill node's transport and damages every Nth
// handoff it sends. Handoffs are counted in the order their first message
// leaves, so a run's damage falls on the same handoffs for the same
// traffic.
type handoffFault struct {
	link.Transport
	kind  string
	every int

	mu      sync.Mutex
	n       int
	damaged map[transfer.Ref]bool // decided once per handoff
	held    map[transfer.Ref][]*transfer.Page
}

// damage reports whether ref's handoff is one the fault hits.
func (f *handoffFault) damage(ref transfer.Ref) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	d, seen := f.damaged[ref]
	if !seen {
		f.n++
		d = f.n%f.every == 0
		f.damaged[ref] = d
	}
	return d
}

func (f *handoffFault) Send(ctx context.Context, to transfer.Peer, m transfer.Message) error {
	switch m := m.(type) {
	case *transfer.Page:
		if f.kind == "torn" && m.Index > 0 && f.damage(m.Ref) {
			return nil // the rest of a torn handoff never arrives
		}
		if f.kind == "short" && f.damage(m.Ref) {
			// Held until the manifest says which page is the last; a
			// copy, since Send must not retain m.
			cp := *m
			cp.Data = append([]byte(nil), m.Data...)
			f.mu.Lock()
			f.held[m.Ref] = append(f.held[m.Ref], &cp)
			f.mu.Unlock()
			return nil
		}
	case *transfer.Manifest:
		if !f.damage(m.Ref) {
			break
		}
		if f.kind == "short" {
			return f.sendShort(ctx, to, m)
		}
		if f.kind == "giveup" {
			return f.Transport.Send(ctx, to, &transfer.Abort{Ref: m.Ref, Reason: transfer.ReasonAborted})
		}
		if m.PageCount < 2 {
			break // one page cannot be torn; the next handoff is not owed one
		}
		torn := *m
		torn.PageCount, torn.Filled, torn.PageDigests, torn.TotalTokens = 1, m.Filled[:1], m.PageDigests[:1], m.Filled[0]
		return f.Transport.Send(ctx, to, &torn)
	case *transfer.Commit:
		if f.kind == "giveup" && f.damage(m.Ref) {
			return nil
		}
	}
	return f.Transport.Send(ctx, to, m)
}

// sendShort sends a short handoff's held pages and its manifest, the last
// page one position shorter in both, its digest recomputed: a handoff
// that is consistent in itself, so that only the receiver's comparison
// with what the reservation implies can refuse it.
func (f *handoffFault) sendShort(ctx context.Context, to transfer.Peer, m *transfer.Manifest) error {
	f.mu.Lock()
	pages := f.held[m.Ref]
	delete(f.held, m.Ref)
	f.mu.Unlock()
	short := *m
	last := m.PageCount - 1
	short.Filled = append([]int(nil), m.Filled...)
	short.PageDigests = append([][32]byte(nil), m.PageDigests...)
	if last >= 0 && m.Filled[last] > 1 {
		short.Filled[last]--
		short.TotalTokens--
	}
	for _, pg := range pages {
		if pg.Index == last && short.Filled[last] != m.Filled[last] {
			// A page carries exactly its filled positions' bytes.
			pg.Data = pg.Data[:len(pg.Data)/pg.Filled*short.Filled[last]]
			pg.Filled = short.Filled[last]
			short.PageDigests[last] = transfer.PageDigest(last, pg.Filled, pg.Data)
		}
		if err := f.Transport.Send(ctx, to, pg); err != nil {
			return err
		}
	}
	return f.Transport.Send(ctx, to, &short)
}

// init runs before Main parses anything, so the mutant is on before serve
// (or a role command) builds its first pool or core. A refusal exits 2,
// as a usage error does.
func init() {
	name := os.Getenv(mutantEnv)
	if name == "" {
		return
	}
	m, err := switchOnMutant(name)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pagewarden: %s: %v\n", mutantEnv, err)
		os.Exit(2)
	}
	// Said loudly, on every start: a log from a mutant must never be
	// taken for a real server's.
	fmt.Fprintf(os.Stderr, "pagewarden: MUTANT %s switched on (%s): a deliberately broken build for positive controls\n", name, m.what)
}

// init reads mutantFaultEnv, with or without a mutant (without one it is
// the fault's control run).
func init() {
	v := os.Getenv(mutantFaultEnv)
	if v == "" {
		return
	}
	kind, every, err := parseHandoffFault(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pagewarden: %s: %v\n", mutantFaultEnv, err)
		os.Exit(2)
	}
	serveWrap = func(name transfer.Peer, t link.Transport) link.Transport {
		if !strings.HasPrefix(string(name), "prefill-") {
			return t // pages and manifests go one way: from prefill to decode
		}
		return &handoffFault{Transport: t, kind: kind, every: every, damaged: map[transfer.Ref]bool{}, held: map[transfer.Ref][]*transfer.Page{}}
	}
	fmt.Fprintf(os.Stderr, "pagewarden: handoff FAULT %s on every %d handoffs of serve's prefill node (positive controls only)\n", kind, every)
}
