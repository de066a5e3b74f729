package sched

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// Errors of the core that are not request outcomes.
var (
	// ErrDuplicate: a request with the same owner is already known.
	ErrDuplicate = errors.New("sched: duplicate request id")
	// ErrBatch: Advance was given something other than the batch in
	// flight.
	ErrBatch = errors.New("sched: advance does not match the batch in flight")
	// ErrConfig: the core's configuration is unusable.
	ErrConfig = errors.New("sched: invalid configuration")
)

// ErrPoolDegraded is a request outcome: the request needs more KV pages
// than the pool holds once the pages quarantined after isolation
// violations are set aside, so it could never run now. It wraps
// request.ErrOverloaded (a 503 to retry later): the operator's
// ScrubQuarantined, or the reaper, brings the pages back.
var ErrPoolDegraded = fmt.Errorf("sched: quarantined KV pages leave too few for the request: %w", request.ErrOverloaded)

// Config configures a Core. Zero values take the defaults noted.
type Config struct {
	Limits Limits        // required, from ComputeLimits
	Pool   *kvcache.Pool // required; the core is its only driver
	// MaxBatchTokens is the token budget of one step: decode tokens
	// first, then prefill chunks (default 512).
	MaxBatchTokens int
	// MaxRunning caps sequences running at once over all tenants
	// (default 256).
	MaxRunning int
	// MaxQueued caps waiting requests over all tenants (default 4096) and
	// MaxQueuedPerTenant each tenant's (default 256).
	MaxQueued          int
	MaxQueuedPerTenant int
	// MaxQueueWait rejects a request (request.ErrOverloaded) that waited
	// longer than this for its first step; 0 waits forever. Preempted
	// requests are never timed out this way: they already ran.
	MaxQueueWait time.Duration
	// WatermarkPages are kept free for running sequences to grow into
	// when starting new ones (default UsablePages/100, at least 1), so
	// that admitting does not immediately force preemption. Negative
	// means none.
	WatermarkPages int
	// EndTokens end generation for every request (the model's
	// end-of-generation tokens) but those with Params.IgnoreEOS, besides
	// each request's StopTokens.
	EndTokens []int
	// PrefixCache serves prompt pages a tenant computed before from the
	// pool's tenant-scoped prefix cache and publishes new ones.
	PrefixCache bool
	// Policy gives each tenant's share; nil gives everyone the zero
	// policy. It is called when a tenant becomes active and, for every
	// active tenant, by UpdatePolicies; between two UpdatePolicies it must
	// return the same answers (the core is deterministic).
	Policy func(request.Tenant) TenantPolicy
	// Window, when positive, is the attention window of a model whose
	// every layer attends only to the last Window positions (mistral,
	// phi3: model.Config.EveryLayerWindow). After each step a running
	// sequence gives back the pages wholly behind it
	// (kvcache.Pool.DropBefore), so that a long generation holds at most
	// ceil(Window/PageSize)+1 pages (plus a prefill chunk's) and its tenant
	// is charged only those. A prefill-only request keeps its pages: the
	// handoff sends the whole prompt, and the decode node gives them back
	// after its first step. Admission does not count on it: the quota and
	// capacity checks (and ComputeLimits) still size a request at its full
	// prompt + max_tokens, since a sequence holds all of its prompt's
	// cached pages, or a whole prefill chunk, before its first drop; the
	// pages given back only leave more room to run others and fewer
	// preemptions. 0 keeps every page.
	Window int
	// QuarantineReapAfter scrubs and frees, on Tick, pages that have been
	// quarantined (after an isolation violation) for at least this long,
	// as the core's clock (Tick) measures it from when it first saw them
	// there. 0 never reaps: only the operator's ScrubQuarantined frees
	// them.
	QuarantineReapAfter time.Duration
}

func (c *Config) withDefaults() {
	if c.MaxBatchTokens == 0 {
		c.MaxBatchTokens = 512
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = 256
	}
	if c.MaxQueued == 0 {
		c.MaxQueued = 4096
	}
	if c.MaxQueuedPerTenant == 0 {
		c.MaxQueuedPerTenant = 256
	}
	switch {
	case c.WatermarkPages == 0:
		c.WatermarkPages = max(1, c.Limits.UsablePages/100)
	case c.WatermarkPages < 0:
		c.WatermarkPages = 0
	}
}

// Validate reports whether the configuration is usable.
func (c *Config) Validate() error {
	switch {
	case c.Pool == nil:
		return fmt.Errorf("%w: no KV pool", ErrConfig)
	case c.Limits.MaxContext <= 0:
		return fmt.Errorf("%w: limits not computed", ErrConfig)
	case c.Limits.PageSize != c.Pool.Layout().PageSize || c.Limits.TotalPages != c.Pool.TotalPages():
		return fmt.Errorf("%w: limits were computed for %d pages of %d tokens, the pool has %d of %d",
			ErrConfig, c.Limits.TotalPages, c.Limits.PageSize, c.Pool.TotalPages(), c.Pool.Layout().PageSize)
	case c.MaxBatchTokens < 1 || c.MaxRunning < 1 || c.MaxQueued < 0 || c.MaxQueuedPerTenant < 0 || c.MaxQueueWait < 0:
		return fmt.Errorf("%w: batch tokens %d, running %d, queued %d/%d per tenant, watermark %d, queue wait %v",
			ErrConfig, c.MaxBatchTokens, c.MaxRunning, c.MaxQueued, c.MaxQueuedPerTenant, c.WatermarkPages, c.MaxQueueWait)
	case c.QuarantineReapAfter < 0:
		return fmt.Errorf("%w: quarantine reap delay %v", ErrConfig, c.QuarantineReapAfter)
	case c.Window < 0:
		return fmt.Errorf("%w: attention window %d", ErrConfig, c.Window)
	}
	return nil
}

