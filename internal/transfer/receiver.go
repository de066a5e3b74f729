package transfer

import (
	"errors"
	"fmt"
	"slices"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// ReceiverConfig configures a Receiver. Zero durations take the defaults
// noted.
type ReceiverConfig struct {
	// Layout is the decode node's layout; a manifest must carry its hash.
	Layout Layout
	// Incarnation distinguishes this receiver's reservation ids from those
	// of a previous run of the node (required, non-zero; see
	// ReservationID).
	Incarnation uint64
	// LeaseTTL is how long a reservation lives without a heartbeat from
	// its sender (default 10s).
	LeaseTTL Duration
	// MaxLease caps a reservation's life however often it is renewed, so
	// that a sender that heartbeats but never finishes cannot hold pages
	// forever (default 10 minutes; at least LeaseTTL).
	MaxLease Duration
	// DrainTimeout is how long an aborted reservation waits for its
	// writers in flight before it fences them and quarantines its pages
	// (default 5s).
	DrainTimeout Duration
	// TombstoneTTL is how long an ended reservation is remembered, to
	// refuse late messages for it by name and answer repeated aborts
	// (default 60s).
	TombstoneTTL Duration
	// RetryEvery is how often an Abort is sent again to a party that has
	// not acknowledged it, until the tombstone is forgotten (default 1s).
	RetryEvery Duration
}

func (c *ReceiverConfig) withDefaults() {
	c.Layout = c.Layout.withDefaults()
	def := func(d *Duration, v Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.LeaseTTL, 10*Second)
	def(&c.MaxLease, 600*Second)
	def(&c.DrainTimeout, 5*Second)
	def(&c.TombstoneTTL, 60*Second)
	def(&c.RetryEvery, Second)
}

// Validate reports whether the configuration is usable.
func (c *ReceiverConfig) Validate() error {
	if err := c.Layout.Validate(); err != nil {
		return err
	}
	switch {
	case c.Incarnation == 0:
		return fmt.Errorf("%w: receiver incarnation 0", ErrInvalid)
	case c.LeaseTTL <= 0 || c.MaxLease < c.LeaseTTL || c.DrainTimeout <= 0 || c.TombstoneTTL <= 0 || c.RetryEvery <= 0:
		return fmt.Errorf("%w: lease %v (at most %v), drain %v, tombstone %v, retry %v",
			ErrInvalid, c.LeaseTTL, c.MaxLease, c.DrainTimeout, c.TombstoneTTL, c.RetryEvery)
	}
	return nil
}

// PageArrived is the driver's report of a page frame: its header, and
// the digest (PageDigest) of the bytes that arrived with it.
type PageArrived struct {
	Ref
	Index  int
	Filled int
	Digest [32]byte
}

// WritePage is the receiver's answer to an accepted PageArrived: the
// driver copies the page's bytes into Page and then calls WriteDone. Until
// then the page has a writer in flight and is not released (I7). It is a
// return value rather than an effect because only the caller holds the
// bytes.
type WritePage struct {
	ID     ReservationID
	Index  int
	Page   kvcache.PageID
	Filled int
}

// phase is where a reservation is in its life. The outcome is decided when
// it leaves phaseReceiving, and never changes after.
type phase uint8

const (
	phaseReceiving phase = iota // accepting pages, the manifest and the commit
	phaseDraining               // aborted; waiting for writers before releasing the pages
	phaseEnded                  // a tombstone: pages delivered, released or quarantined
)

func (p phase) String() string {
	return [...]string{"receiving", "draining", "ended"}[p]
}

// slot is the receiver's record of one logical page.
type slot struct {
	arrived bool
	fenced  bool // its writer was fenced; a late completion is void
	writers int  // writes granted and not yet done
	filled  int
	digest  [32]byte
}

// resv is one reservation. Its outcome lives in outcome and nowhere else.
type resv struct {
	Reservation
	gateway, sender Peer
	created         Time

	phase   phase
	outcome Outcome
	reason  Reason
	drained bool   // ended by Release (true) or Quarantine (false)
	detail  string // why, for the operator's log

	slots      []slot
	received   int // slots that arrived
	writing    int // sum of slots' writers
	manifest   *Manifest
	committing bool // the sender's Commit arrived

	drainBy  Time // draining: fence what is still written at this time
	forgetAt Time // ended: forget the tombstone

	// The abort handshake.
	ackTo    []Peer // parties that aborted the reservation, owed an AbortAck once drained
	awaitAck []Peer // parties sent an Abort that have not acknowledged it
	retryAt  Time

	q entry
}

func (rv *resv) sched() *entry { return &rv.q }

// ReceiverStats are the receiver's counters and gauges.
type ReceiverStats struct {
	Live           int // reservations receiving or draining
	PagesHeld      int
	WritesInFlight int
	Reserved       uint64
	Committed      uint64
	Aborted        uint64
	Reaped         uint64
	// Refused counts inputs refused without effect on any reservation
	// (late, unknown, from a stranger, stale); Duplicates the identical
	// copies among them.
	Refused    uint64
	Duplicates uint64
	// VoidCompletions counts WriteDone calls of fenced writers or of
	// reservations already forgotten.
	VoidCompletions  uint64
	PagesReleased    uint64
	PagesQuarantined uint64
}

// Receiver is the decode side of the handoff: it reserves pages for a
// request, accepts the pages, manifest and commit that a sender streams
// into them, and delivers the reservation to decode only if everything
// matches exactly (I6). It is a deterministic state machine with no
// goroutines, clock or IO, driven by one goroutine: inputs are the methods
// below, time comes through Tick, and effects come out of Ready.
type Receiver struct {
	cfg  ReceiverConfig
	hash LayoutHash
	now  Time
	seq  uint64

	resvs   map[ReservationID]*resv
	byOwner map[request.Owner]ReservationID // the latest epoch's reservation
	held    map[kvcache.PageID]ReservationID
	dl      queue[*resv]
	out     []Effect
	stats   ReceiverStats
}

// NewReceiver returns a receiver whose clock starts at now.
func NewReceiver(cfg ReceiverConfig, now Time) (*Receiver, error) {
	cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Receiver{
		cfg:     cfg,
		hash:    cfg.Layout.Hash(),
		now:     now,
		resvs:   make(map[ReservationID]*resv),
		byOwner: make(map[request.Owner]ReservationID),
		held:    make(map[kvcache.PageID]ReservationID),
	}, nil
}

// Config returns the configuration with defaults applied.
func (r *Receiver) Config() ReceiverConfig { return r.cfg }

// Ready returns the effects produced since the last call, in order.
func (r *Receiver) Ready() []Effect {
	out := r.out
	r.out = nil
	return out
}

func (r *Receiver) emit(e Effect)           { r.out = append(r.out, e) }
func (r *Receiver) send(to Peer, m Message) { r.emit(&Send{To: to, Msg: m}) }

// Stats returns the counters and gauges.
func (r *Receiver) Stats() ReceiverStats {
	s := r.stats
	s.PagesHeld = len(r.held)
	for _, rv := range r.resvs {
		if rv.phase != phaseEnded {
			s.Live++
		}
		s.WritesInFlight += rv.writing
	}
	return s
}

// Lookup returns a copy of a reservation the receiver still remembers and
// its outcome (OutcomeNone while it is receiving).
func (r *Receiver) Lookup(id ReservationID) (Reservation, Outcome, Reason, bool) {
	rv := r.resvs[id]
	if rv == nil {
		return Reservation{}, OutcomeNone, ReasonNone, false
	}
	res := rv.Reservation
	res.Pages = slices.Clone(res.Pages)
	return res, rv.outcome, rv.reason, true
}

// checkReserve validates a Reserve and finds an existing reservation for
// the same owner and epoch.
func (r *Receiver) checkReserve(from Peer, req Reserve) (int, *resv, error) {
	l := r.cfg.Layout
	switch {
	case req.Owner.Tenant == "" || len(req.Owner.Tenant) > MaxNameLen || req.Owner.ID.IsZero():
		return 0, nil, fmt.Errorf("%w: owner %q", ErrInvalid, req.Owner)
	case req.Sender == "" || from == "":
		return 0, nil, fmt.Errorf("%w: reserve from %q for sender %q", ErrInvalid, from, req.Sender)
	// Each term is checked on its own first, so the sum cannot overflow.
	case req.PromptTokens < 1 || req.MaxNewTokens < 1 || req.PromptTokens >= l.MaxContext ||
		req.MaxNewTokens >= l.MaxContext || req.PromptTokens+req.MaxNewTokens > l.MaxContext:
		return 0, nil, fmt.Errorf("%w: %d prompt and %d new tokens in a window of %d (the gateway admitted under other limits)",
			ErrInvalid, req.PromptTokens, req.MaxNewTokens, l.MaxContext)
	}
	if id, ok := r.byOwner[req.Owner]; ok {
		rv := r.resvs[id]
		switch {
		case req.Epoch < rv.Epoch:
			r.stats.Refused++
			return 0, nil, refused(id, ReasonStaleEpoch, "reserve for epoch %d, epoch %d exists", req.Epoch, rv.Epoch)
		case req.Epoch == rv.Epoch:
			if rv.phase != phaseReceiving || from != rv.gateway || req.Sender != rv.sender ||
				req.PromptTokens != rv.PromptTokens || req.MaxNewTokens != rv.MaxNewTokens {
				r.stats.Refused++
				return 0, nil, refused(id, ReasonDuplicate, "reserve for epoch %d again (reservation %v)", req.Epoch, rv.phase)
			}
			return 0, rv, nil
		}
	}
	return pagesFor(req.PromptTokens, l.PageSize), nil, nil
}

func (r *Receiver) grant(rv *resv) {
	r.send(rv.gateway, &Grant{Ref: rv.ref(), PageCount: len(rv.Pages), PromptTokens: rv.PromptTokens,
		MaxNewTokens: rv.MaxNewTokens, LeaseTTL: r.cfg.LeaseTTL})
}

// PagesNeeded validates a Reserve from the gateway from and returns how
// many pages the driver must allocate for it (ceil(prompt/page size)).
// For a repeated Reserve (same owner, epoch and numbers, still receiving)
// it sends the grant again and returns ErrDuplicate: nothing to allocate.
func (r *Receiver) PagesNeeded(from Peer, req Reserve) (int, error) {
	n, dup, err := r.checkReserve(from, req)
	if dup != nil {
		r.grant(dup)
		return 0, ErrDuplicate
	}
	return n, err
}

// Reserve records a reservation for req on pages, which the driver has
// just allocated from the pool (exactly PagesNeeded of them, in logical
// order), and sends the grant to the gateway from. A live reservation of
// an earlier epoch of the same request is aborted (ReasonStaleEpoch): its
// writer belongs to an attempt the gateway gave up on.
//
// On error the receiver took nothing and the driver frees the pages. For
// a repeated Reserve the error is ErrDuplicate and the grant is sent
// again.
func (r *Receiver) Reserve(from Peer, req Reserve, pages []kvcache.PageID) (Reservation, error) {
	n, dup, err := r.checkReserve(from, req)
	if dup != nil {
		r.grant(dup)
		return dup.Reservation, ErrDuplicate
	}
	if err != nil {
		return Reservation{}, err
	}
	if len(pages) != n {
		return Reservation{}, fmt.Errorf("%w: %d pages for a prompt of %d tokens (want %d)", ErrInvalid, len(pages), req.PromptTokens, n)
	}
	seen := make(map[kvcache.PageID]bool, n)
	for _, p := range pages {
		if id, ok := r.held[p]; ok || p == 0 || seen[p] {
			// The pool handed out a page that is not free: a broken I1.
			return Reservation{}, invariants.Failf("transfer: page %d given to reserve %v is zero, repeated or held by %v", p, req.Owner, id)
		}
		seen[p] = true
	}
	if id, ok := r.byOwner[req.Owner]; ok {
		r.abort(r.resvs[id], OutcomeAborted, ReasonStaleEpoch, "", fmt.Sprintf("superseded by epoch %d", req.Epoch))
	}
	r.seq++
	rv := &resv{
		Reservation: Reservation{
			ID:           ReservationID{Incarnation: r.cfg.Incarnation, Seq: r.seq},
			Owner:        req.Owner,
			Epoch:        req.Epoch,
			Pages:        slices.Clone(pages),
			PromptTokens: req.PromptTokens,
			MaxNewTokens: req.MaxNewTokens,
			LeaseExpiry:  r.now.Add(r.cfg.LeaseTTL),
		},
		gateway: from,
		sender:  req.Sender,
		created: r.now,
		slots:   make([]slot, n),
		q:       entry{tie: r.seq, idx: -1},
	}
	r.resvs[rv.ID] = rv
	r.byOwner[rv.Owner] = rv.ID
	for _, p := range pages {
		r.held[p] = rv.ID
	}
	r.reschedule(rv)
	r.stats.Reserved++
	r.grant(rv)
	res := rv.Reservation
	res.Pages = slices.Clone(res.Pages)
	return res, nil
}

// lookup finds the live reservation a sender's message (page, manifest,
// commit, heartbeat) names and checks who sent it and for whom. A message
// that cannot concern the reservation (unknown, ended, from a stranger) is
// refused without touching it; one from the reservation's own sender that
// names another owner or epoch aborts it: a sender that crossed two
// handoffs cannot be trusted with either.
func (r *Receiver) lookup(from Peer, ref Ref) (*resv, error) {
	rv := r.resvs[ref.ID]
	if rv == nil {
		r.stats.Refused++
		// Tell a writer we know nothing about to stop.
		r.send(from, &Abort{Ref: ref, Reason: ReasonUnknownReservation})
		return nil, refused(ref.ID, ReasonUnknownReservation, "from %s", from)
	}
	if from != rv.sender && enabled(checkPeer) {
		// A stranger cannot abort a reservation it is not party to; it is
		// only told to stop.
		r.stats.Refused++
		r.send(from, &Abort{Ref: ref, Reason: ReasonWrongPeer})
		return nil, refused(ref.ID, ReasonWrongPeer, "from %s, sender is %s", from, rv.sender)
	}
	if rv.phase != phaseReceiving && enabled(checkLateWrite) {
		// The sender was told the outcome (Committed, or an Abort sent
		// until acknowledged); nothing it sends now can matter.
		r.stats.Refused++
		return nil, refused(ref.ID, ReasonLateWrite, "reservation %v (%v)", rv.phase, rv.outcome)
	}
	var reason Reason
	switch {
	case ref.Owner.Tenant != rv.Owner.Tenant && enabled(checkTenant):
		reason = ReasonWrongTenant
	case ref.Owner.ID != rv.Owner.ID && enabled(checkRequest):
		reason = ReasonWrongRequest
	case ref.Epoch != rv.Epoch && enabled(checkEpoch):
		reason = ReasonStaleEpoch
	default:
		return rv, nil
	}
	return nil, r.fail(rv, reason, "message for %v, reservation is %v", ref, rv.ref())
}

// fail aborts rv after a failed check and returns the error saying so.
func (r *Receiver) fail(rv *resv, reason Reason, format string, args ...any) error {
	detail := fmt.Sprintf(format, args...)
	r.abort(rv, OutcomeAborted, reason, "", detail)
	return aborted(rv.ID, reason, "%s", detail)
}

// PageArrived applies a page frame's header and the digest of its bytes.
// If the page is accepted it returns where to write it; the driver writes
// and then calls WriteDone. An identical copy of a page already received
// is refused (ReasonDuplicate) with no write; a different one aborts.
func (r *Receiver) PageArrived(from Peer, p PageArrived) (WritePage, error) {
	rv, err := r.lookup(from, p.Ref)
	if err != nil {
		return WritePage{}, err
	}
	// Bounds that no check may skip: there is nowhere to write the page.
	if p.Index < 0 || p.Index >= len(rv.Pages) {
		return WritePage{}, r.fail(rv, ReasonPageCountMismatch, "page index %d of a reservation of %d pages", p.Index, len(rv.Pages))
	}
	if p.Filled < 0 || p.Filled > r.cfg.Layout.PageSize {
		return WritePage{}, r.fail(rv, ReasonFilledMismatch, "page %d with %d positions in pages of %d", p.Index, p.Filled, r.cfg.Layout.PageSize)
	}
	s := &rv.slots[p.Index]
	if s.arrived {
		if s.filled == p.Filled && s.digest == p.Digest {
			r.stats.Refused++
			r.stats.Duplicates++
			return WritePage{}, refused(rv.ID, ReasonDuplicate, "identical copy of page %d", p.Index)
		}
		if enabled(checkDuplicate) {
			return WritePage{}, r.fail(rv, ReasonDuplicate, "two versions of page %d", p.Index)
		}
		rv.received-- // the last version wins
	}
	s.arrived, s.filled, s.digest = true, p.Filled, p.Digest
	s.writers++
	rv.received++
	rv.writing++
	return WritePage{ID: rv.ID, Index: p.Index, Page: rv.Pages[p.Index], Filled: p.Filled}, nil
}

// WriteDone reports that the write WritePage granted for page index of
// reservation id has landed. The completion of a fenced writer, or of a
// reservation already forgotten, is void: it is counted and refused.
func (r *Receiver) WriteDone(id ReservationID, index int) error {
	rv := r.resvs[id]
	if rv == nil {
		r.stats.VoidCompletions++
		return refused(id, ReasonLateWrite, "completion for a forgotten reservation")
	}
	if index < 0 || index >= len(rv.slots) {
		return fmt.Errorf("%w: write completion for page %d of %d", ErrInvalid, index, len(rv.slots))
	}
	s := &rv.slots[index]
	switch {
	case s.fenced:
		r.stats.VoidCompletions++
		return refused(id, ReasonLateWrite, "completion of fenced writer of page %d", index)
	case s.writers == 0:
		return invariants.Failf("transfer: write completion for page %d of %v, which has no writer in flight", index, id)
	}
	s.writers--
	rv.writing--
	switch rv.phase {
	case phaseReceiving:
		r.tryCommit(rv)
	case phaseDraining:
		r.tryRelease(rv)
	}
	return nil
}

// Step applies a message from the node from: *Manifest, *Commit,
// *Heartbeat (from the reservation's sender), *Abort (from its gateway or
// sender) or *AbortAck. Pages go through PageArrived. The error says
// whether the message was refused (ErrRefused) or made the reservation
// abort (ErrAborted), and why (ReasonOf).
func (r *Receiver) Step(from Peer, m Message) error {
	switch m := m.(type) {
	case *Manifest:
		return r.manifestArrived(from, m)
	case *Commit:
		rv, err := r.lookup(from, m.Ref)
		if err != nil {
			return err
		}
		if rv.committing {
			r.stats.Refused++
			r.stats.Duplicates++
			return refused(rv.ID, ReasonDuplicate, "second commit")
		}
		rv.committing = true
		r.tryCommit(rv)
		return r.result(rv)
	case *Heartbeat:
		rv, err := r.lookup(from, m.Ref)
		if err != nil || rv.committing {
			// After its Commit the sender has nothing left to send: what
			// has not arrived by the lease's end never will.
			return err
		}
		rv.LeaseExpiry = min(r.now.Add(r.cfg.LeaseTTL), rv.created.Add(r.cfg.MaxLease))
		r.reschedule(rv)
		return nil
	case *Abort:
		return r.abortArrived(from, m)
	case *AbortAck:
		rv := r.resvs[m.ID]
		if rv == nil || m.Owner != rv.Owner || m.Epoch != rv.Epoch || !slices.Contains(rv.awaitAck, from) {
			r.stats.Refused++
			return refused(m.ID, ReasonUnknownReservation, "abort ack from %s", from)
		}
		rv.awaitAck = slices.DeleteFunc(rv.awaitAck, func(p Peer) bool { return p == from })
		r.reschedule(rv)
		return nil
	case nil:
		return fmt.Errorf("%w: nil message", ErrInvalid)
	}
	r.stats.Refused++
	return refused(ReservationID{}, ReasonMalformed, "a receiver does not take %v from %s", m.Type(), from)
}

// result is the error to return after an input that may have aborted rv.
func (r *Receiver) result(rv *resv) error {
	if rv.outcome == OutcomeAborted || rv.outcome == OutcomeReaped {
		return aborted(rv.ID, rv.reason, "%s", rv.detail)
	}
	return nil
}

func manifestsEqual(a, b *Manifest) bool {
	return a.Ref == b.Ref && a.Layout == b.Layout && a.PageCount == b.PageCount && a.TotalTokens == b.TotalTokens &&
		a.FirstToken == b.FirstToken && slices.Equal(a.Filled, b.Filled) && slices.Equal(a.PageDigests, b.PageDigests) &&
		logprobsEqual(a.FirstLogprobs, b.FirstLogprobs) && promptLogprobsEqual(a.PromptLogprobs, b.PromptLogprobs)
}

func (r *Receiver) manifestArrived(from Peer, m *Manifest) error {
	rv, err := r.lookup(from, m.Ref)
	if err != nil {
		return err
	}
	if rv.manifest != nil {
		if manifestsEqual(rv.manifest, m) {
			r.stats.Refused++
			r.stats.Duplicates++
			return refused(rv.ID, ReasonDuplicate, "identical copy of the manifest")
		}
		if enabled(checkDuplicate) {
			return r.fail(rv, ReasonDuplicate, "two different manifests")
		}
	}
	// What the reservation alone decides, checked on arrival; what needs
	// the pages, in validate.
	switch {
	case m.PageCount < 0 || len(m.Filled) != m.PageCount || len(m.PageDigests) != m.PageCount:
		return r.fail(rv, ReasonMalformed, "manifest of %d pages with %d filled counts and %d digests", m.PageCount, len(m.Filled), len(m.PageDigests))
	case m.Layout != r.hash && enabled(checkLayout):
		return r.fail(rv, ReasonLayoutMismatch, "manifest layout %v, receiver's %v", m.Layout, r.hash)
	case m.PageCount != len(rv.Pages) && enabled(checkPageCount):
		return r.fail(rv, ReasonPageCountMismatch, "manifest of %d pages for %d reserved", m.PageCount, len(rv.Pages))
	case m.TotalTokens != rv.PromptTokens && enabled(checkTotalTokens):
		return r.fail(rv, ReasonTotalTokensMismatch, "manifest of %d tokens for a prompt of %d", m.TotalTokens, rv.PromptTokens)
	}
	c := *m
	c.Filled = slices.Clone(m.Filled)
	c.PageDigests = slices.Clone(m.PageDigests)
	rv.manifest = &c
	r.tryCommit(rv)
	return r.result(rv)
}

// tryCommit validates and delivers rv once it has its commit, its manifest,
// the pages the manifest announces and no write in flight.
func (r *Receiver) tryCommit(rv *resv) {
	if rv.phase != phaseReceiving || !rv.committing || rv.manifest == nil || rv.writing > 0 ||
		rv.received < min(rv.manifest.PageCount, len(rv.Pages)) {
		return
	}
	if reason, detail := r.validate(rv); reason != ReasonNone {
		r.abort(rv, OutcomeAborted, reason, "", detail)
		return
	}
	m := rv.manifest
	r.end(rv, OutcomeCommitted, ReasonNone)
	r.unhold(rv)
	r.reschedule(rv)
	r.stats.Committed++
	res := rv.Reservation
	res.Pages = slices.Clone(res.Pages)
	r.emit(&Deliver{Reservation: res, Filled: slices.Clone(m.Filled), TotalTokens: m.TotalTokens, FirstToken: m.FirstToken, FirstLogprobs: m.FirstLogprobs,
		PromptLogprobs: m.PromptLogprobs})
	r.emit(&Ended{Ref: rv.ref(), Outcome: OutcomeCommitted})
	for _, p := range r.parties(rv, "") {
		r.send(p, &Committed{rv.ref()})
	}
}

// validate is the exact-match rule of I6: the manifest, the pages that
// arrived and the reservation agree on everything.
func (r *Receiver) validate(rv *resv) (Reason, string) {
	m, n, ps := rv.manifest, len(rv.Pages), r.cfg.Layout.PageSize
	k := min(m.PageCount, n)
	if enabled(checkLayout) && m.Layout != r.hash {
		return ReasonLayoutMismatch, ""
	}
	if enabled(checkPageCount) && (m.PageCount != n || rv.received != n) {
		return ReasonPageCountMismatch, fmt.Sprintf("%d announced, %d received, %d reserved", m.PageCount, rv.received, n)
	}
	if enabled(checkTotalTokens) && m.TotalTokens != rv.PromptTokens {
		return ReasonTotalTokensMismatch, ""
	}
	if enabled(checkFilled) {
		for i := range k {
			want := expectedFilled(i, rv.PromptTokens, ps)
			if s := rv.slots[i]; m.Filled[i] != want || !s.arrived || s.filled != want {
				return ReasonFilledMismatch, fmt.Sprintf("page %d: manifest %d, page %d, prompt implies %d", i, m.Filled[i], s.filled, want)
			}
		}
	}
	if enabled(checkDigest) {
		for i := range k {
			if s := rv.slots[i]; !s.arrived || s.digest != m.PageDigests[i] {
				return ReasonDigestMismatch, fmt.Sprintf("page %d", i)
			}
		}
	}
	return ReasonNone, ""
}

// parties are the nodes other than except that hold state for rv.
func (r *Receiver) parties(rv *resv, except Peer) []Peer {
	var ps []Peer
	for _, p := range []Peer{rv.gateway, rv.sender} {
		if p != "" && p != except && !slices.Contains(ps, p) {
			ps = append(ps, p)
		}
	}
	return ps
}

// end decides rv's outcome: the one place it is set.
func (r *Receiver) end(rv *resv, o Outcome, reason Reason) {
	if rv.outcome != OutcomeNone {
		_ = invariants.Failf("transfer: reservation %v ended twice (%v, then %v)", rv.ID, rv.outcome, o)
		return
	}
	rv.outcome, rv.reason = o, reason
	rv.phase = phaseEnded
	rv.forgetAt = r.now.Add(r.cfg.TombstoneTTL)
}

// abort ends a receiving reservation: the outcome is reported at once, the
// other parties are sent an Abort (again every RetryEvery until they
// acknowledge), and the pages are released once no writer is in flight,
// or quarantined at the drain deadline. from, if set, is the party whose
// Abort this is; it gets an AbortAck once the pages are released.
func (r *Receiver) abort(rv *resv, o Outcome, reason Reason, from Peer, detail string) {
	if rv == nil || rv.phase != phaseReceiving {
		return
	}
	r.end(rv, o, reason)
	rv.detail = detail
	rv.phase = phaseDraining
	rv.drainBy = r.now.Add(r.cfg.DrainTimeout)
	if o == OutcomeReaped {
		r.stats.Reaped++
	} else {
		r.stats.Aborted++
	}
	r.emit(&Ended{Ref: rv.ref(), Outcome: o, Reason: reason, Detail: detail})
	for _, p := range r.parties(rv, from) {
		r.send(p, &Abort{Ref: rv.ref(), Reason: reason})
		rv.awaitAck = append(rv.awaitAck, p)
	}
	rv.retryAt = r.now.Add(r.cfg.RetryEvery)
	if from != "" {
		rv.ackTo = append(rv.ackTo, from)
	}
	r.tryRelease(rv)
	r.reschedule(rv)
}

// tryRelease scrubs and frees a draining reservation's pages once no
// writer is in flight (I7), then acknowledges the aborts it owes.
func (r *Receiver) tryRelease(rv *resv) {
	if rv.phase != phaseDraining || rv.writing > 0 && enabled(checkDrain) {
		return
	}
	r.emit(&Release{ID: rv.ID, Owner: rv.Owner, Pages: slices.Clone(rv.Pages), Reason: rv.reason})
	r.stats.PagesReleased += uint64(len(rv.Pages))
	r.settle(rv, true)
}

// fence gives up on the writers of a draining reservation: they are
// fenced and all its pages quarantined.
func (r *Receiver) fence(rv *resv) {
	f := &Fence{ID: rv.ID}
	for i := range rv.slots {
		if s := &rv.slots[i]; s.writers > 0 {
			f.Indexes = append(f.Indexes, i)
			f.Pages = append(f.Pages, rv.Pages[i])
			rv.writing -= s.writers
			s.writers, s.fenced = 0, true
		}
	}
	r.emit(f)
	r.emit(&Quarantine{ID: rv.ID, Owner: rv.Owner, Pages: slices.Clone(rv.Pages), Reason: rv.reason})
	r.stats.PagesQuarantined += uint64(len(rv.Pages))
	r.settle(rv, false)
}

// settle finishes a drained reservation: it becomes a tombstone and the
// parties that aborted it get their AbortAck.
func (r *Receiver) settle(rv *resv, drained bool) {
	r.unhold(rv)
	rv.phase, rv.drained = phaseEnded, drained
	rv.forgetAt = r.now.Add(r.cfg.TombstoneTTL)
	for _, p := range rv.ackTo {
		r.send(p, &AbortAck{Ref: rv.ref(), Drained: drained})
	}
	rv.ackTo = nil
	r.reschedule(rv)
}

func (r *Receiver) unhold(rv *resv) {
	for _, p := range rv.Pages {
		if r.held[p] == rv.ID {
			delete(r.held, p)
		}
	}
}

func (r *Receiver) abortArrived(from Peer, m *Abort) error {
	ref := m.Ref
	if ref.ID.IsZero() {
		// The gateway may abort before it has seen the grant.
		if id, ok := r.byOwner[ref.Owner]; ok && r.resvs[id].Epoch == ref.Epoch {
			ref.ID = id
		}
	}
	rv := r.resvs[ref.ID]
	if rv == nil || rv.Owner != ref.Owner || rv.Epoch != ref.Epoch || from != rv.gateway && from != rv.sender {
		// Nothing of ours matches: we hold nothing for it.
		r.stats.Refused++
		r.send(from, &AbortAck{Ref: m.Ref, Drained: true})
		return refused(ref.ID, ReasonUnknownReservation, "abort from %s for %v", from, m.Ref)
	}
	reason := m.Reason
	if reason == ReasonNone {
		reason = ReasonAborted
	}
	switch {
	case rv.phase == phaseReceiving:
		r.abort(rv, OutcomeAborted, reason, from, "aborted by "+string(from))
	case rv.phase == phaseDraining:
		// Acknowledged once drained, like the first abort.
		if !slices.Contains(rv.ackTo, from) {
			rv.ackTo = append(rv.ackTo, from)
		}
	case rv.outcome == OutcomeCommitted:
		r.emit(&AbortDelivered{Ref: rv.ref(), From: from, Reason: reason})
	default:
		r.send(from, &AbortAck{Ref: rv.ref(), Drained: rv.drained})
	}
	return nil
}

// Abort aborts reservation id on the decode node's own initiative
// (shutdown, a local failure): every party is told and the pages are
// released once drained.
func (r *Receiver) Abort(id ReservationID, reason Reason) error {
	rv := r.resvs[id]
	if rv == nil || rv.phase != phaseReceiving {
		return refused(id, ReasonLateWrite, "abort of a reservation that is not receiving")
	}
	r.abort(rv, OutcomeAborted, reason, "", "aborted by the decode node")
	return nil
}

// next is rv's next deadline.
func (r *Receiver) next(rv *resv) Time {
	var t Time
	switch rv.phase {
	case phaseReceiving:
		return rv.LeaseExpiry
	case phaseDraining:
		t = rv.drainBy
	default:
		t = rv.forgetAt
	}
	if len(rv.awaitAck) > 0 {
		t = min(t, rv.retryAt)
	}
	return t
}

func (r *Receiver) reschedule(rv *resv) {
	if r.resvs[rv.ID] == rv {
		r.dl.schedule(rv, r.next(rv))
	}
}

// Tick advances the clock to now and runs the reaper, in deadline order:
// reservations whose lease expired are reaped (pages released once no
// writer is in flight), draining ones past their drain deadline are fenced
// and quarantined, unacknowledged aborts are sent again, and tombstones
// are forgotten.
func (r *Receiver) Tick(now Time) {
	if now > r.now {
		r.now = now
	}
	for {
		rv, ok := r.dl.due(r.now)
		if !ok {
			return
		}
		switch rv.phase {
		case phaseReceiving:
			if rv.LeaseExpiry <= r.now {
				r.abort(rv, OutcomeReaped, ReasonLeaseExpired, "", r.expiry(rv))
			}
		case phaseDraining:
			if rv.drainBy <= r.now {
				r.fence(rv)
			}
		case phaseEnded:
			if rv.forgetAt <= r.now {
				r.forget(rv)
				continue
			}
		}
		if len(rv.awaitAck) > 0 && rv.retryAt <= r.now {
			for _, p := range rv.awaitAck {
				r.send(p, &Abort{Ref: rv.ref(), Reason: rv.reason})
			}
			rv.retryAt = r.now.Add(r.cfg.RetryEvery)
		}
		r.reschedule(rv)
	}
}

// expiry says what a reaped reservation was still waiting for.
func (r *Receiver) expiry(rv *resv) string {
	switch {
	case rv.committing && rv.manifest == nil:
		return "committed, the manifest never arrived"
	case rv.committing:
		return fmt.Sprintf("committed, %d of %d pages arrived, %d writes in flight", rv.received, min(rv.manifest.PageCount, len(rv.Pages)), rv.writing)
	case rv.LeaseExpiry >= rv.created.Add(r.cfg.MaxLease):
		return "reached the longest lease"
	}
	return "no heartbeat"
}

func (r *Receiver) forget(rv *resv) {
	r.dl.remove(rv)
	delete(r.resvs, rv.ID)
	if r.byOwner[rv.Owner] == rv.ID {
		delete(r.byOwner, rv.Owner)
	}
}

// CheckInvariants audits the receiver's bookkeeping: every held page
// belongs to exactly one live reservation, write counts add up, no
// delivered or released reservation still holds pages or writers, every
// reservation is queued once at its next deadline.
func (r *Receiver) CheckInvariants() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	held := 0
	for id, rv := range r.resvs {
		writers, arrived := 0, 0
		for _, s := range rv.slots {
			writers += s.writers
			if s.arrived {
				arrived++
			}
		}
		if writers != rv.writing || arrived != rv.received {
			bad("%v: %d writing, slots say %d; %d received, slots say %d", id, rv.writing, writers, rv.received, arrived)
		}
		live := rv.phase != phaseEnded
		if (rv.phase == phaseReceiving) != (rv.outcome == OutcomeNone) {
			bad("%v: phase %v with outcome %v", id, rv.phase, rv.outcome)
		}
		for _, p := range rv.Pages {
			if h, ok := r.held[p]; live && (!ok || h != id) || !live && ok && h == id {
				bad("%v (%v): page %d held by %v", id, rv.phase, p, h)
			}
		}
		if live {
			held += len(rv.Pages)
		}
		if rv.outcome == OutcomeCommitted && rv.writing != 0 && enabled(checkDrain) {
			bad("%v: committed with %d writes in flight", id, rv.writing)
		}
		if rv.q.idx < 0 || rv.q.idx >= len(r.dl) || r.dl[rv.q.idx] != rv || rv.q.at != r.next(rv) {
			bad("%v: not queued at its deadline", id)
		}
	}
	if held != len(r.held) || len(r.dl) != len(r.resvs) {
		bad("%d pages held, reservations account for %d; %d queued for %d reservations", len(r.held), held, len(r.dl), len(r.resvs))
	}
	for o, id := range r.byOwner {
		if rv := r.resvs[id]; rv == nil || rv.Owner != o {
			bad("owner index: %v -> %v", o, id)
		}
	}
	return errors.Join(errs...)
}
