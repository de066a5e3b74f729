package disagg

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// Vocabulary is what the gateway needs of the model without running it:
// the tokenizer, the chat template and the served limits.
type Vocabulary interface {
	ModelID() string
	Limits() gateway.Limits
	Tokenize(text string, addSpecial, parseSpecial bool) ([]int, error)
	Detokenize(ids []int) (string, error)
	TokenPiece(id int) []byte
	ChatTemplate() string
	BOS() int
	EOS() int
	IsEOG(id int) bool
	FIM() (pre, suf, mid int, ok bool)
}

// RouterConfig configures the gateway's side.
type RouterConfig struct {
	Vocabulary Vocabulary
	Transport  link.Transport
	// Prefill and Decode name the nodes requests are sent through. They
	// must name at least one node each unless Dynamic.
	Prefill, Decode []transfer.Peer
	// Dynamic says that the node lists change while the router runs
	// (SetNodes, from cluster membership): they may start empty, and a
	// request that arrives while one is empty fails as overloaded.
	Dynamic bool
	// AbortWait bounds how long an aborted request waits for its decode
	// node's result before it is ended here (default 5s).
	AbortWait time.Duration
	// AbortRetry is how often an abort a node has not acknowledged is
	// sent again (default 1s), for at most AbortTTL (default 60s): an
	// abort must reach every node that holds state for the request (I7),
	// not only the ones whose link happened to take it.
	AbortRetry, AbortTTL time.Duration
	// DownFor is how long a node whose link went down (or could not be
	// opened) is left out of rotation before it is tried again (default
	// 5s).
	DownFor time.Duration
	// LoadEvery is how often every node is asked for its load (default
	// 250ms); SilentAfter is how long a node may leave a query
	// unanswered before it is out of rotation (default 3s). See
	// routerload.go.
	LoadEvery, SilentAfter time.Duration
	// UsageWait bounds how long a decoded answer waits for the prefill
	// node's account of its prompt (how much its prefix cache served,
	// default 1s). That account and the decode node's result come over
	// different links, in either order; past the wait the answer ends
	// without it (usage counts no cached tokens) rather than never.
	UsageWait time.Duration
	Logger    *slog.Logger
}

// RouterStats are the router's counters.
type RouterStats struct {
	Submitted, Committed, Succeeded, Failed uint64
	// HandoffFailures counts requests that ended on an aborted or reaped
	// handoff, by reason.
	HandoffFailures map[string]uint64
	// Refused counts messages that did not fit the request they named
	// (wrong sender, owner or index): each ends its request with an error.
	Refused uint64
}

// Router is a gateway.Backend that runs every request through a decode
// node (reservation, decoding) and a prefill node (the prompt).
type Router struct {
	Vocabulary
	cfg RouterConfig
	log *slog.Logger

	mu    sync.Mutex
	calls map[request.Owner]*call
	// prefill and decode are the nodes in the cluster now (SetNodes).
	prefill, decode []transfer.Peer
	load            map[transfer.Peer]int       // requests in flight per prefill node
	pages           map[transfer.Peer]int       // worst-case KV pages of the requests in flight per decode node
	down            map[transfer.Peer]time.Time // nodes out of rotation, until
	loads           map[transfer.Peer]*nodeLoad // what the nodes said of their load (routerload.go)
	seq             uint64                      // of the latest LoadQuery
	// affinity remembers which prefill node last computed a tenant's
	// prompt prefix (its first page), so that the node's tenant-scoped
	// prefix cache can serve the next prompt that starts the same way.
	affinity map[[32]byte]transfer.Peer
	// unacked holds, per aborted attempt, the nodes that have not yet
	// acknowledged the gateway's abort.
	unacked map[abortKey]map[transfer.Peer]bool
	fails   map[string]uint64
	stopped bool
	// served remembers which nodes ran the last requests (replay.go), so
	// that an audit re-score can run elsewhere.
	served servedBy

	submitted, committed, succeeded, failed, refused atomic.Uint64
	done                                             chan struct{}
}

var _ gateway.Backend = (*Router)(nil)