// req is the core's record of one request. Its state lives in life and
// nowhere else.
type req struct {
	owner  request.Owner
	adm    Admitted
	params *request.Params // the admitted copy, read-only
	life   Lifecycle
	tenant *tenant
	prio   [2]int // tenant priority, request priority

	tokens    []int // prompt, then every emitted token
	generated int   // tokens sampled, a final stop token included
	computed  int   // positions whose KV is written (== seq.Len())
	seq       *kvcache.Sequence
	pages     int // pages charged to the tenant (seq.HeldPages())

	order       uint64 // arrival number: FIFO and the last tie-break
	started     uint64 // step in which it last started running
	scheduled   uint64 // step in which it was last put in a batch
	enqueued    time.Time
	inFlight    bool
	queued      bool
	preemptions int
	cached      int  // prompt positions served by the prefix cache
	delivered   bool // its Result was handed out by Ready
	// promptLP are the prompt's log-probabilities computed so far
	// (Sampling.PromptLogprobs): entry i is prompt token i+1's, so
	// len(promptLP) == min(computed, len(prompt)-1) between steps until
	// the first token carries them out.
	promptLP []request.Logprobs

	// prefillOnly: SubmitPrefill; the request ends with an Export after
	// its first token. awaitingImport: Reserve; its prompt's pages come
	// from another node and it must not be scheduled or preempted until
	// CommitImport. imported: its prompt came from another node.
	prefillOnly, awaitingImport, imported bool
}

// Stats are the core's counters and gauges.
type Stats struct {
	Queued, Running int
	Steps           uint64
	Submitted       uint64
	Rejected        uint64 // at submission (quota, overload) or queue timeout
	Finished        uint64
	Aborted         uint64
	Preemptions     uint64
	// AbortedButCompleted counts requests that reached Finished after an
	// abort; the state machine makes it impossible, and it must stay 0.
	AbortedButCompleted uint64
	// OwnerMismatches counts outcomes whose echoed owner was not the
	// request they would have been delivered to; must stay 0.
	OwnerMismatches uint64
	// Reaped counts quarantined pages the reaper scrubbed and freed
	// (QuarantineReapAfter); Scrubbed those the operator's
	// ScrubQuarantined freed.
	Reaped, Scrubbed uint64
	// QueueWait is how long requests waited in their queue before they
	// first ran.
	QueueWait QueueWait
}

// Core is the deterministic scheduler: request lifecycle, admission
// queues, continuous batching and preemption over one kvcache.Pool. It has
// no goroutines, no clock and no IO. Inputs are Submit, Abort, Shutdown,
// Tick and Advance; effects come out of Ready as data. One goroutine drives
// it (Node, or a simulation).
type Core struct {
	cfg  Config
	lim  Limits
	pool *kvcache.Pool
	now  time.Time

	reqs    map[request.Owner]*req
	tenants map[request.Tenant]*tenant // the current holder of each active id
	active  []*tenant                  // tenants with queued or running requests, in activation order
	running []*req
	queued  int
	// capsStale: UpdatePolicies may have lowered caps that running
	// sequences exceed; the next schedule preempts them back within.
	capsStale bool

	inflight     *Batch
	inflightReqs []*req
	step         uint64
	arrivals     uint64
	shutdown     bool

	out   Ready
	stats Stats

	order []*req // scratch for schedule

	mut mutants // bug re-introduction hooks: empty unless built with pw_mutants

	// The reaper's view of the pool's quarantine (reaper.go).
	quarantine  []quarantined // by page id
	qViolations uint64        // pool.Violations() at the last look
	qDirty      bool          // the core itself may have quarantined pages
}

// NewCore returns a core over cfg.Pool, which it then drives alone.
func NewCore(cfg Config) (*Core, error) {
	cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.EndTokens = slices.Clone(cfg.EndTokens)
	return &Core{
		cfg:     cfg,
		lim:     cfg.Limits,
		pool:    cfg.Pool,
		reqs:    make(map[request.Owner]*req),
		tenants: make(map[request.Tenant]*tenant),
	}, nil
}

// Limits is the one set of limits the core admits against.
func (c *Core) Limits() Limits { return c.lim }

// Stats returns the counters and gauges.
func (c *Core) Stats() Stats {
	s := c.stats
	s.Queued, s.Running = c.queued, len(c.running)
	return s
}

// Idle reports whether the core holds no request at all (nothing queued,
// running, in flight or waiting to be delivered).
func (c *Core) Idle() bool { return len(c.reqs) == 0 && c.inflight == nil && c.out.Empty() }

// State returns the lifecycle state of a request the core still knows.
func (c *Core) State(o request.Owner) (State, bool) {
	r, ok := c.reqs[o]
	if !ok {
		return 0, false
	}
	return r.life.State(), true
}

// Tick sets the time. Quarantined pages older than QuarantineReapAfter
// are scrubbed and freed, and requests that waited longer than
// MaxQueueWait for their first step are rejected with
// request.ErrOverloaded.
func (c *Core) Tick(now time.Time) {
	c.now = now
	c.watchQuarantine()
	c.reap()
	if c.cfg.MaxQueueWait <= 0 {
		return
	}
	for _, t := range slices.Clone(c.active) {
		for i := 0; i < len(t.queue); {
			r := t.queue[i]
			if r.preemptions > 0 || now.Sub(r.enqueued) <= c.cfg.MaxQueueWait {
				i++
				continue
			}
			c.unqueue(r)
			c.end(r, func(l *Lifecycle) error {
				return l.Reject(fmt.Errorf("%w: waited %v for KV pages", request.ErrOverloaded, now.Sub(r.enqueued)))
			})
		}
	}
}

// Submit offers an admitted request to its tenant's queue. It fails, with
// nothing recorded and no page touched, when the core shuts down
// (request.ErrShuttingDown), the request was admitted under other limits
// (ErrLimitsMismatch), its owner is already known (ErrDuplicate), it could
// never fit the tenant's page cap (request.ErrQuota) or, with no reaper, the
// pool less its quarantined pages (ErrPoolDegraded), or the queues are full
// (request.ErrOverloaded).
func (c *Core) Submit(a Admitted) error {
	if _, err := c.accept(a); err != nil {
		return err
	}
	return c.enqueue(a, false)
}

