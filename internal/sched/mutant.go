package sched

import (
	"github.com/pagewarden/pagewarden/internal/request"
)

// mutantAbort is the positive-control hook: under a mutant it handles a
// client abort the way the incident's engine did and reports true (the
// abort "succeeded" without moving the state). Only tests set c.mutant.
func (c *Core) mutantAbort(r *req) bool {
	if c.toFinish == nil {
		c.toFinish = make(map[request.Owner]bool)
	}
	// The side table: the abort is recorded here and nowhere else.
	c.toFinish[r.owner] = true
	if c.mutant == mutantSideTable || !r.life.State().Running() || r.inFlight {
		return true
	}
	switch c.mutant {
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
