package sched

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched/ownerecho"
)

// raceEnabled is set by race_test.go under -race.
var raceEnabled bool

var (
	simSeeds = flag.Int("sim.seeds", 0, "number of simulation seeds (default 1000, or $PAGEWARDEN_SIM_SEEDS)")
	simSeed  = flag.Uint64("sim.seed", 0, "run only this simulation seed (replay a failure)")
	simFirst = flag.Uint64("sim.first", 1, "first simulation seed")
)

// simRequest is the simulation's own record of one request: what it asked
// for and everything that came back, to check against the core.
type simRequest struct {
	params   request.Params
	history  []int // prompt, then the tokens received
	results  int
	result   request.Result
	aborted  bool // an Abort for it returned nil before its result came
	accepted bool
}

// sim drives a Core, a real kvcache.Pool and the owner-echo model with
// one seeded random source and a fake clock.
type sim struct {
	rng     *rand.Rand
	core    *Core
	pool    *kvcache.Pool
	exec    *echoExecutor
	lim     Limits
	now     time.Time
	reqs    map[request.Owner]*simRequest
	order   []request.Owner // submission order, for deterministic picks
	vocab   int
	tenants []request.Tenant
	ids     uint64
	log     []string
	iter    uint64
	aborts  map[uint64][]request.Owner // iteration -> requests to abort then
	// policies is what Config.Policy returns; reloadPolicy changes it.
	policies map[request.Tenant]TenantPolicy
}

func (s *sim) logf(format string, args ...any) {
	if len(s.log) > 200 {
		s.log = s.log[1:]
	}
	s.log = append(s.log, fmt.Sprintf("[%d] ", s.core.step)+fmt.Sprintf(format, args...))
}

// newSim builds the node for seed with randomly chosen limits and policies.
func newSim(seed uint64, mut mutant) (*sim, error) {
	rng := rand.New(rand.NewPCG(seed, 0x9a9e7a4de4))
	ps := []int{1, 2, 4, 8}[rng.IntN(4)]
	window := []int{8, 16, 24, 40}[rng.IntN(4)]
	margin := []float64{1, 1.5, 2, 3}[rng.IntN(4)]
	minPages := int(float64(window)*margin+float64(ps)-1) / ps
	pages := minPages + rng.IntN(window/ps+1)
	layout := ownerecho.Layout(ps)
	vocab := 64
	lim, err := ComputeLimits(ModelShape{ContextLength: window, Vocab: vocab}, layout, pages, window, margin)
	if err != nil {
		return nil, err
	}
	pool, err := kvcache.NewPool(kvcache.Config{Layout: layout, Pages: pages, Scrub: kvcache.ScrubPoison, VerifyScrub: true})
	if err != nil {
		return nil, err
	}
	nt := 1 + rng.IntN(5)
	tenants := make([]request.Tenant, nt)
	policies := map[request.Tenant]TenantPolicy{}
	for i := range tenants {
		tenants[i] = request.Tenant(fmt.Sprintf("t%d", i))
		policies[tenants[i]] = randomPolicy(rng, lim)
	}
	cfg := Config{
		Limits:             lim,
		Pool:               pool,
		MaxBatchTokens:     []int{1, 3, 8, 32, 128}[rng.IntN(5)],
		MaxRunning:         []int{1, 2, 4, 16, 64}[rng.IntN(5)],
		MaxQueued:          4 + rng.IntN(20),
		MaxQueuedPerTenant: 2 + rng.IntN(16),
		WatermarkPages:     rng.IntN(3) - 1,
		PrefixCache:        rng.IntN(2) == 0,
		Policy:             func(t request.Tenant) TenantPolicy { return policies[t] },
	}
	if rng.IntN(3) == 0 {
		cfg.MaxQueueWait = time.Duration(1+rng.IntN(50)) * time.Millisecond
	}
	if rng.IntN(2) == 0 {
		cfg.EndTokens = []int{rng.IntN(vocab)}
	}
	core, err := NewCore(cfg)
	if err != nil {
		return nil, err
	}
	core.setMutant(mut)
	s := &sim{
		rng: rng, core: core, pool: pool, lim: lim, vocab: vocab, tenants: tenants,
		now:    time.Unix(1_700_000_000, 0),
		reqs:   map[request.Owner]*simRequest{},
		aborts: map[uint64][]request.Owner{},
		exec:   &echoExecutor{vocab: vocab},

		policies: policies,
	}
	s.exec.salt = func(o request.Owner) string { return s.reqs[o].params.CacheSalt }
	failRate := []int{0, 0, 50, 200}[rng.IntN(4)] // 1 in N items fail
	if failRate > 0 {
		s.exec.fail = func(int) bool { return rng.IntN(failRate) == 0 }
		s.exec.batchFail = func() bool { return rng.IntN(failRate*4) == 0 }
	}
	return s, nil
}