// NewRouter builds a router; Run must be running for requests to progress.
func NewRouter(cfg RouterConfig) (*Router, error) {
	if cfg.Vocabulary == nil || cfg.Transport == nil {
		return nil, errors.New("disagg: a router needs a vocabulary and a transport")
	}
	if !cfg.Dynamic && (len(cfg.Prefill) == 0 || len(cfg.Decode) == 0) {
		return nil, errors.New("disagg: a router needs at least one prefill and one decode node")
	}
	if cfg.AbortWait <= 0 {
		cfg.AbortWait = 5 * time.Second
	}
	if cfg.AbortRetry <= 0 {
		cfg.AbortRetry = time.Second
	}
	if cfg.AbortTTL <= 0 {
		cfg.AbortTTL = 60 * time.Second
	}
	if cfg.DownFor <= 0 {
		cfg.DownFor = 5 * time.Second
	}
	if cfg.LoadEvery <= 0 {
		cfg.LoadEvery = 250 * time.Millisecond
	}
	if cfg.SilentAfter <= 0 {
		cfg.SilentAfter = 3 * time.Second
	}
	if cfg.UsageWait <= 0 {
		cfg.UsageWait = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Router{loads: make(map[transfer.Peer]*nodeLoad),
		Vocabulary: cfg.Vocabulary, cfg: cfg, log: cfg.Logger,
		prefill: slices.Clone(cfg.Prefill), decode: slices.Clone(cfg.Decode),
		calls: make(map[request.Owner]*call), load: make(map[transfer.Peer]int), pages: make(map[transfer.Peer]int),
		down: make(map[transfer.Peer]time.Time), unacked: make(map[abortKey]map[transfer.Peer]bool), affinity: make(map[[32]byte]transfer.Peer), fails: make(map[string]uint64),
		done: make(chan struct{}),
	}, nil
}

// Stats returns the router's counters.
func (rt *Router) Stats() RouterStats {
	rt.mu.Lock()
	f := make(map[string]uint64, len(rt.fails))
	for k, v := range rt.fails {
		f[k] = v
	}
	rt.mu.Unlock()
	return RouterStats{Submitted: rt.submitted.Load(), Committed: rt.committed.Load(), Succeeded: rt.succeeded.Load(),
		Failed: rt.failed.Load(), Refused: rt.refused.Load(), HandoffFailures: f}
}

// call is one request in flight through the cluster.
type call struct {
	rt      *Router
	owner   request.Owner
	params  request.Params
	epoch   uint64
	decode  transfer.Peer
	prefill transfer.Peer
	tried   map[transfer.Peer]bool // decode nodes tried
	// avoidDecode is the decode node an audit re-score should not run on
	// (the one that generated the answer), if another can take it.
	avoidDecode transfer.Peer
	// prefillTried are the prefill nodes that refused or failed c's
	// prompt (retryPrefill). Guarded by rt.mu.
	prefillTried map[transfer.Peer]bool
	pages        int // worst-case KV pages, charged to the decode node
	cached       int // prompt tokens the prefill node's prefix cache served
	// prefilled: the prefill node's Result for this epoch arrived (cached
	// holds its count). held is a successful answer from the decode node
	// that came first and waits for it (UsageWait). Guarded by rt.mu.
	prefilled bool
	held      *request.Result

	// Tokens wait in buf until the pump hands them to the tokens channel:
	// the router's loop never blocks on a slow client (buf is bounded by
	// max_tokens, which the decode node enforces).
	tokens chan request.Token
	buf    []request.Token // guarded by rt.mu
	notify chan struct{}

	// Guarded by rt.mu.
	ref       transfer.Ref // with the decode node's reservation id, once granted
	granted   bool
	committed bool
	next      int // index of the next token expected
	ended     bool
	res       request.Result
	doneCh    chan struct{}
	abortOnce sync.Once
	aborting  bool // an abort was sent: a grant that arrives now is given back
}

func (c *call) Tokens() <-chan request.Token { return c.tokens }

func (c *call) Result() request.Result {
	<-c.doneCh
	return c.res
}

// Submit sends p to a decode node for a reservation; the rest happens as
// answers arrive (Run).
func (rt *Router) Submit(ctx context.Context, p request.Params) (gateway.Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if p.Owner.ID.IsZero() {
		p.Owner.ID = request.NewID()
	}
	c := &call{rt: rt, owner: p.Owner, params: p, tokens: make(chan request.Token, 16), notify: make(chan struct{}, 1), doneCh: make(chan struct{})}
	rt.mu.Lock()
	if rt.stopped {
		rt.mu.Unlock()
		return nil, request.ErrShuttingDown
	}
	if _, dup := rt.calls[p.Owner]; dup {
		rt.mu.Unlock()
		return nil, fmt.Errorf("%w: duplicate request id", request.ErrInternal)
	}
	var avoid map[transfer.Peer]bool
	if orig, ok := gateway.ReplayOf(ctx); ok {
		avoid, c.avoidDecode = rt.elsewhere(orig)
	}
	c.prefill = rt.pickPrefill(p, avoid)
	if c.prefill == "" {
		rt.mu.Unlock()
		return nil, fmt.Errorf("%w: no prefill node in the cluster", request.ErrOverloaded)
	}
	rt.calls[p.Owner] = c
	rt.load[c.prefill]++
	rt.sent(c.prefill, 0)
	c.pages = request.MaxKVPages(len(p.Prompt), p.MaxTokens, rt.Limits().PageSize)
	c.tried = map[transfer.Peer]bool{}
	rt.mu.Unlock()
	rt.submitted.Add(1)
	if err := rt.reserve(c); err != nil {
		rt.end(c, request.Result{Owner: p.Owner, Reason: request.FinishError, Err: err})
		return nil, err
	}
	context.AfterFunc(ctx, func() { rt.abort(c, request.ErrAborted) })
	go c.pump(ctx)
	return c, nil
}

// pump moves tokens from buf to the tokens channel, and closes it once the
// call ended and every token went out, or when the caller's context ends
// (it stopped reading).
func (c *call) pump(ctx context.Context) {
	defer close(c.tokens)
	for {
		c.rt.mu.Lock()
		batch := c.buf
		c.buf = nil
		ended := c.ended
		c.rt.mu.Unlock()
		for _, t := range batch {
			select {
			case c.tokens <- t:
			case <-ctx.Done():
				return
			}
		}
		if ended && len(batch) == 0 {
			return
		}
		if len(batch) == 0 {
			select {
			case <-c.notify:
			case <-ctx.Done():
				return
			}
		}
	}
}

func (c *call) wake() {
	select {
	case c.notify <- struct{}{}:
	default:
	}
}

// affinitySlack is how many more requests in flight than the least
// loaded node a prefill node may have and still be preferred for holding
// the prompt's prefix.
const affinitySlack = 2

// maxAffinity bounds the affinity table; past it the table starts over.
const maxAffinity = 1 << 16

// prefixKey names a tenant's prompt prefix: the first page of tokens under
// the tenant and its cache salt (the same scope as the nodes' prefix
// cache, so one tenant's prompts never steer another's). ok is false for
// prompts shorter than two pages' worth: nothing to share.
func prefixKey(p request.Params, pageSize int) (k [32]byte, ok bool) {
	if pageSize <= 0 || len(p.Prompt) <= pageSize {
		return k, false
	}
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s|%d:%s|", len(p.Owner.Tenant), p.Owner.Tenant, len(p.CacheSalt), p.CacheSalt)
	var b [4]byte
	for _, t := range p.Prompt[:pageSize] {
		binary.BigEndian.PutUint32(b[:], uint32(t))
		h.Write(b[:])
	}
	h.Sum(k[:0])
	return k, true
}

// pickPrefill chooses p's prefill node among those in rotation: the one
// that last computed p's prefix if it is not much busier than the rest,
// else the least busy (Router.work: its own account of its queue, and this
// router's requests in flight); any node when none is in rotation (it may
// have come back), none when there is no prefill node. Called with rt.mu
// held.
func (rt *Router) pickPrefill(p request.Params, skip map[transfer.Peer]bool) transfer.Peer {
	now := time.Now()
	var best transfer.Peer
	bestWork := 0
	for _, n := range rt.prefill {
		if skip[n] || rt.isDown(n) || rt.silent(n, now) {
			continue
		}
		if w := rt.work(n, rt.load[n]); best == "" || w < bestWork {
			best, bestWork = n, w
		}
	}
	if best == "" {
		i := slices.IndexFunc(rt.prefill, func(n transfer.Peer) bool { return !skip[n] })
		if i < 0 {
			return ""
		}
		best = rt.prefill[i]
	}
	key, ok := prefixKey(p, rt.Limits().PageSize)
	if !ok {
		return best
	}
	if n, hit := rt.affinity[key]; hit && !skip[n] && !rt.isDown(n) && !rt.silent(n, now) && slices.Contains(rt.prefill, n) && rt.work(n, rt.load[n]) <= bestWork+affinitySlack {
		best = n
	}
	if len(rt.affinity) >= maxAffinity {
		clear(rt.affinity)
	}
	rt.affinity[key] = best
	return best
}

// pickDecode chooses c's decode node among those not yet tried for c:
// first among the nodes in rotation that have room for the whole request
// (prompt and max_tokens) by their last answer, or have not answered yet
// (a node that just joined gets work at once), the least busy, then the
// one with the most room (a node that has not answered counts as roomy:
// it refuses a reservation it cannot hold, and the next is tried), then
// the one with the fewest pages promised by this router; then any other
// untried node, in rotation first (too little room by its last answer),
// then silent or down ones (they may have come back). Called with rt.mu
// held.
func (rt *Router) pickDecode(c *call) (transfer.Peer, bool) {
	now := time.Now()
	var best transfer.Peer
	var bestWork, bestRoom int
	for _, n := range rt.decode {
		if c.tried[n] || rt.isDown(n) || rt.silent(n, now) || n == c.avoidDecode {
			continue
		}
		room, known := rt.room(n)
		if !known {
			room = math.MaxInt
		} else if room < c.pages {
			continue
		}
		w := rt.work(n, rt.sentSince(n))
		if best == "" || w < bestWork || (w == bestWork && (room > bestRoom || (room == bestRoom && rt.pages[n] < rt.pages[best]))) {
			best, bestWork, bestRoom = n, w, room
		}
	}
	if best != "" {
		return best, true
	}
	for _, pass := range []bool{false, true} { // in rotation first, then any untried
		for _, n := range rt.decode {
			if c.tried[n] || (!pass && (rt.isDown(n) || rt.silent(n, now))) {
				continue
			}
			if best == "" || rt.pages[n] < rt.pages[best] {
				best = n
			}
		}
		if best != "" {
			return best, true
		}
	}
	return "", false
}

// isDown reports whether node is out of rotation. Called with rt.mu held.
func (rt *Router) isDown(node transfer.Peer) bool {
	until, ok := rt.down[node]
	if ok && time.Now().After(until) {
		delete(rt.down, node)
		return false
	}
	return ok
}

// markDown takes node out of rotation for DownFor.
func (rt *Router) markDown(node transfer.Peer) {
	rt.mu.Lock()
	rt.down[node] = time.Now().Add(rt.cfg.DownFor)
	rt.mu.Unlock()
}

// sendTimeout bounds a control message's wait for a slow link. It is not
// the client's context: a client that leaves must not tear down a link
// that other requests share (its request is aborted instead).
const sendTimeout = 10 * time.Second

// reserve sends the request to the next decode node (a new epoch per try).
func (rt *Router) reserve(c *call) error {
	rt.mu.Lock()
	if c.decode != "" {
		rt.pages[c.decode] -= c.pages
	}
	d, ok := rt.pickDecode(c)
	if !ok {
		c.decode = ""
		rt.mu.Unlock()
		return fmt.Errorf("%w: every decode node refused or is down", request.ErrOverloaded)
	}
	c.decode = d
	c.tried[d] = true
	rt.pages[d] += c.pages
	rt.sent(d, c.pages)
	c.epoch++
	c.ref = transfer.Ref{Owner: c.owner, Epoch: c.epoch}
	c.prefilled, c.cached = false, 0
	rt.mu.Unlock()
	job := transfer.JobOf(c.params)
	m := &transfer.Generate{Reserve: transfer.Reserve{Owner: c.owner, Epoch: c.epoch, PromptTokens: len(job.Prompt), MaxNewTokens: job.MaxTokens, Sender: c.prefill}, Job: job}
	ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
	defer cancel()
	if err := rt.cfg.Transport.Send(ctx, c.decode, m); err != nil {
		rt.markDown(c.decode)
		if err := rt.reserve(c); err == nil {
			return nil
		}
		return fmt.Errorf("%w: decode node %s: %v", request.ErrOverloaded, c.decode, err)
	}
	return nil
}

// Abort ends tenant's request id.
func (rt *Router) Abort(tenant request.Tenant, id request.ID) error {
	rt.mu.Lock()
	c := rt.calls[request.Owner{Tenant: tenant, ID: id}]
	rt.mu.Unlock()
	if c == nil {
		return request.ErrNotFound
	}
	rt.abort(c, request.ErrAborted)
	return nil
}

// abort tells the nodes holding state for c to end it, and ends c here if
// the decode node's result does not come in time.
func (rt *Router) abort(c *call, cause error) {
	c.abortOnce.Do(func() {
		rt.mu.Lock()
		if c.ended {
			rt.mu.Unlock()
			return
		}
		if c.held != nil {
			// Answered: no node holds anything for it any more.
			rt.mu.Unlock()
			rt.end(c, request.Result{Reason: request.FinishAbort, Err: cause})
			return
		}
		c.aborting = true
		ref, granted, decode, prefill := c.ref, c.granted, c.decode, c.prefill
		rt.mu.Unlock()
		ab := &transfer.Abort{Ref: ref, Reason: transfer.ReasonAborted}
		parties := []transfer.Peer{decode}
		if granted {
			parties = append(parties, prefill)
		}
		rt.sendAbort(ab, parties)
		go func() {
			t := time.NewTimer(rt.cfg.AbortWait)
			defer t.Stop()
			select {
			case <-c.doneCh:
			case <-t.C:
				rt.end(c, request.Result{Owner: c.owner, Reason: request.FinishAbort, Err: cause})
			}
		}()
	})
}

// abortKey names one attempt of a request.
type abortKey struct {
	owner request.Owner
	epoch uint64
}

// sendAbort sends ab to every party, and again every AbortRetry to those
// that have not acknowledged it (AbortAck), for at most AbortTTL.
func (rt *Router) sendAbort(ab *transfer.Abort, parties []transfer.Peer) {
	key := abortKey{ab.Owner, ab.Epoch}
	waiting := make(map[transfer.Peer]bool, len(parties))
	for _, p := range parties {
		waiting[p] = true
	}
	rt.mu.Lock()
	rt.unacked[key] = waiting
	rt.mu.Unlock()
	send := func() bool {
		rt.mu.Lock()
		var to []transfer.Peer
		for p := range rt.unacked[key] {
			to = append(to, p)
		}
		rt.mu.Unlock()
		// sendTimeout, not AbortRetry: a send abandoned while the link
		// takes the frame closes the link, which every request on that
		// node shares.
		ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
		defer cancel()
		for _, p := range to {
			_ = rt.cfg.Transport.Send(ctx, p, ab)
		}
		return len(to) > 0
	}
	send()
	go func() {
		defer func() {
			rt.mu.Lock()
			delete(rt.unacked, key)
			rt.mu.Unlock()
		}()
		tick := time.NewTicker(rt.cfg.AbortRetry)
		defer tick.Stop()
		give := time.NewTimer(rt.cfg.AbortTTL)
		defer give.Stop()
		for {
			select {
			case <-tick.C:
				if !send() {
					return
				}
			case <-give.C:
				return
			case <-rt.done:
				return
			}
		}
	}()
}

// acked records a node's AbortAck.
func (rt *Router) acked(from transfer.Peer, ref transfer.Ref) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	key := abortKey{ref.Owner, ref.Epoch}
	if w := rt.unacked[key]; w != nil {
		delete(w, from)
		if len(w) == 0 {
			delete(rt.unacked, key)
		}
	}
}

