package kvcache

import (
	"errors"
	"fmt"
	"slices"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// entry is one block-table row: the page and the epoch the sequence expects
// the ledger to show for it, and whether it holds the page as owner or as
// one reference of a shared page.
type entry struct {
	id     PageID
	shared bool
	epoch  uint64
}

// Sequence is a block table: for each of its pages the PageID and the epoch
// it expects to find in the ledger, and whether it holds the page as owner
// or as one reference of a shared page. Its length is the number of
// positions Commit recorded as written. A Sequence belongs to the Pool that
// made it and is driven by the same goroutine.
type Sequence struct {
	pool    *Pool
	serial  uint64 // unique per pool; the ledger names the owning sequence by it
	owner   request.Owner
	table   []entry
	length  int
	cached  int
	closed  bool
	viewGen uint64 // bumped whenever the current View stops being valid
	// dropped is the number of leading block-table entries whose pages
	// DropBefore gave back (behind an attention window); their entries
	// are zero, so no check can match them again.
	dropped int
	// imported is, per page, the positions ImportPage wrote from another
	// node, until CommitImport makes them the sequence's content.
	imported []int32
}

// NewSequence starts an empty sequence for owner.
func (p *Pool) NewSequence(owner request.Owner) *Sequence {
	p.serial++
	s := &Sequence{pool: p, serial: p.serial, owner: owner}
	p.live[s] = struct{}{}
	return s
}

// Owner is the owner every page of the sequence is checked against.
func (s *Sequence) Owner() request.Owner { return s.owner }

// Len is the number of positions written (committed), never counting
// reserved ones.
func (s *Sequence) Len() int { return s.length }

// NumPages is the number of pages in the block table, reserved ones
// included, and those DropBefore gave back: the table still spans every
// position from 0, so Capacity and Reserve count from it.
func (s *Sequence) NumPages() int { return len(s.table) }

// HeldPages is the number of pages the sequence holds: NumPages less the
// ones DropBefore gave back.
func (s *Sequence) HeldPages() int { return len(s.table) - s.dropped }

// DroppedPages is the number of leading pages DropBefore gave back;
// positions before DroppedPages()*page size can no longer be read.
func (s *Sequence) DroppedPages() int { return s.dropped }

// Capacity is the number of positions the block table can hold.
func (s *Sequence) Capacity() int {
	if s.pool == nil {
		return 0
	}
	return len(s.table) * s.pool.layout.PageSize
}

// CachedTokens is the number of prompt positions AttachPrefix served from
// the prefix cache (usage.cached_tokens).
func (s *Sequence) CachedTokens() int { return s.cached }

// Released reports whether the sequence was released or aborted.
func (s *Sequence) Released() bool { return s.closed }

// Pages returns a copy of the block table's page ids (0 for the pages
// DropBefore gave back).
func (s *Sequence) Pages() []PageID {
	out := make([]PageID, len(s.table))
	for i, e := range s.table {
		out[i] = e.id
	}
	return out
}

// usable checks that s can be operated on by p.
func (p *Pool) usable(s *Sequence) error {
	switch {
	case s == nil:
		return fmt.Errorf("%w: nil sequence", ErrInvalid)
	case s.pool != p:
		return ErrWrongPool
	case s.closed:
		return ErrReleased
	}
	return nil
}

// Reserve makes sure the block table has pages for Len()+n positions,
// allocating fresh pages (and evicting unreferenced prefix-cache pages when
// the free list runs short). It is all-or-nothing: on ErrNoPages the block
// table is unchanged. Reserved positions are not written: Len does not
// move.
func (p *Pool) Reserve(s *Sequence, n int) error {
	if err := p.usable(s); err != nil {
		return err
	}
	ps := p.layout.PageSize
	if n < 0 {
		return fmt.Errorf("%w: reserve %d positions", ErrInvalid, n)
	}
	if n > p.total*ps {
		return fmt.Errorf("%w: %d positions exceed the pool", ErrNoPages, n)
	}
	need := (s.length+n+ps-1)/ps - len(s.table)
	if need <= 0 {
		return nil
	}
	if need > p.FreePages() {
		return fmt.Errorf("%w: need %d pages, %d allocatable", ErrNoPages, need, p.FreePages())
	}
	base := len(s.table)
	s.table = slices.Grow(s.table, need)
	for range need {
		id, err := p.allocate(s)
		if err != nil {
			// Only possible when VerifyScrub quarantined pages on the
			// way: give back what this call took.
			for i := len(s.table) - 1; i >= base; i-- {
				p.freePage(s.table[i].id)
			}
			s.table = s.table[:base]
			return err
		}
		s.table = append(s.table, entry{id: id, epoch: p.ledger[id].epoch, shared: false})
	}
	return nil
}

// matches reports whether block-table entry i of s agrees with the ledger
// about who holds the page. Filled counts are checked by verify.
func (p *Pool) matches(s *Sequence, i int) bool {
	id := s.table[i].id
	if id == 0 || int(id) > p.total {
		return false
	}
	pg := &p.ledger[id]
	if pg.epoch != s.table[i].epoch {
		return false
	}
	if s.table[i].shared {
		return pg.state == PageShared && pg.owner.Tenant == s.owner.Tenant && pg.refs > 0
	}
	return pg.state == PageOwned && pg.seq == s.serial && pg.owner == s.owner
}

// close ends s: it leaves the live set and its views become stale.
func (p *Pool) close(s *Sequence) {
	s.closed = true
	s.table = nil
	s.imported = nil
	s.length = 0
	s.dropped = 0
	s.viewGen++
	delete(p.live, s)
}

// unref drops one reference to a shared page. The last reference leaves an
// indexed page in the cache (most recently used); an unindexed one (from
// Fork) has no further use and is scrubbed and freed.
func (p *Pool) unref(id PageID) {
	pg := &p.ledger[id]
	pg.refs--
	if pg.refs > 0 {
		return
	}
	if pg.indexed {
		p.lruPushBack(id)
		return
	}
	p.freePage(id)
}

// Release ends s normally: its owned pages are scrubbed and freed and its
// references to shared pages dropped. Releasing twice is a no-op. An entry
// that does not match the ledger is left alone (it is not s's to free) and
// reported as a violation; pages the ledger says s owns but its table no
// longer names are then quarantined.
func (p *Pool) Release(s *Sequence) {
	p.end(s, false)
}

// Abort ends s after a failure. When cause wraps ErrViolation the pages s
// owns are quarantined rather than freed, so that nothing they hold is
// reused before an operator scrubs them; otherwise Abort is Release. The
// violation itself is counted where it was detected, not here.
func (p *Pool) Abort(s *Sequence, cause error) {
	p.end(s, errors.Is(cause, ErrViolation))
}

func (p *Pool) end(s *Sequence, quarantine bool) {
	if s == nil || s.closed {
		return
	}
	if s.pool != p {
		_ = invariants.Failf("kvcache: release of a sequence of another pool (%v)", s.owner)
		return
	}
	p.remember(s)
	if quarantine {
		p.quarantineSequence(s)
		return
	}
	var bad []int
	// Last page first: a prompt's later pages then enter the LRU before
	// its earlier ones and are evicted first, keeping chains' heads.
	for i := len(s.table) - 1; i >= s.dropped; i-- {
		if !p.matches(s, i) {
			bad = append(bad, i)
			continue
		}
		if s.table[i].shared {
			p.unref(s.table[i].id)
		} else {
			p.freePage(s.table[i].id)
		}
	}
	if len(bad) == 0 {
		p.close(s)
		return
	}
	owner := s.owner
	p.sweepOrphans(s)
	p.close(s)
	p.repairShared()
	p.violations.Add(1)
	_ = invariants.Failf("kvcache: release of %v: block-table entries %v do not match the ledger", owner, bad)
}

// quarantineSequence ends s after a violation: every page the ledger says s
// owns is quarantined, its shared references are dropped, and entries that
// are not s's are left to their real holders.
func (p *Pool) quarantineSequence(s *Sequence) {
	for i := len(s.table) - 1; i >= s.dropped; i-- {
		if !p.matches(s, i) {
			continue
		}
		if s.table[i].shared {
			p.unref(s.table[i].id)
		} else {
			p.quarantine(s.table[i].id)
		}
	}
	p.sweepOrphans(s)
	p.close(s)
	p.repairShared()
}

// sweepOrphans quarantines pages the ledger says s owns that its block
// table no longer names (a corrupted table). O(pages); violation path only.
func (p *Pool) sweepOrphans(s *Sequence) {
	for id := 1; id <= p.total; id++ {
		pg := &p.ledger[id]
		if pg.state == PageOwned && pg.seq == s.serial {
			p.quarantine(PageID(id))
		}
	}
}

// repairShared recounts the references of every shared page from the live
// block tables. A corrupted table may have lost an entry for a shared page
// (its reference would leak, pinning the page forever); recounting after
// the table is gone restores the counts. O(pages + entries); violation
// path only.
func (p *Pool) repairShared() {
	refs := make(map[PageID]int32)
	for s := range p.live {
		for i, e := range s.table {
			if e.shared && p.matches(s, i) {
				refs[e.id]++
			}
		}
	}
	for id := 1; id <= p.total; id++ {
		pg := &p.ledger[id]
		if pg.state != PageShared || pg.refs == 0 || pg.refs == refs[PageID(id)] {
			continue
		}
		pg.refs = refs[PageID(id)] + 1
		p.unref(PageID(id)) // to the cache or the free list at zero
	}
}

// Fork starts a sequence for owner (same tenant as parent) that continues
// from parent's written positions. Parent's full pages become shared
// between the two (read-only, refcounted); its partial last page, if any,
// is copied into a fresh page owned by the child. Parent's reserved but
// unwritten pages stay with parent. Fork checks parent first, like Begin.
func (p *Pool) Fork(parent *Sequence, owner request.Owner) (*Sequence, error) {
	if err := p.usable(parent); err != nil {
		return nil, err
	}
	if owner.Tenant != parent.owner.Tenant {
		return nil, fmt.Errorf("%w: fork of %v for %v", ErrTenant, parent.owner, owner)
	}
	if err := p.verify(parent, 0); err != nil {
		return nil, p.fail(parent, "fork", err)
	}
	if parent.dropped > 0 {
		// The child would start with positions nobody holds; a fork
		// (best_of, n) happens right after the prompt, before any
		// window could leave a page behind.
		return nil, fmt.Errorf("%w: fork of %v, which gave back %d pages behind its attention window", ErrInvalid, parent.owner, parent.dropped)
	}
	ps := p.layout.PageSize
	full, rest := parent.length/ps, parent.length%ps
	if rest > 0 && p.FreePages() == 0 {
		return nil, fmt.Errorf("%w: fork needs a page for the partial last page", ErrNoPages)
	}
	child := p.NewSequence(owner)
	var partial PageID
	if rest > 0 {
		// Allocate before sharing anything, so that failure leaves
		// parent untouched. Eviction cannot take parent's pages: they
		// are referenced.
		id, err := p.allocate(child)
		if err != nil {
			p.close(child)
			return nil, err
		}
		p.copyPage(id, parent.table[full].id, rest)
		p.ledger[id].filled = int32(rest)
		partial = id
	}
	for i := range full {
		id := parent.table[i].id
		pg := &p.ledger[id]
		if !parent.table[i].shared {
			pg.seq, pg.owner = 0, request.Owner{Tenant: parent.owner.Tenant}
			p.setState(pg, PageShared)
			pg.refs = 1
			parent.table[i].shared = true
		}
		pg.refs++
		child.table = append(child.table, entry{id: id, epoch: pg.epoch, shared: true})
	}
	if partial != 0 {
		child.table = append(child.table, entry{id: partial, epoch: p.ledger[partial].epoch, shared: false})
	}
	child.length = parent.length
	return child, nil
}

// DropBefore gives back the pages of s that hold only positions before
// pos, for a model whose every layer attends to a sliding window: once the
// next position to compute is q, keys before q-window+1 are never read
// again (llama.cpp's n_swa rule: k is seen from q iff q-k < window), so the
// caller passes pos = Len()-window+1. Only full, written pages are given
// back (never the one holding Len(), nor reserved ones); owned pages are
// scrubbed and freed, references to shared (prefix-cache) pages dropped,
// exactly as Release does. s is checked against the ledger first, like
// Begin: on a mismatch nothing is given back, s's pages are quarantined, s
// ends and the error wraps ErrViolation. The block table keeps its length
// (entries for the pages given back become zero, and Views refuse them),
// so positions, Capacity and Reserve are unchanged. Any View of s becomes
// stale. It returns the number of pages given back.
func (p *Pool) DropBefore(s *Sequence, pos int) (int, error) {
	if err := p.usable(s); err != nil {
		return 0, err
	}
	ps := p.layout.PageSize
	upto := min(max(pos, 0), s.length) / ps // pages [0, upto) are behind pos
	if upto <= s.dropped {
		return 0, nil
	}
	if len(s.imported) > 0 {
		return 0, fmt.Errorf("%w: drop in a sequence with an import pending", ErrInvalid)
	}
	if err := p.verify(s, 0); err != nil {
		return 0, p.fail(s, "drop", err)
	}
	n := 0
	for i := s.dropped; i < upto; i++ {
		if s.table[i].shared {
			p.unref(s.table[i].id)
		} else {
			p.freePage(s.table[i].id)
		}
		s.table[i] = entry{}
		n++
	}
	s.dropped = upto
	s.viewGen++
	return n, nil
}

// copyPage copies the first n positions of every layer's K and V from src
// to dst.
func (p *Pool) copyPage(dst, src PageID, n int) {
	dlo, _ := p.span(dst)
	slo, _ := p.span(src)
	m := n * p.kvDim
	for l := range p.layout.Layers {
		if p.k32 != nil {
			copy(p.k32[l][dlo:dlo+m], p.k32[l][slo:slo+m])
			copy(p.v32[l][dlo:dlo+m], p.v32[l][slo:slo+m])
		} else {
			copy(p.k16[l][dlo:dlo+m], p.k16[l][slo:slo+m])
			copy(p.v16[l][dlo:dlo+m], p.v16[l][slo:slo+m])
		}
	}
}
