package sched

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// NodeConfig configures a Node.
type NodeConfig struct {
	Core     Config
	Executor Executor
	// Clock is the time source fed to Core.Tick (default time.Now).
	Clock func() time.Time
	// TickEvery is how often an idle loop ticks while requests wait or
	// quarantined pages wait for the reaper (default 50ms); only queue
	// timeouts and reaping depend on it.
	TickEvery time.Duration
	// PolicyGeneration reports the version of what Core.Policy returns
	// (tenants.Registry.Generation). The loop reads it before it applies a
	// submission and before each step, and calls Core.UpdatePolicies when
	// it changed. Bump it after the policies changed and before the
	// gateway admits under the new ones: no request admitted under a new
	// policy then meets an old one here. nil: policies never change.
	PolicyGeneration func() uint64
	// Observe, if set, is called on the loop goroutine at every turn of
	// the loop (after events and steps, before the next batch runs) with
	// the core's stats and the pool's Counts (no per-tenant pages), so
	// that metrics can read them without waiting for a step to end. It
	// must not block.
	Observe func(NodeStats)
	// Logger receives the audit trail: one ERROR line for every request
	// ended by an isolation violation (the pages, epochs and owners the
	// check saw are in the error; no prompt text) and one WARN line for
	// every result that failed for an internal reason. nil discards.
	Logger *slog.Logger
}

// Node runs a Core in one goroutine (Run) and offers the Go API the gateway
// and the node wiring use. Submit, Abort, Stats and ScrubQuarantined may be
// called from any goroutine: each becomes an event that the loop applies
// between steps, so the core keeps exactly one writer (invariant I4).
type Node struct {
	core   *Core
	exec   Executor
	lim    Limits
	clock  func() time.Time
	tick   time.Duration
	events chan event
	done   chan struct{}
	ran    atomic.Bool

	policyGen func() uint64
	gen       uint64 // the generation the core's policies are from; loop-owned
	observe   func(NodeStats)
	log       *slog.Logger

	// streams is owned by the loop goroutine.
	streams map[request.Owner]*Stream
}

type eventKind uint8

const (
	evSubmit eventKind = iota
	evAbort
	evStats
	evScrub
	evReserve
	evImport
	evCommit
	evPages
	evForensics
)

type event struct {
	kind   eventKind
	adm    Admitted
	stream *Stream
	owner  request.Owner
	cause  error
	reply  chan error // submit, abort, import, commit
	// prefill: a SubmitPrefill. pages: Reserve's answer. The import and
	// commit fields: logical page, filled positions (or total tokens),
	// bytes, first token.
	prefill  bool
	pages    chan []kvcache.PageID
	index    int
	filled   int
	data     []byte
	firstTok int
	firstLP  *request.Logprobs
	promptLP []request.Logprobs
	stats    chan NodeStats   // stats
	scrub    chan scrubResult // scrub
	pagemap  chan PageMap     // pages
	answer   chan AnswerPages // forensics
}

type scrubResult struct {
	n   int
	err error
}

// NodeStats is a snapshot of the scheduler and its pool.
type NodeStats struct {
	Core Stats
	Pool kvcache.Stats
}