// accept is Submit's checks and bookkeeping up to the queue: on success r
// is Admitted and known to the core, holding nothing.
func (c *Core) accept(a Admitted) (*req, error) {
	if !a.Valid() {
		return nil, ErrNotAdmitted
	}
	if a.a.limits != c.lim {
		return nil, ErrLimitsMismatch
	}
	if c.shutdown {
		return nil, request.ErrShuttingDown
	}
	p := &a.a.params
	c.watchQuarantine() // capacity is counted against the pool as it is now
	if _, dup := c.reqs[p.Owner]; dup {
		return nil, fmt.Errorf("%w: %v", ErrDuplicate, p.Owner)
	}
	r := &req{owner: p.Owner, adm: a, params: p}
	t := c.tenantFor(p.Owner.Tenant)
	cause := c.unfit(t, p)
	if c.waitsForReaper(cause) {
		cause = nil
	}
	switch {
	case cause != nil:
	case len(t.queue) >= cmp.Or(t.policy.MaxQueued, c.cfg.MaxQueuedPerTenant):
		cause = fmt.Errorf("%w: %d requests of this tenant are waiting", request.ErrOverloaded, len(t.queue))
	case c.queued >= c.cfg.MaxQueued:
		cause = fmt.Errorf("%w: %d requests are waiting", request.ErrOverloaded, c.queued)
	}
	if cause != nil {
		if err := r.life.Reject(cause); err != nil {
			return nil, invariants.Failf("sched: reject at submission: %v", err)
		}
		c.stats.Rejected++
		c.retire(t)
		return nil, cause
	}
	if err := r.life.Admit(); err != nil {
		return nil, invariants.Failf("sched: admit: %v", err)
	}
	c.arrivals++
	r.order, r.tenant, r.enqueued = c.arrivals, t, c.now
	r.prio = [2]int{t.policy.Priority, p.Priority}
	r.tokens = append(make([]int, 0, len(p.Prompt)+min(p.MaxTokens, 64)), p.Prompt...)
	c.reqs[r.owner] = r
	c.stats.Submitted++
	return r, nil
}

// enqueue puts an admitted request in its tenant's queue. The queue's only
// input is an Admitted value, and the request behind it must be in state
// Admitted holding no pages: anything else is a scheduler bug (the
// incident's re-queued placeholder), reported as a broken invariant.
func (c *Core) enqueue(a Admitted, front bool) error {
	r := c.reqs[a.Owner()]
	if r == nil || r.adm.a != a.a || r.life.State() != StateAdmitted || r.seq != nil || r.queued || r.inFlight {
		st := "unknown"
		if r != nil {
			st = r.life.State().String()
		}
		return invariants.Failf("sched: enqueue of %v in state %s (must be Admitted, holding no pages)", a.Owner(), st)
	}
	t := r.tenant
	if front {
		t.queue = slices.Insert(t.queue, 0, r)
	} else {
		t.queue = append(t.queue, r)
	}
	r.queued = true
	c.queued++
	return nil
}

func (c *Core) unqueue(r *req) {
	t := r.tenant
	if i := slices.Index(t.queue, r); i >= 0 {
		t.queue = slices.Delete(t.queue, i, i+1)
		r.queued = false
		c.queued--
	}
}

// Abort ends a request of owner's tenant on the client's behalf. It is
// idempotent: aborting a request that already ended (and whose result is
// not yet handed out) changes nothing and returns nil. A request the core
// does not know for that owner, including any request of another tenant,
// gives request.ErrNotFound.
func (c *Core) Abort(owner request.Owner) error {
	err := c.abort(owner, request.ErrAborted)
	c.watchQuarantine()
	return err
}

func (c *Core) abort(owner request.Owner, cause error) error {
	r, ok := c.reqs[owner]
	if !ok {
		return request.ErrNotFound
	}
	if r.life.State().Terminal() {
		return nil
	}
	if c.mutantAbort(r, cause) {
		return nil
	}
	c.unqueue(r)
	if errors.Is(cause, kvcache.ErrViolation) && !r.inFlight {
		// Pages first, with the cause, so that they are quarantined
		// rather than freed.
		c.noteQuarantine(cause)
		c.dropPages(r, cause)
	}
	c.end(r, func(l *Lifecycle) error { return l.Abort(cause) })
	return nil
}

// Shutdown aborts every request (request.ErrShuttingDown) and refuses new
// ones. Pages of requests in the batch in flight are released when that
// batch is advanced.
func (c *Core) Shutdown() {
	c.shutdown = true
	for _, t := range slices.Clone(c.active) {
		for _, r := range slices.Clone(t.queue) {
			_ = c.abort(r.owner, request.ErrShuttingDown)
		}
	}
	for _, r := range slices.Clone(c.running) {
		_ = c.abort(r.owner, request.ErrShuttingDown)
	}
}

// end moves r to a terminal state with move, records the result and gives
// back its pages (at once, or when its in-flight step is advanced).
func (c *Core) end(r *req, move func(*Lifecycle) error) {
	if err := move(&r.life); err != nil {
		_ = invariants.Failf("sched: ending %v: %v", r.owner, err)
		return
	}
	switch r.life.State() {
	case StateFinished:
		c.stats.Finished++
	case StateRejected:
		c.stats.Rejected++
	case StateAborted:
		c.stats.Aborted++
	}
	c.out.Results = append(c.out.Results, request.Result{
		Owner:  r.owner,
		Reason: r.life.Reason(),
		Err:    r.life.Err(),
		Usage: request.Usage{
			PromptTokens:     len(r.params.Prompt),
			CompletionTokens: r.generated,
			CachedTokens:     r.cached,
		},
	})
	if !r.inFlight {
		c.releasePages(r, nil)
	}
}

// releasePages gives r's pages back (dropPages), then forgets r's tenant
// and r itself when nothing else holds them.
func (c *Core) releasePages(r *req, cause error) {
	c.dropPages(r, cause)
	c.retire(r.tenant)
	c.forget(r)
}

