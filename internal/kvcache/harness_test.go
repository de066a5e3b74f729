package kvcache_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"pgregory.net/rapid"
)

// The harness drives a pool through random operations with several
// tenants and checks, after every operation, the ledger audit, page
// conservation, the counters, and the content of every page a View shows:
// each written position holds a value derived from (tenant, tokens up to
// it), so a read of any other tenant's or request's data, or of a stale
// page, shows up as a wrong value, and every unwritten position must hold
// the scrub pattern. The same harness runs under rapid (shrinking) and as
// a seeded simulation (volume).

// chooser is the source of random choices.
type chooser interface {
	Intn(label string, n int) int // uniform in [0, n)
}

type rapidChooser struct{ t *rapid.T }

func (c rapidChooser) Intn(label string, n int) int { return rapid.IntRange(0, n-1).Draw(c.t, label) }

type randChooser struct{ r *rand.Rand }

func (c randChooser) Intn(_ string, n int) int { return c.r.IntN(n) }

type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

type hseq struct {
	s      *kvcache.Sequence
	tenant int
	salt   string
	prompt []int
	tokens []int    // committed tokens: len(tokens) == s.Len()
	hashes []uint64 // hashes[i] identifies (tenant, tokens[:i+1])
	dirty  int      // positions that may hold uncommitted writes
}

type harness struct {
	t       fataler
	c       chooser
	p       *kvcache.Pool
	l       kvcache.Layout
	scrub   kvcache.ScrubPolicy
	tenants []request.Tenant
	prompts [][]int
	seqs    []*hseq
	nextID  uint32
	ops     int
	// violations is how many violations the harness provoked on purpose
	// (opCorrupt); the pool must have counted exactly these.
	violations uint64
}

type harnessConfig struct {
	dtype    kvcache.DType
	scrub    kvcache.ScrubPolicy
	pageSize int
	pages    int
	noVerify bool // leave Config.VerifyScrub off (controls of the harness itself)
}

func newHarness(t fataler, c chooser, hc harnessConfig) *harness {
	t.Helper()
	l := kvcache.Layout{Layers: 2, KVHeads: 2, HeadDim: 2, PageSize: hc.pageSize, DType: hc.dtype}
	p, err := kvcache.NewPool(kvcache.Config{Layout: l, Pages: hc.pages, Scrub: hc.scrub, VerifyScrub: !hc.noVerify, ModelDigest: [32]byte{1}})
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	ps := hc.pageSize
	return &harness{
		t: t, c: c, p: p, l: p.Layout(), scrub: hc.scrub,
		// "org_1"/"org_12345" differ only in framing; all tenants use
		// the same prompts, so any cross-tenant hit would be found.
		tenants: []request.Tenant{"org_1", "org_12345", "t3"},
		prompts: [][]int{
			seqTokens(2*ps+1, 1),
			seqTokens(3*ps+2, 1), // extends the first one's pages
			seqTokens(2*ps, 7),
		},
	}
}

func seqTokens(n, start int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = start + i%5
	}
	return out
}

func owner(tenant request.Tenant, n uint32) request.Owner {
	var id request.ID
	id[0], id[1], id[2], id[3] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
	id[15] = 0xAA
	return request.Owner{Tenant: tenant, ID: id}
}

func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

func (h *hseq) push(tok int) {
	prev := uint64(h.tenant+1) * 0x9E3779B97F4A7C15
	if n := len(h.hashes); n > 0 {
		prev = h.hashes[n-1]
	}
	h.tokens = append(h.tokens, tok)
	h.hashes = append(h.hashes, mix(prev^uint64(tok)*0x100000001B3))
}

// value is what position pos of h holds at (layer, kv, element e).
func value(ph uint64, layer, kv, e int) uint16 {
	return uint16(1 + mix(ph^uint64(layer<<20|kv<<16|e))%1000)
}

func (h *harness) pick() *hseq {
	if len(h.seqs) == 0 {
		return nil
	}
	return h.seqs[h.c.Intn("seq", len(h.seqs))]
}

func (h *harness) drop(x *hseq) {
	for i, y := range h.seqs {
		if y == x {
			h.seqs = append(h.seqs[:i], h.seqs[i+1:]...)
			return
		}
	}
}

