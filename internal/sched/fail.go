package sched

import "github.com/pagewarden/pagewarden/internal/request"

// Fail ends owner's request with cause on the driver's initiative: a
// handoff that failed or was reaped (package transfer's Release and
// Quarantine effects), a peer that left. It is Abort with a cause other
// than the client's: a cause wrapping kvcache.ErrViolation quarantines the
// request's pages instead of freeing them (a writer that could not be
// drained). Like Abort it is idempotent for a request that already ended
// and gives request.ErrNotFound for one the core does not know. Node.Fail
// runs it on the node's loop; a simulation calls it directly.
func (c *Core) Fail(owner request.Owner, cause error) error {
	err := c.abort(owner, cause)
	c.watchQuarantine()
	return err
}