// NewNode builds a node; call Run to start it.
func NewNode(cfg NodeConfig) (*Node, error) {
	if cfg.Executor == nil {
		return nil, fmt.Errorf("%w: no executor", ErrConfig)
	}
	core, err := NewCore(cfg.Core)
	if err != nil {
		return nil, err
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.TickEvery <= 0 {
		cfg.TickEvery = 50 * time.Millisecond
	}
	n := &Node{
		core:    core,
		exec:    cfg.Executor,
		lim:     core.Limits(),
		clock:   cfg.Clock,
		tick:    cfg.TickEvery,
		events:  make(chan event, 64),
		done:    make(chan struct{}),
		streams: make(map[request.Owner]*Stream),

		policyGen: cfg.PolicyGeneration,
		observe:   cfg.Observe,
		log:       cmp.Or(cfg.Logger, slog.New(slog.DiscardHandler)),
	}
	if n.policyGen != nil {
		n.gen = n.policyGen()
	}
	return n, nil
}

// syncPolicies brings the core's tenant policies up to date.
func (n *Node) syncPolicies() {
	if n.policyGen == nil {
		return
	}
	if g := n.policyGen(); g != n.gen {
		n.gen = g
		n.core.UpdatePolicies()
	}
}

// Limits is the node's one set of limits.
func (n *Node) Limits() Limits { return n.lim }

// Submit admits p and starts it. p.Owner comes from authentication; a zero
// ID is replaced by a fresh one. Errors mean nothing was started and no
// page was touched: admission errors (request.ErrContextLength,
// ErrInvalidRequest), request.ErrQuota, request.ErrOverloaded,
// request.ErrShuttingDown, or ctx's error. Cancelling ctx later aborts the
// request (its stream then ends with FinishAbort).
func (n *Node) Submit(ctx context.Context, p request.Params) (*Stream, error) {
	return n.submit(ctx, p, false)
}

// SubmitPrefill is Submit for the prefill half of a disaggregated
// request (Core.SubmitPrefill): the stream delivers the first token, then
// ends with FinishLength, and Export returns the prompt's KV.
func (n *Node) SubmitPrefill(ctx context.Context, p request.Params) (*Stream, error) {
	return n.submit(ctx, p, true)
}

// Reserve is the decode half of a disaggregated request (Core.Reserve):
// it reserves pages for p's prompt now, or fails with nothing held. The
// stream delivers the tokens once CommitImport succeeds; cancelling ctx
// aborts the request like Submit's.
func (n *Node) Reserve(ctx context.Context, p request.Params) (*Stream, []kvcache.PageID, error) {
	if p.Owner.ID.IsZero() {
		p.Owner.ID = request.NewID()
	}
	a, err := n.lim.Admit(p)
	if err != nil {
		return nil, nil, err
	}
	s := newStream(ctx, p.Owner)
	ev := event{kind: evReserve, adm: a, stream: s, reply: make(chan error, 1), pages: make(chan []kvcache.PageID, 1)}
	if err := n.send(ctx, ev); err != nil {
		return nil, nil, err
	}
	if err := n.wait(ev.reply); err != nil {
		return nil, nil, err
	}
	pages := <-ev.pages
	n.watchCancel(ctx, s, p.Owner)
	return s, pages, nil
}

// Fail ends owner's request with cause (an error for the client, unless
// cause wraps request.ErrAborted). A cause wrapping kvcache.ErrViolation
// quarantines the request's pages instead of freeing them. A request the
// node does not know gives request.ErrNotFound.
func (n *Node) Fail(owner request.Owner, cause error) error {
	ev := event{kind: evAbort, owner: owner, cause: cause, reply: make(chan error, 1)}
	if err := n.send(context.Background(), ev); err != nil {
		return err
	}
	return n.wait(ev.reply)
}

// ImportPage writes one page of a reserved request's prompt (see
// Core.ImportPage).
func (n *Node) ImportPage(owner request.Owner, i, filled int, data []byte) error {
	ev := event{kind: evImport, owner: owner, index: i, filled: filled, data: data, reply: make(chan error, 1)}
	if err := n.send(context.Background(), ev); err != nil {
		return err
	}
	return n.wait(ev.reply)
}

// CommitImport ends a reserved request's import (see Core.CommitImport).
func (n *Node) CommitImport(owner request.Owner, tokens, firstToken int, firstLogprobs *request.Logprobs) error {
	return n.CommitImportPrompt(owner, tokens, firstToken, firstLogprobs, nil)
}

// CommitImportPrompt is CommitImport with the prompt logprobs the
// prefill node sent (Core.CommitImportPrompt).
func (n *Node) CommitImportPrompt(owner request.Owner, tokens, firstToken int, firstLogprobs *request.Logprobs, prompt []request.Logprobs) error {
	ev := event{kind: evCommit, owner: owner, filled: tokens, firstTok: firstToken, firstLP: firstLogprobs, promptLP: prompt, reply: make(chan error, 1)}
	if err := n.send(context.Background(), ev); err != nil {
		return err
	}
	return n.wait(ev.reply)
}

func (n *Node) submit(ctx context.Context, p request.Params, prefill bool) (*Stream, error) {
	if p.Owner.ID.IsZero() {
		p.Owner.ID = request.NewID()
	}
	a, err := n.lim.Admit(p)
	if err != nil {
		return nil, err
	}
	s := newStream(ctx, p.Owner)
	ev := event{kind: evSubmit, adm: a, stream: s, reply: make(chan error, 1), prefill: prefill}
	if err := n.send(ctx, ev); err != nil {
		return nil, err
	}
	if err := n.wait(ev.reply); err != nil {
		return nil, err
	}
	n.watchCancel(ctx, s, p.Owner)
	return s, nil
}

// watchCancel turns the cancellation of ctx into an abort of owner's
// request, until its stream ends.
func (n *Node) watchCancel(ctx context.Context, s *Stream, owner request.Owner) {
	// From here the loop owns the request; cancellation is one more
	// abort event, applied by the loop like any other.
	// Registered only now, so it fires at once if ctx is already done.
	stop := context.AfterFunc(ctx, func() {
		_ = n.send(context.Background(), event{kind: evAbort, owner: owner, cause: request.ErrAborted})
	})
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		stop()
	} else {
		s.stop = stop
		s.mu.Unlock()
	}
}

