//go:build pw_mutants

package sched

import (
	"sync/atomic"

	"github.com/pagewarden/pagewarden/internal/request"
)

// The bug re-introduction hooks of the positive-control tests, built only
// with -tags pw_mutants (go test -tags pw_mutants ./internal/sched/).
// Without the tag nomutant.go stands in with hooks that do nothing, so a
// release binary cannot contain these.

// mutant selects a deliberately broken behaviour. Only this package's
// tests set it (Core.setMutant).
type mutant uint8

const (
	mutantNone mutant = iota
	// mutantSideTable records a client abort in a side table instead of
	// the state (SGLang's to_finish vs finished()): the request keeps
	// running and can finish "successfully".
	mutantSideTable
	// mutantPlaceholderQueued additionally shrinks a running request to a
	// 1-token placeholder and puts it back in the queue without moving
	// its state, as the incident did.
	mutantPlaceholderQueued
	// mutantPlaceholderPreempted shrinks the request to a 1-token
	// placeholder through a legal preemption (state Admitted), so only
	// the end-to-end checks can see it.
	mutantPlaceholderPreempted
)

// mutants is the core's state of the hooks.
type mutants struct {
	mutant   mutant
	toFinish map[request.Owner]bool // the side table
}

func (c *Core) setMutant(m mutant) { c.mut.mutant = m }

// mutantAbort is the positive-control hook: under a mutant it handles a
// client abort the way the incident's engine did and reports true (the
// abort "succeeded" without moving the state).
func (c *Core) mutantAbort(r *req, cause error) bool {
	if c.mut.mutant == mutantNone {
		// Another package's control (IncidentForControls) may have set
		// the incident for every core.
		c.mut.mutant = mutant(controlMutant.Load())
	}
	if c.mut.mutant == mutantNone || cause != request.ErrAborted {
		return false
	}
	if c.mut.toFinish == nil {
		c.mut.toFinish = make(map[request.Owner]bool)
	}
	// The side table: the abort is recorded here and nowhere else.
	c.mut.toFinish[r.owner] = true
	if c.mut.mutant == mutantSideTable || !r.life.State().Running() || r.inFlight {
		return true
	}
	switch c.mut.mutant {
	case mutantPlaceholderQueued:
		// Free the pages, shrink to a 1-token placeholder and queue it
		// again, state untouched (still "running").
		c.dropPages(r, nil)
		r.tokens = r.tokens[:1]
		_ = c.enqueue(r.adm, false)
	case mutantPlaceholderPreempted:
		// The same through legal edges: only the output can tell.
		c.preempt(r)
		r.tokens = r.tokens[:1]
	}
	return true
}

// mutantFinished counts a request finishing although its abort went to
// the side table: the state still said running.
func (c *Core) mutantFinished(r *req) {
	if c.mut.toFinish[r.owner] {
		c.stats.AbortedButCompleted++
	}
}

// TrustReservationForControls makes CommitImport take the reserved
// prompt's length as what was imported, whatever the handoff said: the
// incident's decode, which fed every page it had reserved into attention.
// For other packages' positive controls (disagg); restore after.
func TrustReservationForControls() (restore func()) {
	trustReservation.Store(true)
	return func() { trustReservation.Store(false) }
}

var trustReservation atomic.Bool

func trustsReservation() bool { return trustReservation.Load() }

// IncidentForControls makes every core handle a client abort as the
// incident's engine did (mutantPlaceholderQueued): the abort goes to a
// side table, the running request is shrunk to a 1-token placeholder and
// queued again with its state untouched. For other packages' positive
// controls (the whole-system simulation, internal/sim); restore after.
func IncidentForControls() (restore func()) {
	controlMutant.Store(uint32(mutantPlaceholderQueued))
	return func() { controlMutant.Store(uint32(mutantNone)) }
}

// AbortSideTableForControls makes every core record a client abort in a
// side table and nowhere else (mutantSideTable): the request keeps running
// and finishes "successfully", as the incident's engine let it. Restore
// after.
func AbortSideTableForControls() (restore func()) {
	controlMutant.Store(uint32(mutantSideTable))
	return func() { controlMutant.Store(uint32(mutantNone)) }
}

var controlMutant atomic.Uint32