// dropPages ends r's sequence (kvcache.Pool.Abort with cause when it is not
// nil, so that a violation quarantines) and takes r off the running list.
func (c *Core) dropPages(r *req, cause error) {
	if r.seq == nil {
		return
	}
	if cause != nil {
		c.pool.Abort(r.seq, cause)
		c.noteQuarantine(cause)
	} else {
		c.pool.Release(r.seq)
	}
	r.seq = nil
	r.tenant.pages -= r.pages
	r.pages = 0
	r.computed = 0
	if i := slices.Index(c.running, r); i >= 0 {
		c.running = slices.Delete(c.running, i, i+1)
		r.tenant.running--
	}
}

// forget drops a terminal request whose result went out and whose pages
// are back.
func (c *Core) forget(r *req) {
	if r.life.State().Terminal() && r.delivered && r.seq == nil && !r.inFlight {
		delete(c.reqs, r.owner)
	}
}

// Ready returns what the driver must do now: deliver the tokens and results
// produced since the last call and, when no batch is in flight, run the
// next batch. The driver must call Advance with that batch (and nothing
// else) before the next batch is planned.
func (c *Core) Ready() Ready {
	var b *Batch
	if c.inflight == nil {
		b = c.schedule()
	}
	c.watchQuarantine() // Begin may have quarantined a sequence
	rd := c.out
	rd.Batch = b
	c.out = Ready{}
	for _, res := range rd.Results {
		if r := c.reqs[res.Owner]; r != nil {
			r.delivered = true
			c.forget(r)
		}
	}
	return rd
}

// prioLess orders requests from most to least deserving of pages: higher
// priority, then earlier start, then earlier arrival.
func prioLess(a, b *req) int {
	if c := cmp.Compare(b.prio[0], a.prio[0]); c != 0 {
		return c
	}
	if c := cmp.Compare(b.prio[1], a.prio[1]); c != 0 {
		return c
	}
	if c := cmp.Compare(a.started, b.started); c != 0 {
		return c
	}
	return cmp.Compare(a.order, b.order)
}

// schedule plans the next batch: decode tokens of running sequences first,
// then their pending prefill chunks, then the first chunks of queued
// requests, within MaxBatchTokens.
func (c *Core) schedule() *Batch {
	if len(c.running) == 0 && c.queued == 0 {
		return nil
	}
	c.step++
	b := &Batch{Step: c.step, Items: make([]Item, 0, len(c.running)+min(c.queued, 16))}
	c.inflightReqs = c.inflightReqs[:0]
	budget := c.cfg.MaxBatchTokens

	c.watchQuarantine()
	c.enforceCaps()
	c.relieveStarvation()

	// Decodes (one token) before prefill chunks, each group in priority
	// order, so that long prompts never stall running generations.
	c.order = append(c.order[:0], c.running...)
	slices.SortFunc(c.order, func(a, b *req) int {
		ad, bd := len(a.tokens)-a.computed == 1, len(b.tokens)-b.computed == 1
		if ad != bd {
			if ad {
				return -1
			}
			return 1
		}
		return prioLess(a, b)
	})
	run := func(r *req) {
		if budget == 0 || r.seq == nil || r.life.State().Terminal() || r.awaitingImport {
			return // preempted (or ended) earlier in this pass, or its KV is on its way
		}
		n := min(len(r.tokens)-r.computed, budget, c.chunkCap(r))
		if !c.grow(r, r.computed+n) {
			return
		}
		if c.add(b, r, n) {
			budget -= n
		}
	}
	// Background requests (request.BackgroundPriority: the replay
	// audit's re-scores) run only in steps that carry nothing else: a
	// re-score's prefill chunk never lengthens a customer's step.
	var background []*req
	for _, r := range c.order {
		if r.params.Priority == request.BackgroundPriority {
			background = append(background, r)
			continue
		}
		run(r)
	}

	// New sequences, tenant by tenant, least-loaded tenant first;
	// background ones only when nothing else runs this step and no
	// other request waits for pages.
	type skipped struct {
		t    *tenant
		prev uint64
	}
	var held []skipped
	start := func(bg bool) (blocked bool) {
		for budget > 0 && len(c.running) < c.cfg.MaxRunning && !c.shutdown {
			t := c.pickTenant()
			if t == nil {
				return false
			}
			r := t.queue[0]
			if (r.params.Priority == request.BackgroundPriority) != bg {
				held = append(held, skipped{t, t.skip})
				t.skip = c.step
				continue
			}
			if err := c.unfit(t, r.params); err != nil {
				// The caps or the pool changed since it was submitted.
				// Either way it must not hold up the other tenants.
				if c.waitsForReaper(err) {
					t.skip = c.step
				} else {
					c.shed(r, err)
				}
				continue
			}
			seq, cached, n, ok := c.prepareStart(t, r, min(budget, c.chunkCap(r)))
			if !ok {
				if t.skip == c.step {
					continue // its own cap: others may go ahead
				}
				// Out of pages: everyone waits (no overtaking), so a large
				// request at the head is not starved by small ones.
				return true
			}
			c.unqueue(r)
			if err := r.life.StartPrefill(); err != nil {
				_ = invariants.Failf("sched: start of %v: %v", r.owner, err)
				c.pool.Release(seq)
				continue
			}
			r.seq, r.pages, r.computed = seq, seq.HeldPages(), cached
			if r.preemptions == 0 {
				r.cached = cached
				c.stats.QueueWait.observe(c.now.Sub(r.enqueued))
			}
			t.pages += r.pages
			t.running++
			t.served = c.step
			r.started = c.step
			c.running = append(c.running, r)
			if c.add(b, r, n) {
				budget -= n
			}
		}
		return false
	}
	blocked := start(false)
	if len(b.Items) == 0 {
		for i := len(held) - 1; i >= 0; i-- {
			held[i].t.skip = held[i].prev
		}
		held = held[:0]
		// A running background request goes on (it ends and gives its
		// pages back, which a waiting request may need); a new one
		// starts only if nobody waits for pages.
		for _, r := range background {
			run(r)
		}
		if !blocked {
			start(true)
		}
	}
	for i := len(held) - 1; i >= 0; i-- {
		held[i].t.skip = held[i].prev
	}
	if len(b.Items) == 0 {
		return nil
	}
	c.inflight = b
	c.stats.Steps++
	return b
}