// Abort ends tenant's request id. A request of another tenant, or one that
// already ended and was delivered, gives request.ErrNotFound; aborting a
// request twice is harmless.
func (n *Node) Abort(tenant request.Tenant, id request.ID) error {
	ev := event{kind: evAbort, owner: request.Owner{Tenant: tenant, ID: id}, cause: request.ErrAborted, reply: make(chan error, 1)}
	if err := n.send(context.Background(), ev); err != nil {
		return err
	}
	return n.wait(ev.reply)
}

// Stats returns a snapshot taken by the loop.
func (n *Node) Stats(ctx context.Context) (NodeStats, error) {
	ev := event{kind: evStats, stats: make(chan NodeStats, 1)}
	if err := n.send(ctx, ev); err != nil {
		return NodeStats{}, err
	}
	select {
	case st := <-ev.stats:
		return st, nil
	case <-n.done:
		return NodeStats{}, request.ErrShuttingDown
	case <-ctx.Done():
		return NodeStats{}, ctx.Err()
	}
}

// PageMap returns a picture of the pool's pages, the tenants' queues and
// the counters (Core.PageMap), taken by the loop between two steps so that
// it is consistent: no batch is in flight while it is taken.
func (n *Node) PageMap(ctx context.Context) (PageMap, error) {
	ev := event{kind: evPages, pagemap: make(chan PageMap, 1)}
	if err := n.send(ctx, ev); err != nil {
		return PageMap{}, err
	}
	select {
	case m := <-ev.pagemap:
		return m, nil
	case <-n.done:
		select {
		case m := <-ev.pagemap:
			return m, nil
		default:
			return PageMap{}, request.ErrShuttingDown
		}
	case <-ctx.Done():
		return PageMap{}, ctx.Err()
	}
}

