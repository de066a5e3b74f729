package sched

import (
	"errors"
	"fmt"
	"time"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// ErrInFlight: the operation must wait until the batch in flight is
// advanced.
var ErrInFlight = errors.New("sched: a batch is in flight")

// quarantined is a page the core saw in quarantine: which page, which
// ledger epoch it was quarantined under (so that a page scrubbed and
// quarantined again behind the core's back starts a new wait), and when
// the core first saw it there.
type quarantined struct {
	id    kvcache.PageID
	epoch uint64
	since time.Time // zero: seen before any Tick; stamped by the next one
}

// noteQuarantine records that the core just did something that may have
// quarantined pages (a violation surfaced in Begin or Advance), so the next
// watchQuarantine looks at the pool.
func (c *Core) noteQuarantine(cause error) {
	if cause != nil && errors.Is(cause, kvcache.ErrViolation) {
		c.qDirty = true
	}
}

// watchQuarantine brings the core's list of quarantined pages up to date.
// Listing the pool's quarantine is O(pages), so it runs only when a page
// may have entered it: every quarantine inside the pool counts a violation
// first (Begin's check, the scrub check of allocate, a release that does
// not match the ledger), and the one the core asks for itself
// (Pool.Abort with a violation) sets qDirty. A page new to the list is
// stamped with the time of the last Tick.
func (c *Core) watchQuarantine() {
	if v := c.pool.Violations(); v != c.qViolations {
		c.qViolations = v
		c.qDirty = true
	}
	if !c.qDirty {
		return
	}
	c.qDirty = false
	ids := c.pool.Quarantined()
	next := make([]quarantined, 0, len(ids))
	j := 0
	for _, id := range ids {
		info, _ := c.pool.Page(id)
		for j < len(c.quarantine) && c.quarantine[j].id < id {
			j++
		}
		q := quarantined{id: id, epoch: info.Epoch, since: c.now}
		if j < len(c.quarantine) && c.quarantine[j].id == id && c.quarantine[j].epoch == info.Epoch {
			q.since = c.quarantine[j].since
		}
		next = append(next, q)
	}
	c.quarantine = next
}

// reap scrubs and frees the pages that have been quarantined for at least
// QuarantineReapAfter. It waits while a batch is in flight: no view names
// a quarantined page, but freeing nothing under a running executor is the
// rule (writers before free) and costs one step at most.
func (c *Core) reap() {
	for i := range c.quarantine {
		if c.quarantine[i].since.IsZero() {
			c.quarantine[i].since = c.now
		}
	}
	after := c.cfg.QuarantineReapAfter
	if after <= 0 || len(c.quarantine) == 0 || c.inflight != nil {
		return
	}
	var due []kvcache.PageID
	keep := c.quarantine[:0]
	for _, q := range c.quarantine {
		if c.now.Sub(q.since) < after {
			keep = append(keep, q)
			continue
		}
		// Only the page the core timed: one freed and quarantined again
		// since the last look is left for the next.
		if info, ok := c.pool.Page(q.id); ok && info.State == kvcache.PageQuarantined && info.Epoch == q.epoch {
			due = append(due, q.id)
		}
	}
	if len(keep) < len(c.quarantine) {
		c.qDirty = true // look again: pages may have left or re-entered
	}
	c.quarantine = keep
	if len(due) == 0 {
		return // never ScrubQuarantined(): with no ids it frees them all
	}
	n, _ := c.pool.ScrubQuarantined(due...) // every id was checked just above
	c.stats.Reaped += uint64(n)
}

// reapPending reports whether pages wait for the reaper, so that an idle
// driver keeps ticking.
func (c *Core) reapPending() bool {
	return c.cfg.QuarantineReapAfter > 0 && len(c.quarantine) > 0
}

// ScrubQuarantined is the operator's release of quarantine: every
// quarantined page of the pool is scrubbed and freed at once, whatever
// its age. It returns how many pages it freed; with a batch in flight it
// frees nothing and returns ErrInFlight.
func (c *Core) ScrubQuarantined() (int, error) {
	if c.inflight != nil {
		return 0, ErrInFlight
	}
	n, err := c.pool.ScrubQuarantined() // no ids: all of them
	c.stats.Scrubbed += uint64(n)
	c.quarantine = c.quarantine[:0]
	c.qDirty = false
	c.qViolations = c.pool.Violations()
	if err != nil {
		return n, fmt.Errorf("sched: scrub quarantined pages: %w", err)
	}
	return n, nil
}