// prepareStart gets r's sequence ready to run its first n positions after
// the cached ones the prefix cache served, within its tenant's cap and the
// free pages less the watermark (kept for running sequences to grow into,
// unless nothing runs: then nobody needs it and r must be able to start).
// When r cannot start now it returns !ok with no sequence; t.skip is set
// if its own cap is what holds it.
//
// Attaching the cached prefix counts prefix-cache hits (and misses) in the
// pool, so the attach comes only after the start is certain and covers no
// more than the step can use: the room is checked as if every page the
// cache might serve had to come out of the free pages. A request that
// waits is therefore counted once, when it starts, not on every step it
// waits; the price is that one whose cached pages are in use by others
// may wait for a few pages it would not have needed.
func (c *Core) prepareStart(t *tenant, r *req, budget int) (seq *kvcache.Sequence, cached, n int, ok bool) {
	// first is how many pages the first step holds in all, cached ones
	// included (they count against the tenant's cap like its own).
	first := func(cached int) int { return c.lim.PagesFor(min(len(r.tokens), cached+budget)) }
	room := c.pool.FreePages()
	if len(c.running) > 0 {
		room -= c.cfg.WatermarkPages
	}
	if cp := t.policy.MaxPages; cp > 0 && first(0) > cp-t.pages {
		t.skip = c.step
		return nil, 0, 0, false
	}
	if cp := t.policy.MaxPages; cp > 0 {
		room = min(room, cp-t.pages)
	}
	if first(0) > room {
		return nil, 0, 0, false
	}
	seq = c.pool.NewSequence(r.owner)
	if c.cfg.PrefixCache && !r.params.Sampling.PromptLogprobs {
		// (A request that scores its prompt computes every position:
		// a cached one has no logits.)
		// AttachPrefix serves full pages of tokens[:k-1]: at most
		// cached = room*PageSize - budget positions keep first(cached)
		// within room when the whole of r.tokens does not fit it.
		k := len(r.tokens)
		if first(k) > room {
			ps := c.lim.PageSize
			k = min(k, (room*ps-budget)/ps*ps+1)
		}
		cached = c.pool.AttachPrefix(seq, r.tokens[:k], r.params.CacheSalt)
	}
	n = min(len(r.tokens)-cached, budget)
	if total := c.lim.PagesFor(cached + n); total > room {
		_ = invariants.Failf("sched: start of %v: %d cached positions make a first step of %d pages, room was %d", r.owner, cached, total, room)
		c.pool.Release(seq)
		return nil, 0, 0, false
	}
	if err := c.pool.Reserve(seq, n); err != nil {
		// Only when allocation found unscrubbed pages and quarantined
		// them on the way: the free pages were fewer than counted.
		c.pool.Release(seq)
		return nil, 0, 0, false
	}
	return seq, cached, n, true
}

// add begins r's view for n positions and appends the item. It reports
// false when the pool refused the view (r is then aborted).
func (c *Core) add(b *Batch, r *req, n int) bool {
	v, err := c.pool.Begin(r.seq, n)
	if err != nil {
		// The pool already quarantined and ended the sequence on a
		// violation; for anything else give the pages back.
		c.noteQuarantine(err)
		c.end(r, func(l *Lifecycle) error { return l.Abort(fmt.Errorf("%w: %w", request.ErrInternal, err)) })
		return false
	}
	end := r.computed + n
	b.Items = append(b.Items, Item{
		Owner:       r.owner,
		View:        v,
		Tokens:      r.tokens[r.computed:end:end],
		Sample:      end == len(r.tokens),
		Sampling:    r.params.Sampling,
		SampleIndex: r.generated,
		History:     r.tokens[:end:end],
		ScorePrompt: c.scorePrompt(r, end),
	})
	r.inFlight = true
	r.scheduled = c.step
	c.inflightReqs = append(c.inflightReqs, r)
	return true
}

// MaxScoredRows bounds the positions a step computes for a request that
// scores its prompt (request.Sampling.PromptLogprobs): each such position
// needs its row of logits (a vocabulary of floats: 128 rows of a
// 49,152-token vocabulary are 25 MB, a 512-token chunk's would be 100 MB
// for one step). Chunking gives the same bits, so it changes no value.
const MaxScoredRows = 128

// chunkCap is the most positions a step computes for r.
func (c *Core) chunkCap(r *req) int {
	if r.params.Sampling.PromptLogprobs && r.generated == 0 {
		return MaxScoredRows
	}
	return math.MaxInt
}

// scorePrompt is the Item.ScorePrompt of r's step computing positions
// r.computed..end-1: the prompt tokens those positions predict, while r
// still owes its prompt logprobs (its first token has not gone out). A
// recompute from position 0 (preemption) computes them again.
func (c *Core) scorePrompt(r *req, end int) []int {
	pr := r.params.Prompt
	if !r.params.Sampling.PromptLogprobs || r.generated > 0 || r.computed+1 >= len(pr) {
		return nil
	}
	if r.computed == 0 {
		r.promptLP = r.promptLP[:0]
	}
	hi := min(end+1, len(pr))
	return pr[r.computed+1 : hi : hi]
}

// grow makes sure r holds pages for positions, preempting other sequences
// (or r itself) when the pool or r's tenant cap is short. It reports
// whether r can run this step.
func (c *Core) grow(r *req, positions int) bool {
	t := r.tenant
	if err := c.unfitGrowth(r, positions); err != nil {
		// Preempting others would not help.
		if c.waitsForReaper(err) {
			c.preempt(r)
		} else {
			c.end(r, func(l *Lifecycle) error { return l.Abort(err) })
		}
		return false
	}
	for {
		extra := c.lim.PagesFor(positions) - r.seq.NumPages()
		if extra <= 0 {
			return true
		}
		var scope *tenant
		if t.policy.MaxPages > 0 && t.pages+extra > t.policy.MaxPages {
			scope = t // only the tenant's own sequences can make room
		} else {
			err := c.pool.Reserve(r.seq, positions-r.seq.Len())
			if err == nil {
				t.pages += r.seq.HeldPages() - r.pages
				r.pages = r.seq.HeldPages()
				return true
			}
			if !errors.Is(err, kvcache.ErrNoPages) {
				c.end(r, func(l *Lifecycle) error { return l.Abort(fmt.Errorf("%w: %w", request.ErrInternal, err)) })
				return false
			}
		}
		v := c.victim(r, scope)
		c.preempt(v)
		if v == r {
			return false
		}
	}
}