// end records c's single result and closes its stream.
func (rt *Router) end(c *call, res request.Result) {
	rt.mu.Lock()
	if c.ended {
		rt.mu.Unlock()
		return
	}
	c.ended = true
	if c.held != nil && !res.Reason.Success() {
		// The answer is whole and waited only for the prefill node's
		// account of the prompt: whatever ends it now (its node went
		// down, shutdown) ends it as it is, as it would have ended had
		// the account come first.
		res = *c.held
	}
	res.Owner = c.owner
	if res.Usage.PromptTokens == 0 {
		res.Usage.PromptTokens = len(c.params.Prompt)
	}
	c.res = res
	delete(rt.calls, c.owner)
	rt.served.note(c.owner, c.prefill, c.decode)
	rt.load[c.prefill]--
	if c.decode != "" {
		rt.pages[c.decode] -= c.pages
	}
	rt.mu.Unlock()
	if res.Reason.Success() {
		rt.succeeded.Add(1)
	} else {
		rt.failed.Add(1)
	}
	close(c.doneCh)
	c.wake()
}

// Run routes what the nodes send to the requests it concerns, until ctx
// ends; then it ends every request still in flight.
func (rt *Router) Run(ctx context.Context) error {
	defer close(rt.done)
	inbox := rt.cfg.Transport.Inbox()
	pctx, stopPoll := context.WithCancel(ctx)
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		rt.poll(pctx)
	}()
	defer func() { stopPoll(); <-polled }()
	for {
		select {
		case <-ctx.Done():
			rt.shutdown()
			return nil
		case in, ok := <-inbox:
			if !ok {
				rt.shutdown()
				return nil
			}
			rt.inbound(ctx, in)
		}
	}
}

