package sched

import (
	"cmp"
	"slices"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// PageMap is one picture of a node's KV pool and queues, for the
// operator's page map. The core takes it between two steps, so the pages,
// the per-tenant counts and the counters all describe the same moment. It
// holds owners (tenant and request ids), epochs and fill counts, never
// token ids or text.
type PageMap struct {
	PageSize int
	// Pages is the ledger entry of every page: page id i+1 at index i.
	Pages []kvcache.PageInfo
	// InTransfer are the pages, in increasing order, reserved for
	// handoffs whose KV is still being imported from a prefill node
	// (Reserve, before CommitImport). They are owned in the ledger.
	InTransfer []kvcache.PageID
	// Tenants are the tenants that hold pages or have requests queued or
	// running, by name.
	Tenants []TenantLoad
	Core    Stats
	Pool    kvcache.Stats // Counts: TenantPages is nil (see Tenants)
}

// TenantLoad is one tenant's share of a node at the moment of a PageMap.
type TenantLoad struct {
	Tenant request.Tenant
	// Pages are the pages the pool's ledger gives the tenant (owned and
	// shared, cached prefix pages included).
	Pages           int
	Queued, Running int
}

// PageMap snapshots the pool's ledger, the per-tenant queues and the
// counters. It is O(pages + requests), with one allocation for the pages
// (none when reuse, the Pages of an earlier map, is large enough);
// BenchmarkPageMap measures it on a 65,536-page pool.
func (c *Core) PageMap(reuse []kvcache.PageInfo) PageMap {
	m := PageMap{
		PageSize: c.pool.Layout().PageSize,
		Pages:    c.pool.Snapshot(reuse),
		Core:     c.Stats(),
		Pool:     c.pool.Counts(),
	}
	for _, r := range c.reqs {
		if r.awaitingImport && r.seq != nil {
			m.InTransfer = append(m.InTransfer, r.seq.Pages()...)
		}
	}
	slices.Sort(m.InTransfer)
	load := make(map[request.Tenant]*TenantLoad)
	get := func(t request.Tenant) *TenantLoad {
		l := load[t]
		if l == nil {
			l = &TenantLoad{Tenant: t}
			load[t] = l
		}
		return l
	}
	for t, n := range c.pool.Stats().TenantPages {
		get(t).Pages = n
	}
	// A recycled id can have a former holder's state still draining
	// beside the new one's: both count under the one name.
	for _, t := range c.active {
		l := get(t.name)
		l.Queued += len(t.queue)
		l.Running += t.running
	}
	m.Tenants = make([]TenantLoad, 0, len(load))
	for _, l := range load {
		m.Tenants = append(m.Tenants, *l)
	}
	slices.SortFunc(m.Tenants, func(a, b TenantLoad) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return m
}
