package transfer

import (
	"errors"
	"fmt"
	"slices"

	"github.com/pagewarden/pagewarden/internal/request"
)

// SenderConfig configures a Sender. Zero durations take the defaults
// noted.
type SenderConfig struct {
	// Layout is the prefill node's layout; its hash goes in every
	// manifest.
	Layout Layout
	// HeartbeatEvery is how often a handoff that is still being computed
	// renews its reservation's lease (default 2s, and never less often
	// than three times per lease the grant announces).
	HeartbeatEvery Duration
	// DrainTimeout is how long an aborted handoff waits for page reads in
	// flight before it gives up on them and asks for its source pages to
	// be quarantined (default 5s).
	DrainTimeout Duration
	// RetryEvery is how often an unacknowledged Abort is sent again
	// (default 1s), for at most AbortTTL (default 60s).
	RetryEvery Duration
	AbortTTL   Duration
}

func (c *SenderConfig) withDefaults() {
	c.Layout = c.Layout.withDefaults()
	def := func(d *Duration, v Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&c.HeartbeatEvery, 2*Second)
	def(&c.DrainTimeout, 5*Second)
	def(&c.RetryEvery, Second)
	def(&c.AbortTTL, 60*Second)
}

// Validate reports whether the configuration is usable.
func (c *SenderConfig) Validate() error {
	if err := c.Layout.Validate(); err != nil {
		return err
	}
	if c.HeartbeatEvery <= 0 || c.DrainTimeout <= 0 || c.RetryEvery <= 0 || c.AbortTTL <= 0 {
		return fmt.Errorf("%w: heartbeat %v, drain %v, retry %v, abort TTL %v", ErrInvalid, c.HeartbeatEvery, c.DrainTimeout, c.RetryEvery, c.AbortTTL)
	}
	return nil
}

type sphase uint8

const (
	sphaseSending  sphase = iota // pages going out as prefill produces them
	sphaseAborting               // aborted; waiting for page reads in flight
	sphaseEnded                  // sealed or drained; waiting only for abort acks
)

type spage struct {
	ready, reading, sent bool
	filled               int
	digest               [32]byte
}

// handoff is one grant being served. Its outcome lives in outcome only.
type handoff struct {
	Grant
	decode, gateway Peer

	phase   sphase
	outcome Outcome
	reason  Reason

	pages       []spage
	ready, sent int
	reading     int
	prefillDone bool
	total       int
	first       int
	firstLP     *request.Logprobs
	promptLP    []request.Logprobs

	nextBeat Time
	drainBy  Time
	forgetAt Time
	ackTo    []Peer
	awaitAck []Peer
	retryAt  Time

	q entry
}

func (h *handoff) sched() *entry { return &h.q }

// SenderStats are the sender's counters and gauges.
type SenderStats struct {
	Active     int // handoffs not ended
	Started    uint64
	Sent       uint64 // sealed: every page, the manifest and the commit went out
	Aborted    uint64
	Heartbeats uint64
	Refused    uint64
}

// Sender is the prefill side of the handoff. Given a grant, it streams the
// pages as prefill finishes them, then the manifest and the commit with
// the first sampled token; it renews the reservation's lease while prefill
// works, and takes part in the abort handshake. Like Receiver it is a
// deterministic state machine without goroutines, clock or IO.
//
// The prefill driver reports each page when its KV is final (PageReady,
// with the digest of its bytes: the sender's truth), reports when a page's
// read is done (Sent), and when prefill has sampled the first token
// (PrefillDone).
type Sender struct {
	cfg   SenderConfig
	hash  LayoutHash
	now   Time
	n     uint64
	hs    map[ReservationID]*handoff
	dl    queue[*handoff]
	out   []Effect
	stats SenderStats
}