func (h *harness) opNew() {
	if len(h.seqs) >= 8 {
		return
	}
	ti := h.c.Intn("tenant", len(h.tenants))
	prompt := h.prompts[h.c.Intn("prompt", len(h.prompts))]
	salt := []string{"", "salt"}[h.c.Intn("salt", 2)]
	h.nextID++
	x := &hseq{s: h.p.NewSequence(owner(h.tenants[ti], h.nextID)), tenant: ti, salt: salt, prompt: prompt}
	cached := h.p.AttachPrefix(x.s, prompt, salt)
	ps := h.l.PageSize
	if cached%ps != 0 || cached >= max(len(prompt), 1) || x.s.Len() != cached || x.s.CachedTokens() != cached {
		h.t.Fatalf("AttachPrefix: cached %d of a %d-token prompt, Len %d, CachedTokens %d", cached, len(prompt), x.s.Len(), x.s.CachedTokens())
	}
	for _, tok := range prompt[:cached] {
		x.push(tok)
	}
	x.dirty = cached
	h.seqs = append(h.seqs, x)
}

// fresh reports whether bits are the scrub pattern of an unwritten
// position.
func (h *harness) fresh(b uint32) bool {
	if h.scrub == kvcache.ScrubPoison {
		if h.l.DType == kvcache.F16 {
			return b == 0x7E00
		}
		return b == math.Float32bits(float32(math.NaN())) || b == 0x7FC00000
	}
	return b == 0
}

// checkView verifies every element the view shows.
func (h *harness) checkView(x *hseq, v *kvcache.View) {
	h.t.Helper()
	ps, kvd := h.l.PageSize, h.l.KVDim()
	end := v.Start() + v.N()
	if v.Start() != x.s.Len() || v.NumPages() != (end+ps-1)/ps {
		h.t.Fatalf("view at %d for %d positions over %d pages, sequence length %d", v.Start(), v.N(), v.NumPages(), x.s.Len())
	}
	if v.FirstPage() != x.s.DroppedPages() {
		h.t.Fatalf("view's first page %d, sequence gave back %d", v.FirstPage(), x.s.DroppedPages())
	}
	for layer := range h.l.Layers {
		for pg := range v.NumPages() {
			valid := min(end-pg*ps, ps)
			if pg < v.FirstPage() {
				valid = 0 // given back behind the window: nothing to read
			}
			for kv := range 2 {
				elems := h.elems(v, layer, pg, kv)
				if len(elems) != valid*kvd {
					h.t.Fatalf("layer %d page %d: %d elements, want %d valid positions", layer, pg, len(elems), valid)
				}
				for i, b := range elems {
					pos := pg*ps + i/kvd
					switch {
					case pos < v.Start():
						if want := value(x.hashes[pos], layer, kv, i%kvd); b != uint32(want) {
							h.t.Fatalf("%v position %d layer %d kv %d elem %d: read %#x, want %#x (foreign or stale data)", x.s.Owner(), pos, layer, kv, i%kvd, b, want)
						}
					case pos >= x.dirty && !h.fresh(b):
						h.t.Fatalf("%v unwritten position %d layer %d kv %d: read %#x, not the %v scrub pattern", x.s.Owner(), pos, layer, kv, b, h.scrub)
					}
				}
			}
		}
	}
}

// elems returns a page's elements as bit patterns (F32 values written by
// the harness are small integers, stored exactly).
func (h *harness) elems(v *kvcache.View, layer, pg, kv int) []uint32 {
	var out []uint32
	if h.l.DType == kvcache.F32 {
		s := v.K(layer, pg)
		if kv == 1 {
			s = v.V(layer, pg)
		}
		for _, f := range s {
			if f >= 1 && f <= 1000 {
				out = append(out, uint32(f))
			} else {
				out = append(out, math.Float32bits(f))
			}
		}
		return out
	}
	s := v.K16(layer, pg)
	if kv == 1 {
		s = v.V16(layer, pg)
	}
	for _, u := range s {
		out = append(out, uint32(u))
	}
	return out
}

func (h *harness) write(v *kvcache.View, pos int, ph uint64) {
	ps, kvd := h.l.PageSize, h.l.KVDim()
	pg, off := pos/ps, (pos%ps)*kvd
	for layer := range h.l.Layers {
		for e := range kvd {
			if h.l.DType == kvcache.F32 {
				v.K(layer, pg)[off+e] = float32(value(ph, layer, 0, e))
				v.V(layer, pg)[off+e] = float32(value(ph, layer, 1, e))
			} else {
				v.K16(layer, pg)[off+e] = value(ph, layer, 0, e)
				v.V16(layer, pg)[off+e] = value(ph, layer, 1, e)
			}
		}
	}
}