func (rt *Router) shutdown() {
	rt.mu.Lock()
	rt.stopped = true
	calls := make([]*call, 0, len(rt.calls))
	for _, c := range rt.calls {
		calls = append(calls, c)
	}
	rt.mu.Unlock()
	for _, c := range calls {
		rt.end(c, request.Result{Reason: request.FinishAbort, Err: request.ErrShuttingDown})
	}
}

// prefillOf returns the call whose prefill node from is, if ref names it.
func (rt *Router) prefillOf(from transfer.Peer, ref transfer.Ref) *call {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	c := rt.calls[ref.Owner]
	if c == nil || c.ended || ref.Epoch != c.epoch || from != c.prefill || from == c.decode || ref.ID != c.ref.ID {
		return nil
	}
	return c
}

// owned returns the call a message names, checking that it came from the
// node the call uses for it.
func (rt *Router) owned(from transfer.Peer, ref transfer.Ref, fromDecode bool) *call {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	c := rt.calls[ref.Owner]
	if c == nil || c.ended || c.held != nil || ref.Epoch != c.epoch {
		// Ended, or answered and waiting only for the prefill node's
		// account (prefillOf): nothing more is taken for it.
		return nil
	}
	want := c.prefill
	if fromDecode {
		want = c.decode
	}
	if from != want {
		rt.refused.Add(1)
		rt.log.Warn("message from a node the request does not use", "from", from, "owner", ref.Owner, "want", want)
		return nil
	}
	if c.granted && !ref.ID.IsZero() && ref.ID != c.ref.ID {
		rt.refused.Add(1)
		rt.log.Warn("message for another reservation", "from", from, "ref", ref, "have", c.ref)
		return nil
	}
	return c
}

