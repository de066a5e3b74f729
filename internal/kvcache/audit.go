package kvcache

import (
	"errors"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Stats is a snapshot of the pool's gauges and counters, for metrics.
type Stats struct {
	TotalPages       int
	FreePages        int // on the free list
	OwnedPages       int
	SharedPages      int // referenced or cached
	CachedPages      int // shared and unreferenced: evictable, part of SharedPages
	QuarantinedPages int
	Sequences        int                    // live sequences
	TenantPages      map[request.Tenant]int // owned and shared pages per tenant

	Allocations     uint64 // pages handed out
	Scrubs          uint64 // pages scrubbed
	Evictions       uint64 // cached pages evicted
	Quarantines     uint64 // pages put in quarantine
	Violations      uint64 // isolation violations detected; must stay 0
	PrefixHitPages  uint64 // pages served by AttachPrefix
	PrefixMissPages uint64 // full prompt pages AttachPrefix could not serve
	PublishedPages  uint64 // pages indexed by PublishPrefix
}

// Stats returns a snapshot.
func (p *Pool) Stats() Stats {
	st := p.Counts()
	st.TenantPages = make(map[request.Tenant]int, len(p.tenants))
	for k, v := range p.tenants {
		st.TenantPages[k] = v
	}
	return st
}

// Counts is Stats without the per-tenant pages (TenantPages is nil). It
// allocates nothing, so that a driver can take it after every step and
// publish it for metrics without waiting for the loop that owns the pool.
func (p *Pool) Counts() Stats {
	return Stats{
		TotalPages:       p.total,
		FreePages:        p.count[PageFree],
		OwnedPages:       p.count[PageOwned],
		SharedPages:      p.count[PageShared],
		CachedPages:      p.lruLen,
		QuarantinedPages: p.count[PageQuarantined],
		Sequences:        len(p.live),
		Allocations:      p.st.allocations,
		Scrubs:           p.st.scrubs,
		Evictions:        p.st.evictions,
		Quarantines:      p.st.quarantines,
		Violations:       p.violations.Load(),
		PrefixHitPages:   p.st.prefixHits,
		PrefixMissPages:  p.st.prefixMisses,
		PublishedPages:   p.st.published,
	}
}

// ErrCorrupt reports a ledger that fails CheckInvariants.
var ErrCorrupt = errors.New("kvcache: ledger audit failed")

// CheckInvariants audits the whole ledger against every live block table,
// the free list, the prefix index and the LRU list (O(pages + entries)). It
// is for tests and simulations, which call it after every operation, and
// for an operator's debug endpoint. It reports the first problems found.
func (p *Pool) CheckInvariants() error {
	var errs []error
	bad := func(format string, args ...any) {
		if len(errs) < 16 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	ps := p.layout.PageSize

	// Who the live block tables say holds each page.
	type holder struct {
		owners  int
		sharers int
		seq     *Sequence
		tenants map[request.Tenant]bool
	}
	held := make([]holder, p.total+1)
	for s := range p.live {
		if s.closed || s.pool != p {
			bad("live set holds a closed or foreign sequence %v", s.owner)
			continue
		}
		if err := p.verify(s, 0); err != nil {
			bad("sequence %v: %v", s.owner, err)
		}
		seen := make(map[PageID]bool, len(s.table))
		for i, e := range s.table {
			id := e.id
			if id == 0 || int(id) > p.total {
				continue // reported by verify
			}
			if seen[id] {
				bad("sequence %v: page %d appears twice in its block table", s.owner, id)
			}
			seen[id] = true
			h := &held[id]
			if s.table[i].shared {
				h.sharers++
				if h.tenants == nil {
					h.tenants = map[request.Tenant]bool{}
				}
				h.tenants[s.owner.Tenant] = true
			} else {
				h.owners++
				h.seq = s
			}
		}
		if s.cached > s.length {
			bad("sequence %v: %d cached positions exceed its length %d", s.owner, s.cached, s.length)
		}
	}

	var count [numStates]int
	tenants := map[request.Tenant]int{}
	epochs := make(map[uint64]PageID, p.total)
	for id := 1; id <= p.total; id++ {
		pg := &p.ledger[id]
		h := &held[id]
		if pg.state >= numStates {
			bad("page %d: unknown state %d", id, pg.state)
			continue
		}
		count[pg.state]++
		if pg.state != PageFree {
			if other, dup := epochs[pg.epoch]; dup {
				bad("pages %d and %d share epoch %d", other, id, pg.epoch)
			}
			epochs[pg.epoch] = PageID(id)
		}
		if pg.filled < 0 || int(pg.filled) > ps {
			bad("page %d: filled %d outside 0..%d", id, pg.filled, ps)
		}
		if pg.indexed && pg.state != PageShared {
			bad("page %d: %v but indexed", id, pg.state)
		}
		switch pg.state {
		case PageFree:
			if h.owners+h.sharers > 0 {
				bad("page %d: free but in %d block tables", id, h.owners+h.sharers)
			}
			if pg.refs != 0 || pg.filled != 0 || pg.owner != (request.Owner{}) || pg.seq != 0 {
				bad("page %d: free but carries an owner, refs or filled", id)
			}
		case PageOwned:
			if h.owners != 1 || h.sharers != 0 {
				bad("page %d: owned but held by %d owners and %d sharers", id, h.owners, h.sharers)
			} else if h.seq.serial != pg.seq || h.seq.owner != pg.owner {
				bad("page %d: owned by %v but in the block table of %v", id, pg.owner, h.seq.owner)
			}
			if pg.refs != 0 {
				bad("page %d: owned with refs %d", id, pg.refs)
			}
			tenants[pg.owner.Tenant]++
		case PageShared:
			if h.owners != 0 || int(pg.refs) != h.sharers {
				bad("page %d: shared with refs %d but %d sharers and %d owners", id, pg.refs, h.sharers, h.owners)
			}
			for t := range h.tenants {
				if t != pg.owner.Tenant {
					bad("page %d: shared by tenant %q but referenced by tenant %q", id, pg.owner.Tenant, t)
				}
			}
			if pg.owner.ID != (request.ID{}) || pg.seq != 0 {
				bad("page %d: shared but names a request", id)
			}
			if int(pg.filled) != ps {
				bad("page %d: shared with %d of %d positions filled", id, pg.filled, ps)
			}
			if pg.indexed {
				if p.index[pg.key] != PageID(id) {
					bad("page %d: indexed but the index maps its key to page %d", id, p.index[pg.key])
				}
			} else if pg.refs == 0 {
				bad("page %d: shared, unindexed and unreferenced (leaked)", id)
			}
			tenants[pg.owner.Tenant]++
		case PageQuarantined:
			if h.owners+h.sharers > 0 {
				bad("page %d: quarantined but in %d block tables", id, h.owners+h.sharers)
			}
			if pg.refs != 0 || pg.indexed {
				bad("page %d: quarantined with refs %d, indexed %v", id, pg.refs, pg.indexed)
			}
		}
	}
	if count != p.count {
		bad("state counts %v, ledger has %v", p.count, count)
	}
	sum := 0
	for _, c := range count {
		sum += c
	}
	if sum != p.total {
		bad("pages not conserved: %d in states, %d in the pool", sum, p.total)
	}
	if len(tenants) != len(p.tenants) {
		bad("per-tenant counts %v, ledger has %v", p.tenants, tenants)
	} else {
		for t, c := range tenants {
			if p.tenants[t] != c {
				bad("tenant %q: counted %d pages, ledger has %d", t, p.tenants[t], c)
			}
		}
	}

	// The free list holds exactly the free pages, once each.
	if len(p.free) != count[PageFree] {
		bad("free list has %d pages, ledger %d free", len(p.free), count[PageFree])
	}
	onFree := make(map[PageID]bool, len(p.free))
	for _, id := range p.free {
		if id == 0 || int(id) > p.total || p.ledger[id].state != PageFree || onFree[id] {
			bad("free list entry %d is not a free page or appears twice", id)
		}
		onFree[id] = true
	}

	// The index maps keys to indexed shared pages with that key.
	for key, id := range p.index {
		if id == 0 || int(id) > p.total {
			bad("index maps a key to page %d", id)
			continue
		}
		pg := &p.ledger[id]
		if pg.state != PageShared || !pg.indexed || pg.key != key {
			bad("index maps a key to page %d, which is %v (indexed %v) under another key", id, pg.state, pg.indexed)
		}
	}

	// The LRU list holds exactly the unreferenced indexed shared pages.
	n := 0
	prev := PageID(0)
	for id := p.ledger[0].next; id != 0; id = p.ledger[id].next {
		if n > p.total {
			bad("LRU list has a cycle")
			break
		}
		pg := &p.ledger[id]
		if pg.state != PageShared || !pg.indexed || pg.refs != 0 {
			bad("LRU list holds page %d: %v, indexed %v, refs %d", id, pg.state, pg.indexed, pg.refs)
		}
		if pg.prev != prev {
			bad("LRU list: page %d links back to %d, not %d", id, pg.prev, prev)
		}
		prev = id
		n++
	}
	if p.ledger[0].prev != prev {
		bad("LRU list tail is %d, walk ends at %d", p.ledger[0].prev, prev)
	}
	want := 0
	for id := 1; id <= p.total; id++ {
		pg := &p.ledger[id]
		if pg.state == PageShared && pg.indexed && pg.refs == 0 {
			want++
		}
	}
	if n != p.lruLen || n != want {
		bad("LRU list has %d pages, counted %d, ledger has %d evictable", n, p.lruLen, want)
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrCorrupt, errors.Join(errs...))
}

// PageInfo is the ledger entry of one page, for operators and tests.
type PageInfo struct {
	State  PageState
	Owner  request.Owner // owned: the owner; shared: the tenant; quarantined: the last owner
	Epoch  uint64
	Refs   int
	Filled int
	Cached bool // indexed in the prefix cache
	// Seq is the pool's serial number of the Sequence that owns the page
	// (kept on a quarantined page for forensics): the pages of one block
	// table share it, and a request preempted and restarted gets a new one.
	Seq uint64
}

// Page returns the ledger entry of id; ok is false when id is not a page of
// the pool.
func (p *Pool) Page(id PageID) (info PageInfo, ok bool) {
	if id == 0 || int(id) > p.total {
		return PageInfo{}, false
	}
	pg := &p.ledger[id]
	return p.info(pg), true
}

func (p *Pool) info(pg *page) PageInfo {
	return PageInfo{State: pg.state, Owner: pg.owner, Epoch: pg.epoch, Refs: int(pg.refs), Filled: int(pg.filled), Cached: pg.indexed, Seq: pg.seq}
}

// Snapshot appends the ledger entry of every page, in page order (page id
// i+1 at index i), to dst[:0] and returns it: the operator's page map. It
// is O(pages) and copies no KV, and, like every Pool method, must be called
// by the goroutine that drives the pool, so the picture it gives is of one
// moment between two steps. Pass the previous result to reuse its memory.
func (p *Pool) Snapshot(dst []PageInfo) []PageInfo {
	if cap(dst) < p.total {
		dst = make([]PageInfo, 0, p.total) // one allocation, not a doubling series
	}
	dst = dst[:0]
	for id := 1; id <= p.total; id++ {
		dst = append(dst, p.info(&p.ledger[id]))
	}
	return dst
}
