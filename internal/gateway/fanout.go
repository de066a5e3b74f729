package gateway

import (
	"context"
	"fmt"
	"net/http"
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

// chargeN is charge for n sequences. It returns the max_tokens each runs
// with and the pages one of them may hold.
func (s *Server) chargeN(prompt int, promptParam string, g *genParams, budget int) (maxTokens, pages int, e *apiError) {
	perSeq := budget
	if budget > 0 && g.maxTokens == 0 {
		// "As much as fits" is shared among the n sequences.
		if perSeq = budget / g.n; perSeq == 0 {
			return 0, 0, nKVError(g.n, 1, budget)
		}
	}
	if maxTokens, pages, e = s.charge(prompt, promptParam, g, perSeq); e != nil {
		if perSeq != budget && e.Code == "kv_page_limit_exceeded" {
			return 0, 0, nKVError(g.n, pages, budget)
		}
		return 0, 0, e
	}
	// pages is at most the window's pages and n at most maxN: no overflow.
	if budget > 0 && g.n*pages > budget {
		return 0, 0, nKVError(g.n, pages, budget)
	}
	return maxTokens, pages, nil
}

func nKVError(n, pages, budget int) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "kv_page_limit_exceeded", Param: "n",
		Message: fmt.Sprintf("'n' = %d choices need up to %d KV pages each (%d in all) but your tenant may hold at most %d; lower n or max_tokens.",
			n, pages, n*pages, budget)}
}

// generateN is generate for n > 1 choices.
func (c *call) generateN(prompt []int, promptParam string, g genParams, newResp func(index int) responder) *apiError {
	s := c.s
	if e := s.checkTokenIDs(&g); e != nil {
		return e
	}
	if e := s.checkConstraint(&g); e != nil {
		return e
	}
	maxTokens, pages, e := s.chargeN(len(prompt), promptParam, &g, c.tenant.Limits.MaxKVPages)
	if e != nil {
		return e
	}
	c.promptTokens = len(prompt)
	grant, e := c.acquire(len(prompt)+g.n*maxTokens, g.n*pages)
	if e != nil {
		return e
	}
	used := len(prompt)
	defer func() { grant.Release(s.now(), used) }()

	// One HTTP request, however many choices: MaxInFlight bounds the
	// gateway's handlers, the scheduler bounds sequences.
	if n := s.inflight.Add(1); s.cfg.MaxInFlight > 0 && int(n) > s.cfg.MaxInFlight {
		s.inflight.Add(-1)
		return errOverloaded
	}
	defer s.inflight.Add(-1)

	c.id = request.NewID()
	// The request's seed; choice i draws with seed + i.
	c.w.Header().Set("X-Seed", strconv.FormatInt(int64(g.sampling.Seed), 10))
	s.m.promptTokens.WithLabelValues(c.tenant.ID).Add(float64(len(prompt)))
	gauge := s.m.inFlight.WithLabelValues(c.tenant.ID)
	gauge.Inc()
	defer gauge.Dec()

	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	fan := &fanout{}
	kids := make([]*call, g.n)
	params := make([]request.Params, g.n)
	resps := make([]responder, g.n)
	counts := make([]int, g.n)
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
	first := make(chan struct{})
	var firstOnce sync.Once
	signal := func() { firstOnce.Do(func() { close(first) }) }
	for i := range kids {
		k := &call{}
		*k = *c
		k.ctx, k.fan, k.index, k.sent = ctx, fan, i, nil
		id := c.id
		if i > 0 {
			id = request.NewID()
		}
		// Every child is the caller's tenant: the owner comes from
		// authentication, never from the request.
		params[i] = request.Params{
			Owner: request.Owner{Tenant: request.Tenant(c.tenant.ID), ID: id}, Prompt: prompt, MaxTokens: maxTokens,
			Sampling: g.sampling, StopTokens: g.stopTokens, IgnoreEOS: g.ignoreEOS,
			CacheSalt: c.tenant.CacheNamespace + "|" + g.cacheSalt, Priority: c.tenant.Limits.Priority,
		}
		params[i].Sampling.Seed = g.sampling.Seed + uint64(i) // wraps, as documented
		kids[i], resps[i] = k, newResp(i)
	}
	kids[0].onFirst = signal
	var wg sync.WaitGroup
	run := func(i int) {
		defer wg.Done()
		if i == 0 {
			defer signal() // ended without a token: release the siblings' wait
		}
		k := kids[i]
		st, err := s.backend.Submit(ctx, params[i])
		if err != nil {
			if ctx.Err() != nil {
				k.status, k.finish, k.err = statusClientClosed, "client_closed", err
				return
			}
			fail(k, backendError(fmt.Errorf("submit choice %d: %w", i, err)))
			return
		}
		n, e := k.relay(st, params[i].Owner, &g, resps[i])
		counts[i] = n
		switch {
		case e != nil:
			fail(k, e)
		case k.status == statusClientClosed:
			cancel() // the client is gone, or this choice could not be written
		}
	}
	wg.Add(1)
	go run(0)
	<-first
	if ctx.Err() == nil {
		for i := 1; i < g.n; i++ {
			wg.Add(1)
			go run(i)
		}
	}
	wg.Wait()

	c.started = fan.started
	total := 0
	for _, n := range counts {
		total += n
	}
	used += total
	if total > 0 {
		s.m.completionTokens.WithLabelValues(c.tenant.ID).Add(float64(total))
	}
	c.completionTokens = total
	c.ttft, c.cachedTokens = kids[0].ttft, kids[0].cachedTokens
	if firstErr != nil {
		c.finish = failed.finish
		return firstErr
	}
	c.outputText = kids[0].outputText
	for _, k := range kids {
		if k.finish == "" && k.status == 0 {
			// Never submitted: child 0 ended the request's context
			// before its siblings started (a hang-up, or the drain
			// deadline after child 0 finished).
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
	choices := make([]any, g.n)
	for i, k := range kids {
		choices[i] = k.choiceOut
	}
	u := usageJSON{PromptTokens: c.promptTokens, CompletionTokens: total, TotalTokens: c.promptTokens + total,
		PromptTokensDetails: &promptDetails{CachedTokens: c.cachedTokens}}
	if err := resps[0].end(c, &g, choices, u); err != nil {
		c.status, c.finish, c.err = statusClientClosed, "client_closed", err
		return nil
	}
	for i, k := range kids {
		s.audit.maybe(params[i], k.sent)
	}
	return nil
}