func (rt *Router) inbound(ctx context.Context, in link.Inbound) {
	from := in.From.Name
	if in.Down != nil {
		rt.peerDown(from, in.Down)
		return
	}
	switch m := in.Msg.(type) {
	case *transfer.Load:
		rt.loaded(from, m)
	case *transfer.Grant:
		c := rt.owned(from, m.Ref, true)
		if c == nil {
			// A grant for nothing this gateway still routes there (the
			// request ended, or moved on with a new epoch, and the abort
			// sent then may have been lost with a link): give the
			// reservation back now, not when its lease runs out.
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
				defer cancel()
				_ = rt.cfg.Transport.Send(ctx, from, &transfer.Abort{Ref: m.Ref, Reason: transfer.ReasonAborted})
			}()
			return
		}
		rt.mu.Lock()
		c.ref, c.granted = m.Ref, true
		aborting := c.aborting
		rt.mu.Unlock()
		if aborting {
			// The client left before the grant: nothing is computed for
			// it, and the reservation is given back now, not by lease.
			rt.sendAbort(&transfer.Abort{Ref: m.Ref, Reason: transfer.ReasonAborted}, []transfer.Peer{c.decode})
			return
		}
		job := transfer.JobOf(c.params)
		if err := rt.cfg.Transport.Send(ctx, c.prefill, &transfer.Prefill{Grant: *m, Decode: c.decode, Job: job}); err != nil {
			rt.markDown(c.prefill)
			rt.fail(c, fmt.Errorf("%w: prefill node %s: %v", request.ErrOverloaded, c.prefill, err), transfer.ReasonNone)
			_ = rt.cfg.Transport.Send(ctx, c.decode, &transfer.Abort{Ref: m.Ref, Reason: transfer.ReasonPrefillFailed})
		}
	case *transfer.Committed:
		if c := rt.owned(from, m.Ref, true); c != nil {
			rt.mu.Lock()
			c.committed = true
			rt.mu.Unlock()
			rt.committed.Add(1)
		}
	case *transfer.Tokens:
		c := rt.owned(from, m.Ref, true)
		if c == nil {
			return
		}
		// Logprobs exactly as asked: none when none were, top_logprobs
		// alternatives each when they were. More is a broken peer.
		lpErr := checkTokenLogprobs(m, c.params.Sampling)
		if lpErr == nil {
			lpErr = checkPromptLogprobs(m, c.params)
		}
		rt.mu.Lock()
		ok := c.committed && m.Start == c.next && !c.ended && lpErr == nil
		if ok {
			c.next += len(m.IDs)
			for i, id := range m.IDs {
				t := request.Token{Owner: c.owner, Index: m.Start + i, ID: id}
				if m.Logprobs != nil {
					t.Logprobs = m.Logprobs[i]
				}
				if i == 0 {
					t.Prompt = m.Prompt
				}
				c.buf = append(c.buf, t)
			}
		}
		rt.mu.Unlock()
		if !ok {
			// Tokens before the commit, out of order, or with logprobs
			// other than asked: never relayed.
			rt.refused.Add(1)
			rt.fail(c, fmt.Errorf("%w: tokens %d.. from %s (committed %v, logprobs: %v)", request.ErrInternal, m.Start, from, c.committed, lpErr), transfer.ReasonNone)
			rt.abort(c, request.ErrInternal)
			return
		}
		c.wake()
	case *transfer.Result:
		if c := rt.prefillOf(from, m.Ref); c != nil && m.Reason.Success() {
			// The prefill node's account of the prompt: how much of it
			// its prefix cache served. The request goes on at decode,
			// unless its answer came first and waits for this.
			rt.mu.Lock()
			c.cached, c.prefilled = m.Usage.CachedTokens, true
			held := c.held
			rt.mu.Unlock()
			if held != nil {
				res := *held
				res.Usage.CachedTokens = m.Usage.CachedTokens
				rt.end(c, res)
			}
			return
		}
		c := rt.owned(from, m.Ref, true)
		if c == nil {
			return
		}
		if !c.granted && m.Code == transfer.CodeOverloaded {
			// No room there now: try the next decode node.
			if err := rt.reserve(c); err == nil {
				return
			}
		}
		res := request.Result{Reason: m.Reason, Usage: m.Usage}
		if !m.Reason.Success() {
			res.Err = m.Code.Err()
			if m.Code == transfer.CodeHandoff {
				res.Err = fmt.Errorf("%w: handoff failed: %v", request.ErrInternal, m.Handoff)
				rt.countFailure(m.Handoff)
			}
		} else if !c.committed {
			// Success without a commit cannot be: never answer 200 for it.
			rt.refused.Add(1)
			res = request.Result{Reason: request.FinishError, Err: fmt.Errorf("%w: result before the handoff committed", request.ErrInternal)}
		}
		res.Usage.PromptTokens = len(c.params.Prompt)
		rt.mu.Lock()
		if res.Reason.Success() && !c.prefilled { // owned: not held yet
			// The prefill node's Result travels on another link and
			// may come after this: wait for it, a bounded time.
			held := res
			held.Usage.CachedTokens = 0 // unless the account comes
			c.held = &held
			rt.mu.Unlock()
			time.AfterFunc(rt.cfg.UsageWait, func() { rt.end(c, held) })
			return
		}
		res.Usage.CachedTokens = c.cached
		rt.mu.Unlock()
		rt.end(c, res)
	case *transfer.Abort:
		_ = rt.cfg.Transport.Send(ctx, from, &transfer.AbortAck{Ref: m.Ref, Drained: true})
		rt.mu.Lock()
		c := rt.calls[m.Owner]
		answered := c != nil && c.held != nil
		rt.mu.Unlock()
		if c == nil || answered || (from != c.decode && from != c.prefill) || m.Epoch != c.epoch {
			return
		}
		// Only a prefill node refuses or fails a prompt; the decode node
		// passes its Abort on, over another link, and that copy can come
		// first: either one moves the prompt (the other is then of an
		// old epoch).
		refused := m.Reason == transfer.ReasonPrefillFailed || m.Reason == transfer.ReasonOverloaded
		if refused && (from == c.prefill || from == c.decode) && rt.retryPrefill(c, c.prefill) {
			return
		}
		if from == c.prefill {
			// A prefill node that refused the prompt at the start told
			// only this gateway: the decode node's reservation is given
			// back now, not when its lease runs out (an abort it already
			// had is acknowledged all the same).
			rt.mu.Lock()
			granted, decode := c.granted, c.decode
			rt.mu.Unlock()
			if granted && decode != "" {
				rt.sendAbort(&transfer.Abort{Ref: m.Ref, Reason: m.Reason}, []transfer.Peer{decode})
			}
		}
		rt.countFailure(m.Reason)
		cause := request.ErrInternal
		if m.Reason == transfer.ReasonOverloaded {
			cause = request.ErrOverloaded // no room in time: retry later, a 503
		}
		rt.fail(c, fmt.Errorf("%w: handoff aborted by %s: %v", cause, from, m.Reason), m.Reason)
	case *transfer.AbortAck:
		rt.acked(from, m.Ref)
	default:
		rt.log.Warn("unexpected message at the gateway", "from", from, "type", in.Msg.Type())
	}
}

