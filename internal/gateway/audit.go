package gateway

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pagewarden/pagewarden/internal/request"
)

// The replay audit (DESIGN.md, layer C): a sampled fraction of the
// answers that went out with a 200 is re-scored, after the fact,
// teacher-forced on fresh pages, in one prefill: the audit submits the
// request's prompt followed by the answer's tokens but the last as a
// prompt whose log-probabilities it asks for
// (request.Sampling.PromptLogprobs), with the last token forced
// (request.Sampling.Forced, max_tokens 1), so the engine computes, at
// every generated position, the logits of the answer's own history and
// the log-probability of the token that was sent, without drawing — all
// positions in the steps of one prefill (chunks of the scheduler's step
// budget) rather than one decode step per token: about a quarter of the
// CPU a forced decode took (engine.BenchmarkAuditRescore). The answer recorded, at generation, each
// token's log-probability and a digest of its top-k alternatives
// (auditTopK, ids and values), because the gateway asked the engine for
// them when it picked the answer for audit (before submitting it:
// unaudited answers compute nothing). Each position of the re-score is
// compared with the record.
//
// The engine's kernels give the same logits whatever the batch,
// chunking or prefix cache, and a prompt row's logits in prefill are a
// decode step's at that position bit for bit (engine.TestPromptLogprobs,
// on F32, F16, Q8_0 and Q4_K_M weights), so a clean answer re-scores bit for
// bit, and the comparison is exact by default: equal log-probability
// bits and equal digests. Config.AuditTolerance relaxes it to |Δlogprob|
// within the tolerance for clusters whose nodes cannot agree bit for
// bit (other CPUs, other kernel tiers). A sequence that attended over
// anything but its own prompt and output (another tenant's stale page:
// the incident) has other logits at every position after the page, and
// the first one it changes shows up here, whether or not it changed the
// token drawn.
//
// Where the backend has several nodes (disagg's router), a re-score runs
// on a prefill and a decode node other than those that generated the
// answer when there is one (WithReplayOf), so that a node computing
// wrongly cannot confirm its own answer.
//
// A replay runs as the reserved tenant AuditTenant (which no configured
// tenant can be named: tenant ids start with a letter or digit), so it is
// charged to no customer and counts against no customer's caps; as
// background work (request.BackgroundPriority), so that the scheduler runs
// it only in steps with no customer's work in them, starts it only while
// no customer waits for pages, and preempts it first; with a cache salt of its own, so that it
// reuses no prefix-cache page, not even an earlier replay's. Its output
// never leaves the auditor. The queue is bounded: when replays cannot keep
// up, the excess is dropped and counted, never waited for.

// AuditTenant is the tenant replays run as.
const AuditTenant request.Tenant = "_audit"

// auditPriority is below any tenant's (tenants.Limits.Priority is small):
// background work, which the scheduler runs only in steps with nothing
// else in them.
const auditPriority = request.BackgroundPriority

// defaultAuditQueue bounds the replays waiting to run (Config.AuditQueue).
const defaultAuditQueue = 64

// auditTopK is how many alternatives per position an audited answer
// records (digested) and its re-score compares.
const auditTopK = 5

// auditJob is one answer to re-score: the request as it was submitted,
// the tokens the client received and, per position, the emitted token's
// log-probability and the digest of the top auditTopK alternatives.
type auditJob struct {
	p       request.Params
	tokens  []int
	lps     []float32
	digests []uint64
	finish  string
}

// topDigest is FNV-1a over the top k alternatives' ids and value bits.
func topDigest(lp *request.Logprobs) uint64 {
	h := uint64(14695981039346656037)
	mix := func(v uint32) {
		for range 4 {
			h = (h ^ uint64(v&0xff)) * 1099511628211
			v >>= 8
		}
	}
	for _, t := range lp.Top[:min(auditTopK, len(lp.Top))] {
		mix(uint32(t.ID))
		mix(math.Float32bits(t.Logprob))
	}
	return h
}

// auditor runs replays one at a time (their cost is a second generation
// of the audited answer; one at a time bounds what they take from the
// customers).
type auditor struct {
	s    *Server
	rate float64
	tol  float64 // Config.AuditTolerance: 0 is exact
	once sync.Once
	jobs chan auditJob

	replays    *prometheus.CounterVec
	mismatches prometheus.Counter
	// done, for tests, receives every finished replay's outcome.
	done func(result string)
	// scored, for tests and calibration, receives every re-score's
	// largest |Δlogprob| and whether it was a mismatch.
	scored func(tenant request.Tenant, maxDelta float64, mismatch bool)
}