// randomPolicy draws a tenant policy.
func randomPolicy(rng *rand.Rand, lim Limits) TenantPolicy {
	var p TenantPolicy
	if rng.IntN(3) == 0 {
		p.MaxPages = 1 + rng.IntN(lim.PagesFor(lim.MaxContext)+2)
	}
	if rng.IntN(3) == 0 {
		p.MaxRunning = 1 + rng.IntN(3)
	}
	if rng.IntN(3) == 0 {
		p.MaxQueued = 1 + rng.IntN(4)
	}
	p.Priority = rng.IntN(2)
	return p
}

// reloadPolicy is a tenant configuration reload: one tenant's policy
// changes, sometimes with the id handed to another customer.
func (s *sim) reloadPolicy() {
	t := s.tenants[s.rng.IntN(len(s.tenants))]
	p := randomPolicy(s.rng, s.lim)
	p.Customer = s.policies[t].Customer
	if s.rng.IntN(3) == 0 {
		p.Customer = fmt.Sprint("customer-", s.iter)
	}
	s.policies[t] = p
	s.core.UpdatePolicies()
	s.logf("reloaded %s: %+v", t, p)
}

// length draws a prompt length or max_tokens from the boundary set.
func (s *sim) length() int {
	w, ps := s.lim.MaxContext, s.lim.PageSize
	set := []int{0, 1, ps - 1, ps, ps + 1, w - 1, w, w + 1, 2 * w, 1 + s.rng.IntN(w), 1 + s.rng.IntN(w/2+1), w/2 - 1, w / 3}
	return max(0, set[s.rng.IntN(len(set))])
}

// submit makes one request and offers it to admission and the core.
func (s *sim) submit() error {
	s.ids++
	var id request.ID
	for i := range 8 {
		id[i] = byte(s.ids >> (8 * i))
	}
	id[15] = 1
	owner := request.Owner{Tenant: s.tenants[s.rng.IntN(len(s.tenants))], ID: id}
	p := request.Params{Owner: owner, MaxTokens: s.length(), Priority: s.rng.IntN(2)}
	if s.rng.IntN(4) == 0 {
		// Short prompts often, so that many requests run at once.
		p.MaxTokens = 1 + s.rng.IntN(4)
	}
	n := s.length()
	if s.rng.IntN(3) == 0 && len(s.order) > 0 {
		// Reuse an earlier prompt: prefix-cache hits (same tenant) and
		// near misses (other tenants).
		prev := s.reqs[s.order[s.rng.IntN(len(s.order))]].params.Prompt
		p.Prompt = append([]int(nil), prev...)
	} else {
		p.Prompt = make([]int, n)
		for i := range p.Prompt {
			p.Prompt[i] = s.rng.IntN(s.vocab)
		}
	}
	if s.rng.IntN(4) == 0 {
		p.StopTokens = []int{s.rng.IntN(s.vocab)}
	}
	if s.rng.IntN(4) == 0 {
		p.CacheSalt = "salt"
	}
	if s.ids%5 == 0 {
		// Every fifth request scores its prompt (from its id, not the
		// generator, so that recorded seeds replay as before): chunks,
		// preemptions and aborts while its prompt logprobs accumulate.
		p.Sampling.PromptLogprobs, p.Sampling.PromptTopLogprobs = true, int(s.ids%3)
	}
	before := s.pool.Stats()
	a, err := s.lim.Admit(p)
	fits := len(p.Prompt) >= 1 && p.MaxTokens >= 1 && len(p.Prompt)+p.MaxTokens <= s.lim.MaxContext
	if (err == nil) != fits {
		return fmt.Errorf("admission of prompt %d + max_tokens %d (W %d): err %v, want accepted=%v", len(p.Prompt), p.MaxTokens, s.lim.MaxContext, err, fits)
	}
	if err == nil {
		err = s.core.Submit(a)
		if err != nil && !errors.Is(err, request.ErrOverloaded) && !errors.Is(err, request.ErrQuota) {
			return fmt.Errorf("submit %v: unexpected error %w", owner, err)
		}
	}
	if err != nil {
		if after := s.pool.Stats(); !statsEqual(before, after) {
			return fmt.Errorf("rejected %v changed the pool: %+v -> %+v", owner, before, after)
		}
		s.logf("rejected %v: %v", owner, err)
		return nil
	}
	s.logf("submitted %v prompt %d max %d", owner, len(p.Prompt), p.MaxTokens)
	s.reqs[owner] = &simRequest{params: p, history: append([]int(nil), p.Prompt...), accepted: true}
	if s.rng.IntN(10) < 3 {
		// 30% of accepted requests get a client abort at a random
		// later step: queued, prefilling, decoding or already done.
		at := s.iter + uint64(s.rng.IntN(12))
		s.aborts[at] = append(s.aborts[at], owner)
	}
	s.order = append(s.order, owner)
	return nil
}

