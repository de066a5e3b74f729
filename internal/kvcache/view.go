package kvcache

import (
	"github.com/pagewarden/pagewarden/internal/request"

	"errors"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/invariants"
)

// verify is THE check (I2, I3): every page of s's block table against the
// ledger, and a window of n new positions against what s reserved. It costs
// a handful of integer compares per page and allocates nothing unless it
// fails.
func (p *Pool) verify(s *Sequence, n int) error {
	ps := p.layout.PageSize
	capacity := len(s.table) * ps
	if s.length < 0 || s.length > capacity {
		return fmt.Errorf("length %d outside the %d reserved positions", s.length, capacity)
	}
	if n > capacity-s.length {
		return fmt.Errorf("window of %d positions at %d exceeds the %d reserved positions", n, s.length, capacity)
	}
	// Pages given back behind an attention window (DropBefore) are full
	// pages before the end, and their entries stay zero.
	if s.dropped < 0 || s.dropped*ps > s.length {
		return fmt.Errorf("%d pages given back behind the window, more than the %d positions written", s.dropped, s.length)
	}
	for i := range s.dropped {
		if s.table[i] != (entry{}) {
			return fmt.Errorf("entry %d names page %d, but the sequence gave its first %d pages back", i, s.table[i].id, s.dropped)
		}
	}
	for i := s.dropped; i < len(s.table); i++ {
		id := s.table[i].id
		if !p.matches(s, i) {
			return p.describeMismatch(s, i)
		}
		// Sequence length must agree with what was written, page by
		// page: full pages before the one holding the end, nothing
		// after it.
		want := min(max(s.length-i*ps, 0), ps)
		if got := int(p.ledger[id].filled); got != want {
			return fmt.Errorf("page %d (entry %d): ledger has %d positions filled, sequence of length %d expects %d", id, i, got, s.length, want)
		}
		if s.table[i].shared && want != ps {
			return fmt.Errorf("page %d (entry %d): shared page is not full in a sequence of length %d", id, i, s.length)
		}
	}
	return nil
}

func (p *Pool) describeMismatch(s *Sequence, i int) error {
	id := s.table[i].id
	if id == 0 || int(id) > p.total {
		return fmt.Errorf("entry %d names page %d, not a page of this pool", i, id)
	}
	pg := &p.ledger[id]
	kind := "owned"
	if s.table[i].shared {
		kind = "shared"
	}
	return fmt.Errorf("entry %d (%s, epoch %d) names page %d, which the ledger has %v by %v (sequence %d, epoch %d, refs %d); sequence %d is %v",
		i, kind, s.table[i].epoch, id, pg.state, pg.owner, pg.seq, pg.epoch, pg.refs, s.serial, s.owner)
}

// fail handles a violation detected on s: s's pages are quarantined and s
// ends, the violation is counted and reported through package invariants
// (a panic in strict mode, after the pool is consistent again), and the
// returned error wraps ErrViolation.
func (p *Pool) fail(s *Sequence, op string, cause error) error {
	owner := s.owner
	p.quarantineSequence(s)
	p.violations.Add(1)
	ierr := invariants.Failf("kvcache: %s for %v: %v", op, owner, cause)
	return fmt.Errorf("%w: %s for %v: %w", ErrViolation, op, owner, ierr)
}

// View is the forward pass's only access to KV memory: the pages of one
// sequence for one step, after the check passed. Positions Start() ..
// Start()+N()-1 are written by the step; positions before Start() were
// written by earlier steps and are readable.
//
// K, V, K16 and V16 return a page's slice truncated to its valid positions
// for this step, with capacity equal to length, so reading past them
// panics instead of returning stale data. A View is valid until Commit, the
// next Begin of its sequence, or the sequence's release; using it later is
// a violation. Forward-pass workers may read a View concurrently.
type View struct {
	pool  *Pool
	seq   *Sequence
	gen   uint64
	start int
	n     int
	first int     // pages before it were given back (DropBefore)
	table []entry // the pages the window reaches, no more
}

// Begin checks s (every page against the ledger, I2/I3) and returns a View
// for n new positions at Len(). On a violation nothing is handed out: s's
// pages are quarantined, s is ended and the error wraps ErrViolation. A
// second Begin before Commit makes the first View stale (a failed step is
// simply begun again).
func (p *Pool) Begin(s *Sequence, n int) (*View, error) {
	if err := p.usable(s); err != nil {
		return nil, err
	}
	if n < 1 {
		return nil, fmt.Errorf("%w: window of %d positions", ErrInvalid, n)
	}
	if err := p.verify(s, n); err != nil {
		return nil, p.fail(s, "begin", err)
	}
	ps := p.layout.PageSize
	end := (s.length + n + ps - 1) / ps
	s.viewGen++
	table := s.table[:end:end]
	if testHooks.swapPage != nil {
		table = testHooks.swapPage(p, s, table)
	}
	return &View{pool: p, seq: s, gen: s.viewGen, start: s.length, n: n, first: s.dropped, table: table}, nil
}