func newAuditor(s *Server, rate, tol float64, queue int) *auditor {
	a := &auditor{s: s, rate: rate, tol: tol, jobs: make(chan auditJob, cmp.Or(queue, defaultAuditQueue))}
	a.replays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pagewarden_audit_replays_total",
		Help: "Replay audits by result: match, mismatch, failed (the replay did not complete), dropped (the queue was full).",
	}, []string{"result"})
	a.mismatches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pagewarden_audit_mismatches_total",
		Help: "Answers whose teacher-forced re-score on fresh pages gave other log-probabilities than the answer recorded: an answer built from something other than its own request. Must stay 0.",
	})
	for _, r := range []string{"match", "mismatch", "failed", "dropped"} {
		a.replays.WithLabelValues(r)
	}
	return a
}

// pick decides, with probability rate, that the answer about to be
// submitted with sampling s is audited, and has the engine compute what
// the audit records (s is changed only then).
func (a *auditor) pick(s *request.Sampling) bool {
	if a.rate <= 0 || (a.rate < 1 && rand.Float64() >= a.rate) {
		return false
	}
	s.Logprobs = true
	s.TopLogprobs = max(s.TopLogprobs, auditTopK)
	return true
}

// queue queues a picked answer (p as submitted, the tokens and logprobs
// the client received, its finish reason) for its re-score.
func (a *auditor) queue(p request.Params, tokens []int, lps []*request.Logprobs, finish string) {
	if len(tokens) == 0 || len(lps) != len(tokens) {
		return
	}
	a.once.Do(func() { go a.run(a.s.stop) })
	job := auditJob{p: p, tokens: slices.Clone(tokens), finish: finish,
		lps: make([]float32, len(lps)), digests: make([]uint64, len(lps))}
	for i, lp := range lps {
		if lp == nil {
			return // the relay checked every token had them
		}
		job.lps[i], job.digests[i] = lp.Logprob, topDigest(lp)
	}
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

// replay re-scores j's answer teacher-forced and compares every position
// with what was recorded.
func (a *auditor) replay(ctx context.Context, j auditJob) {
	orig := j.p.Owner
	if len(j.p.Prompt) == 0 {
		// No row predicts an empty prompt's first token (no engine
		// generates from nothing): nothing to compare it with.
		a.failed(orig, errors.New("an answer to an empty prompt has no row to re-score its first token"))
		return
	}
	p := j.p
	n := len(j.tokens)
	p.Owner = request.Owner{Tenant: AuditTenant, ID: request.NewID()}
	// One prefill over the prompt and the answer but its last token,
	// which is forced: its row is the last prompt row.
	p.Prompt = append(slices.Clip(j.p.Prompt), j.tokens[:n-1]...)
	p.MaxTokens = 1
	p.Priority = auditPriority
	p.CacheSalt = fmt.Sprintf("audit|%x", p.Owner.ID[:])
	// Forced tokens: no draw, so none of the sampling knobs or the
	// output constraint matters (logprobs are the raw distribution's).
	// The stop tokens stay: a forced answer that ended on one ends there.
	p.Sampling = request.Sampling{Seed: j.p.Sampling.Seed, Logprobs: true, TopLogprobs: auditTopK,
		PromptLogprobs: true, PromptTopLogprobs: auditTopK, Forced: j.tokens[n-1:]}
	st, err := a.s.backend.Submit(WithReplayOf(ctx, orig), p)
	if err != nil {
		a.failed(orig, err)
		return
	}
	var got []int
	var gotLP []*request.Logprobs
	var prompt []request.Logprobs
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
		if t.Index == 0 {
			prompt = t.Prompt
		}
		got = append(got, t.ID)
		gotLP = append(gotLP, t.Logprobs)
	}
	res := st.Result()
	if !res.Reason.Success() {
		a.failed(orig, fmt.Errorf("replay ended %v: %v", res.Reason, res.Err))
		return
	}
	if !slices.Equal(got, j.tokens[n-1:]) {
		// Forced tokens come back as forced, or the backend is broken:
		// not a verdict on the answer.
		a.failed(orig, fmt.Errorf("a teacher-forced re-score emitted %v, not the forced %d", got, j.tokens[n-1]))
		return
	}
	if len(prompt) != len(p.Prompt)-1 {
		a.failed(orig, fmt.Errorf("a re-score came back with %d prompt logprobs for %d prompt tokens", len(prompt), len(p.Prompt)))
		return
	}
	// The answer's positions: the prompt rows after the original
	// prompt's last, then the forced token's.
	rescored := make([]*request.Logprobs, 0, n)
	for i := len(j.p.Prompt) - 1; i < len(prompt); i++ {
		rescored = append(rescored, &prompt[i])
	}
	gotLP = append(rescored, gotLP...)
	var bad []int
	worst := 0.0
	for i, lp := range gotLP {
		if lp == nil {
			a.failed(orig, fmt.Errorf("re-score token %d without logprobs", i))
			return
		}
		d := math.Abs(float64(lp.Logprob) - float64(j.lps[i]))
		if math.IsNaN(d) {
			d = math.Inf(1)
		}
		worst = max(worst, d)
		if d > a.tol || (a.tol == 0 && (math.Float32bits(lp.Logprob) != math.Float32bits(j.lps[i]) || topDigest(lp) != j.digests[i])) {
			bad = append(bad, i)
		}
	}
	if a.scored != nil {
		a.scored(orig.Tenant, worst, len(bad) > 0)
	}
	if len(bad) == 0 {
		a.count("match")
		return
	}
	// Never the text: positions and values say where to look; the
	// request id and tenant say whose answer it was.
	attrs := []any{"tenant", string(orig.Tenant), "request_id", orig.ID.String(), "first_difference_at", bad[0],
		"positions", truncatedInts(bad, 32), "mismatched_positions", len(bad), "max_abs_delta_logprob", worst,
		"tolerance", a.tol, "sent_tokens", len(j.tokens), "prompt_tokens", len(j.p.Prompt), "finish", j.finish}
	// The pages and epochs the answer's sequence held, those still alive
	// withdrawn (pages in the log as node:page@epoch).
	attrs = append(attrs, a.forensics(ctx, orig)...)
	a.s.log.Error("replay audit mismatch: an answer's log-probabilities differ from its teacher-forced re-score on fresh pages", attrs...)
	// Counted after the line is written, so whoever sees the count can
	// find the line.
	a.mismatches.Inc()
	a.count("mismatch")
}