// unfit says why a request of tenant t with params p can never start
// (nil if it can): it could outgrow the tenant's page cap
// (request.ErrQuota), or the pool less its quarantined pages
// (ErrPoolDegraded).
func (c *Core) unfit(t *tenant, p *request.Params) error {
	return c.fits(t, request.MaxKVPages(len(p.Prompt), p.MaxTokens, c.lim.PageSize), "up to ")
}

// unfitGrowth says why running r can never hold positions (nil if it
// can), by the same rules as unfit.
func (c *Core) unfitGrowth(r *req, positions int) error {
	return c.fits(r.tenant, c.lim.PagesFor(positions), "")
}

func (c *Core) fits(t *tenant, need int, upTo string) error {
	if cp := t.policy.MaxPages; cp > 0 && need > cp {
		return fmt.Errorf("%w: the request needs %s%d KV pages, the tenant may hold %d", request.ErrQuota, upTo, need, cp)
	}
	if capa := c.capacity(); need > capa {
		return fmt.Errorf("%w: the request needs %s%d KV pages, %d of the pool's %d are quarantined after isolation violations",
			ErrPoolDegraded, upTo, need, c.lim.UsablePages-capa, c.lim.UsablePages)
	}
	return nil
}

// capacity is the most pages one sequence could hold in the pool as it
// is now: the usable pages less the quarantined ones.
func (c *Core) capacity() int { return c.lim.UsablePages - len(c.quarantine) }

// waitsForReaper reports whether a request refused by unfit with err is
// to wait rather than end: it lacks only quarantined pages, and the
// reaper will free them.
func (c *Core) waitsForReaper(err error) bool {
	return c.cfg.QuarantineReapAfter > 0 && errors.Is(err, ErrPoolDegraded)
}

// shed ends a waiting request that can never start with cause: Rejected
// if it never ran, Aborted if it was preempted (what it streamed stands).
func (c *Core) shed(r *req, cause error) {
	c.unqueue(r)
	if r.preemptions == 0 {
		c.end(r, func(l *Lifecycle) error { return l.Reject(cause) })
		return
	}
	c.end(r, func(l *Lifecycle) error { return l.Abort(cause) })
}

// victim picks the running sequence to preempt so that r can grow: among
// those not yet in this step's batch (within scope when set) and r itself,
// the lowest priority, then the one whose tenant is furthest over its fair
// share, then the most recently started. Returning r means r yields.
func (c *Core) victim(r *req, scope *tenant) *req {
	share := c.fairShare()
	worst := r
	for _, v := range c.running {
		if v == r || v.scheduled == c.step || v.seq == nil || v.awaitingImport || (scope != nil && v.tenant != scope) {
			continue
		}
		if c.worse(v, worst, share) {
			worst = v
		}
	}
	return worst
}

// worse reports whether a should be preempted before b.
func (c *Core) worse(a, b *req, share int) bool {
	if a.prio != b.prio {
		return prioLess(a, b) > 0
	}
	ao, bo := a.tenant.pages > share, b.tenant.pages > share
	if ao != bo {
		return ao
	}
	return prioLess(a, b) > 0
}

// fairShare is the number of pages each active tenant may hold while
// others wait.
func (c *Core) fairShare() int {
	return c.lim.UsablePages / max(1, len(c.active))
}

// preempt releases r's pages and puts it back at the front of its
// tenant's queue, to be recomputed (prompt and generated tokens) later.
func (c *Core) preempt(r *req) {
	if r.inFlight || r.seq == nil || r.awaitingImport {
		_ = invariants.Failf("sched: preempting %v in flight %v / without pages / awaiting an import %v", r.owner, r.inFlight, r.awaitingImport)
		return
	}
	c.dropPages(r, nil)
	if err := r.life.Preempt(); err != nil {
		_ = invariants.Failf("sched: preempt %v: %v", r.owner, err)
		return
	}
	r.preemptions++
	c.stats.Preemptions++
	c.out.Preempted = append(c.out.Preempted, r.owner)
	_ = c.enqueue(r.adm, true)
}

// pickTenant chooses whose queued request starts next: among tenants with
// a waiting request and room under their caps, the one holding the fewest
// pages, then the fewest running sequences, then the one served longest
// ago.
func (c *Core) pickTenant() *tenant {
	var best *tenant
	for _, t := range c.active {
		if len(t.queue) == 0 || t.skip == c.step {
			continue
		}
		if t.policy.MaxRunning > 0 && t.running >= t.policy.MaxRunning {
			continue
		}
		if best == nil || t.queue[0].prio[0] > best.queue[0].prio[0] ||
			t.queue[0].prio[0] == best.queue[0].prio[0] &&
				(t.pages < best.pages || t.pages == best.pages &&
					(t.running < best.running || t.running == best.running && t.served < best.served)) {
			best = t
		}
	}
	return best
}

