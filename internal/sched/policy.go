package sched

import (
	"slices"

	"github.com/pagewarden/pagewarden/internal/request"
)

// TenantPolicy is a tenant's configured share of the node. Zero values mean
// "no cap beyond the node's own".
type TenantPolicy struct {
	// MaxPages caps the KV pages the tenant's running sequences hold at
	// once. A request that could never fit under it is refused with
	// request.ErrQuota.
	MaxPages int
	// MaxRunning caps the tenant's sequences running at once.
	MaxRunning int
	// MaxQueued caps the tenant's waiting requests (0: the node's
	// MaxQueuedPerTenant); beyond it, request.ErrOverloaded.
	MaxQueued int
	// Priority orders tenants when pages are short: higher is scheduled
	// first and preempted last. Params.Priority orders within it.
	Priority int
	// Customer names who holds the tenant id (the gateway registry's
	// CacheNamespace serves). When UpdatePolicies finds it changed, the id
	// was handed to another customer: the previous holder's requests
	// finish under the policy they had, in state of their own, and the new
	// holder starts with an empty queue and nothing held.
	Customer string
}

// tenant is the per-tenant scheduling state of one holder of a tenant id.
type tenant struct {
	name    request.Tenant
	policy  TenantPolicy
	queue   []*req // FIFO; preempted requests go back to the front
	running int
	pages   int
	served  uint64 // step it last started a sequence (round-robin tie-break)
	skip    uint64 // step in which its head could not start under its own caps
	// former: the id has since been handed to another customer; this
	// state only drains, and c.tenants names the new holder's.
	former bool
}

func (c *Core) policyOf(name request.Tenant) TenantPolicy {
	if c.cfg.Policy == nil {
		return TenantPolicy{}
	}
	return c.cfg.Policy(name)
}

// tenantFor returns the state of the current holder of tenant id name,
// making it active (with its policy as of now) if it was not.
func (c *Core) tenantFor(name request.Tenant) *tenant {
	if t, ok := c.tenants[name]; ok {
		return t
	}
	t := &tenant{name: name, policy: c.policyOf(name)}
	c.tenants[name] = t
	c.active = append(c.active, t)
	return t
}

// retire forgets a tenant with nothing queued or running, so that the
// tenant table stays bounded by the active tenants.
func (c *Core) retire(t *tenant) {
	if t.running > 0 || len(t.queue) > 0 {
		return
	}
	if !t.former {
		delete(c.tenants, t.name)
	}
	if i := slices.Index(c.active, t); i >= 0 {
		c.active = slices.Delete(c.active, i, i+1)
	}
}

// UpdatePolicies re-reads Config.Policy for every active tenant. The driver
// calls it when the policies changed (a tenant configuration reload), so
// that the core applies, from its next decision on, the policy the gateway
// now admits under: one policy, not the one each tenant had when it
// became active.
//
//   - Raised caps and changed priorities apply at once, to waiting and
//     running requests alike.
//   - Lowered caps apply from the next step: sequences beyond them are
//     preempted (recomputed later, not failed), and a waiting request that
//     could never fit under the new page cap ends with request.ErrQuota
//     when its turn comes.
//   - A tenant id now held by another customer (TenantPolicy.Customer)
//     splits: the previous holder's requests keep their policy and drain;
//     the new holder's requests queue apart from them and count against
//     its own caps only.
func (c *Core) UpdatePolicies() {
	if c.cfg.Policy == nil {
		return
	}
	for _, t := range c.active {
		if t.former {
			continue
		}
		p := c.cfg.Policy(t.name)
		if p.Customer != t.policy.Customer {
			t.former = true
			delete(c.tenants, t.name)
			continue
		}
		t.policy = p
		for _, r := range t.queue {
			r.prio[0] = p.Priority
		}
	}
	for _, r := range c.running {
		r.prio[0] = r.tenant.policy.Priority
	}
	c.capsStale = true
}

// enforceCaps preempts, after UpdatePolicies, the sequences of tenants
// beyond their (lowered) caps: the lowest priority, most recently started
// first. It runs with no batch in flight.
func (c *Core) enforceCaps() {
	if !c.capsStale {
		return
	}
	c.capsStale = false
	for _, t := range c.active {
		for t.policy.MaxPages > 0 && t.pages > t.policy.MaxPages || t.policy.MaxRunning > 0 && t.running > t.policy.MaxRunning {
			var v *req
			for _, r := range c.running {
				if r.tenant == t && !r.inFlight && r.seq != nil && !r.awaitingImport && (v == nil || prioLess(r, v) > 0) {
					v = r
				}
			}
			if v == nil {
				break
			}
			c.preempt(v)
		}
	}
}