// retryPrefill moves c to another prefill node after its prefill node
// refused or failed the prompt before the handoff committed (a node that
// drains refuses new prompts). A reservation takes pages from the sender
// it names only, so c cannot keep it: the decode node's reservation is
// aborted, and c is reserved again with a new epoch, on a decode node not
// yet tried, naming the new prefill node (late pages of the old one are
// refused by epoch). It reports false, and changes nothing, when no other
// prefill node is left to try or c is past the point of moving; the
// caller then fails c.
func (rt *Router) retryPrefill(c *call, from transfer.Peer) bool {
	rt.mu.Lock()
	if c.ended || c.committed || c.aborting || !c.granted || from != c.prefill {
		rt.mu.Unlock()
		return false
	}
	skip := maps.Clone(c.prefillTried)
	if skip == nil {
		skip = map[transfer.Peer]bool{}
	}
	skip[from] = true
	next := rt.pickPrefill(c.params, skip)
	if next == "" {
		rt.mu.Unlock()
		return false
	}
	c.prefillTried = skip
	old, decode := c.ref, c.decode
	rt.load[from]--
	rt.load[next]++
	rt.sent(next, 0)
	c.prefill, c.granted = next, false
	rt.mu.Unlock()
	rt.log.Info("prefill node refused a prompt; moving it", "from", from, "to", next, "owner", c.owner)
	rt.sendAbort(&transfer.Abort{Ref: old, Reason: transfer.ReasonPrefillFailed}, []transfer.Peer{decode})
	if err := rt.reserve(c); err != nil {
		rt.fail(c, fmt.Errorf("prefill node %s refused the prompt, and moving it failed: %w", from, err), transfer.ReasonPrefillFailed)
	}
	return true
}

