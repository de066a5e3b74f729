package kvcache

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"

	"github.com/pagewarden/pagewarden/internal/hugemem"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// PageID names a page of a pool. Pages are numbered from 1; 0 is never a
// page, so a block-table entry that was never set fails every check.
type PageID uint32

// PageState is the ledger state of a page.
type PageState uint8

const (
	PageFree        PageState = iota // scrubbed (unless ScrubNone) and allocatable
	PageOwned                        // written by exactly one live sequence
	PageShared                       // read-only, refcounted, one tenant
	PageQuarantined                  // withheld until an operator scrubs it
	numStates
)

func (s PageState) String() string {
	switch s {
	case PageFree:
		return "free"
	case PageOwned:
		return "owned"
	case PageShared:
		return "shared"
	case PageQuarantined:
		return "quarantined"
	}
	return fmt.Sprintf("PageState(%d)", uint8(s))
}

// ScrubPolicy says what a released page is overwritten with.
type ScrubPolicy uint8

const (
	ScrubZero   ScrubPolicy = iota // zero fill; the default
	ScrubPoison                    // NaN fill, so a stale read shows as non-finite logits
	ScrubNone                      // no scrub; only with Config.AllowNoScrub
)

func (s ScrubPolicy) String() string {
	switch s {
	case ScrubZero:
		return "zero"
	case ScrubPoison:
		return "poison"
	case ScrubNone:
		return "none"
	}
	return fmt.Sprintf("ScrubPolicy(%d)", uint8(s))
}

// ParseScrubPolicy reads "zero", "poison" or "none".
func ParseScrubPolicy(s string) (ScrubPolicy, error) {
	for _, p := range []ScrubPolicy{ScrubZero, ScrubPoison, ScrubNone} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: scrub policy %q (want zero, poison or none)", ErrConfig, s)
}

// The poison patterns: quiet NaNs, which survive arithmetic and make any
// logit that touched them non-finite.
const (
	poisonF32 uint32 = 0x7FC00000
	poisonF16 uint16 = 0x7E00
)

// Config configures a Pool.
type Config struct {
	Layout Layout
	Pages  int // usable pages; see PagesForMemory
	Scrub  ScrubPolicy
	// AllowNoScrub must be set for Scrub == ScrubNone: skipping the scrub
	// leaves one tenant's KV in pages the next tenant gets.
	AllowNoScrub bool
	// VerifyScrub checks, on every allocation, that the page still holds
	// the scrub pattern (O(page bytes), for tests and simulations): a page
	// that does not is quarantined and counted as a violation.
	VerifyScrub bool
	// ModelDigest identifies the model whose KV the pool holds; it is part
	// of every prefix-cache key.
	ModelDigest [32]byte
}

// Validate reports whether the configuration describes a pool.
func (c Config) Validate() error {
	if err := c.Layout.Validate(); err != nil {
		return err
	}
	switch {
	case c.Pages < 1 || c.Pages > maxPages:
		return fmt.Errorf("%w: %d pages (want 1..%d)", ErrConfig, c.Pages, maxPages)
	case c.Scrub > ScrubNone:
		return fmt.Errorf("%w: scrub policy %v", ErrConfig, c.Scrub)
	case c.Scrub == ScrubNone && !c.AllowNoScrub:
		return fmt.Errorf("%w: scrub policy none needs AllowNoScrub", ErrConfig)
	case c.Scrub == ScrubNone && c.VerifyScrub:
		return fmt.Errorf("%w: VerifyScrub needs a scrub policy", ErrConfig)
	}
	return nil
}

// Errors. A *violation* (ErrViolation) is a broken invariant: it is counted,
// reported through package invariants and never computed on. Its message
// names the pages and owners involved, possibly another tenant's, for the
// operator's log: it must never reach a client. The others are ordinary
// outcomes or caller errors.
var (
	ErrConfig         = errors.New("kvcache: invalid configuration")
	ErrNoPages        = errors.New("kvcache: not enough free pages")
	ErrViolation      = errors.New("kvcache: isolation violation")
	ErrReleased       = errors.New("kvcache: sequence already released")
	ErrWrongPool      = errors.New("kvcache: sequence belongs to another pool")
	ErrStaleView      = errors.New("kvcache: view is no longer current")
	ErrInvalid        = errors.New("kvcache: invalid argument")
	ErrTenant         = errors.New("kvcache: pages cannot cross tenants")
	ErrNotQuarantined = errors.New("kvcache: page is not quarantined")
)