func (h *harness) opStep() {
	x := h.pick()
	if x == nil {
		return
	}
	n := 1 + h.c.Intn("n", 2*h.l.PageSize)
	if err := h.p.Reserve(x.s, n); err != nil {
		if !errors.Is(err, kvcache.ErrNoPages) {
			h.t.Fatalf("Reserve: %v", err)
		}
		return
	}
	v, err := h.p.Begin(x.s, n)
	if err != nil {
		h.t.Fatalf("Begin of a correct sequence: %v", err)
	}
	h.checkView(x, v)
	// The next tokens continue the prompt, then come from a small
	// alphabet so that sequences collide.
	next := &hseq{tenant: x.tenant, tokens: append([]int(nil), x.tokens...), hashes: append([]uint64(nil), x.hashes...)}
	for i := range n {
		pos := v.Start() + i
		tok := h.c.Intn("tok", 3)
		if pos < len(x.prompt) {
			tok = x.prompt[pos]
		}
		next.push(tok)
		h.write(v, pos, next.hashes[pos])
	}
	x.dirty = max(x.dirty, v.Start()+n)
	if h.c.Intn("abandon", 6) == 0 {
		return // a failed step: nothing committed
	}
	if err := h.p.Commit(v); err != nil {
		h.t.Fatalf("Commit: %v", err)
	}
	x.tokens, x.hashes = next.tokens, next.hashes
	if err := h.p.Commit(v); !errors.Is(err, kvcache.ErrStaleView) {
		h.t.Fatalf("second Commit of a view: %v, want ErrStaleView", err)
	}
}

func (h *harness) opPublish() {
	x := h.pick()
	if x == nil {
		return
	}
	n := min(len(x.prompt), len(x.tokens))
	h.p.PublishPrefix(x.s, x.tokens[:n], x.salt)
}

func (h *harness) ownedPages(x *hseq) int {
	n := 0
	for _, id := range x.s.Pages() {
		if info, _ := h.p.Page(id); info.State == kvcache.PageOwned {
			n++
		}
	}
	return n
}

func (h *harness) opRelease() {
	x := h.pick()
	if x == nil {
		return
	}
	switch h.c.Intn("how", 3) {
	case 0:
		h.p.Release(x.s)
	case 1:
		h.p.Abort(x.s, request.ErrAborted)
	case 2:
		owned := h.ownedPages(x)
		before := h.p.Stats().QuarantinedPages
		h.p.Abort(x.s, fmt.Errorf("handoff: %w", kvcache.ErrViolation))
		if got := h.p.Stats().QuarantinedPages - before; got != owned {
			h.t.Fatalf("abort on a violation quarantined %d pages, sequence owned %d", got, owned)
		}
	}
	h.p.Release(x.s) // idempotent
	if !x.s.Released() || x.s.Len() != 0 || x.s.NumPages() != 0 {
		h.t.Fatalf("released sequence still has length %d and %d pages", x.s.Len(), x.s.NumPages())
	}
	if _, err := h.p.Begin(x.s, 1); !errors.Is(err, kvcache.ErrReleased) {
		h.t.Fatalf("Begin after release: %v, want ErrReleased", err)
	}
	h.drop(x)
}

func (h *harness) opFork() {
	x := h.pick()
	if x == nil || len(h.seqs) >= 8 {
		return
	}
	h.nextID++
	child, err := h.p.Fork(x.s, owner(h.tenants[x.tenant], h.nextID))
	if err != nil {
		if x.s.DroppedPages() > 0 && errors.Is(err, kvcache.ErrInvalid) {
			return // pages given back: nothing to fork from
		}
		if !errors.Is(err, kvcache.ErrNoPages) {
			h.t.Fatalf("Fork: %v", err)
		}
		return
	}
	y := &hseq{s: child, tenant: x.tenant, salt: x.salt, prompt: x.prompt,
		tokens: append([]int(nil), x.tokens...), hashes: append([]uint64(nil), x.hashes...), dirty: len(x.tokens)}
	if child.Len() != x.s.Len() {
		h.t.Fatalf("fork has length %d, parent %d", child.Len(), x.s.Len())
	}
	h.seqs = append(h.seqs, y)
}

// opDropBefore gives back the pages of a sequence behind a random
// position, as a sliding-window model's scheduler does: exactly the full,
// written pages wholly before it, and later steps (checkView) still read
// every position after them correctly.
func (h *harness) opDropBefore() {
	x := h.pick()
	if x == nil {
		return
	}
	ps := h.l.PageSize
	pos := h.c.Intn("pos", x.s.Len()+2*ps)
	prev, held := x.s.DroppedPages(), x.s.HeldPages()
	want := max(prev, min(pos, x.s.Len())/ps)
	n, err := h.p.DropBefore(x.s, pos)
	if err != nil || n != want-prev || x.s.DroppedPages() != want || x.s.HeldPages() != held-n {
		h.t.Fatalf("DropBefore(%d) at length %d: %d pages, %v; dropped %d (was %d), want %d", pos, x.s.Len(), n, err, x.s.DroppedPages(), prev, want)
	}
}