// fail ends c with an error (the decode node's result, if it still comes,
// is ignored).
func (rt *Router) fail(c *call, err error, reason transfer.Reason) {
	if errors.Is(err, request.ErrAborted) || reason == transfer.ReasonAborted {
		rt.end(c, request.Result{Reason: request.FinishAbort, Err: fmt.Errorf("%w: %w", request.ErrAborted, err)})
		return
	}
	rt.end(c, request.Result{Reason: request.FinishError, Err: err})
}

func (rt *Router) countFailure(r transfer.Reason) {
	rt.mu.Lock()
	rt.fails[r.String()]++
	rt.mu.Unlock()
}

// SetNodes replaces the prefill and decode nodes requests are sent
// through (cluster membership); safe to call while requests are
// submitted. A node that left takes no new request from now on, and the
// requests that depend on it end with an error at once, as when its link
// goes down: the cluster holds it gone, and a node that lost its
// membership stops serving (package cluster), so nothing it would still
// send could be trusted to arrive. A node that (re)joins is in rotation
// at once.
func (rt *Router) SetNodes(prefill, decode []transfer.Peer) {
	rt.mu.Lock()
	var gone []transfer.Peer
	for _, n := range rt.prefill {
		if !slices.Contains(prefill, n) && !slices.Contains(decode, n) {
			gone = append(gone, n)
		}
	}
	for _, n := range rt.decode {
		if !slices.Contains(prefill, n) && !slices.Contains(decode, n) {
			gone = append(gone, n)
		}
	}
	for _, n := range slices.Concat(prefill, decode) {
		if !slices.Contains(rt.prefill, n) && !slices.Contains(rt.decode, n) {
			delete(rt.down, n) // a new process: give it its chance
		}
	}
	rt.prefill, rt.decode = slices.Clone(prefill), slices.Clone(decode)
	for n, l := range rt.load {
		if l == 0 && !slices.Contains(prefill, n) {
			delete(rt.load, n)
		}
	}
	for n, p := range rt.pages {
		if p == 0 && !slices.Contains(decode, n) {
			delete(rt.pages, n)
		}
	}
	for n := range rt.loads {
		if !slices.Contains(prefill, n) && !slices.Contains(decode, n) {
			delete(rt.loads, n)
		}
	}
	rt.mu.Unlock()
	for _, n := range gone {
		rt.log.Info("node left the cluster", "node", n)
		rt.failDependents(n, errLeft)
	}
}