// relieveStarvation makes room for a tenant that has requests waiting and
// nothing running when the pool is short: it preempts the most recent
// sequence of the tenant furthest over its fair share, as long as that
// tenant keeps at least one running sequence (so two tenants can never
// take turns preempting each other).
func (c *Core) relieveStarvation() {
	var starved *tenant
	for _, t := range c.active {
		// A background request (the audit's) never preempts anyone.
		if len(t.queue) > 0 && t.running == 0 && (starved == nil || t.queue[0].order < starved.queue[0].order) &&
			t.queue[0].params.Priority != request.BackgroundPriority &&
			c.unfit(t, t.queue[0].params) == nil {
			starved = t
		}
	}
	if starved == nil || c.shutdown {
		return
	}
	head := starved.queue[0]
	need := c.lim.PagesFor(min(len(head.tokens), c.cfg.MaxBatchTokens)) + c.cfg.WatermarkPages
	share := c.fairShare()
	for c.pool.FreePages() < need {
		var hog *tenant
		for _, t := range c.active {
			if t != starved && t.running > 1 && t.pages > share && (hog == nil || t.pages > hog.pages) {
				hog = t
			}
		}
		if hog == nil {
			return
		}
		var v *req
		for _, r := range c.running {
			if r.tenant == hog && !r.awaitingImport && (v == nil || prioLess(r, v) > 0) {
				v = r
			}
		}
		if v == nil || prioLess(v, head) < 0 && v.prio != head.prio {
			return // never preempt higher priority for fairness
		}
		c.preempt(v)
	}
}

// Advance applies the outcomes of the batch in flight: it commits the
// written positions, takes each sampled token, and ends requests that
// finished or failed. A batch-wide execErr fails every item. Outcomes for
// requests aborted while the batch ran are dropped and their pages
// released only now, after the executor stopped writing them.
func (c *Core) Advance(b *Batch, outs []Outcome, execErr error) error {
	if b == nil || b != c.inflight {
		return ErrBatch
	}
	if execErr == nil && len(outs) != len(b.Items) {
		execErr = fmt.Errorf("executor returned %d outcomes for %d items", len(outs), len(b.Items))
	}
	for i, it := range b.Items {
		r := c.inflightReqs[i]
		r.inFlight = false
		if r.owner != it.Owner {
			_ = invariants.Failf("sched: batch item %d is for %v, the core put %v there", i, it.Owner, r.owner)
		}
		if r.life.State().Terminal() {
			c.releasePages(r, nil)
			continue
		}
		err := execErr
		if err == nil {
			err = outs[i].Err
		}
		if err == nil && outs[i].Owner != r.owner {
			// The executor computed this outcome for someone else: an
			// item/outcome crossing. Never delivered; pages quarantined.
			c.stats.OwnerMismatches++
			err = fmt.Errorf("%w: outcome %d was computed for %v, not %v", kvcache.ErrViolation, i, outs[i].Owner, r.owner)
			_ = invariants.Failf("sched: %v", err)
		}
		if err == nil {
			err = c.pool.Commit(it.View)
		}
		if err == nil && it.Sample && c.lim.Vocab > 0 && (outs[i].Token < 0 || outs[i].Token >= c.lim.Vocab) {
			err = fmt.Errorf("sampled token %d outside the vocabulary of %d", outs[i].Token, c.lim.Vocab)
		}
		if err == nil {
			err = c.takePrompt(r, it, outs[i].PromptLogprobs)
		}
		if err != nil {
			// Pages first, with the cause, so that a violation
			// quarantines them rather than freeing them.
			c.dropPages(r, err)
			cause := fmt.Errorf("%w: %w", request.ErrInternal, err)
			c.end(r, func(l *Lifecycle) error { return l.Abort(cause) })
			continue
		}
		r.computed += len(it.Tokens)
		if it.Sample {
			c.take(r, outs[i].Token, outs[i].Logprobs)
		}
		c.dropBehindWindow(r)
	}
	c.inflight = nil
	c.inflightReqs = c.inflightReqs[:0]
	c.watchQuarantine()
	return nil
}

// dropBehindWindow gives back the pages of r's sequence that its model's
// attention window has left behind (Config.Window), once a step is
// committed: the next position computed is Len(), which sees keys from
// Len()-Window+1 on. The pool checks the sequence against the ledger
// first; a violation ends r like a failed commit.
func (c *Core) dropBehindWindow(r *req) {
	if c.cfg.Window <= 0 || r.seq == nil || r.prefillOnly || r.life.State().Terminal() {
		return
	}
	pos := r.seq.Len() - c.cfg.Window + 1
	if c.cfg.PrefixCache && r.preemptions == 0 && !r.imported && r.life.State() == StatePrefilling &&
		pos/c.lim.PageSize > r.seq.DroppedPages() {
		// A prompt longer than the window gives back its first pages
		// before it is done, and take publishes only what is held then:
		// publish them now, or the chain of keys would miss its head and
		// no later request could ever hit it. (A published page given
		// back stays cached for the tenant, unreferenced.)
		c.pool.PublishPrefix(r.seq, r.params.Prompt, r.params.CacheSalt)
	}
	n, err := c.pool.DropBefore(r.seq, pos)
	if err != nil {
		c.dropPages(r, err)
		cause := fmt.Errorf("%w: %w", request.ErrInternal, err)
		c.end(r, func(l *Lifecycle) error { return l.Abort(cause) })
		return
	}
	r.pages -= n
	r.tenant.pages -= n
}

// takePrompt appends a step's prompt logprobs to r's, checking that
// the executor gave exactly one per Item.ScorePrompt token, each with the
// alternatives asked, and that they continue where the last step's ended.
func (c *Core) takePrompt(r *req, it Item, lps []request.Logprobs) error {
	if len(lps) != len(it.ScorePrompt) {
		return fmt.Errorf("%d prompt logprobs for %d prompt positions", len(lps), len(it.ScorePrompt))
	}
	if len(lps) == 0 {
		return nil
	}
	if len(r.promptLP) != r.computed {
		return fmt.Errorf("prompt logprobs of positions from %d, %d held", r.computed, len(r.promptLP))
	}
	for k := range lps {
		if err := lps[k].Check(r.params.Sampling.PromptTopLogprobs, c.lim.Vocab); err != nil {
			return fmt.Errorf("prompt token %d: %w", r.computed+1+k, err)
		}
	}
	r.promptLP = append(r.promptLP, lps...)
	return nil
}