// NewSender returns a sender whose clock starts at now.
func NewSender(cfg SenderConfig, now Time) (*Sender, error) {
	cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Sender{cfg: cfg, hash: cfg.Layout.Hash(), now: now, hs: make(map[ReservationID]*handoff)}, nil
}

// Ready returns the effects produced since the last call, in order.
func (s *Sender) Ready() []Effect {
	out := s.out
	s.out = nil
	return out
}

func (s *Sender) emit(e Effect)           { s.out = append(s.out, e) }
func (s *Sender) send(to Peer, m Message) { s.emit(&Send{To: to, Msg: m}) }

// Stats returns the counters and gauges.
func (s *Sender) Stats() SenderStats {
	st := s.stats
	for _, h := range s.hs {
		if h.phase != sphaseEnded {
			st.Active++
		}
	}
	return st
}

// Outcome returns how handoff id ended (OutcomeNone while it runs) and
// whether the sender still remembers it.
func (s *Sender) Outcome(id ReservationID) (Outcome, Reason, bool) {
	h := s.hs[id]
	if h == nil {
		return OutcomeNone, ReasonNone, false
	}
	return h.outcome, h.reason, true
}

// Start begins serving grant g: pages go to the decode node, and aborts to
// it and to the gateway. A grant whose page count is not what this node's
// page size implies for its prompt is aborted at once (the two nodes do
// not share a layout).
func (s *Sender) Start(g Grant, decode, gateway Peer) error {
	switch {
	case g.ID.IsZero() || g.Owner.Tenant == "" || g.Owner.ID.IsZero() || decode == "" || gateway == "":
		return fmt.Errorf("%w: grant %v from %q via %q", ErrInvalid, g.Ref, decode, gateway)
	case g.PromptTokens < 1 || g.PageCount < 0 || g.PageCount > MaxPages:
		return fmt.Errorf("%w: grant of %d pages for %d tokens", ErrInvalid, g.PageCount, g.PromptTokens)
	}
	if old := s.hs[g.ID]; old != nil {
		if old.Grant == g {
			return ErrDuplicate
		}
		return fmt.Errorf("%w: a second, different grant %v", ErrInvalid, g.Ref)
	}
	s.n++
	h := &handoff{Grant: g, decode: decode, gateway: gateway, pages: make([]spage, g.PageCount), q: entry{tie: s.n, idx: -1}}
	s.hs[g.ID] = h
	s.stats.Started++
	h.nextBeat = s.now.Add(s.beat(h))
	s.reschedule(h)
	if want := pagesFor(g.PromptTokens, s.cfg.Layout.PageSize); g.PageCount != want {
		return s.fail(h, ReasonPageCountMismatch, "grant of %d pages for %d tokens, pages of %d take %d", g.PageCount, g.PromptTokens, s.cfg.Layout.PageSize, want)
	}
	return nil
}

func (s *Sender) beat(h *handoff) Duration {
	b := s.cfg.HeartbeatEvery
	if h.LeaseTTL > 0 {
		b = min(b, max(h.LeaseTTL/3, 1))
	}
	return b
}

func (s *Sender) fail(h *handoff, reason Reason, format string, args ...any) error {
	s.abort(h, reason, "")
	return aborted(h.ID, reason, format, args...)
}

func (s *Sender) sending(id ReservationID) (*handoff, error) {
	h := s.hs[id]
	switch {
	case h == nil:
		return nil, refused(id, ReasonUnknownReservation, "no such handoff")
	case h.phase != sphaseSending:
		return nil, refused(id, ReasonLateWrite, "handoff %v", h.outcome)
	}
	return h, nil
}