func (h *harness) opScrubQuarantined() {
	q := h.p.Quarantined()
	k := h.c.Intn("k", len(q)+1)
	if k == 0 {
		return // no ids would mean all of them
	}
	n, err := h.p.ScrubQuarantined(q[:k]...)
	if err != nil || n != k {
		h.t.Fatalf("ScrubQuarantined of %d pages: %d, %v", k, n, err)
	}
}

// opPressure takes every allocatable page (evicting the whole cache), checks
// that all of them read as scrubbed, and gives them back.
func (h *harness) opPressure() {
	free := h.p.FreePages()
	if free == 0 {
		return
	}
	h.nextID++
	x := &hseq{s: h.p.NewSequence(owner(h.tenants[h.c.Intn("tenant", len(h.tenants))], h.nextID))}
	n := free * h.l.PageSize
	if err := h.p.Reserve(x.s, n); err != nil {
		h.t.Fatalf("Reserve of all %d allocatable pages: %v", free, err)
	}
	if h.p.FreePages() != 0 || h.p.Stats().CachedPages != 0 {
		h.t.Fatalf("after reserving everything: %d allocatable, %d cached", h.p.FreePages(), h.p.Stats().CachedPages)
	}
	if err := h.p.Reserve(x.s, n+1); !errors.Is(err, kvcache.ErrNoPages) {
		h.t.Fatalf("Reserve beyond the pool: %v, want ErrNoPages", err)
	}
	v, err := h.p.Begin(x.s, n)
	if err != nil {
		h.t.Fatalf("Begin: %v", err)
	}
	h.checkView(x, v)
	h.p.Release(x.s)
}

func (h *harness) opEvict() {
	h.p.EvictCached(h.c.Intn("evict", 3))
}

// check runs after every operation.
func (h *harness) check() {
	h.t.Helper()
	h.ops++
	if err := h.p.CheckInvariants(); err != nil {
		h.t.Fatalf("after %d operations: %v", h.ops, err)
	}
	st := h.p.Stats()
	if st.FreePages+st.OwnedPages+st.SharedPages+st.QuarantinedPages != st.TotalPages {
		h.t.Fatalf("pages not conserved: %+v", st)
	}
	if h.p.FreePages() != st.FreePages+st.CachedPages {
		h.t.Fatalf("FreePages %d, stats free %d + cached %d", h.p.FreePages(), st.FreePages, st.CachedPages)
	}
	sum := 0
	for _, n := range st.TenantPages {
		sum += n
	}
	if sum != st.OwnedPages+st.SharedPages {
		h.t.Fatalf("per-tenant pages sum to %d, owned+shared %d", sum, st.OwnedPages+st.SharedPages)
	}
	if st.Violations != h.violations || st.Sequences != len(h.seqs) {
		h.t.Fatalf("%d violations, %d live sequences (want %d, %d)", st.Violations, st.Sequences, h.violations, len(h.seqs))
	}
}

// opCorrupt breaks one sequence's block table the way a scheduler bug
// would (needs strict invariants off): a page of another tenant in its
// table, or a length beyond what was written. The next Begin must refuse
// it, quarantine its pages and count one violation, and every other
// sequence must carry on unharmed (their content is checked by later
// steps).
func (h *harness) opCorrupt() {
	x, y := h.pick(), h.pick()
	if x == nil || x.s.NumPages() == 0 {
		return
	}
	switch h.c.Intn("fault", 3) {
	case 0, 1:
		if y == nil || y.tenant == x.tenant || y.s.HeldPages() == 0 {
			return
		}
		// A page y holds (an entry it gave back names no page: copying
		// it over one x also gave back would change nothing).
		j := y.s.DroppedPages() + h.c.Intn("j", y.s.HeldPages())
		kvcache.InjectPage(x.s, h.c.Intn("i", x.s.NumPages()), y.s, j, h.c.Intn("keep", 2) == 0)
	case 2:
		kvcache.SetLength(x.s, x.s.Len()+1+h.c.Intn("extra", h.l.PageSize))
	}
	if _, err := h.p.Begin(x.s, 1); !errors.Is(err, kvcache.ErrViolation) {
		h.t.Fatalf("Begin of a corrupted sequence: %v, want ErrViolation", err)
	}
	h.violations++
	if !x.s.Released() {
		h.t.Fatalf("corrupted sequence still live")
	}
	h.drop(x)
}

func (h *harness) actions() map[string]func() {
	return map[string]func(){
		"new": h.opNew, "new2": h.opNew, "step": h.opStep, "step2": h.opStep, "step3": h.opStep,
		"publish": h.opPublish, "release": h.opRelease, "fork": h.opFork,
		"scrubQuarantined": h.opScrubQuarantined, "pressure": h.opPressure, "evict": h.opEvict,
		"dropBefore": h.opDropBefore,
	}
}
