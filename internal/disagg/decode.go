package disagg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// DecodeConfig configures a decode node's driver.
type DecodeConfig struct {
	Sched     *sched.Node
	Layout    transfer.Layout // the node's KV layout (node.Node.HandoffLayout)
	Transport link.Transport
	// Receiver tunes leases and timeouts; its Layout and Incarnation are
	// filled in.
	Receiver transfer.ReceiverConfig
	// TickEvery is how often leases and retries are checked (default
	// 100ms).
	TickEvery time.Duration
	Logger    *slog.Logger
	Clock     func() time.Time // default time.Now
	// Load reports the node's room and work to a gateway's LoadQuery
	// (LoadOf); nil answers none, and gateways route on their own
	// counts and leave the node out of rotation once it stays silent.
	Load func() transfer.Load
}

// DecodeStats are a decode driver's counters.
type DecodeStats struct {
	Receiver  transfer.ReceiverStats
	Refused   uint64 // Generate refused before a reservation (no room, bad request)
	Committed uint64
	Failed    uint64 // handoffs that ended without a commit
}

// Decode is a decode node's driver: it turns Generate into a reservation
// in the scheduler, writes arriving pages into it, hands a committed
// handoff to the scheduler, and streams the request's tokens and result to
// the gateway.
type Decode struct {
	*loop
	cfg  DecodeConfig
	recv *transfer.Receiver

	// owned by the loop
	reqs map[transfer.ReservationID]*decodeReq
	byOw map[request.Owner]*decodeReq

	refused, committed, failed atomic.Uint64
	statsMu                    sync.Mutex
	stats                      transfer.ReceiverStats
}

// decodeReq is the driver's record of one request on this node.
type decodeReq struct {
	ref     transfer.Ref
	gateway transfer.Peer
	sender  transfer.Peer
	stream  *sched.Stream
	cancel  context.CancelFunc
	ended   bool // the reservation ended (committed or not)
	// settled is closed once the reservation ended and what the receiver
	// sent about it (Committed, Abort) has gone out: only then may tokens
	// follow, so that the gateway never sees a token before the commit.
	settled chan struct{}
	// logprobs: the request asked for them, so every token carries them
	// (and none does otherwise).
	logprobs bool
}

// NewDecode builds the driver; Run runs it.
func NewDecode(cfg DecodeConfig) (*Decode, error) {
	if cfg.Sched == nil || cfg.Transport == nil {
		return nil, errors.New("disagg: decode needs a scheduler and a transport")
	}
	lp := newLoop(cfg.TickEvery, cfg.Clock, cfg.Logger)
	cfg.Clock = lp.clock
	rc := cfg.Receiver
	rc.Layout = cfg.Layout
	// A fresh incarnation per start: ids of a previous run never match.
	rc.Incarnation = request.NewSeed() | 1
	recv, err := transfer.NewReceiver(rc, transfer.Time(cfg.Clock().UnixNano()))
	if err != nil {
		return nil, fmt.Errorf("disagg: decode: %w", err)
	}
	return &Decode{
		loop: lp, cfg: cfg, recv: recv,
		reqs: make(map[transfer.ReservationID]*decodeReq),
		byOw: make(map[request.Owner]*decodeReq),
	}, nil
}

// Stats returns the driver's counters.
func (d *Decode) Stats() DecodeStats {
	d.statsMu.Lock()
	defer d.statsMu.Unlock()
	return DecodeStats{Receiver: d.stats, Refused: d.refused.Load(), Committed: d.committed.Load(), Failed: d.failed.Load()}
}

// Run is the driver's loop; it returns when ctx ends, after the requests
// it started have ended.
func (d *Decode) Run(ctx context.Context) error {
	return d.run(ctx, d.cfg.Transport.Inbox(), handlers{
		inbound: d.inbound,
		tick:    func(now time.Time) { d.recv.Tick(transfer.Time(now.UnixNano())) },
		after:   d.effects,
		stop:    d.stop,
	})
}