func statsEqual(a, b kvcache.Stats) bool { return cmp.Equal(a, b) }

// abortSome aborts a random known request, and also tries to abort it as
// another tenant (which must be refused and change nothing).
func (s *sim) abortSome() error {
	if len(s.order) == 0 {
		return nil
	}
	return s.abort(s.order[s.rng.IntN(len(s.order))])
}

// abort aborts o as its tenant and as an intruder.
func (s *sim) abort(o request.Owner) error {
	r := s.reqs[o]
	other := request.Owner{Tenant: "intruder", ID: o.ID}
	if err := s.core.Abort(other); !errors.Is(err, request.ErrNotFound) {
		return fmt.Errorf("abort of %v by another tenant: %v, want ErrNotFound", o, err)
	}
	st, known := s.core.State(o)
	err := s.core.Abort(o)
	switch {
	case err == nil:
		if !known {
			return fmt.Errorf("abort of %v succeeded, but the core does not know it", o)
		}
		if !st.Terminal() {
			// From here nothing may report success for it.
			r.aborted = true
		}
		s.logf("aborted %v", o)
	case errors.Is(err, request.ErrNotFound):
		if r.results == 0 {
			return fmt.Errorf("abort of %v: not found, but no result was delivered", o)
		}
	default:
		return fmt.Errorf("abort of %v: %v", o, err)
	}
	return nil
}

// deliver checks what Ready handed out against the simulation's records.
func (s *sim) deliver(rd Ready) error {
	for _, t := range rd.Tokens {
		r := s.reqs[t.Owner]
		if r == nil {
			return fmt.Errorf("token for unknown owner %v", t.Owner)
		}
		if r.results > 0 {
			return fmt.Errorf("token %d for %v after its result", t.Index, t.Owner)
		}
		if want := len(r.history) - len(r.params.Prompt); t.Index != want {
			return fmt.Errorf("token for %v has index %d, want %d", t.Owner, t.Index, want)
		}
		if err := checkEchoPrompt(r.params, t); err != nil {
			return err
		}
		if want := echoNext(t.Owner, r.params.CacheSalt, r.history, s.vocab); t.ID != want {
			return fmt.Errorf("token %d for %v is %d, the owner-echo model over its own history gives %d: it read KV that is not its own",
				t.Index, t.Owner, t.ID, want)
		}
		r.history = append(r.history, t.ID)
	}
	for _, res := range rd.Results {
		r := s.reqs[res.Owner]
		if r == nil {
			return fmt.Errorf("result for unknown owner %v", res.Owner)
		}
		r.results++
		if r.results > 1 {
			return fmt.Errorf("second result for %v: %+v after %+v", res.Owner, res, r.result)
		}
		r.result = res
		if r.aborted && res.Reason.Success() {
			return fmt.Errorf("%v was aborted but reports success (%s)", res.Owner, res.Reason)
		}
		if res.Reason == request.FinishNone || (res.Reason.Success() != (res.Err == nil)) {
			return fmt.Errorf("result for %v: reason %s, err %v", res.Owner, res.Reason, res.Err)
		}
		got := len(r.history) - len(r.params.Prompt)
		if res.Reason == request.FinishLength && got != r.params.MaxTokens {
			return fmt.Errorf("%v finished for length after %d of %d tokens", res.Owner, got, r.params.MaxTokens)
		}
		if got > r.params.MaxTokens {
			return fmt.Errorf("%v got %d tokens, max_tokens %d", res.Owner, got, r.params.MaxTokens)
		}
		if res.Usage.PromptTokens != len(r.params.Prompt) {
			return fmt.Errorf("%v usage: %+v", res.Owner, res.Usage)
		}
		s.logf("result %v: %s %v", res.Owner, res.Reason, res.Err)
	}
	return nil
}

// step runs one scheduler iteration.
func (s *sim) step(arrivals bool) error {
	s.now = s.now.Add(time.Duration(s.rng.IntN(5)) * time.Millisecond)
	s.core.Tick(s.now)
	if arrivals {
		n := 0
		switch x := s.rng.IntN(20); {
		case x == 0:
			n = 10 + s.rng.IntN(20) // overload burst
		case x < 8:
			n = 1
		}
		for range n {
			if err := s.submit(); err != nil {
				return err
			}
		}
	}
	s.iter++
	for _, o := range s.aborts[s.iter] {
		if err := s.abort(o); err != nil {
			return err
		}
	}
	delete(s.aborts, s.iter)
	if s.rng.IntN(100) < 3 {
		if err := s.abortSome(); err != nil {
			return err
		}
	}
	if s.rng.IntN(40) == 0 {
		s.reloadPolicy()
	}
	rd := s.core.Ready()
	if err := s.deliver(rd); err != nil {
		return err
	}
	if rd.Batch != nil {
		// Aborts that land while the batch runs: the pages must stay
		// with the executor until Advance.
		if s.rng.IntN(8) == 0 {
			if err := s.abortSome(); err != nil {
				return err
			}
		}
		if s.rng.IntN(80) == 0 {
			s.reloadPolicy() // caps it lowers hold from the next step
		}
		outs, err := s.exec.Execute(nil, rd.Batch)
		if len(s.exec.foreign) > 0 {
			return fmt.Errorf("owner-echo model read foreign or unwritten KV: %v", s.exec.foreign)
		}
		if err := s.core.Advance(rd.Batch, outs, err); err != nil {
			return err
		}
		if s.rng.IntN(3) == 0 {
			if err := s.core.Advance(rd.Batch, outs, nil); !errors.Is(err, ErrBatch) {
				return fmt.Errorf("advancing the same batch twice: %v", err)
			}
		}
	}
	return s.core.CheckInvariants()
}