// PageReady reports that page index of handoff id is final in the prefill
// pool, holding filled positions whose bytes digest (PageDigest) to
// digest. The sender asks for it to be sent at once (SendPage).
func (s *Sender) PageReady(id ReservationID, index, filled int, digest [32]byte) error {
	h, err := s.sending(id)
	if err != nil {
		return err
	}
	if index < 0 || index >= len(h.pages) || h.pages[index].ready || filled < 0 || filled > s.cfg.Layout.PageSize {
		return fmt.Errorf("%w: page %d (%d positions) of a handoff of %d pages", ErrInvalid, index, filled, len(h.pages))
	}
	if want := expectedFilled(index, h.PromptTokens, s.cfg.Layout.PageSize); filled != want && enabled(checkSenderPrompt) {
		return s.fail(h, ReasonFilledMismatch, "page %d holds %d positions, the granted prompt implies %d", index, filled, want)
	}
	p := &h.pages[index]
	p.ready, p.reading, p.filled, p.digest = true, true, filled, digest
	h.ready++
	h.reading++
	s.emit(&SendPage{To: h.decode, Page: Page{Ref: h.Ref, Index: index, Filled: filled}})
	return nil
}

// Sent reports that the driver has read page index of handoff id and put
// it on the wire; the source page is no longer being read.
func (s *Sender) Sent(id ReservationID, index int) error {
	h := s.hs[id]
	if h == nil || index < 0 || index >= len(h.pages) || !h.pages[index].reading {
		return fmt.Errorf("%w: page %d of %v was not being sent", ErrInvalid, index, id)
	}
	p := &h.pages[index]
	p.reading, p.sent = false, true
	h.reading--
	h.sent++
	switch h.phase {
	case sphaseSending:
		s.trySeal(h)
	case sphaseAborting:
		s.tryDrain(h)
	}
	return nil
}

// PrefillDone reports that prefill of handoff id computed totalTokens
// positions and sampled firstToken. A prompt other than the one the grant
// was for (the incident's 1-token placeholder) aborts the handoff here.
//
// firstLogprobs are the first token's, when the request asked for them;
// they go out in the manifest.
func (s *Sender) PrefillDone(id ReservationID, totalTokens, firstToken int, firstLogprobs *request.Logprobs) error {
	return s.PrefillDonePrompt(id, totalTokens, firstToken, firstLogprobs, nil)
}

// PrefillDonePrompt is PrefillDone with the prompt logprobs of a request
// that asked for them (sched.Export.PromptLogprobs); they go out in the
// manifest too.
func (s *Sender) PrefillDonePrompt(id ReservationID, totalTokens, firstToken int, firstLogprobs *request.Logprobs, prompt []request.Logprobs) error {
	h, err := s.sending(id)
	if err != nil {
		return err
	}
	if h.prefillDone || totalTokens < 0 || firstToken < 0 {
		return fmt.Errorf("%w: prefill of %v done again, or with %d tokens, first %d", ErrInvalid, id, totalTokens, firstToken)
	}
	if enabled(checkSenderPrompt) {
		if totalTokens != h.PromptTokens {
			return s.fail(h, ReasonTotalTokensMismatch, "prefill computed %d positions for a grant of %d", totalTokens, h.PromptTokens)
		}
		if h.ready != len(h.pages) {
			return s.fail(h, ReasonPageCountMismatch, "prefill done with %d of %d pages", h.ready, len(h.pages))
		}
	}
	h.prefillDone, h.total, h.first, h.firstLP, h.promptLP = true, totalTokens, firstToken, firstLogprobs, prompt
	s.trySeal(h)
	return nil
}

// trySeal sends the manifest and the commit once prefill is done and
// every ready page has left: the frames before them on the link are all
// the pages.
func (s *Sender) trySeal(h *handoff) {
	if h.phase != sphaseSending || !h.prefillDone || h.reading > 0 || h.sent != h.ready {
		return
	}
	n := h.ready
	m := &Manifest{Ref: h.Ref, Layout: s.hash, PageCount: n, Filled: make([]int, n), TotalTokens: h.total,
		PageDigests: make([][32]byte, n), FirstToken: h.first, FirstLogprobs: h.firstLP,
		PromptLogprobs: h.promptLP}
	for i := range n {
		m.Filled[i], m.PageDigests[i] = h.pages[i].filled, h.pages[i].digest
	}
	s.send(h.decode, m)
	s.send(h.decode, &Commit{h.Ref})
	h.outcome = OutcomeSent
	s.stats.Sent++
	s.emit(&ReleaseSource{Ref: h.Ref})
	s.emit(&Ended{Ref: h.Ref, Outcome: OutcomeSent})
	// Nothing is left to do: the decode node decides, and tells the
	// gateway. A later Abort is answered as for any handoff we do not
	// hold.
	s.forget(h)
}

