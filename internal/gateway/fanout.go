package gateway

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/pagewarden/pagewarden/internal/request"
)

// n > 1: parallel sampling by fan-out, as vLLM's V1 engine does it. The
// gateway submits n child requests, one per choice, each a whole request
// of the caller's tenant with the same prompt and cache salt. Child i
// samples with seed + i (uint64 arithmetic, wrapping), so that choice i of
// a seeded request is exactly the single-choice answer to the same request
// with seed + i, and greedy choices are all the same text, as OpenAI's are.
//
// The prompt is computed once: child 0 is submitted first, and its
// siblings only once child 0 has delivered its first token (or ended), so
// that its full prompt pages are in the tenant-scoped prefix cache and the
// siblings reuse them read-only instead of computing them again. The
// isolation rules that govern the prefix cache govern these pages: a hit
// needs the same tenant and cache salt, and every child is the caller's
// tenant by construction (the owner comes from authentication, as for a
// single choice).
//
// Admission charges the worst case for n sequences: prompt + n × max_tokens
// tokens and n × the KV pages of one, and refuses with a 400 naming n when
// n sequences can never fit the tenant's page budget. Unused tokens are
// given back at the end.
//
// The answer is all or nothing: if any child fails, its siblings are
// aborted and the client gets the error (an SSE error event once the
// stream started), never a 200 with choices missing. A client that hangs
// up aborts every child.

// maxN bounds n, as OpenAI's API does.
const maxN = 128

// fanout is the writer state that the choices of one response share.
type fanout struct {
	mu      sync.Mutex
	started bool // the response's header was written
}

// chargeN is charge for every choice of every prompt: each sequence's
// max_tokens (one for all, as the request names one), the pages of each
// prompt's sequences, and the tokens to charge. A batch that can never fit
// the tenant's page budget is refused with a 400 naming n (or prompt, for
// a batch of single choices).
func (s *Server) chargeN(prompts [][]int, promptParam string, g *genParams, budget int) (maxTokens int, pages []int, tokens, allPages int, e *apiError) {
	seqs := len(prompts) * g.n
	perSeq := budget
	if budget > 0 && g.maxTokens == 0 {
		// "As much as fits" is shared among the sequences.
		if perSeq = budget / seqs; perSeq == 0 {
			return 0, nil, 0, 0, s.nKVError(len(prompts), g.n, seqs, budget)
		}
	}
	// The longest prompt decides an omitted max_tokens, so that every
	// prompt's sequences fit the window.
	longest := 0
	for i, p := range prompts {
		if len(p) > len(prompts[longest]) {
			longest = i
		}
	}
	if maxTokens, _, e = s.charge(len(prompts[longest]), promptParam, g, perSeq); e != nil {
		if perSeq != budget && e.Code == "kv_page_limit_exceeded" {
			return 0, nil, 0, 0, s.nKVError(len(prompts), g.n, seqs, budget)
		}
		return 0, nil, 0, 0, e
	}
	pinned := *g
	pinned.maxTokens = maxTokens
	pages = make([]int, len(prompts))
	for i, p := range prompts {
		// Every prompt checked as its own request (length, one
		// sequence's pages); the sums stay far from overflow: at most
		// maxN sequences of at most a window each.
		if _, pages[i], e = s.charge(len(p), promptParam, &pinned, budget); e != nil {
			return 0, nil, 0, 0, e
		}
		tokens += len(p) + g.n*maxTokens
		allPages += g.n * pages[i]
	}
	if budget > 0 && allPages > budget {
		return 0, nil, 0, 0, s.nKVError(len(prompts), g.n, allPages, budget)
	}
	return maxTokens, pages, tokens, allPages, nil
}

func (s *Server) nKVError(prompts, n, pages, budget int) *apiError {
	param := "n"
	if n == 1 {
		param = "prompt"
	}
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "kv_page_limit_exceeded", Param: param,
		Message: fmt.Sprintf("%d prompt(s) × 'n' = %d choices need up to %d KV pages in all (%d tokens per page) but your tenant may hold at most %d; lower n or max_tokens, or send fewer prompts.",
			prompts, n, pages, s.limits.PageSize, budget)}
}