// truncatedInts is v, at most n of it, for a log line.
func truncatedInts(v []int, n int) []int { return v[:min(len(v), n)] }

func (a *auditor) failed(orig request.Owner, err error) {
	a.count("failed")
	a.s.log.Warn("replay audit could not run", "tenant", string(orig.Tenant), "request_id", orig.ID.String(), "err", err)
}

// Forensics is implemented by a backend that remembers the pages its
// ended answers' sequences held (kvcache keeps the last few thousand per
// node): on a mismatch the audit asks it for the answer's pages and
// epochs, for the ERROR line, and has it withdraw those still alive with
// the same epoch (the same KV the suspect answer read: quarantined when
// unreferenced, out of the prefix index when something reads them).
type Forensics interface {
	QuarantineAnswer(ctx context.Context, owner request.Owner) []AnswerPages
}

// AnswerPages is one node's account of an answer's pages.
type AnswerPages struct {
	Node string // "" on a single node
	// Pages are "page@epoch", in the sequence's order.
	Pages                  []string
	Quarantined, Withdrawn int
}

// forensics asks the backend, if it can, for orig's pages, withdrawing
// those still alive, and returns the log attributes that say so.
func (a *auditor) forensics(ctx context.Context, orig request.Owner) []any {
	f, ok := a.s.backend.(Forensics)
	if !ok {
		return []any{"pages", "unknown (the backend keeps no page record)"}
	}
	var pages []string
	q, w := 0, 0
	for _, n := range f.QuarantineAnswer(ctx, orig) {
		for _, p := range n.Pages {
			if n.Node != "" {
				p = n.Node + ":" + p
			}
			pages = append(pages, p)
		}
		q += n.Quarantined
		w += n.Withdrawn
	}
	if pages == nil {
		return []any{"pages", "unknown (no node remembers the answer)"}
	}
	return []any{"pages", pages, "pages_quarantined", q, "pages_withdrawn_from_prefix_cache", w}
}

type replayOfKey struct{}

// WithReplayOf marks ctx as the context of orig's audit re-score: a
// backend with several nodes (disagg's router) runs it, where it can, on
// nodes other than those that generated orig, so that a node computing
// wrongly for its own reasons cannot confirm itself.
func WithReplayOf(ctx context.Context, orig request.Owner) context.Context {
	return context.WithValue(ctx, replayOfKey{}, orig)
}

// ReplayOf returns the answer a re-score submitted with ctx re-scores.
func ReplayOf(ctx context.Context) (request.Owner, bool) {
	o, ok := ctx.Value(replayOfKey{}).(request.Owner)
	return o, ok
}