// Commit records the view's N positions as written: the sequence's length
// and its pages' filled counts move together.
func (p *Pool) Commit(v *View) error {
	if v == nil || v.pool != p {
		return fmt.Errorf("%w: view of another pool", ErrInvalid)
	}
	s := v.seq
	if s.closed {
		return ErrReleased
	}
	if v.gen != s.viewGen || s.length != v.start {
		return ErrStaleView
	}
	ps := p.layout.PageSize
	end := v.start + v.n
	for i := v.start / ps; i*ps < end; i++ {
		if s.table[i].shared || !p.matches(s, i) {
			return p.fail(s, "commit", p.describeMismatch(s, i))
		}
	}
	for i := v.start / ps; i*ps < end; i++ {
		p.ledger[s.table[i].id].filled = int32(min(end-i*ps, ps))
	}
	s.length = end
	s.viewGen++
	return nil
}

// Owner is the owner of the sequence this view was checked for. Executors
// echo it with what they computed, so that an outcome handed to the wrong
// request is detected rather than delivered.
func (v *View) Owner() request.Owner { return v.seq.owner }

// Start is the number of positions written before this step.
func (v *View) Start() int { return v.start }

// N is the number of positions this step writes.
func (v *View) N() int { return v.n }

// PageSize is the number of positions per page.
func (v *View) PageSize() int { return v.pool.layout.PageSize }

// Layout is the layout of the pool the view reads.
func (v *View) Layout() Layout { return v.pool.layout }

// NumPages is the number of pages the window reaches: page indexes
// FirstPage()..NumPages()-1 are valid arguments of K and V.
func (v *View) NumPages() int { return len(v.table) }

// FirstPage is the first page the view can read: 0, or the number of
// pages the sequence gave back behind its attention window
// (Pool.DropBefore). K, V, K16 and V16 of an earlier page are empty.
func (v *View) FirstPage() int { return v.first }

// errStale is what a stale View reports through package invariants.
var errStale = errors.New("kvcache: read through a stale view")

// valid returns the element range of page for this step, or ok == false
// (after reporting a violation) when the view is stale.
func (v *View) valid(page int) (lo, hi int, ok bool) {
	id := v.table[page].id // index panic beyond the window
	s := v.seq
	if s.closed || v.gen != s.viewGen {
		v.pool.violations.Add(1)
		_ = invariants.Failf("%v: %v page %d", errStale, s.owner, page)
		return 0, 0, false
	}
	if page < v.first {
		// A page given back behind the attention window (maybe someone
		// else's by now): an empty slice, so that any read of it is an
		// index panic, never data. It is not nil, so that a caller
		// probing page 0 for the pool's dtype or the view's staleness
		// (K nil: F16 pool; K and K16 nil: stale) still learns that.
		return 0, 0, true
	}
	ps := v.pool.layout.PageSize
	n := min(v.start+v.n-page*ps, ps)
	lo = (int(id) - 1) * v.pool.pageElems
	return lo, lo + n*v.pool.kvDim, true
}

// K is the keys of layer's page for this step in an F32 pool (nil in an F16
// pool): length = valid positions × KVDim, element
// (pos%PageSize)*KVDim + kvHead*HeadDim + d.
func (v *View) K(layer, page int) []float32 { return v.f32(v.pool.k32, layer, page) }

// V is the values of layer's page, like K.
func (v *View) V(layer, page int) []float32 { return v.f32(v.pool.v32, layer, page) }

// K16 is the keys of layer's page in an F16 pool (nil in an F32 pool).
func (v *View) K16(layer, page int) []uint16 { return v.f16(v.pool.k16, layer, page) }

// V16 is the values of layer's page in an F16 pool.
func (v *View) V16(layer, page int) []uint16 { return v.f16(v.pool.v16, layer, page) }

func (v *View) f32(arena [][]float32, layer, page int) []float32 {
	if arena == nil {
		return nil
	}
	lo, hi, ok := v.valid(page)
	if !ok {
		return nil
	}
	return arena[layer][lo:hi:hi]
}

func (v *View) f16(arena [][]uint16, layer, page int) []uint16 {
	if arena == nil {
		return nil
	}
	lo, hi, ok := v.valid(page)
	if !ok {
		return nil
	}
	return arena[layer][lo:hi:hi]
}