// generateN is generate for several choices: n per prompt, choice
// k*n + i being prompt k's i-th.
func (c *call) generateN(prompts [][]int, promptParam string, g genParams, newResp func(index int) responder) *apiError {
	s := c.s
	if e := s.checkTokenIDs(&g); e != nil {
		return e
	}
	if e := s.checkConstraint(&g); e != nil {
		return e
	}
	maxTokens, _, tokens, allPages, e := s.chargeN(prompts, promptParam, &g, c.tenant.Limits.MaxKVPages)
	if e != nil {
		return e
	}
	for _, p := range prompts {
		c.promptTokens += len(p)
	}
	grant, e := c.acquire(tokens, allPages)
	if e != nil {
		return e
	}
	used := c.promptTokens
	defer func() { grant.Release(s.now(), used) }()

	// One HTTP request, however many choices: MaxInFlight bounds the
	// gateway's handlers, the scheduler bounds sequences.
	if n := s.inflight.Add(1); s.cfg.MaxInFlight > 0 && int(n) > s.cfg.MaxInFlight {
		s.inflight.Add(-1)
		return errOverloaded
	}
	defer s.inflight.Add(-1)

	c.id = request.NewID()
	// The request's seed; choice i of each prompt draws with seed + i.
	c.w.Header().Set("X-Seed", strconv.FormatInt(int64(g.sampling.Seed), 10))
	s.m.promptTokens.WithLabelValues(c.tenant.ID).Add(float64(c.promptTokens))
	gauge := s.m.inFlight.WithLabelValues(c.tenant.ID)
	gauge.Inc()
	defer gauge.Dec()

	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	fan := &fanout{}
	total := len(prompts) * g.n
	kids := make([]*call, total)
	params := make([]request.Params, total)
	resps := make([]responder, total)
	counts := make([]int, total)
	var (
		errMu    sync.Mutex
		firstErr *apiError
		failed   *call
	)
	fail := func(k *call, e *apiError) {
		errMu.Lock()
		if firstErr == nil {
			firstErr, failed = e, k
		}
		errMu.Unlock()
		cancel() // abort the siblings
	}
	for j := range kids {
		prompt, i := prompts[j/g.n], j%g.n
		k := &call{}
		*k = *c
		k.ctx, k.fan, k.index, k.sent, k.sentLP, k.promptTokens, k.prompt = ctx, fan, j, nil, nil, len(prompt), prompt
		id := c.id
		if j > 0 {
			id = request.NewID()
		}
		// Every child is the caller's tenant: the owner comes from
		// authentication, never from the request.
		params[j] = request.Params{
			Owner: request.Owner{Tenant: request.Tenant(c.tenant.ID), ID: id}, Prompt: prompt, MaxTokens: maxTokens,
			Sampling: g.sampling, StopTokens: g.stopTokens, IgnoreEOS: g.ignoreEOS,
			CacheSalt: mutantNamespace(c.tenant.CacheNamespace) + "|" + g.cacheSalt, Priority: c.tenant.Limits.Priority,
		}
		params[j].Sampling.Seed = g.sampling.Seed + uint64(i) // wraps, as documented
		k.audited = s.audit.pick(&params[j].Sampling)
		k.sampling = params[j].Sampling
		kids[j], resps[j] = k, newResp(j)
	}
	var wg sync.WaitGroup
	run := func(j int) {
		defer wg.Done()
		k := kids[j]
		st, err := s.backend.Submit(ctx, params[j])
		if err != nil {
			if ctx.Err() != nil {
				k.status, k.finish, k.err = statusClientClosed, "client_closed", err
				return
			}
			fail(k, backendError(fmt.Errorf("submit choice %d: %w", j, err)))
			return
		}
		n, e := k.relay(st, params[j].Owner, &g, resps[j])
		counts[j] = n
		switch {
		case e != nil:
			fail(k, e)
		case k.status == statusClientClosed:
			cancel() // the client is gone, or this choice could not be written
		}
	}
	for p := range prompts {
		// Each prompt's first choice computes the prompt; its siblings
		// start once it delivered its first token (or ended), when its
		// full prompt pages are in the prefix cache.
		lead := p * g.n
		first := make(chan struct{})
		var once sync.Once
		signal := func() { once.Do(func() { close(first) }) }
		kids[lead].onFirst = signal
		wg.Add(2)
		go func() {
			defer signal() // ended without a token: release the wait
			run(lead)
		}()
		go func() {
			defer wg.Done()
			<-first
			if ctx.Err() != nil {
				return
			}
			for j := lead + 1; j < lead+g.n; j++ {
				wg.Add(1)
				go run(j)
			}
		}()
	}
	wg.Wait()

	c.started = fan.started
	sum := 0
	for _, n := range counts {
		sum += n
	}
	used += sum
	if sum > 0 {
		s.m.completionTokens.WithLabelValues(c.tenant.ID).Add(float64(sum))
	}
	c.completionTokens = sum
	c.ttft = kids[0].ttft
	// What the client is spared: each prompt's first choice's cache hit
	// (its siblings' hits are the fan-out's own sharing).
	c.cachedTokens = 0
	for p := range prompts {
		c.cachedTokens += kids[p*g.n].cachedTokens
	}
	if firstErr != nil {
		c.finish = failed.finish
		return firstErr
	}
	c.outputText = kids[0].outputText
	for _, k := range kids {
		if k.finish == "" && k.status == 0 {
			// Never submitted: a first choice ended the request's
			// context before its siblings started (a hang-up, or the
			// drain deadline after it finished).
			if s.stop.Err() != nil {
				return backendError(ErrDraining)
			}
			c.status, c.finish, c.err = statusClientClosed, "client_closed", c.ctx.Err()
			return nil
		}
		if k.status == statusClientClosed {
			c.status, c.finish, c.err = statusClientClosed, "client_closed", k.err
			return nil
		}
		if k.finish != "stop" && k.finish != "length" {
			// Every choice either failed, was closed or finished: a
			// choice in no state is our bug, and no 200 goes out for it.
			return internalError(fmt.Errorf("choice %d ended without an outcome (%q)", k.index, k.finish))
		}
	}
	c.finish = kids[0].finish
	choices := make([]any, total)
	for i, k := range kids {
		choices[i] = k.choiceOut
	}
	if g.keep > 0 {
		choices = bestOf(choices, g.n, g.keep)
	}
	u := usageJSON{PromptTokens: c.promptTokens, CompletionTokens: sum, TotalTokens: c.promptTokens + sum,
		PromptTokensDetails: &promptDetails{CachedTokens: c.cachedTokens}}
	if err := resps[0].end(c, &g, choices, u); err != nil {
		c.status, c.finish, c.err = statusClientClosed, "client_closed", err
		return nil
	}
	for i, k := range kids {
		if k.audited {
			s.audit.queue(params[i], k.sent, k.sentLP, k.finish)
		}
	}
	return nil
}

// bestOf keeps, of each prompt's per candidates (completion choices, in
// order), the keep of highest cumulative log-probability (ties: the
// earlier candidate), in that order, numbered choice k*keep + i as n
// choices would be: vLLM's best_of.
func bestOf(cands []any, per, keep int) []any {
	out := make([]any, 0, len(cands)/per*keep)
	for lo := 0; lo < len(cands); lo += per {
		group := make([]completionChoice, per)
		for i := range group {
			group[i] = cands[lo+i].(completionChoice)
		}
		slices.SortStableFunc(group, func(a, b completionChoice) int { return cmp.Compare(b.cumLogprob, a.cumLogprob) })
		for i := range keep {
			ch := group[i]
			ch.Index = lo/per*keep + i
			out = append(out, ch)
		}
	}
	return out
}