// page is one ledger entry.
type page struct {
	state   PageState
	indexed bool // shared and present in the prefix index under key
	// owner is the owning sequence's owner (owned), the tenant alone
	// (shared), or the last owner (quarantined, for forensics).
	owner  request.Owner
	seq    uint64 // owned: serial of the owning Sequence
	epoch  uint64 // set on allocation, unique over the pool's life
	refs   int32  // shared: block-table entries that reference the page
	filled int32  // positions written, 0..PageSize
	key    [32]byte
	// prev and next link unreferenced indexed shared pages into the LRU
	// list whose head is the ledger's entry 0.
	prev, next PageID
}

// counters are the monotonic counts behind Stats.
type counters struct {
	allocations, scrubs, evictions, quarantines uint64
	prefixHits, prefixMisses, published         uint64
}

// Pool owns the KV memory of a node. Its methods must be called from one
// goroutine; Views may be read concurrently (see View).
type Pool struct {
	layout      Layout
	scrub       ScrubPolicy
	verifyScrub bool
	digest      [32]byte
	total       int
	kvDim       int
	pageElems   int // PageSize*KVDim elements of one page in one layer

	// Per-layer arenas; page id's elements are at (id-1)*pageElems.
	k32, v32 [][]float32
	k16, v16 [][]uint16

	ledger  []page // ledger[0] is the LRU list head, never a page
	free    []PageID
	index   map[[32]byte]PageID
	lruLen  int
	epoch   uint64
	serial  uint64
	live    map[*Sequence]struct{}
	count   [numStates]int
	tenants map[request.Tenant]int

	st         counters
	violations atomic.Uint64 // also bumped by Views on worker goroutines
	keyBuf     []byte

	// recent remembers the pages of the last ended sequences (forensics.go).
	recent recentPages
}

// NewPool allocates the arenas and ledger of cfg.Pages pages. Under
// ScrubPoison the arenas start poisoned, so that even a never-used page
// reads as NaN.
func NewPool(cfg Config) (*Pool, error) {
	cfg.Layout = cfg.Layout.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := cfg.Layout
	p := &Pool{
		layout:      l,
		scrub:       cfg.Scrub,
		verifyScrub: cfg.VerifyScrub,
		digest:      cfg.ModelDigest,
		total:       cfg.Pages,
		kvDim:       l.KVDim(),
		pageElems:   l.PageSize * l.KVDim(),
		ledger:      make([]page, cfg.Pages+1),
		free:        make([]PageID, 0, cfg.Pages),
		index:       make(map[[32]byte]PageID),
		live:        make(map[*Sequence]struct{}),
		tenants:     make(map[request.Tenant]int),
	}
	// The page arrays are asked for huge pages (package hugemem): attention
	// reads every page of a sequence once per token, scattered over arrays
	// of hundreds of MiB, a TLB miss per 4 KiB page otherwise (16 sequences
	// decoding together on an F16 cache: +5% tokens/s on huge pages).
	n := cfg.Pages * p.pageElems
	switch l.DType {
	case F32:
		p.k32, p.v32 = make([][]float32, l.Layers), make([][]float32, l.Layers)
		for i := range l.Layers {
			p.k32[i], p.v32[i] = hugemem.Make[float32](n), hugemem.Make[float32](n)
			if cfg.Scrub == ScrubPoison {
				fill32(p.k32[i], poisonF32)
				fill32(p.v32[i], poisonF32)
			}
		}
	case F16:
		p.k16, p.v16 = make([][]uint16, l.Layers), make([][]uint16, l.Layers)
		for i := range l.Layers {
			p.k16[i], p.v16[i] = hugemem.Make[uint16](n), hugemem.Make[uint16](n)
			if cfg.Scrub == ScrubPoison {
				fill16(p.k16[i], poisonF16)
				fill16(p.v16[i], poisonF16)
			}
		}
	}
	// Push in reverse so that allocation hands out page 1 first: runs
	// are then easy to read in tests and logs.
	for id := cfg.Pages; id >= 1; id-- {
		p.free = append(p.free, PageID(id))
	}
	p.count[PageFree] = cfg.Pages
	return p, nil
}