// abort stops the handoff: no page is sent any more, the other parties
// are told (again every RetryEvery until they acknowledge), and the source
// pages are released once no read is in flight. from, if set, is the
// party whose Abort this is; it gets an AbortAck then.
func (s *Sender) abort(h *handoff, reason Reason, from Peer) {
	if h.phase != sphaseSending {
		return
	}
	h.phase, h.outcome, h.reason = sphaseAborting, OutcomeAborted, reason
	h.drainBy = s.now.Add(s.cfg.DrainTimeout)
	h.forgetAt = s.now.Add(s.cfg.AbortTTL)
	s.stats.Aborted++
	s.emit(&Ended{Ref: h.Ref, Outcome: OutcomeAborted, Reason: reason})
	for _, p := range []Peer{h.decode, h.gateway} {
		if p != from && !slices.Contains(h.awaitAck, p) {
			s.send(p, &Abort{Ref: h.Ref, Reason: reason})
			h.awaitAck = append(h.awaitAck, p)
		}
	}
	h.retryAt = s.now.Add(s.cfg.RetryEvery)
	if from != "" {
		h.ackTo = append(h.ackTo, from)
	}
	s.tryDrain(h)
	s.reschedule(h)
}

func (s *Sender) tryDrain(h *handoff) {
	if h.phase != sphaseAborting || h.reading > 0 {
		return
	}
	s.settle(h, true)
}

func (s *Sender) settle(h *handoff, drained bool) {
	s.emit(&ReleaseSource{Ref: h.Ref, Quarantine: !drained})
	h.phase = sphaseEnded
	for _, p := range h.ackTo {
		s.send(p, &AbortAck{Ref: h.Ref, Drained: drained})
	}
	h.ackTo = nil
	s.reschedule(h)
}

// Abort aborts handoff id on the prefill node's own initiative (prefill
// failed, the node is shutting down).
func (s *Sender) Abort(id ReservationID, reason Reason) error {
	h, err := s.sending(id)
	if err != nil {
		return err
	}
	s.abort(h, reason, "")
	return nil
}

// Step applies a message from node from: *Abort (from the decode node or
// the gateway), *AbortAck or *Committed.
func (s *Sender) Step(from Peer, m Message) error {
	switch m := m.(type) {
	case *Abort:
		h := s.hs[m.ID]
		if h == nil || h.Ref != m.Ref || from != h.decode && from != h.gateway {
			// We hold nothing for it (any more): nothing to drain.
			s.stats.Refused++
			s.send(from, &AbortAck{Ref: m.Ref, Drained: true})
			if h == nil {
				return nil
			}
			return refused(m.ID, ReasonWrongPeer, "abort from %s for %v", from, m.Ref)
		}
		reason := m.Reason
		if reason == ReasonNone {
			reason = ReasonAborted
		}
		switch h.phase {
		case sphaseSending:
			s.abort(h, reason, from)
		case sphaseAborting:
			if !slices.Contains(h.ackTo, from) {
				h.ackTo = append(h.ackTo, from)
			}
		default:
			s.send(from, &AbortAck{Ref: h.Ref, Drained: true})
		}
		return nil
	case *AbortAck:
		h := s.hs[m.ID]
		if h == nil || h.Ref != m.Ref || !slices.Contains(h.awaitAck, from) {
			s.stats.Refused++
			return refused(m.ID, ReasonUnknownReservation, "abort ack from %s", from)
		}
		h.awaitAck = slices.DeleteFunc(h.awaitAck, func(p Peer) bool { return p == from })
		if h.phase == sphaseEnded && len(h.awaitAck) == 0 {
			s.forget(h)
		} else {
			s.reschedule(h)
		}
		return nil
	case *Committed:
		// The handoff was forgotten when sealed; nothing to do.
		return nil
	case nil:
		return fmt.Errorf("%w: nil message", ErrInvalid)
	}
	s.stats.Refused++
	return refused(ReservationID{}, ReasonMalformed, "a sender does not take %v from %s", m.Type(), from)
}

