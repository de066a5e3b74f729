package gateway

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pagewarden/pagewarden/internal/request"
)

// The replay audit (DESIGN.md, layer C): a sampled fraction of the
// answers that went out with a 200 is generated again, after the fact, on
// fresh pages, and must come out token for token the same. Sampling is a
// function of the logits and the request's seed (every request has one:
// an unseeded request draws a fresh seed and keeps it), and the engine's
// kernels give the same logits whatever the batch, chunking or prefix
// cache, so a clean sequence replays exactly. A sequence that attended
// over anything but its own prompt and output (another tenant's stale
// page: the incident) gives other logits, and the first token those change
// shows up here: exactly the contamination that reaches a client does.
//
// A replay runs as the reserved tenant AuditTenant (which no configured
// tenant can be named: tenant ids start with a letter or digit), so it is
// charged to no customer and counts against no customer's caps; at the
// lowest priority, so that the scheduler admits it after every customer's
// request and preempts it first; with a cache salt of its own, so that it
// reuses no prefix-cache page, not even an earlier replay's. Its output
// never leaves the auditor. The queue is bounded: when replays cannot keep
// up, the excess is dropped and counted, never waited for.

// AuditTenant is the tenant replays run as.
const AuditTenant request.Tenant = "_audit"

// auditPriority is below any tenant's (tenants.Limits.Priority is small).
const auditPriority = math.MinInt32

// defaultAuditQueue bounds the replays waiting to run (Config.AuditQueue).
const defaultAuditQueue = 64

// auditJob is one answer to replay: the request as it was submitted, and
// the tokens the client received.
type auditJob struct {
	p      request.Params
	tokens []int
}

// auditor runs replays one at a time (their cost is a second generation
// of the audited answer; one at a time bounds what they take from the
// customers).
type auditor struct {
	s    *Server
	rate float64
	once sync.Once
	jobs chan auditJob

	replays    *prometheus.CounterVec
	mismatches prometheus.Counter
	// done, for tests, receives every finished replay's outcome.
	done func(result string)
}

func newAuditor(s *Server, rate float64, queue int) *auditor {
	a := &auditor{s: s, rate: rate, jobs: make(chan auditJob, cmp.Or(queue, defaultAuditQueue))}
	a.replays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pagewarden_audit_replays_total",
		Help: "Replay audits by result: match, mismatch, failed (the replay did not complete), dropped (the queue was full).",
	}, []string{"result"})
	a.mismatches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pagewarden_audit_mismatches_total",
		Help: "Answers whose replay on fresh pages produced other tokens: an answer built from something other than its own request. Must stay 0.",
	})
	for _, r := range []string{"match", "mismatch", "failed", "dropped"} {
		a.replays.WithLabelValues(r)
	}
	return a
}

// maybe queues p's answer for a replay with probability rate.
func (a *auditor) maybe(p request.Params, tokens []int) {
	if a.rate <= 0 || len(tokens) == 0 || (a.rate < 1 && rand.Float64() >= a.rate) {
		return
	}
	a.once.Do(func() { go a.run(a.s.stop) })
	job := auditJob{p: p, tokens: slices.Clone(tokens)}
	job.p.Prompt = slices.Clone(p.Prompt)
	select {
	case a.jobs <- job:
	default:
		a.count("dropped")
	}
}

func (a *auditor) count(result string) {
	a.replays.WithLabelValues(result).Inc()
	if a.done != nil {
		a.done(result)
	}
}

// run replays queued answers until ctx ends (the server shut down).
func (a *auditor) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case j := <-a.jobs:
			a.replay(ctx, j)
		}
	}
}

// replay generates j's answer again and compares it with what was sent.
func (a *auditor) replay(ctx context.Context, j auditJob) {
	orig := j.p.Owner
	p := j.p
	p.Owner = request.Owner{Tenant: AuditTenant, ID: request.NewID()}
	p.MaxTokens = len(j.tokens)
	p.Priority = auditPriority
	p.CacheSalt = fmt.Sprintf("audit|%x", p.Owner.ID[:])
	st, err := a.s.backend.Submit(ctx, p)
	if err != nil {
		a.failed(orig, err)
		return
	}
	var got []int
	for t := range st.Tokens() {
		if t.Owner != p.Owner {
			// The relay's own check (I10) on the replay's stream.
			a.s.m.ownerMismatch.Inc()
			_ = a.s.backend.Abort(p.Owner.Tenant, p.Owner.ID)
			for range st.Tokens() {
			}
			a.failed(orig, fmt.Errorf("%w: a replay token for %v", ErrOwnerMismatch, t.Owner))
			return
		}
		got = append(got, t.ID)
	}
	res := st.Result()
	if !res.Reason.Success() {
		a.failed(orig, fmt.Errorf("replay ended %v: %v", res.Reason, res.Err))
		return
	}
	if slices.Equal(got, j.tokens) {
		a.count("match")
		return
	}
	at := 0
	for at < min(len(got), len(j.tokens)) && got[at] == j.tokens[at] {
		at++
	}
	a.mismatches.Inc()
	a.count("mismatch")
	// Never the text: positions and counts say where to look; the
	// request id and tenant say whose answer it was.
	a.s.log.Error("replay audit mismatch: an answer differs from its replay on fresh pages",
		"tenant", string(orig.Tenant), "request_id", orig.ID.String(), "first_difference_at", at,
		"sent_tokens", len(j.tokens), "replayed_tokens", len(got), "prompt_tokens", len(p.Prompt))
}

func (a *auditor) failed(orig request.Owner, err error) {
	a.count("failed")
	a.s.log.Warn("replay audit could not run", "tenant", string(orig.Tenant), "request_id", orig.ID.String(), "err", err)
}