// Layout is the pool's layout, with defaults applied.
func (p *Pool) Layout() Layout { return p.layout }

// ScrubPolicy is the policy released pages are scrubbed with.
func (p *Pool) ScrubPolicy() ScrubPolicy { return p.scrub }

// TotalPages is the number of usable pages (the never-allocated page 0 is
// not counted).
func (p *Pool) TotalPages() int { return p.total }

// FreePages is the number of pages a Reserve can obtain now: free pages plus
// unreferenced prefix-cache pages, which are evicted on demand.
func (p *Pool) FreePages() int { return len(p.free) + p.lruLen }

// Violations is the number of isolation violations this pool detected.
func (p *Pool) Violations() uint64 { return p.violations.Load() }

// fill32 and fill16 set every element by doubling copies, which run at
// memmove speed (a plain loop is several times slower than clear).
func fill32(s []float32, bits uint32) {
	if len(s) == 0 {
		return
	}
	s[0] = math.Float32frombits(bits)
	for i := 1; i < len(s); i *= 2 {
		copy(s[i:], s[:i])
	}
}

func fill16(s []uint16, v uint16) {
	if len(s) == 0 {
		return
	}
	s[0] = v
	for i := 1; i < len(s); i *= 2 {
		copy(s[i:], s[:i])
	}
}

func (p *Pool) span(id PageID) (lo, hi int) {
	lo = (int(id) - 1) * p.pageElems
	return lo, lo + p.pageElems
}

// scrubPage overwrites every layer's K and V of the page with the pattern
// of pol (ScrubNone does nothing).
func (p *Pool) scrubPage(id PageID, pol ScrubPolicy) {
	if pol == ScrubNone || testHooks.skipScrub {
		return
	}
	p.fillRows(id, 0, pol == ScrubPoison)
	p.st.scrubs++
}

// fillRows overwrites every layer's K and V of page id, from position from
// to the end of the page, with the poison pattern or zeros.
func (p *Pool) fillRows(id PageID, from int, poison bool) {
	lo, hi := p.span(id)
	lo += from * p.kvDim
	for l := range p.layout.Layers {
		switch {
		case p.k32 != nil && poison:
			fill32(p.k32[l][lo:hi], poisonF32)
			fill32(p.v32[l][lo:hi], poisonF32)
		case p.k32 != nil:
			clear(p.k32[l][lo:hi])
			clear(p.v32[l][lo:hi])
		case poison:
			fill16(p.k16[l][lo:hi], poisonF16)
			fill16(p.v16[l][lo:hi], poisonF16)
		default:
			clear(p.k16[l][lo:hi])
			clear(p.v16[l][lo:hi])
		}
	}
}

// scrubbed reports whether every element of the page holds the pool's
// scrub pattern.
func (p *Pool) scrubbed(id PageID) bool {
	lo, hi := p.span(id)
	var w32 uint32
	var w16 uint16
	if p.scrub == ScrubPoison {
		w32, w16 = poisonF32, poisonF16
	}
	for l := range p.layout.Layers {
		if p.k32 != nil {
			for _, a := range [2][]float32{p.k32[l][lo:hi], p.v32[l][lo:hi]} {
				for _, x := range a {
					if math.Float32bits(x) != w32 {
						return false
					}
				}
			}
		} else {
			for _, a := range [2][]uint16{p.k16[l][lo:hi], p.v16[l][lo:hi]} {
				for _, x := range a {
					if x != w16 {
						return false
					}
				}
			}
		}
	}
	return true
}