// stop ends every request the driver started.
func (d *Decode) stop() {
	for _, r := range d.byOw {
		r.cancel()
	}
}

func (d *Decode) inbound(ctx context.Context, in link.Inbound) {
	from := in.From.Name
	if in.Down != nil {
		d.peerGone(from, transfer.ReasonAborted)
		return
	}
	d.recv.Tick(transfer.Time(d.cfg.Clock().UnixNano()))
	switch m := in.Msg.(type) {
	case *transfer.Generate:
		d.generate(ctx, from, m)
	case *transfer.Page:
		d.page(from, m)
	case *transfer.Manifest, *transfer.Commit, *transfer.Heartbeat, *transfer.AbortAck:
		if err := d.recv.Step(from, m); err != nil {
			d.log.Debug("handoff message refused", "from", from, "type", m.Type(), "err", err)
		}
	case *transfer.Abort:
		if err := d.recv.Step(from, m); err != nil {
			d.log.Debug("abort refused", "from", from, "err", err)
		}
	case *transfer.LoadQuery:
		if d.cfg.Load != nil {
			l := d.cfg.Load()
			l.Seq = m.Seq
			d.send(ctx, from, &l)
		}
	default:
		d.log.Warn("unexpected message on a decode node", "from", from, "type", in.Msg.Type())
	}
}

// PeerLeft tells the driver that node left the cluster: its etcd lease
// expired or was revoked (package cluster), so the cluster holds it gone
// even where its link is still up. The handoff leases of the reservations
// it takes part in are bound to that registration: every reservation
// whose sender (prefill node) or gateway it is and that has not committed
// is aborted at once, with transfer.ReasonLeaseExpired; the receiver
// tells the other parties (the gateway fails the request with an error),
// drains the writers in flight and frees the pages, or quarantines them
// if a writer cannot be drained. The requests a gateway that left was
// streaming are ended too: nobody is left to read them. A node that
// rejoins under the same name is a new registration and starts afresh.
//
// PeerLeft runs on the driver's loop and returns once it has, or at once
// if the driver has stopped. It is safe to call from any goroutine (the
// membership watch); it returns how many reservations it aborted.
func (d *Decode) PeerLeft(node transfer.Peer) int {
	n := 0
	d.do(func() { n = d.peerGone(node, transfer.ReasonLeaseExpired) })
	if n > 0 {
		d.log.Warn("peer left the cluster; its reservations aborted", "peer", node, "reservations", n)
	}
	return n
}

// peerGone ends what depends on a peer whose link went down or that left
// the cluster: every reservation it takes part in that has not ended (the
// receiver's abort reaches the other parties), and every request it is
// the gateway of. It returns the reservations it aborted.
func (d *Decode) peerGone(peer transfer.Peer, reason transfer.Reason) int {
	n := 0
	for id, r := range d.reqs {
		if !r.ended && (r.sender == peer || r.gateway == peer) {
			if d.recv.Abort(id, reason) == nil {
				n++
			}
		}
	}
	for _, r := range d.byOw {
		if r.gateway == peer {
			r.cancel() // nobody to stream to: the client's gone with it
		}
	}
	return n
}

