package kvcache

import "github.com/pagewarden/pagewarden/internal/request"

// Forensics for the replay audit. An answer is re-scored after its
// sequence ended, so by then its pages are free, reused, or alive in the
// prefix cache (its prompt's full pages, published for reuse). The pool
// remembers the pages (id and epoch) of the last RecentSequences ended
// sequences by owner, so that an audit mismatch can name the pages and
// epochs the answer read and quarantine those still alive with the same
// epoch: the same KV the suspect answer read, which nothing else may
// attach. A page reallocated since has another epoch and holds none of
// it.

// RecentSequences is how many ended sequences the pool remembers.
const RecentSequences = 4096

// PageRef names a page as a sequence held it.
type PageRef struct {
	ID    PageID
	Epoch uint64
}

// recentPages is a ring of ended sequences' pages by owner.
type recentPages struct {
	byOwner map[request.Owner][]PageRef
	ring    []request.Owner
	next    int
}

// remember records s's pages (those it still holds) as it ends.
func (p *Pool) remember(s *Sequence) {
	r := &p.recent
	if r.byOwner == nil {
		r.byOwner = make(map[request.Owner][]PageRef)
		r.ring = make([]request.Owner, 0, RecentSequences)
	}
	refs := make([]PageRef, 0, len(s.table)-s.dropped)
	for _, e := range s.table[s.dropped:] {
		refs = append(refs, PageRef{ID: e.id, Epoch: e.epoch})
	}
	if _, seen := r.byOwner[s.owner]; !seen {
		if len(r.ring) < RecentSequences {
			r.ring = append(r.ring, s.owner)
		} else {
			delete(r.byOwner, r.ring[r.next])
			r.ring[r.next] = s.owner
			r.next = (r.next + 1) % RecentSequences
		}
	}
	r.byOwner[s.owner] = refs
}

// QuarantineAnswer names the pages owner's ended sequence held and
// withdraws those still alive with the same epoch: an unreferenced
// prefix-cache page is quarantined (kept for forensics until an operator
// scrubs it), one that other sequences are reading is taken out of the
// prefix index so that nothing new attaches it (its readers keep it until
// they end, then it is scrubbed). ok is false when the pool does not
// remember owner (never here, or too long ago).
func (p *Pool) QuarantineAnswer(owner request.Owner) (pages []PageRef, quarantined, withdrawn int, ok bool) {
	refs, ok := p.recent.byOwner[owner]
	if !ok {
		return nil, 0, 0, false
	}
	for _, r := range refs {
		if r.ID == 0 || int(r.ID) > p.total {
			continue
		}
		pg := &p.ledger[r.ID]
		if pg.epoch != r.Epoch || pg.state != PageShared {
			continue
		}
		if pg.refs == 0 {
			p.quarantine(r.ID)
			quarantined++
		} else if pg.indexed {
			p.unindex(r.ID)
			withdrawn++
		}
	}
	return append([]PageRef(nil), refs...), quarantined, withdrawn, true
}