func (s *Sender) next(h *handoff) Time {
	var t Time
	switch h.phase {
	case sphaseSending:
		return h.nextBeat
	case sphaseAborting:
		t = h.drainBy
	default:
		t = h.forgetAt
	}
	if len(h.awaitAck) > 0 {
		t = min(t, h.retryAt)
	}
	return t
}

func (s *Sender) reschedule(h *handoff) {
	if s.hs[h.ID] == h {
		s.dl.schedule(h, s.next(h))
	}
}

func (s *Sender) forget(h *handoff) {
	s.dl.remove(h)
	delete(s.hs, h.ID)
}

// Tick advances the clock to now: heartbeats for handoffs still being
// computed, aborts sent again to parties that have not acknowledged,
// reads that did not drain in time given up on (their source pages
// quarantined), and aborted handoffs forgotten after AbortTTL.
func (s *Sender) Tick(now Time) {
	if now > s.now {
		s.now = now
	}
	for {
		h, ok := s.dl.due(s.now)
		if !ok {
			return
		}
		switch h.phase {
		case sphaseSending:
			s.send(h.decode, &Heartbeat{h.Ref})
			s.stats.Heartbeats++
			h.nextBeat = s.now.Add(s.beat(h))
		case sphaseAborting:
			if h.drainBy <= s.now {
				for i := range h.pages {
					h.pages[i].reading = false
				}
				h.reading = 0
				s.settle(h, false)
			}
		}
		if h.phase == sphaseEnded && h.forgetAt <= s.now {
			s.forget(h)
			continue
		}
		if len(h.awaitAck) > 0 && h.retryAt <= s.now {
			for _, p := range h.awaitAck {
				s.send(p, &Abort{Ref: h.Ref, Reason: h.reason})
			}
			h.retryAt = s.now.Add(s.cfg.RetryEvery)
		}
		s.reschedule(h)
	}
}

// CheckInvariants audits the sender's bookkeeping.
func (s *Sender) CheckInvariants() error {
	var errs []error
	for id, h := range s.hs {
		ready, reading, sent := 0, 0, 0
		for _, p := range h.pages {
			if p.ready {
				ready++
			}
			if p.reading {
				reading++
			}
			if p.sent {
				sent++
			}
		}
		if ready != h.ready || reading != h.reading || sent != h.sent {
			errs = append(errs, fmt.Errorf("%v: counts %d/%d/%d, pages say %d/%d/%d", id, h.ready, h.reading, h.sent, ready, reading, sent))
		}
		if (h.phase == sphaseSending) != (h.outcome == OutcomeNone) {
			errs = append(errs, fmt.Errorf("%v: phase %d with outcome %v", id, h.phase, h.outcome))
		}
		if h.q.idx < 0 || h.q.idx >= len(s.dl) || s.dl[h.q.idx] != h || h.q.at != s.next(h) {
			errs = append(errs, fmt.Errorf("%v: not queued at its deadline", id))
		}
	}
	if len(s.dl) != len(s.hs) {
		errs = append(errs, fmt.Errorf("%d queued for %d handoffs", len(s.dl), len(s.hs)))
	}
	return errors.Join(errs...)
}