// ScrubQuarantined is the operator's release of the KV pool's quarantine:
// the loop scrubs and frees every quarantined page between two steps (no
// batch in flight) and answers how many it freed.
func (n *Node) ScrubQuarantined(ctx context.Context) (int, error) {
	ev := event{kind: evScrub, scrub: make(chan scrubResult, 1)}
	if err := n.send(ctx, ev); err != nil {
		return 0, err
	}
	select {
	case r := <-ev.scrub:
		return r.n, r.err
	case <-n.done:
		// The loop answers every event it takes, also while stopping.
		select {
		case r := <-ev.scrub:
			return r.n, r.err
		default:
			return 0, request.ErrShuttingDown
		}
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// send queues ev for the loop.
func (n *Node) send(ctx context.Context, ev event) error {
	select {
	case <-n.done:
		return request.ErrShuttingDown
	default:
	}
	select {
	case n.events <- ev:
		return nil
	case <-n.done:
		return request.ErrShuttingDown
	case <-ctx.Done():
		return ctx.Err()
	}
}

// wait waits for the loop's answer to an event it received. The loop
// answers every event it takes; one still in the channel when the loop
// exits gets request.ErrShuttingDown.
func (n *Node) wait(reply chan error) error {
	select {
	case err := <-reply:
		return err
	case <-n.done:
		select {
		case err := <-reply:
			return err
		default:
			return request.ErrShuttingDown
		}
	}
}

// Run is the loop: it applies events, runs batches through the executor
// and delivers tokens and results, until ctx is done. Then it aborts every
// request with request.ErrShuttingDown, delivers those results and
// returns. Run may be called once.
func (n *Node) Run(ctx context.Context) error {
	if n.ran.Swap(true) {
		return fmt.Errorf("%w: Run called twice", ErrConfig)
	}
	defer close(n.done)
	timer := time.NewTimer(n.tick)
	defer timer.Stop()
	for {
		n.syncPolicies()
		n.core.Tick(n.clock())
		rd := n.core.Ready()
		// Counts first: a client that saw its result sees it counted.
		n.report()
		n.deliver(&rd)
		if rd.Batch != nil {
			outs, err := n.execute(ctx, rd.Batch)
			if ctx.Err() != nil {
				// Shutting down: end every request first, so that the
				// batch's requests end as aborted, not failed.
				n.core.Shutdown()
			}
			if aerr := n.core.Advance(rd.Batch, outs, err); aerr != nil {
				_ = invariants.Failf("sched: advance of the batch just run: %v", aerr)
			}
			n.drain()
			continue
		}
		if ctx.Err() != nil {
			return n.stop()
		}
		var tick <-chan time.Time
		// Waiting requests time out and quarantined pages come due only
		// as time passes: keep ticking while there are any.
		if st := n.core.Stats(); st.Queued > 0 || n.core.reapPending() {
			timer.Reset(n.tick)
			tick = timer.C
		}
		select {
		case ev := <-n.events:
			n.apply(ev)
			n.drain()
		case <-tick:
		case <-ctx.Done():
		}
	}
}

// stop shuts the core down and answers whatever is still queued.
func (n *Node) stop() error {
	n.core.Shutdown()
	rd := n.core.Ready()
	n.report()
	n.deliver(&rd)
	for {
		select {
		case ev := <-n.events:
			n.apply(ev)
		default:
			n.report()
			if len(n.streams) != 0 {
				return invariants.Failf("sched: %d streams left open at shutdown", len(n.streams))
			}
			return nil
		}
	}
}

// audit logs a result that a person must look at: an isolation
// violation (its pages are quarantined), or an internal failure.
func (n *Node) audit(res request.Result) {
	switch {
	case errors.Is(res.Err, kvcache.ErrViolation):
		n.log.Error("isolation violation: request aborted, its pages quarantined",
			"tenant", string(res.Owner.Tenant), "request", res.Owner.ID.String(), "err", res.Err.Error())
	case errors.Is(res.Err, request.ErrInternal):
		n.log.Warn("request failed", "tenant", string(res.Owner.Tenant), "request", res.Owner.ID.String(), "err", res.Err.Error())
	}
}

// report hands the current counts to NodeConfig.Observe.
func (n *Node) report() {
	if n.observe != nil {
		n.observe(NodeStats{Core: n.core.Stats(), Pool: n.core.pool.Counts()})
	}
}

// execute runs the executor, turning a panic into an error so that one bad
// batch fails its requests rather than the process.
func (n *Node) execute(ctx context.Context, b *Batch) (outs []Outcome, err error) {
	defer func() {
		if p := recover(); p != nil {
			var v *invariants.Violation
			if e, ok := p.(error); ok && errors.As(e, &v) && invariants.Strict() {
				panic(p) // tests want broken invariants loud
			}
			outs, err = nil, fmt.Errorf("executor panicked: %v", p)
		}
	}()
	return n.exec.Execute(ctx, b)
}

// drain applies every event already queued, without blocking.
func (n *Node) drain() {
	for {
		select {
		case ev := <-n.events:
			n.apply(ev)
		default:
			return
		}
	}
}

func (n *Node) apply(ev event) {
	switch ev.kind {
	case evSubmit:
		n.syncPolicies()
		var err error
		if ev.prefill {
			err = n.core.SubmitPrefill(ev.adm)
		} else {
			err = n.core.Submit(ev.adm)
		}
		if err == nil {
			n.streams[ev.adm.Owner()] = ev.stream
		}
		ev.reply <- err
	case evReserve:
		n.syncPolicies()
		pages, err := n.core.Reserve(ev.adm)
		if err == nil {
			n.streams[ev.adm.Owner()] = ev.stream
		}
		ev.pages <- pages
		ev.reply <- err
	case evImport:
		ev.reply <- n.core.ImportPage(ev.owner, ev.index, ev.filled, ev.data)
	case evCommit:
		ev.reply <- n.core.CommitImportPrompt(ev.owner, ev.filled, ev.firstTok, ev.firstLP, ev.promptLP)
	case evAbort:
		err := n.core.abort(ev.owner, ev.cause)
		if ev.reply != nil {
			ev.reply <- err
		}
		// A result may be ready now; the loop's next Ready delivers it.
	case evStats:
		ev.stats <- NodeStats{Core: n.core.Stats(), Pool: n.core.pool.Stats()}
	case evScrub:
		k, err := n.core.ScrubQuarantined()
		ev.scrub <- scrubResult{k, err}
	case evPages:
		ev.pagemap <- n.core.PageMap(nil)
	case evForensics:
		var a AnswerPages
		a.Pages, a.Quarantined, a.Withdrawn, a.Known = n.core.pool.QuarantineAnswer(ev.owner)
		if a.Quarantined > 0 {
			// The reaper's list (and its age) picks them up.
			n.core.qDirty = true
			n.core.watchQuarantine()
		}
		ev.answer <- a
	}
}

// deliver hands tokens and results to their streams, checking that each
// goes to the stream of the owner it is tagged with.
func (n *Node) deliver(rd *Ready) {
	for _, t := range rd.Tokens {
		s := n.streams[t.Owner]
		if s == nil {
			_ = invariants.Failf("sched: token for %v, which has no stream", t.Owner)
			continue
		}
		s.push(t)
	}
	for _, ex := range rd.Exports {
		if s := n.streams[ex.Owner]; s != nil {
			s.setExport(ex)
		} else {
			_ = invariants.Failf("sched: export for %v, which has no stream", ex.Owner)
		}
	}
	for _, res := range rd.Results {
		n.audit(res)
		s := n.streams[res.Owner]
		if s == nil {
			_ = invariants.Failf("sched: result for %v, which has no stream", res.Owner)
			continue
		}
		delete(n.streams, res.Owner)
		s.finish(res)
	}
}

// Stream is the output of one request: tokens in order, each tagged with
// the request's owner, then exactly one Result.
type Stream struct {
	owner  request.Owner
	ctx    context.Context
	notify chan struct{}
	done   chan struct{}

	mu     sync.Mutex
	stop   func() bool // stops the cancellation hook
	buf    []request.Token
	next   int
	res    request.Result
	ended  bool
	export *Export
	tokens chan request.Token
}

func newStream(ctx context.Context, owner request.Owner) *Stream {
	return &Stream{owner: owner, ctx: ctx, notify: make(chan struct{}, 1), done: make(chan struct{})}
}

// Owner is the request's owner.
func (s *Stream) Owner() request.Owner { return s.owner }

func (s *Stream) push(t request.Token) {
	s.mu.Lock()
	s.buf = append(s.buf, t)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *Stream) finish(res request.Result) {
	s.mu.Lock()
	s.res, s.ended = res, true
	stop := s.stop
	s.stop = nil
	s.mu.Unlock()
	if stop != nil {
		stop()
	}
	close(s.done)
}

// Recv returns the next token, io.EOF once every token was returned and
// the request ended (Result then has its outcome), or ctx's error.
func (s *Stream) Recv(ctx context.Context) (request.Token, error) {
	for {
		s.mu.Lock()
		if s.next < len(s.buf) {
			t := s.buf[s.next]
			s.buf[s.next] = request.Token{}
			s.next++
			s.mu.Unlock()
			return t, nil
		}
		ended := s.ended
		s.mu.Unlock()
		if ended {
			return request.Token{}, io.EOF
		}
		select {
		case <-s.notify:
		case <-s.done:
		case <-ctx.Done():
			return request.Token{}, ctx.Err()
		}
	}
}

func (s *Stream) setExport(ex Export) {
	s.mu.Lock()
	s.export = &ex
	s.mu.Unlock()
}

// Export waits for the request's end and returns the prompt KV of a
// prefill-only request that finished (SubmitPrefill), or false.
func (s *Stream) Export() (Export, bool) {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.export == nil {
		return Export{}, false
	}
	return *s.export, true
}

// Pending reports whether a token is ready for Recv without waiting.
func (s *Stream) Pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next < len(s.buf)
}

// Done is closed when the request reached its terminal state.
func (s *Stream) Done() <-chan struct{} { return s.done }

// Result waits for the request's single terminal outcome. It returns even
// if the tokens were not drained. Since cancelling the Submit context
// aborts the request, Result returns soon after that too.
func (s *Stream) Result() request.Result {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.res
}

// Tokens is Recv as a channel (the gateway's Stream shape): it is closed
// after the last token. A goroutine feeds it until the tokens end or the
// Submit context is done, so a reader that stops reading must cancel that
// context.
func (s *Stream) Tokens() <-chan request.Token {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tokens == nil {
		s.tokens = make(chan request.Token, 16)
		go s.pump(s.tokens)
	}
	return s.tokens
}

func (s *Stream) pump(ch chan<- request.Token) {
	defer close(ch)
	for {
		t, err := s.Recv(s.ctx)
		if err != nil {
			return
		}
		select {
		case ch <- t:
		case <-s.ctx.Done():
			return
		}
	}
}