// errLeft is why requests end when their node leaves the cluster.
var errLeft = errors.New("it left the cluster")

// Nodes returns the prefill and decode nodes in the cluster now.
func (rt *Router) Nodes() (prefill, decode []transfer.Peer) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return slices.Clone(rt.prefill), slices.Clone(rt.decode)
}

// peerDown takes node out of rotation for a while and ends every request
// that depends on it.
func (rt *Router) peerDown(node transfer.Peer, cause error) {
	rt.markDown(node)
	rt.failDependents(node, cause)
}

// failDependents ends every request that depends on node: all of a decode
// node's, and a prefill node's that have not committed.
func (rt *Router) failDependents(node transfer.Peer, cause error) {
	rt.mu.Lock()
	var hit, answered []*call
	for _, c := range rt.calls {
		switch {
		case c.held != nil && (c.decode == node || c.prefill == node):
			// Answered; its account will not come now, or need not.
			answered = append(answered, c)
		case c.decode == node || (c.prefill == node && !c.committed):
			hit = append(hit, c)
		}
	}
	rt.mu.Unlock()
	for _, c := range answered {
		rt.end(c, request.Result{Reason: request.FinishError, Err: cause})
	}
	if len(hit) > 0 {
		rt.log.Warn("node down; failing its requests", "node", node, "requests", len(hit), "err", cause)
	}
	for _, c := range hit {
		rt.fail(c, fmt.Errorf("%w: node %s went down: %v", request.ErrNodeFailed, node, cause), transfer.ReasonNone)
		if c.prefill == node && c.decode != node {
			// The decode node still holds a reservation for it.
			_ = rt.cfg.Transport.Send(context.Background(), c.decode, &transfer.Abort{Ref: c.ref, Reason: transfer.ReasonPrefillFailed})
		} else if errors.Is(cause, errLeft) {
			// A decode node that left may still be running, cut off
			// from the cluster only, until it sees its session lost:
			// tell it (it frees the pages at once). Where its link is
			// gone too, this fails at once (link.GRPC.RemovePeer).
			ctx, cancel := context.WithTimeout(context.Background(), sendTimeout)
			_ = rt.cfg.Transport.Send(ctx, c.decode, &transfer.Abort{Ref: c.ref, Reason: transfer.ReasonAborted})
			cancel()
		}
	}
}

// checkPromptLogprobs checks that a Tokens message carries the prompt
// logprobs its request asked for: with the first token (start 0) only,
// one per prompt token after the first, each with exactly
// PromptTopLogprobs alternatives; none for a request that asked none.
func checkPromptLogprobs(m *transfer.Tokens, p request.Params) error {
	s := p.Sampling
	if !s.PromptLogprobs || m.Start != 0 {
		if m.Prompt != nil {
			return fmt.Errorf("prompt logprobs sent with tokens from %d (asked: %v)", m.Start, s.PromptLogprobs)
		}
		return nil
	}
	if want := max(len(p.Prompt)-1, 0); len(m.Prompt) != want {
		return fmt.Errorf("%d prompt logprobs for %d prompt tokens", len(m.Prompt), len(p.Prompt))
	}
	for i := range m.Prompt {
		if err := m.Prompt[i].Check(s.PromptTopLogprobs, 0); err != nil {
			return fmt.Errorf("prompt token %d: %w", i+1, err)
		}
	}
	return nil
}

// checkTokenLogprobs checks that a Tokens message carries the logprobs its
// request asked for: one per token with exactly TopLogprobs alternatives,
// or none at all.
func checkTokenLogprobs(m *transfer.Tokens, s request.Sampling) error {
	if !s.Logprobs {
		if m.Logprobs != nil {
			return errors.New("logprobs sent for a request that asked for none")
		}
		return nil
	}
	if len(m.Logprobs) != len(m.IDs) {
		return fmt.Errorf("%d logprobs for %d tokens", len(m.Logprobs), len(m.IDs))
	}
	for i, lp := range m.Logprobs {
		if lp == nil {
			return fmt.Errorf("token %d without logprobs", m.Start+i)
		}
		if err := lp.Check(s.TopLogprobs, 0); err != nil {
			return fmt.Errorf("token %d: %w", m.Start+i, err)
		}
	}
	return nil
}
