package transfer

import (
	"container/heap"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// The deterministic simulation: one Receiver (the decode node), one to
// three Senders (prefill nodes) and a scripted gateway, joined by a faulty
// transport that carries real frames (AppendFrame/DecodeFrame), against a
// fake clock and one seeded random source. The drivers around the cores
// are modelled in the sim: the decode pool (a ledger of pages with their
// state, writers in flight and the digest of what they hold), the prefill
// pool (source pages), page writes and reads that take time or hang, and
// a decode scheduler that frees delivered pages later.
//
// Faults: frames dropped, duplicated, delayed (reordered), corrupted or
// truncated on the wire; a buggy sender that lies in well-formed frames
// (flipped or swapped page bytes, wrong filled counts, another owner,
// epoch or reservation, a placeholder manifest, another layout, wrong
// digests); a prefill node computing with another model; prefill
// producing the incident's 1-token placeholder; writes and reads that are
// slow or never finish; clients aborting; crashes of either side.
//
// After every step: the cores' own audits, and the oracle, which knows the
// truth: a reservation is delivered only if every page decode will attend
// holds exactly the bytes the right prefill computed for it (and owner,
// epoch, counts and first token are the truth); no write is granted into,
// and no write lands in, a page the reservation does not hold; no page is
// released while a write is in flight on it; no reservation ends twice;
// prefill never releases a source page a read is still using. At the end,
// once faults stop and every lease and tombstone has run out: every
// reservation ended exactly once, every page is free or quarantined, no
// core holds anything.

var (
	simSeeds = flag.Int("transfer.seeds", 0, "simulation seeds to run (default 4000; 300 with -short or -race)")
	simSeed  = flag.Uint64("transfer.seed", 0, "run only this simulation seed and log every step (replays a failure)")
	simFirst = flag.Uint64("transfer.first", 1, "first simulation seed")
)

// raceEnabled is set by race_test.go under -race, which runs fewer seeds.
var raceEnabled bool

type faults struct {
	drop, dup, corrupt, truncate, delay float64 // per frame
	lie                                 float64 // per prefill → decode message
	placeholder                         float64 // per attempt
	misconfigured                       bool    // the last prefill node has another model
	slowWrite, hangWrite, hangRead      float64
	crashSender, crashReceiver          float64 // per step
	clientAbort                         float64 // per request
	retry                               float64 // per failed attempt
}

// randomFaults draws a seed's fault profile: a sixth of the seeds run
// without faults, the others with random rates of each. A variable, so
// that the mutant runs can bias it.
var randomFaults = func(rng *rand.Rand) faults {
	if rng.IntN(6) == 0 {
		return faults{retry: 0.5}
	}
	r := func(limit float64) float64 { return rng.Float64() * limit }
	return faults{
		drop: r(0.05), dup: r(0.08), corrupt: r(0.03), truncate: r(0.02), delay: r(0.05),
		lie: r(0.04), placeholder: r(0.15), misconfigured: rng.IntN(8) == 0,
		slowWrite: r(0.1), hangWrite: r(0.03), hangRead: r(0.02),
		crashSender: r(0.002), crashReceiver: r(0.001), clientAbort: r(0.3), retry: 0.7,
	}
}

type pageState uint8

const (
	pageFree pageState = iota
	pageHeld
	pageDecoding
	pageQuarantined
)

var pageStateNames = [...]string{"free", "held", "decoding", "quarantined"}

// simPage is the decode pool's ledger entry for one page, as the sim
// tracks it independently of the receiver.
type simPage struct {
	state   pageState
	owner   ReservationID
	writers int
	content [32]byte // digest of the last write that landed; zero when scrubbed
}

// attempt is one epoch of a request: the truth prefill should compute.
type attempt struct {
	req         *simReq
	epoch       uint64
	sender      int
	data        [][]byte
	filled      []int
	digests     [][32]byte
	first       int
	granted     bool
	grant       Grant
	failed      bool
	placeholder bool
	delivered   bool
}

type simReq struct {
	owner    request.Owner
	prompt   int
	maxNew   int
	cur      *attempt
	attempts int
	done     bool
}

type simSender struct {
	name   Peer
	s      *Sender
	layout Layout
	wrong  bool // computes with another model
	gen    int  // bumped by a crash: work of an older generation is lost
	source map[ReservationID][][]byte
	reads  map[ReservationID]int
}

type simEvent struct {
	at   Time
	seq  uint64
	tick bool
	fn   func()
}

type eventQueue []*simEvent

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(*simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type simViolation struct {
	oracle bool // found by the oracle (not by a core's own audit)
	msg    string
}

// simTotals are counted over all seeds, to show the runs are not vacuous.
type simTotals struct {
	seeds, steps, frames, dropped, badFrames, lies, crashes uint64
	committed, aborted, reaped, quarantined, lateWrites     uint64
	reasons                                                 map[Reason]uint64
}

type sim struct {
	seed    uint64
	rng     *rand.Rand
	f       faults
	layout  Layout
	pos     int // bytes per position
	now     Time
	q       eventQueue
	seq     uint64
	pending int // non-tick events queued
	healAt  Time
	endAt   Time
	verbose func(string)
	log     []string

	r    *Receiver
	inc  uint64
	pool []simPage // by PageID; [0] unused
	free []kvcache.PageID

	senders  []*simSender
	reqs     []*simReq
	attempts []*attempt
	byResv   map[ReservationID]*attempt
	byOwner  map[request.Owner][]*attempt
	resvs    []ReservationID // in order made; the last incarnation's are checked at the end
	ended    map[ReservationID]int

	violations []simViolation
	tot        *simTotals
}

const (
	ms         = Duration(time.Millisecond)
	gateway    = Peer("gateway")
	decodeNode = Peer("decode")
)

func (s *sim) logf(format string, args ...any) {
	line := fmt.Sprintf("%8.3fs ", float64(s.now)/float64(Second)) + fmt.Sprintf(format, args...)
	if s.verbose != nil {
		s.verbose(line)
	}
	if len(s.log) >= 400 {
		s.log = s.log[1:]
	}
	s.log = append(s.log, line)
}

func (s *sim) violate(oracle bool, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.logf("VIOLATION: %s", msg)
	s.violations = append(s.violations, simViolation{oracle, msg})
}

func (s *sim) after(d Duration, fn func()) {
	s.seq++
	s.pending++
	heap.Push(&s.q, &simEvent{at: s.now.Add(d), seq: s.seq, fn: fn})
}

func (s *sim) between(lo, hi Duration) Duration { return lo + Duration(s.rng.Int64N(int64(hi-lo)+1)) }
func (s *sim) chance(p float64) bool            { return p > 0 && s.rng.Float64() < p }
func (s *sim) faulty() bool                     { return s.now < s.healAt }

func newSim(seed uint64, tot *simTotals) *sim {
	rng := rand.New(rand.NewPCG(seed, 0x7472616e73666572))
	ps := []int{1, 2, 4, 8}[rng.IntN(4)]
	l := Layout{ModelDigest: sha256.Sum256([]byte("sim model")), DType: kvcache.F16, PageSize: ps,
		Layers: 1, KVHeads: 1, HeadDim: 2, MaxContext: 48}
	s := &sim{seed: seed, rng: rng, layout: l, pos: 2 * 1 * 2 * 2, tot: tot,
		byResv: map[ReservationID]*attempt{}, byOwner: map[request.Owner][]*attempt{}, ended: map[ReservationID]int{}}
	s.f = randomFaults(rng)
	s.newReceiver()
	npages := pagesFor(l.MaxContext, ps) * (2 + rng.IntN(4))
	s.pool = make([]simPage, npages+1)
	for id := 1; id <= npages; id++ {
		s.free = append(s.free, kvcache.PageID(id))
	}
	for k := range 1 + rng.IntN(3) {
		ss := &simSender{name: Peer(fmt.Sprintf("prefill-%d", k)), layout: l}
		if s.f.misconfigured && k > 0 && k == 1+rng.IntN(2) {
			ss.wrong = true
			ss.layout.ModelDigest = sha256.Sum256([]byte("another model"))
		}
		s.senders = append(s.senders, ss)
		s.newSender(ss)
	}
	issue := Duration(s.between(500*ms, 4000*ms))
	s.healAt = Time(issue + Second)
	s.endAt = Time(issue + 300*Second)
	for range 2 + rng.IntN(9) {
		s.after(s.between(0, issue), s.newRequest)
	}
	s.tickLoop()
	return s
}

func (s *sim) newReceiver() {
	s.inc++
	r, err := NewReceiver(ReceiverConfig{Layout: s.layout, Incarnation: s.inc, LeaseTTL: 2 * Second, MaxLease: 20 * Second,
		DrainTimeout: Second, TombstoneTTL: 5 * Second, RetryEvery: 300 * ms}, s.now)
	if err != nil {
		panic(err)
	}
	s.r = r
}

func (s *sim) newSender(ss *simSender) {
	sn, err := NewSender(SenderConfig{Layout: ss.layout, HeartbeatEvery: 500 * ms, DrainTimeout: Second,
		RetryEvery: 300 * ms, AbortTTL: 5 * Second}, s.now)
	if err != nil {
		panic(err)
	}
	ss.s, ss.gen = sn, ss.gen+1
	ss.source, ss.reads = map[ReservationID][][]byte{}, map[ReservationID]int{}
}

func (s *sim) tickLoop() {
	s.seq++
	heap.Push(&s.q, &simEvent{at: s.now.Add(s.between(50*ms, 250*ms)), seq: s.seq, tick: true, fn: s.tickLoop})
}

// run plays the seed to the end and returns what went wrong.
func (s *sim) run() (err error) {
	before := invariants.Count()
	defer func() {
		if p := recover(); p != nil {
			s.violate(false, "panic: %v\n%s", p, debug.Stack())
		}
		if n := invariants.Count() - before; n > 0 {
			s.violate(false, "%d invariant failures reported by the cores", n)
		}
		if len(s.violations) > 0 {
			err = errors.New(s.violations[0].msg)
		}
	}()
	for s.q.Len() > 0 && len(s.violations) == 0 {
		ev := heap.Pop(&s.q).(*simEvent)
		if ev.at > s.endAt {
			break
		}
		s.now = ev.at
		if !ev.tick {
			s.pending--
		}
		ev.fn()
		s.r.Tick(s.now)
		s.applyReceiver()
		for k, ss := range s.senders {
			ss.s.Tick(s.now)
			s.applySender(k)
		}
		if s.faulty() {
			if s.chance(s.f.crashSender) {
				k := s.rng.IntN(len(s.senders))
				s.logf("CRASH %s", s.senders[k].name)
				s.tot.crashes++
				s.newSender(s.senders[k])
			}
			if s.chance(s.f.crashReceiver) {
				s.crashReceiver()
			}
		}
		s.tot.steps++
		s.check()
		if s.now >= s.healAt && s.quiet() {
			break
		}
	}
	if len(s.violations) == 0 {
		s.final()
	}
	return nil
}

// quiet reports whether nothing is left to happen: no event but ticks,
// no reservation or tombstone, no handoff.
func (s *sim) quiet() bool {
	if s.pending > 0 || len(s.r.resvs) > 0 {
		return false
	}
	for _, ss := range s.senders {
		if len(ss.s.hs) > 0 {
			return false
		}
	}
	return true
}

func (s *sim) crashReceiver() {
	s.logf("CRASH decode (incarnation %d)", s.inc)
	s.tot.crashes++
	// The process and its memory are gone: the new one starts with a
	// scrubbed pool, and writes of the old one never land.
	for id := range s.pool {
		s.pool[id] = simPage{}
	}
	s.free = s.free[:0]
	for id := 1; id < len(s.pool); id++ {
		s.free = append(s.free, kvcache.PageID(id))
	}
	s.newReceiver()
}

// --- transport ---

func (s *sim) transmit(from, to Peer, m Message) {
	b, err := EncodeFrame(m)
	if err != nil {
		s.violate(false, "encode %T from %s: %v", m, from, err)
		return
	}
	s.tot.frames++
	if s.faulty() && s.chance(s.f.drop) {
		s.logf("drop %s→%s %v", from, to, m.Type())
		s.tot.dropped++
		return
	}
	copies := 1
	if s.faulty() && s.chance(s.f.dup) {
		copies = 2
	}
	for range copies {
		c := slices.Clone(b)
		switch {
		case !s.faulty():
		case s.chance(s.f.corrupt):
			bit := s.rng.IntN(8 * len(c))
			c[bit/8] ^= 1 << (bit % 8)
		case s.chance(s.f.truncate):
			c = c[:s.rng.IntN(len(c))]
		}
		d := s.between(ms, 10*ms)
		if s.faulty() && s.chance(s.f.delay) {
			d += s.between(500*ms, 4*Second)
		}
		s.after(d, func() { s.deliver(from, to, c) })
	}
}

func (s *sim) deliver(from, to Peer, b []byte) {
	m, err := DecodeFrame(b)
	if err != nil {
		s.logf("bad frame %s→%s: %v", from, to, err)
		s.tot.badFrames++
		return
	}
	switch {
	case to == decodeNode:
		s.decodeReceive(from, m)
	case to == gateway:
		s.gatewayReceive(from, m)
	default:
		for k, ss := range s.senders {
			if ss.name == to {
				s.prefillReceive(k, from, m)
			}
		}
	}
}

// --- gateway ---

func (s *sim) newRequest() {
	if !s.faulty() {
		return
	}
	tenants := []request.Tenant{"org_a", "org_b", "org_c"}
	o := request.Owner{Tenant: tenants[s.rng.IntN(len(tenants))]}
	for i := range o.ID {
		o.ID[i] = byte(s.rng.Uint32())
	}
	prompt := 1 + s.rng.IntN(s.layout.MaxContext-2)
	req := &simReq{owner: o, prompt: prompt, maxNew: 1 + s.rng.IntN(s.layout.MaxContext-prompt)}
	s.reqs = append(s.reqs, req)
	s.logf("request %v: %d prompt, %d new", o, prompt, req.maxNew)
	s.startAttempt(req)
	if s.chance(s.f.clientAbort) {
		s.after(s.between(0, 2*Second), func() { s.clientAbort(req) })
	}
}

func (s *sim) startAttempt(req *simReq) {
	req.attempts++
	a := &attempt{req: req, epoch: uint64(req.attempts), sender: s.rng.IntN(len(s.senders)), first: s.rng.IntN(32000)}
	ps := s.layout.PageSize
	for i := range pagesFor(req.prompt, ps) {
		f := expectedFilled(i, req.prompt, ps)
		d := make([]byte, f*s.pos)
		for j := range d {
			d[j] = byte(s.rng.Uint32())
		}
		a.data, a.filled, a.digests = append(a.data, d), append(a.filled, f), append(a.digests, PageDigest(i, f, d))
	}
	req.cur = a
	s.attempts = append(s.attempts, a)
	s.byOwner[req.owner] = append(s.byOwner[req.owner], a)
	s.transmit(gateway, decodeNode, &Reserve{Owner: req.owner, Epoch: a.epoch, PromptTokens: req.prompt,
		MaxNewTokens: req.maxNew, Sender: s.senders[a.sender].name})
}

func (s *sim) attemptOf(o request.Owner, epoch uint64) *attempt {
	for _, a := range s.byOwner[o] {
		if a.epoch == epoch {
			return a
		}
	}
	return nil
}

func (s *sim) clientAbort(req *simReq) {
	a := req.cur
	if req.done || a.failed {
		return
	}
	s.logf("client aborts %v epoch %d", req.owner, a.epoch)
	ref := Ref{Owner: req.owner, Epoch: a.epoch}
	if a.granted {
		ref.ID = a.grant.ID
		s.transmit(gateway, s.senders[a.sender].name, &Abort{Ref: ref, Reason: ReasonAborted})
	}
	s.transmit(gateway, decodeNode, &Abort{Ref: ref, Reason: ReasonAborted})
}

func (s *sim) gatewayReceive(from Peer, m Message) {
	switch m := m.(type) {
	case *Grant:
		a := s.attemptOf(m.Owner, m.Epoch)
		if a == nil || a != a.req.cur || a.granted || a.failed {
			return
		}
		a.granted, a.grant = true, *m
		s.transmit(gateway, s.senders[a.sender].name, m)
	case *Abort:
		s.transmit(gateway, from, &AbortAck{Ref: m.Ref, Drained: true})
		a := s.attemptOf(m.Owner, m.Epoch)
		if a == nil || a != a.req.cur || a.failed || a.req.done {
			return
		}
		a.failed = true
		if s.faulty() && a.req.attempts < 3 && s.chance(s.f.retry) {
			s.after(s.between(50*ms, 500*ms), func() { s.startAttempt(a.req) })
		}
	case *Committed:
		if a := s.attemptOf(m.Owner, m.Epoch); a != nil {
			a.req.done = true
		}
	}
}

// --- decode node ---

func (s *sim) decodeReceive(from Peer, m Message) {
	switch m := m.(type) {
	case *Reserve:
		n, err := s.r.PagesNeeded(from, *m)
		if err != nil {
			s.logf("reserve %v epoch %d: %v", m.Owner, m.Epoch, err)
			break
		}
		if n > len(s.free) {
			s.logf("reserve %v: %d pages, %d free: dropped", m.Owner, n, len(s.free))
			break
		}
		// Take pages from anywhere in the free list, so that freed
		// pages are reused soon and at random.
		s.rng.Shuffle(len(s.free), func(i, j int) { s.free[i], s.free[j] = s.free[j], s.free[i] })
		pages := slices.Clone(s.free[len(s.free)-n:])
		s.free = s.free[:len(s.free)-n]
		res, err := s.r.Reserve(from, *m, pages)
		if err != nil {
			s.violate(false, "reserve after PagesNeeded: %v", err)
			return
		}
		for _, p := range pages {
			if s.pool[p].state != pageFree || s.pool[p].writers != 0 {
				s.violate(true, "allocated page %d in state %s with %d writers", p, pageStateNames[s.pool[p].state], s.pool[p].writers)
			}
			s.pool[p] = simPage{state: pageHeld, owner: res.ID}
		}
		// A Reserve delayed past a crash of the decode node may reserve
		// for an attempt again: a second reservation, reaped in time.
		s.byResv[res.ID] = s.attemptOf(m.Owner, m.Epoch)
		s.resvs = append(s.resvs, res.ID)
		s.logf("reserved %v for %v epoch %d: pages %v", res.ID, m.Owner, m.Epoch, pages)
	case *Page:
		d := PageDigest(m.Index, m.Filled, m.Data)
		w, err := s.r.PageArrived(from, PageArrived{Ref: m.Ref, Index: m.Index, Filled: m.Filled, Digest: d})
		if err != nil {
			s.logf("page %d of %v from %s: %v", m.Index, m.ID, from, err)
			if ReasonOf(err) == ReasonLateWrite {
				s.tot.lateWrites++
			}
			break
		}
		s.startWrite(w, d)
	default:
		if err := s.r.Step(from, m); err != nil {
			s.logf("%v of %v from %s: %v", m.Type(), refOf(m), from, err)
		}
	}
	s.applyReceiver()
}

func refOf(m Message) Ref {
	switch m := m.(type) {
	case *Manifest:
		return m.Ref
	case *Commit:
		return m.Ref
	case *Abort:
		return m.Ref
	case *AbortAck:
		return m.Ref
	case *Heartbeat:
		return m.Ref
	case *Committed:
		return m.Ref
	case *Grant:
		return m.Ref
	}
	return Ref{}
}

// startWrite copies a page into the pool: it takes time, and may hang.
func (s *sim) startWrite(w WritePage, digest [32]byte) {
	pg := &s.pool[w.Page]
	if pg.state != pageHeld || pg.owner != w.ID {
		s.violate(true, "write granted into page %d (%s, %v) for %v", w.Page, pageStateNames[pg.state], pg.owner, w.ID)
		return
	}
	pg.writers++
	inc := s.inc
	land := func() {
		if s.inc != inc {
			return // died with its process
		}
		pg := &s.pool[w.Page]
		pg.writers--
		switch {
		case pg.state == pageFree:
			s.violate(true, "a write of %v landed in free page %d", w.ID, w.Page)
		case pg.state != pageQuarantined && pg.owner != w.ID:
			s.violate(true, "a write of %v landed in page %d of %v", w.ID, w.Page, pg.owner)
		}
		pg.content = digest
		if err := s.r.WriteDone(w.ID, w.Index); err != nil {
			s.logf("write done %v page %d: %v", w.ID, w.Index, err)
		}
		s.applyReceiver()
	}
	switch {
	case s.faulty() && s.chance(s.f.hangWrite):
		s.logf("write %v page %d hangs", w.ID, w.Index)
		if s.rng.IntN(2) == 0 {
			s.after(s.between(2*Second, 8*Second), land)
		}
	case s.faulty() && s.chance(s.f.slowWrite):
		s.after(s.between(50*ms, 1500*ms), land)
	default:
		s.after(s.between(ms/2, 5*ms), land)
	}
}

func (s *sim) applyReceiver() {
	for _, e := range s.r.Ready() {
		switch e := e.(type) {
		case *Send:
			s.transmit(decodeNode, e.To, e.Msg)
		case *Deliver:
			s.deliverCheck(e)
		case *Release:
			for _, p := range e.Pages {
				pg := &s.pool[p]
				if pg.writers > 0 {
					s.violate(true, "page %d of %v released with %d writes in flight", p, e.ID, pg.writers)
				}
				if pg.state != pageHeld || pg.owner != e.ID {
					s.violate(true, "release of page %d (%s, %v) by %v", p, pageStateNames[pg.state], pg.owner, e.ID)
				}
				pg.state, pg.content = pageFree, [32]byte{}
				s.free = append(s.free, p)
			}
		case *Quarantine:
			for _, p := range e.Pages {
				if pg := &s.pool[p]; pg.state != pageHeld || pg.owner != e.ID {
					s.violate(true, "quarantine of page %d (%s, %v) by %v", p, pageStateNames[pg.state], pg.owner, e.ID)
				}
				s.pool[p].state = pageQuarantined
			}
			s.tot.quarantined += uint64(len(e.Pages))
		case *Fence:
		case *Ended:
			s.logf("ENDED %v: %v (%v) %s", e.ID, e.Outcome, e.Reason, e.Detail)
			if _, ok := s.byResv[e.ID]; !ok {
				s.violate(false, "ended an unknown reservation %v", e.ID)
				break
			}
			s.ended[e.ID]++
			if s.ended[e.ID] > 1 {
				s.violate(true, "reservation %v ended twice", e.ID)
			}
			switch e.Outcome {
			case OutcomeCommitted:
				s.tot.committed++
			case OutcomeReaped:
				s.tot.reaped++
			default:
				s.tot.aborted++
			}
			s.tot.reasons[e.Reason]++
		case *AbortDelivered:
			// The decode scheduler ends the request and acknowledges.
			s.freeDecoding(e.ID)
			s.transmit(decodeNode, e.From, &AbortAck{Ref: e.Ref, Drained: true})
		default:
			s.violate(false, "receiver effect %T", e)
		}
	}
}

// deliverCheck is the oracle of I6: what decode is about to attend must be
// exactly the truth of the attempt the reservation was made for.
func (s *sim) deliverCheck(d *Deliver) {
	a := s.byResv[d.ID]
	if a == nil {
		s.violate(false, "delivered an unknown reservation %v", d.ID)
		return
	}
	bad := func(format string, args ...any) {
		s.violate(true, "delivered %v (%v epoch %d) wrongly: %s", d.ID, a.req.owner, a.epoch, fmt.Sprintf(format, args...))
	}
	switch {
	case d.Owner != a.req.owner || d.Epoch != a.epoch:
		bad("owner %v epoch %d", d.Owner, d.Epoch)
	case d.TotalTokens != a.req.prompt || !slices.Equal(d.Filled, a.filled):
		bad("%d tokens, filled %v; truth %d, %v", d.TotalTokens, d.Filled, a.req.prompt, a.filled)
	case d.FirstToken != a.first:
		bad("first token %d, truth %d", d.FirstToken, a.first)
	case len(d.Pages) != len(a.digests):
		bad("%d pages for %d", len(d.Pages), len(a.digests))
	}
	for i, p := range d.Pages {
		pg := &s.pool[p]
		switch {
		case pg.state != pageHeld || pg.owner != d.ID:
			bad("page %d is %s (%v)", p, pageStateNames[pg.state], pg.owner)
		case pg.writers > 0:
			bad("page %d still being written", p)
		case i < len(a.digests) && pg.content != a.digests[i]:
			bad("page %d (logical %d) does not hold the true KV", p, i)
		}
		pg.state = pageDecoding
	}
	a.delivered = true
	id := d.ID
	inc := s.inc
	s.after(s.between(10*ms, 500*ms), func() {
		if s.inc == inc {
			s.freeDecoding(id)
		}
	})
}

func (s *sim) freeDecoding(id ReservationID) {
	for p := range s.pool {
		if pg := &s.pool[p]; pg.state == pageDecoding && pg.owner == id {
			*pg = simPage{}
			s.free = append(s.free, kvcache.PageID(p))
		}
	}
}

// --- prefill nodes ---

func wrongModel(b []byte) []byte {
	c := slices.Clone(b)
	for i := range c {
		c[i] ^= 0x5a
	}
	return c
}

func (s *sim) prefillReceive(k int, from Peer, m Message) {
	ss := s.senders[k]
	switch m := m.(type) {
	case *Grant:
		err := ss.s.Start(*m, decodeNode, gateway)
		s.logf("%s starts %v: %v", ss.name, m.ID, err)
		if err == nil {
			s.prefill(k, *m)
		}
	default:
		if err := ss.s.Step(from, m); err != nil {
			s.logf("%s: %v from %s: %v", ss.name, m.Type(), from, err)
		}
	}
	s.applySender(k)
}

// prefill computes the pages of a grant one by one, then the first token.
func (s *sim) prefill(k int, g Grant) {
	ss := s.senders[k]
	a := s.byResv[g.ID]
	if a == nil {
		return
	}
	gen := ss.gen
	n := len(a.data)
	if s.faulty() && s.chance(s.f.placeholder) {
		// The incident: the prompt was swapped for a 1-token placeholder.
		a.placeholder = true
		n = 1
	}
	src := make([][]byte, len(a.data))
	ss.source[g.ID] = src
	t := Duration(0)
	for i := range n {
		t += s.between(ms, 20*ms)
		s.after(t, func() {
			if ss.gen != gen {
				return
			}
			d, f := a.data[i], a.filled[i]
			if a.placeholder {
				d, f = d[:min(len(d), s.pos)], min(f, 1)
			}
			if ss.wrong {
				d = wrongModel(d)
			}
			src[i] = d
			if err := ss.s.PageReady(g.ID, i, f, PageDigest(i, f, d)); err != nil {
				s.logf("%s page ready %v/%d: %v", ss.name, g.ID, i, err)
			}
			s.applySender(k)
		})
	}
	s.after(t+s.between(ms, 10*ms), func() {
		if ss.gen != gen {
			return
		}
		total := a.req.prompt
		if a.placeholder {
			total = 1
		}
		if err := ss.s.PrefillDone(g.ID, total, a.first, nil); err != nil {
			s.logf("%s prefill done %v: %v", ss.name, g.ID, err)
		}
		s.applySender(k)
	})
}

func (s *sim) applySender(k int) {
	ss := s.senders[k]
	for _, e := range ss.s.Ready() {
		switch e := e.(type) {
		case *Send:
			s.senderSend(ss, e.To, e.Msg)
		case *SendPage:
			s.read(k, e)
		case *ReleaseSource:
			if ss.reads[e.ID] > 0 && !e.Quarantine {
				s.violate(true, "%s released the source pages of %v with %d reads in flight", ss.name, e.ID, ss.reads[e.ID])
			}
			delete(ss.source, e.ID)
		case *Ended:
			s.logf("%s ENDED %v: %v (%v)", ss.name, e.ID, e.Outcome, e.Reason)
		default:
			s.violate(false, "sender effect %T", e)
		}
	}
}

// read takes a page from the prefill pool and puts it on the wire.
func (s *sim) read(k int, e *SendPage) {
	ss := s.senders[k]
	gen := ss.gen
	ss.reads[e.Page.ID]++
	done := func() {
		if ss.gen != gen {
			return
		}
		ss.reads[e.Page.ID]--
		src, ok := ss.source[e.Page.ID]
		if !ok {
			// Only a read the sender gave up on (quarantined source).
			s.logf("%s: late read of %v/%d after the source was dropped", ss.name, e.Page.ID, e.Page.Index)
		} else {
			p := e.Page
			p.Data = src[p.Index]
			s.senderSend(ss, e.To, &p)
		}
		if err := ss.s.Sent(e.Page.ID, e.Page.Index); err != nil {
			s.logf("%s sent %v/%d: %v", ss.name, e.Page.ID, e.Page.Index, err)
		}
		s.applySender(k)
	}
	switch {
	case s.faulty() && s.chance(s.f.hangRead):
		s.logf("%s read of %v/%d hangs", ss.name, e.Page.ID, e.Page.Index)
		if s.rng.IntN(2) == 0 {
			s.after(s.between(2*Second, 6*Second), done)
		}
	default:
		s.after(s.between(ms/2, 5*ms), done)
	}
}

// senderSend transmits a message from a prefill node, through the buggy
// sender when it lies.
func (s *sim) senderSend(ss *simSender, to Peer, m Message) {
	if to == decodeNode && s.faulty() && s.chance(s.f.lie) {
		if l, what := s.lie(m); l != nil {
			s.logf("LIE %s: %s", ss.name, what)
			s.tot.lies++
			m = l
		}
	}
	s.transmit(ss.name, to, m)
}

// lie returns a wrong but well-formed copy of m, or nil.
func (s *sim) lie(m Message) (Message, string) {
	other := func(id ReservationID) (Ref, bool) {
		var refs []Ref
		for _, a := range s.attempts {
			if a.granted && a.grant.ID != id {
				refs = append(refs, a.grant.Ref)
			}
		}
		if len(refs) == 0 {
			return Ref{}, false
		}
		return refs[s.rng.IntN(len(refs))], true
	}
	switch m := m.(type) {
	case *Page:
		p := *m
		a := s.byResv[p.ID]
		switch s.rng.IntN(6) {
		case 0:
			if len(p.Data) == 0 {
				return nil, ""
			}
			p.Data = slices.Clone(p.Data)
			p.Data[s.rng.IntN(len(p.Data))] ^= 1 << s.rng.IntN(8)
			return &p, fmt.Sprintf("flipped a bit of %v page %d", p.ID, p.Index)
		case 1:
			if a == nil || len(a.data) < 2 {
				return nil, ""
			}
			j := (p.Index + 1 + s.rng.IntN(len(a.data)-1)) % len(a.data)
			p.Data = a.data[j]
			return &p, fmt.Sprintf("sent page %d's bytes as page %d of %v", j, p.Index, p.ID)
		case 2:
			if p.Filled > 0 && s.rng.IntN(2) == 0 {
				p.Filled--
			} else {
				p.Filled++
			}
			return &p, fmt.Sprintf("page %d of %v claims %d positions", p.Index, p.ID, p.Filled)
		case 3:
			r, ok := other(p.ID)
			if !ok {
				return nil, ""
			}
			p.ID = r.ID
			return &p, fmt.Sprintf("page %d of %v re-addressed to %v", p.Index, m.ID, r.ID)
		case 4:
			p.Epoch--
			return &p, fmt.Sprintf("page %d of %v with epoch %d", p.Index, p.ID, p.Epoch)
		default:
			p.Owner.Tenant += "x"
			return &p, fmt.Sprintf("page %d of %v for tenant %s", p.Index, p.ID, p.Owner.Tenant)
		}
	case *Manifest:
		c := *m
		c.Filled, c.PageDigests = slices.Clone(m.Filled), slices.Clone(m.PageDigests)
		switch s.rng.IntN(6) {
		case 0:
			if c.PageCount == 0 {
				return nil, ""
			}
			c.PageCount, c.Filled, c.PageDigests, c.TotalTokens = 1, []int{1}, c.PageDigests[:1], 1
			return &c, fmt.Sprintf("placeholder manifest for %v", c.ID)
		case 1:
			c.Layout[0] ^= 1
			return &c, fmt.Sprintf("manifest of %v with another layout", c.ID)
		case 2:
			c.TotalTokens++
			return &c, fmt.Sprintf("manifest of %v with %d tokens", c.ID, c.TotalTokens)
		case 3:
			if c.PageCount == 0 {
				return nil, ""
			}
			c.PageDigests[s.rng.IntN(c.PageCount)][0] ^= 1
			return &c, fmt.Sprintf("manifest of %v with a wrong digest", c.ID)
		case 4:
			r, ok := other(c.ID)
			if !ok {
				return nil, ""
			}
			c.ID = r.ID
			return &c, fmt.Sprintf("manifest of %v re-addressed to %v", m.ID, r.ID)
		default:
			c.Owner.ID[0] ^= 1
			return &c, fmt.Sprintf("manifest of %v for another request", c.ID)
		}
	}
	return nil, ""
}

// --- checks ---

func (s *sim) check() {
	if err := s.r.CheckInvariants(); err != nil {
		s.violate(false, "receiver audit: %v", err)
	}
	for _, ss := range s.senders {
		if err := ss.s.CheckInvariants(); err != nil {
			s.violate(false, "%s audit: %v", ss.name, err)
		}
	}
	held := 0
	for _, pg := range s.pool {
		if pg.state == pageHeld {
			held++
		}
	}
	if st := s.r.Stats(); st.PagesHeld != held {
		s.violate(false, "receiver holds %d pages, the pool %d", st.PagesHeld, held)
	}
}

func (s *sim) final() {
	if !s.quiet() {
		var live []string
		for id, rv := range s.r.resvs {
			live = append(live, fmt.Sprintf("%v %v %v", id, rv.phase, rv.outcome))
		}
		for _, ss := range s.senders {
			for id, h := range ss.s.hs {
				live = append(live, fmt.Sprintf("%s: %v phase %d", ss.name, id, h.phase))
			}
		}
		s.violate(false, "not quiet at the end: %d events pending, %s", s.pending, strings.Join(live, "; "))
		return
	}
	for _, id := range s.resvs {
		if id.Incarnation == s.inc && s.ended[id] != 1 {
			s.violate(true, "reservation %v ended %d times", id, s.ended[id])
		}
	}
	for p := 1; p < len(s.pool); p++ {
		if pg := s.pool[p]; pg.state != pageFree && pg.state != pageQuarantined {
			s.violate(true, "page %d left %s (%v)", p, pageStateNames[pg.state], pg.owner)
		}
	}
	if free := len(s.free); free+int(s.countState(pageQuarantined)) != len(s.pool)-1 {
		s.violate(true, "%d free + %d quarantined of %d pages", free, s.countState(pageQuarantined), len(s.pool)-1)
	}
}

func (s *sim) countState(st pageState) (n int) {
	for p := 1; p < len(s.pool); p++ {
		if s.pool[p].state == st {
			n++
		}
	}
	return n
}

// runSeeds runs seeds first.. until n ran or one failed; it returns the
// failing seed's sim, if any.
func runSeeds(first uint64, n int, tot *simTotals, verbose func(string)) (*sim, uint64) {
	for seed := first; seed < first+uint64(n); seed++ {
		s := newSim(seed, tot)
		s.verbose = verbose
		tot.seeds++
		if s.run(); len(s.violations) > 0 {
			return s, seed
		}
	}
	return nil, 0
}

func newTotals() *simTotals { return &simTotals{reasons: map[Reason]uint64{}} }

// TestSim runs the simulation over many seeds (-transfer.seeds=N for more,
// -transfer.seed=N to replay one with its log).
func TestSim(t *testing.T) {
	tot := newTotals()
	first, n := *simFirst, *simSeeds
	var verbose func(string)
	if *simSeed != 0 {
		first, n, verbose = *simSeed, 1, func(l string) { t.Log(l) }
	} else if n == 0 {
		n = 4000
		if testing.Short() || raceEnabled {
			n = 300
		}
	}
	start := time.Now()
	s, seed := runSeeds(first, n, tot, verbose)
	if s != nil {
		t.Fatalf("seed %d: %s\n\nlast steps:\n%s\n\nreplay: go test ./internal/transfer -run 'TestSim$' -transfer.seed=%d",
			seed, s.violations[0].msg, strings.Join(s.log[max(0, len(s.log)-60):], "\n"), seed)
	}
	t.Logf("%d seeds in %v: %d steps, %d frames (%d dropped, %d refused by the codec), %d lies, %d crashes; "+
		"%d committed, %d aborted, %d reaped, %d pages quarantined, %d late writes refused",
		tot.seeds, time.Since(start).Round(time.Millisecond), tot.steps, tot.frames, tot.dropped, tot.badFrames, tot.lies,
		tot.crashes, tot.committed, tot.aborted, tot.reaped, tot.quarantined, tot.lateWrites)
	var reasons []string
	for r := range numReasons {
		if tot.reasons[r] > 0 {
			reasons = append(reasons, fmt.Sprintf("%v=%d", r, tot.reasons[r]))
		}
	}
	t.Logf("outcome reasons: %s", strings.Join(reasons, " "))
	if n >= 300 {
		// The run exercised what it claims to.
		for name, v := range map[string]uint64{"commits": tot.committed, "aborts": tot.aborted, "reaps": tot.reaped,
			"quarantines": tot.quarantined, "lies": tot.lies, "crashes": tot.crashes, "late writes": tot.lateWrites,
			"digest mismatches": tot.reasons[ReasonDigestMismatch], "page count mismatches": tot.reasons[ReasonPageCountMismatch]} {
			if v == 0 {
				t.Errorf("no %s in %d seeds", name, tot.seeds)
			}
		}
	}
}

// TestSimReplays: a seed replays identically.
func TestSimReplays(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		a, b := newSim(seed, newTotals()), newSim(seed, newTotals())
		a.run()
		b.run()
		if !slices.Equal(a.log, b.log) || a.now != b.now {
			t.Fatalf("seed %d does not replay", seed)
		}
	}
}

// TestSimCatchesMutants: with a check disabled, the simulation's oracle
// (not a core's own audit) finds the bug it guards against within a few
// hundred seeds: the simulation is strong enough to see each failure the
// checks exist for.
func TestSimCatchesMutants(t *testing.T) {
	mutants := []struct {
		name  string
		skip  check
		bias  func(f *faults)
		limit int
	}{
		{"incident: no page count, filled or token checks", checkSenderPrompt | checkPageCount | checkFilled | checkTotalTokens,
			func(f *faults) { f.placeholder = 0.5 }, 300},
		{"no digest check", checkDigest, func(f *faults) { f.lie = 0.2 }, 300},
		{"no layout check", checkLayout, func(f *faults) { f.misconfigured = true }, 300},
		{"no late-write check", checkLateWrite, func(f *faults) { f.clientAbort, f.delay, f.dup = 0.8, 0.2, 0.2 }, 300},
		{"no drain before release", checkDrain, func(f *faults) { f.clientAbort, f.slowWrite, f.hangWrite = 0.8, 0.5, 0.1 }, 300},
	}
	lenient(t)
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			withSkipped(t, m.skip)
			old := randomFaults
			randomFaults = func(rng *rand.Rand) faults {
				f := old(rng)
				m.bias(&f)
				f.retry = 0.5
				return f
			}
			t.Cleanup(func() { randomFaults = old })
			tot := newTotals()
			for seed := uint64(1); seed <= uint64(m.limit); seed++ {
				s := newSim(seed, tot)
				s.run()
				for _, v := range s.violations {
					if v.oracle {
						t.Logf("caught at seed %d: %s", seed, v.msg)
						return
					}
				}
			}
			t.Fatalf("the oracle did not notice %v disabled in %d seeds", m.skip, m.limit)
		})
	}
}