// take applies one sampled token (and its logprobs, if asked) to r.
func (c *Core) take(r *req, tok int, lp *request.Logprobs) {
	if r.life.State() == StatePrefilling {
		if r.prefillOnly {
			if c.cfg.PrefixCache && r.preemptions == 0 {
				c.pool.PublishPrefix(r.seq, r.params.Prompt, r.params.CacheSalt)
			}
			c.export(r, tok, lp)
			return
		}
		// An imported prompt is not published: the prefill node's
		// cache holds it, and this one never computed it.
		if c.cfg.PrefixCache && r.preemptions == 0 && !r.imported {
			c.pool.PublishPrefix(r.seq, r.params.Prompt, r.params.CacheSalt)
		}
		if err := r.life.Handoff(); err != nil {
			_ = invariants.Failf("sched: %v", err)
		}
		if err := r.life.StartDecode(); err != nil {
			_ = invariants.Failf("sched: %v", err)
		}
	}
	r.generated++
	// The stop token is delivered too: usage counts it (as vLLM does), and
	// the gateway checks that usage equals what it was sent; it hides the
	// text of end-of-generation tokens itself.
	t := request.Token{Owner: r.owner, Index: r.generated - 1, ID: tok, Logprobs: lp}
	if r.generated == 1 && r.params.Sampling.PromptLogprobs {
		t.Prompt, r.promptLP = c.promptOut(r), nil
	}
	c.out.Tokens = append(c.out.Tokens, t)
	if slices.Contains(r.params.StopTokens, tok) || (!r.params.IgnoreEOS && slices.Contains(c.cfg.EndTokens, tok)) {
		c.finish(r, request.FinishStop)
		return
	}
	r.tokens = append(r.tokens, tok)
	if r.generated >= r.params.MaxTokens {
		c.finish(r, request.FinishLength)
	}
}

// promptOut is r's prompt logprobs as its first token carries them:
// every prompt position's, or nil with an invariant failure when some are
// missing (the core scheduled every one; an import checked its count).
func (c *Core) promptOut(r *req) []request.Logprobs {
	want := max(len(r.params.Prompt)-1, 0)
	if len(r.promptLP) != want {
		_ = invariants.Failf("sched: %v: %d prompt logprobs for %d prompt tokens", r.owner, len(r.promptLP), len(r.params.Prompt))
		return nil
	}
	return slices.Clip(r.promptLP)
}

func (c *Core) finish(r *req, reason request.FinishReason) {
	c.mutantFinished(r)
	c.end(r, func(l *Lifecycle) error { return l.Finish(reason) })
}

// CheckInvariants verifies the core's bookkeeping against itself and the
// pool (tests and simulations call it after every step).
func (c *Core) CheckInvariants() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	pages := map[*tenant]int{}
	running := map[*tenant]int{}
	queued, holders := 0, 0
	for _, t := range c.active {
		if (c.tenants[t.name] == t) == t.former {
			bad("active tenant %q (former holder %v) in the tenant table %v", t.name, t.former, c.tenants[t.name] == t)
		}
		if !t.former {
			holders++
		}
		for _, r := range t.queue {
			queued++
			if r.life.State() != StateAdmitted || r.seq != nil || !r.queued || r.tenant != t {
				bad("queued %v: state %s, pages %v, queued %v", r.owner, r.life.State(), r.seq != nil, r.queued)
			}
		}
	}
	if queued != c.queued || len(c.tenants) != holders {
		bad("queued count %d, queues hold %d; %d tenants, %d active holders", c.queued, queued, len(c.tenants), holders)
	}
	for _, r := range c.running {
		if r.seq == nil || !r.life.State().Running() && !(r.inFlight && r.life.State().Terminal()) {
			bad("running %v: state %s, pages %v", r.owner, r.life.State(), r.seq != nil)
			continue
		}
		if r.seq.Released() || r.pages != r.seq.HeldPages() || r.seq.Owner() != r.owner {
			bad("running %v: sequence released %v, pages %d vs %d, owner %v", r.owner, r.seq.Released(), r.pages, r.seq.HeldPages(), r.seq.Owner())
		}
		// Only pages wholly behind the window are ever given back.
		if d := r.seq.DroppedPages(); d > 0 && (c.cfg.Window <= 0 || r.prefillOnly || d*c.lim.PageSize > r.seq.Len()-c.cfg.Window+1) {
			bad("running %v: %d pages given back at length %d with window %d (prefill only %v)", r.owner, d, r.seq.Len(), c.cfg.Window, r.prefillOnly)
		}
		if !r.inFlight && r.computed != r.seq.Len() {
			bad("running %v: computed %d, sequence length %d", r.owner, r.computed, r.seq.Len())
		}
		pages[r.tenant] += r.pages
		running[r.tenant]++
	}
	for _, t := range c.active {
		if t.pages != pages[t] || t.running != running[t] {
			bad("tenant %q: %d pages / %d running recorded, %d / %d held", t.name, t.pages, t.running, pages[t], running[t])
		}
		// Caps lowered by UpdatePolicies hold from the next step on.
		if !c.capsStale && (t.policy.MaxPages > 0 && t.pages > t.policy.MaxPages || t.policy.MaxRunning > 0 && t.running > t.policy.MaxRunning) {
			bad("tenant %q over its caps: %d pages (cap %d), %d running (cap %d)", t.name, t.pages, t.policy.MaxPages, t.running, t.policy.MaxRunning)
		}
	}
	if len(c.running) > c.cfg.MaxRunning {
		bad("%d running, cap %d", len(c.running), c.cfg.MaxRunning)
	}
	for o, r := range c.reqs {
		if o != r.owner {
			bad("request table key %v holds %v", o, r.owner)
		}
		if r.life.State().Terminal() != (r.life.Reason() != request.FinishNone) {
			bad("%v: state %s with reason %s", o, r.life.State(), r.life.Reason())
		}
	}
	for i, q := range c.quarantine {
		if i > 0 && c.quarantine[i-1].id >= q.id {
			bad("reaper list out of order at %d: page %d after %d", i, q.id, c.quarantine[i-1].id)
		}
		if info, _ := c.pool.Page(q.id); !c.qDirty && (info.State != kvcache.PageQuarantined || info.Epoch != q.epoch) {
			bad("reaper tracks page %d (epoch %d), which the pool has %v (epoch %d)", q.id, q.epoch, info.State, info.Epoch)
		}
	}
	if err := c.pool.CheckInvariants(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