// generate reserves pages for a request in the scheduler and records the
// reservation, which answers the gateway with a grant.
func (d *Decode) generate(ctx context.Context, from transfer.Peer, m *transfer.Generate) {
	fail := func(err error) {
		d.refused.Add(1)
		res := &transfer.Result{Ref: transfer.Ref{Owner: m.Owner, Epoch: m.Epoch}, Reason: request.FinishError, Code: transfer.CodeOf(err)}
		res.Usage.PromptTokens = len(m.Job.Prompt)
		d.send(ctx, from, res)
	}
	if _, dup := d.byOw[m.Owner]; dup {
		// A retry of a Generate we hold: the receiver resends the grant.
		if _, err := d.recv.PagesNeeded(from, m.Reserve); err != nil && !errors.Is(err, transfer.ErrDuplicate) {
			d.log.Debug("repeated generate refused", "owner", m.Owner, "err", err)
		}
		return
	}
	if _, err := d.recv.PagesNeeded(from, m.Reserve); err != nil {
		if !errors.Is(err, transfer.ErrDuplicate) {
			fail(err)
		}
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	st, pages, err := d.cfg.Sched.Reserve(rctx, m.Job.Params(m.Owner))
	if err != nil {
		cancel()
		fail(err)
		return
	}
	res, err := d.recv.Reserve(from, m.Reserve, pages)
	if err != nil {
		cancel() // the scheduler aborts the request and frees its pages
		fail(err)
		return
	}
	r := &decodeReq{ref: transfer.Ref{ID: res.ID, Owner: res.Owner, Epoch: res.Epoch}, gateway: from, sender: m.Sender, stream: st, cancel: cancel,
		settled: make(chan struct{}), logprobs: m.Job.Sampling.Logprobs}
	d.reqs[res.ID] = r
	d.byOw[res.Owner] = r
	d.wg.Add(1)
	go d.relay(ctx, r)
}

// relay streams r's tokens and its one result to the gateway.
func (d *Decode) relay(ctx context.Context, r *decodeReq) {
	defer d.wg.Done()
	defer r.cancel()
	select {
	case <-r.settled:
	case <-ctx.Done():
	}
	const batch = 64
	var ids []int
	var lps []*request.Logprobs
	var prompt []request.Logprobs // the first token's (Token.Prompt)
	next := 0
	flush := func() {
		if len(ids) > 0 {
			d.send(ctx, r.gateway, &transfer.Tokens{Ref: r.ref, Start: next - len(ids), IDs: ids, Logprobs: lps, Prompt: prompt})
			ids, lps, prompt = nil, nil, nil
		}
	}
	for {
		tok, err := r.stream.Recv(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil || tok.Owner != r.ref.Owner || tok.Index != next || (tok.Logprobs != nil) != r.logprobs {
			// The scheduler's own contract broke: end the request
			// rather than forward something we cannot vouch for.
			_ = d.cfg.Sched.Fail(r.ref.Owner, fmt.Errorf("%w: token %d of %v on the stream of %v (%v)", request.ErrInternal, tok.Index, tok.Owner, r.ref.Owner, err))
			for {
				if _, err := r.stream.Recv(context.Background()); err != nil {
					break
				}
			}
			break
		}
		if tok.Index == 0 {
			// The scheduler checked their count at the import.
			prompt = tok.Prompt
		}
		ids = append(ids, tok.ID)
		if r.logprobs {
			lps = append(lps, tok.Logprobs)
		}
		next++
		// Flush at once unless more are already waiting: a stream's
		// latency matters more than a frame's size.
		if len(ids) == batch || !r.stream.Pending() {
			flush()
		}
	}
	flush()
	res := r.stream.Result()
	out := &transfer.Result{Ref: r.ref, Reason: res.Reason, Code: transfer.CodeOf(res.Err), Usage: res.Usage, Handoff: transfer.ReasonOf(res.Err)}
	if res.Reason.Success() {
		out.Code = transfer.CodeNone
	}
	d.send(ctx, r.gateway, out)
	d.post(ctx, func() {
		delete(d.byOw, r.ref.Owner)
		if rr := d.reqs[r.ref.ID]; rr == r && rr.ended {
			delete(d.reqs, r.ref.ID)
		}
	})
}

// page writes an arriving page into its reservation through the
// scheduler, after the receiver checked its header and digest.
func (d *Decode) page(from transfer.Peer, m *transfer.Page) {
	wp, err := d.recv.PageArrived(from, transfer.PageArrived{
		Ref: m.Ref, Index: m.Index, Filled: m.Filled, Digest: transfer.PageDigest(m.Index, m.Filled, m.Data),
	})
	if err != nil {
		d.log.Debug("page refused", "from", from, "ref", m.Ref, "index", m.Index, "err", err)
		return
	}
	ierr := d.cfg.Sched.ImportPage(m.Owner, m.Index, m.Filled, m.Data)
	if err := d.recv.WriteDone(wp.ID, wp.Index); err != nil {
		d.log.Debug("write completion refused", "ref", m.Ref, "err", err)
	}
	if ierr != nil {
		d.log.Warn("page import failed; aborting the handoff", "ref", m.Ref, "index", m.Index, "err", ierr)
		_ = d.recv.Abort(wp.ID, transfer.ReasonMalformed)
	}
}

// effects carries out what the receiver asks, in order.
func (d *Decode) effects(ctx context.Context) {
	var settled []*decodeReq
	defer func() {
		for _, r := range settled {
			close(r.settled)
		}
	}()
	for _, e := range d.recv.Ready() {
		switch e := e.(type) {
		case *transfer.Send:
			d.send(ctx, e.To, e.Msg)
		case *transfer.Deliver:
			if err := d.cfg.Sched.CommitImportPrompt(e.Owner, e.TotalTokens, e.FirstToken, e.FirstLogprobs, e.PromptLogprobs); err != nil {
				// The scheduler ended the request (scrubbed, or
				// quarantined on a violation): its stream's Result says so.
				d.log.Error("committed handoff refused by the pool", "owner", e.Owner, "err", err)
			}
		case *transfer.Release:
			d.endRequest(e.ID, e.Owner, e.Reason, false)
		case *transfer.Quarantine:
			d.endRequest(e.ID, e.Owner, e.Reason, true)
		case *transfer.Fence:
			// Writes are synchronous in this driver: a writer granted a
			// page has finished before the next input. Nothing to stop.
			d.log.Error("fence with no writer in flight", "reservation", e.ID, "pages", e.Indexes)
		case *transfer.Ended:
			if r := d.reqs[e.ID]; r != nil && !r.ended {
				r.ended = true
				settled = append(settled, r)
				if _, live := d.byOw[r.ref.Owner]; !live {
					delete(d.reqs, e.ID)
				}
			}
			switch e.Outcome {
			case transfer.OutcomeCommitted:
				d.committed.Add(1)
			default:
				d.failed.Add(1)
				d.log.Warn("handoff failed", "ref", e.Ref, "outcome", e.Outcome, "reason", e.Reason, "detail", e.Detail)
			}
		case *transfer.AbortDelivered:
			err := d.cfg.Sched.Abort(e.Owner.Tenant, e.Owner.ID)
			if err != nil && !errors.Is(err, request.ErrNotFound) {
				d.log.Warn("abort of a decoding request", "owner", e.Owner, "err", err)
			}
			d.send(ctx, e.From, &transfer.AbortAck{Ref: e.Ref, Drained: true})
		}
	}
	d.statsMu.Lock()
	d.stats = d.recv.Stats()
	d.statsMu.Unlock()
}

// endRequest ends the request of a reservation that will not commit: its
// pages go back scrubbed, or quarantined when a writer could not be
// drained. The client sees an error that names the handoff's failure.
func (d *Decode) endRequest(id transfer.ReservationID, owner request.Owner, reason transfer.Reason, quarantine bool) {
	cause := error(&transfer.Failure{Kind: transfer.ErrAborted, Reason: reason, ID: id})
	if reason == transfer.ReasonAborted {
		cause = fmt.Errorf("%w: %w", request.ErrAborted, cause)
	}
	if quarantine {
		cause = fmt.Errorf("%w: a writer of the handoff could not be drained: %w", kvcache.ErrViolation, cause)
	}
	if err := d.cfg.Sched.Fail(owner, cause); err != nil && !errors.Is(err, request.ErrNotFound) {
		d.log.Warn("ending a failed handoff's request", "owner", owner, "err", err)
	}
}

func (d *Decode) send(ctx context.Context, to transfer.Peer, m transfer.Message) {
	if err := d.cfg.Transport.Send(ctx, to, m); err != nil {
		d.log.Debug("send failed", "to", to, "type", m.Type(), "err", err)
	}
}
