package admin

import (
	"cmp"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
)

// The cell states of the page map. A shared page that no block table
// references any more but the prefix index keeps is "cached" (evictable);
// an owned page reserved for a handoff still being imported is "transfer".
const (
	CellFree        = "free"
	CellOwned       = "owned"
	CellShared      = "shared"
	CellCached      = "cached"
	CellQuarantined = "quarantined"
	CellTransfer    = "transfer"
)

// CellStates lists the cell states in the order the page's legend shows
// them.
var CellStates = []string{CellFree, CellOwned, CellShared, CellCached, CellTransfer, CellQuarantined}

// PagesView is the body of /admin/api/pages: every node's pool.
type PagesView struct {
	Time  time.Time   `json:"time"`
	Nodes []NodePages `json:"nodes"`
}

// NodePages is one node's pool.
type NodePages struct {
	Name       string `json:"name"`
	Error      string `json:"error,omitempty"` // the snapshot failed (shutting down, timeout)
	PageSize   int    `json:"page_size"`
	TotalPages int    `json:"total_pages"`
	// Counts are the pages in each cell state (every state present).
	Counts map[string]int `json:"counts"`
	// Pages are the pages that are not free, by increasing id; every
	// page id from 1 to TotalPages missing here is free. A pool is mostly
	// free when idle, and this keeps the body proportional to use.
	Pages []PageView `json:"pages"`
}

// PageView is one page that is not free. It names owners (tenant and
// request ids) and ledger numbers, never tokens or text.
type PageView struct {
	ID      uint32 `json:"id"`
	State   string `json:"state"`
	Tenant  string `json:"tenant,omitempty"`
	Request string `json:"request,omitempty"` // owned, transfer, quarantined: the (last) owning request
	Seq     uint64 `json:"seq,omitempty"`     // the pool's serial of the owning sequence
	Epoch   uint64 `json:"epoch,omitempty"`
	Filled  int    `json:"filled"` // positions written, 0..page size
	Refs    int    `json:"refs,omitempty"`
}

// TenantsView is the body of /admin/api/tenants: each tenant's pages,
// queued and running requests over every node and per node, and the
// counters that must stay zero.
type TenantsView struct {
	Time       time.Time     `json:"time"`
	Tenants    []TenantLoad  `json:"tenants"`
	MustBeZero Counters      `json:"must_be_zero"`
	Nodes      []NodeTenants `json:"nodes"`
}

// NodeTenants is one node's share of TenantsView.
type NodeTenants struct {
	Name             string       `json:"name"`
	Error            string       `json:"error,omitempty"`
	Tenants          []TenantLoad `json:"tenants"`
	Queued           int          `json:"queued"`
	Running          int          `json:"running"`
	QuarantinedPages int          `json:"quarantined_pages"`
	MustBeZero       Counters     `json:"must_be_zero"`
}

// TenantLoad is one tenant's pages and requests.
type TenantLoad struct {
	Tenant  string `json:"tenant"`
	Pages   int    `json:"pages"`
	Queued  int    `json:"queued"`
	Running int    `json:"running"`
}

// Counters are the counts that are 0 on a healthy node: anything else is
// a broken isolation invariant (see docs/operations.md).
type Counters struct {
	IsolationViolations uint64 `json:"isolation_violations"`
	OwnerMismatches     uint64 `json:"owner_mismatches"`
	AbortedButCompleted uint64 `json:"aborted_but_completed"`
}

func (c *Counters) add(o Counters) {
	c.IsolationViolations += o.IsolationViolations
	c.OwnerMismatches += o.OwnerMismatches
	c.AbortedButCompleted += o.AbortedButCompleted
}

// state is one snapshot of every pool, as the endpoints show it.
type state struct {
	taken   time.Time
	Pages   PagesView
	Tenants TenantsView

	once      sync.Once
	body, key []byte // encoded: see encoded
}