// run is one whole simulation: arrivals for a while, maybe a shutdown, then
// quiescence, and the end-state checks.
func (s *sim) run() error {
	steps := 150 + s.rng.IntN(150)
	shutdownAt := -1
	if s.rng.IntN(10) == 0 {
		shutdownAt = s.rng.IntN(steps)
	}
	for i := range steps {
		if i == shutdownAt {
			s.core.Shutdown()
			s.logf("shutdown")
		}
		if err := s.step(!s.core.shutdown); err != nil {
			return err
		}
	}
	// Quiescence: no arrivals, aborts continue; everything must end.
	for i := 0; !s.core.Idle(); i++ {
		if i > 20000 {
			return fmt.Errorf("no quiescence after %d steps: %+v", i, s.core.Stats())
		}
		if err := s.step(false); err != nil {
			return err
		}
	}
	for _, o := range s.order {
		if r := s.reqs[o]; r.results != 1 {
			return fmt.Errorf("%v ended with %d results", o, r.results)
		}
	}
	st := s.pool.Stats()
	if st.FreePages+st.CachedPages != st.TotalPages || st.OwnedPages != 0 || st.Sequences != 0 || st.QuarantinedPages != 0 || st.Violations != 0 {
		return fmt.Errorf("after quiescence the pool is not back to free: %+v", st)
	}
	if s.core.stats.AbortedButCompleted != 0 {
		return fmt.Errorf("%d requests completed after an abort", s.core.stats.AbortedButCompleted)
	}
	return nil
}

// runSeed runs one seed, turning an invariant panic into an error.
func runSeed(seed uint64, mut mutant) (s *sim, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	s, err = newSim(seed, mut)
	if err != nil {
		return nil, err
	}
	return s, s.run()
}

func simSeedCount() int {
	if *simSeeds > 0 {
		return *simSeeds
	}
	if v, err := strconv.Atoi(os.Getenv("PAGEWARDEN_SIM_SEEDS")); err == nil && v > 0 {
		return v
	}
	if testing.Short() {
		return 100
	}
	if raceEnabled {
		return 250
	}
	return 1000
}

// TestSimulation is the deterministic simulation: many tenants, random
// arrivals across the length boundaries, ~30% aborts (also while batches
// run), overload bursts, injected executor failures, shutdowns; invariants
// after every step; exactly one result per request; a free pool at the end.
// A failure prints the seed; -sim.seed=N replays it exactly.
func TestSimulation(t *testing.T) {
	first, n := *simFirst, uint64(simSeedCount())
	if *simSeed != 0 {
		first, n = *simSeed, 1
	}
	before := invariants.Count()
	for seed := first; seed < first+n; seed++ {
		s, err := runSeed(seed, mutantNone)
		if err != nil {
			if s != nil {
				for _, l := range s.log[max(0, len(s.log)-30):] {
					t.Log(l)
				}
			}
			t.Fatalf("seed %d: %v\nreplay: go test ./internal/sched -run 'TestSimulation$' -sim.seed=%d -v", seed, err, seed)
		}
	}
	if got := invariants.Count() - before; got != 0 {
		t.Fatalf("%d invariant violations reported", got)
	}
}

// TestSimulationReplays checks that a seed replays identically.
func TestSimulationReplays(t *testing.T) {
	for _, seed := range []uint64{3, 17, 99} {
		a, err1 := runSeed(seed, mutantNone)
		b, err2 := runSeed(seed, mutantNone)
		if err1 != nil || err2 != nil {
			t.Fatalf("seed %d: %v / %v", seed, err1, err2)
		}
		if fmt.Sprint(a.log) != fmt.Sprint(b.log) || a.core.Stats() != b.core.Stats() || a.exec.items != b.exec.items {
			t.Errorf("seed %d does not replay identically: %+v vs %+v", seed, a.core.Stats(), b.core.Stats())
		}
	}
}
