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
	Pages []PageCell
	// Tenants are the tenants that hold pages or have requests queued or
	// running, by name.
	Tenants []TenantLoad
	Core    Stats
	Pool    kvcache.Stats // Counts: TenantPages is nil (see Tenants)
}

// PageCell is one page of a PageMap.
type PageCell struct {
	kvcache.PageInfo
	// InTransfer: the page is reserved for a handoff whose KV is still
	// being imported from a prefill node (Reserve, before CommitImport).
	InTransfer bool
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
// counters. It is O(pages + requests); reuse passes the Pages of an earlier
// map to recycle its memory.
func (c *Core) PageMap(reuse []PageCell) PageMap {
	infos := c.pool.Snapshot(nil)
	cells := slices.Grow(reuse[:0], len(infos))[:len(infos)]
	for i, info := range infos {
		cells[i] = PageCell{PageInfo: info}
	}
	for _, r := range c.reqs {
		if !r.awaitingImport || r.seq == nil {
			continue
		}
		for _, id := range r.seq.Pages() {
			if id >= 1 && int(id) <= len(cells) {
				cells[id-1].InTransfer = true
			}
		}
	}
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
	tenants := make([]TenantLoad, 0, len(load))
	for _, l := range load {
		tenants = append(tenants, *l)
	}
	slices.SortFunc(tenants, func(a, b TenantLoad) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return PageMap{
		PageSize: c.pool.Layout().PageSize,
		Pages:    cells,
		Tenants:  tenants,
		Core:     c.Stats(),
		Pool:     c.pool.Counts(),
	}
}