func (p *Pool) setState(pg *page, s PageState) {
	p.count[pg.state]--
	p.count[s]++
	pg.state = s
}

func (p *Pool) addTenant(t request.Tenant, d int) {
	n := p.tenants[t] + d
	if n == 0 {
		delete(p.tenants, t)
	} else {
		p.tenants[t] = n
	}
}

// takeFree pops a page off the free list, evicting the least recently used
// unreferenced prefix-cache page when the list is empty. It returns 0 when
// neither has a page.
func (p *Pool) takeFree() PageID {
	if len(p.free) == 0 {
		if p.lruLen == 0 {
			return 0
		}
		p.evict(p.ledger[0].next)
	}
	id := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return id
}

// allocate hands a free page to s as owned, with a fresh epoch.
func (p *Pool) allocate(s *Sequence) (PageID, error) {
	for {
		id := p.takeFree()
		if id == 0 {
			return 0, fmt.Errorf("%w: pool exhausted", ErrNoPages)
		}
		pg := &p.ledger[id]
		if p.verifyScrub && !p.scrubbed(id) {
			// The page kept a previous owner's data: never hand it
			// out, whoever wrote it.
			p.violations.Add(1)
			p.setState(pg, PageQuarantined)
			p.st.quarantines++
			// Failf panics in strict mode; otherwise the error is acted
			// on by the quarantine above and the next page is tried.
			_ = invariants.Failf("kvcache: free page %d does not hold the %v scrub pattern", id, p.scrub)
			continue
		}
		p.epoch++
		*pg = page{state: pg.state, owner: s.owner, seq: s.serial, epoch: p.epoch}
		p.setState(pg, PageOwned)
		p.addTenant(s.owner.Tenant, 1)
		p.st.allocations++
		return id, nil
	}
}

// freePage scrubs a page that its holder gave up and puts it on the free
// list.
func (p *Pool) freePage(id PageID) {
	pg := &p.ledger[id]
	p.addTenant(pg.owner.Tenant, -1)
	p.scrubPage(id, p.scrub)
	*pg = page{state: pg.state}
	p.setState(pg, PageFree)
	p.free = append(p.free, id)
}

// quarantine withholds a page (owned, or shared and unreferenced) from
// reuse, keeping its owner for forensics.
func (p *Pool) quarantine(id PageID) {
	pg := &p.ledger[id]
	if pg.state == PageOwned || pg.state == PageShared {
		p.addTenant(pg.owner.Tenant, -1)
	}
	if pg.indexed {
		p.unindex(id)
	}
	pg.refs = 0
	p.setState(pg, PageQuarantined)
	p.st.quarantines++
}

// Quarantined lists the quarantined pages in increasing order.
func (p *Pool) Quarantined() []PageID {
	var out []PageID
	for id := 1; id <= p.total; id++ {
		if p.ledger[id].state == PageQuarantined {
			out = append(out, PageID(id))
		}
	}
	return out
}

// ScrubQuarantined is the operator's (or reaper's) release of quarantined
// pages: each is scrubbed (zero fill under ScrubNone: these pages are
// suspect by definition) and freed. With no ids it releases all of them. It
// returns how many pages it freed and an error wrapping ErrNotQuarantined
// for ids that are not quarantined, which it leaves alone.
func (p *Pool) ScrubQuarantined(ids ...PageID) (int, error) {
	if len(ids) == 0 {
		ids = p.Quarantined()
	}
	n := 0
	var bad []PageID
	for _, id := range ids {
		if id == 0 || int(id) > p.total || p.ledger[id].state != PageQuarantined {
			bad = append(bad, id)
			continue
		}
		pol := p.scrub
		if pol == ScrubNone {
			pol = ScrubZero
		}
		p.scrubPage(id, pol)
		pg := &p.ledger[id]
		*pg = page{state: pg.state}
		p.setState(pg, PageFree)
		p.free = append(p.free, id)
		n++
	}
	if len(bad) > 0 {
		return n, fmt.Errorf("%w: %v", ErrNotQuarantined, bad)
	}
	return n, nil
}