// encoded is the state event's data, and the same without the time stamps
// (which always change), by which a stream tells whether anything did: an
// idle node then sends nothing but keep-alives. Encoded once per state,
// whichever stream asks first.
func (st *state) encoded() (body, key []byte) {
	st.once.Do(func() {
		st.body, _ = json.Marshal(StateEvent{Pages: st.Pages, Tenants: st.Tenants})
		st.key, _ = json.Marshal(StateEvent{Pages: st.Pages.untimed(), Tenants: st.Tenants.untimed()})
	})
	return st.body, st.key
}

type namedMap struct {
	name string
	m    sched.PageMap
	err  error
}

func (p PagesView) untimed() PagesView     { p.Time = time.Time{}; return p }
func (t TenantsView) untimed() TenantsView { t.Time = time.Time{}; return t }

// CellState is the page map's state of a page with ledger entry c,
// inTransfer when a handoff is still importing into it.
func CellState(c kvcache.PageInfo, inTransfer bool) string {
	switch c.State {
	case kvcache.PageOwned:
		if inTransfer {
			return CellTransfer
		}
		return CellOwned
	case kvcache.PageShared:
		if c.Refs == 0 && c.Cached {
			return CellCached
		}
		return CellShared
	case kvcache.PageQuarantined:
		return CellQuarantined
	}
	return CellFree
}

// build turns the pools' maps into the endpoints' bodies.
func build(now time.Time, maps []namedMap) *state {
	st := &state{taken: now, Pages: PagesView{Time: now, Nodes: []NodePages{}},
		Tenants: TenantsView{Time: now, Tenants: []TenantLoad{}, Nodes: []NodeTenants{}}}
	total := map[string]*TenantLoad{}
	for _, nm := range maps {
		np := NodePages{Name: nm.name, Counts: map[string]int{}, Pages: []PageView{}}
		nt := NodeTenants{Name: nm.name, Tenants: []TenantLoad{}}
		for _, s := range CellStates {
			np.Counts[s] = 0
		}
		if nm.err != nil {
			np.Error, nt.Error = nm.err.Error(), nm.err.Error()
		} else {
			m := nm.m
			np.PageSize, np.TotalPages = m.PageSize, len(m.Pages)
			transfer := m.InTransfer // sorted: walked beside the pages
			for i, c := range m.Pages {
				id := kvcache.PageID(i + 1)
				for len(transfer) > 0 && transfer[0] < id {
					transfer = transfer[1:]
				}
				s := CellState(c, len(transfer) > 0 && transfer[0] == id)
				np.Counts[s]++
				if s == CellFree {
					continue
				}
				pv := PageView{ID: uint32(i + 1), State: s, Tenant: string(c.Owner.Tenant), Seq: c.Seq, Epoch: c.Epoch, Filled: c.Filled, Refs: c.Refs}
				if c.Owner.ID != (request.ID{}) {
					pv.Request = c.Owner.ID.String()
				}
				np.Pages = append(np.Pages, pv)
			}
			for _, l := range m.Tenants {
				tl := TenantLoad{Tenant: string(l.Tenant), Pages: l.Pages, Queued: l.Queued, Running: l.Running}
				nt.Tenants = append(nt.Tenants, tl)
				t := total[tl.Tenant]
				if t == nil {
					t = &TenantLoad{Tenant: tl.Tenant}
					total[tl.Tenant] = t
				}
				t.Pages += tl.Pages
				t.Queued += tl.Queued
				t.Running += tl.Running
			}
			nt.Queued, nt.Running, nt.QuarantinedPages = m.Core.Queued, m.Core.Running, m.Pool.QuarantinedPages
			nt.MustBeZero = Counters{IsolationViolations: m.Pool.Violations, OwnerMismatches: m.Core.OwnerMismatches,
				AbortedButCompleted: m.Core.AbortedButCompleted}
			st.Tenants.MustBeZero.add(nt.MustBeZero)
		}
		st.Pages.Nodes = append(st.Pages.Nodes, np)
		st.Tenants.Nodes = append(st.Tenants.Nodes, nt)
	}
	for _, t := range total {
		st.Tenants.Tenants = append(st.Tenants.Tenants, *t)
	}
	slices.SortFunc(st.Tenants.Tenants, func(a, b TenantLoad) int { return cmp.Compare(a.Tenant, b.Tenant) })
	return st
}
