package gateway

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pagewarden/pagewarden/internal/gateway/chattmpl"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/request"
)

func (s *Server) chatCompletions(c *call) *apiError {
	body, e := c.readBody()
	if e != nil {
		return e
	}
	g, msgs, addGen, e := parseChat(body)
	if e != nil {
		return e
	}
	if e := c.checkModel(g.model); e != nil {
		return e
	}
	if g.toolAuto != nil {
		if g.toolSyntax = callSyntax(s.backend.ChatTemplate()); g.toolSyntax == "" {
			e := badRequest("tool_choice", "'tool_choice' \"auto\" (the default when 'tools' are given) needs calls parsed out of the model's text, and this model's chat template does not teach a call syntax this server parses (Hermes' <tool_call>, Llama 3's JSON, Mistral's [TOOL_CALLS]). Send \"required\", {\"type\": \"function\", \"function\": {\"name\": ...}} or \"none\".")
			e.Code = "unsupported_parameter"
			return e
		}
	}
	ids, text, e := s.chatPrompt(msgs, addGen, g.tools)
	if e != nil {
		return e
	}
	c.promptText = text
	return c.generate([][]int{ids}, "messages", g, func(i int) responder { return &chatResponder{index: i} })
}

func (s *Server) completions(c *call) *apiError {
	body, e := c.readBody()
	if e != nil {
		return e
	}
	g, ps, e := parseCompletion(body)
	if e != nil {
		return e
	}
	if e := c.checkModel(g.model); e != nil {
		return e
	}
	fim, e := s.fillInTheMiddle(g.suffix)
	if e != nil {
		return e
	}
	for _, p := range ps {
		if fim != nil && p.hasIDs {
			return badRequest("suffix", "'suffix' with a prompt of token ids: send the prompt as text, so that the fill-in-the-middle markers go around it.")
		}
	}
	prompts := make([][]int, len(ps))
	texts := make([]string, len(ps))
	for k, p := range ps {
		if p.hasIDs {
			// Ids out of the vocabulary are the client's mistake, not ours.
			text, err := s.backend.Detokenize(p.ids)
			if err != nil {
				e := badRequest("prompt", "'prompt' holds a token id that is not in the model's vocabulary.")
				e.Err = err
				return e
			}
			prompts[k], texts[k] = p.ids, text
			continue
		}
		ids, err := s.backend.Tokenize(p.text, true, true)
		if fim != nil {
			ids, err = fim(p.text)
		}
		if err != nil {
			return internalError(fmt.Errorf("tokenize prompt: %w", err))
		}
		prompts[k], texts[k] = ids, p.text
		c.promptText += p.text
	}
	return c.generate(prompts, "prompt", g, func(i int) responder {
		r := &completionResponder{index: i}
		if g.echo {
			r.echo = texts[i/g.n] // choice i answers prompt i/n (candidate i, with best_of)
		}
		return r
	})
}

// chatPrompt renders messages with the model's chat template (or the
// ChatML fallback, see chattmpl.Fallback) and tokenizes the result.
func (s *Server) chatPrompt(msgs []message, addGen bool, tools []any) ([]int, string, *apiError) {
	in := chattmpl.Input{AddGenerationPrompt: addGen, Messages: make([]chattmpl.Message, len(msgs)), Tools: tools}
	for i, m := range msgs {
		in.Messages[i] = chattmpl.Message{Role: m.Role, Content: m.Content, ContentNull: m.ContentNull,
			ToolCalls: m.ToolCalls, ToolCallID: m.ToolCallID, Name: m.Name}
	}
	if id := s.backend.BOS(); id >= 0 {
		in.BOSToken = string(s.backend.TokenPiece(id))
	}
	if id := s.backend.EOS(); id >= 0 {
		in.EOSToken = string(s.backend.TokenPiece(id))
	}
	var text string
	if s.tmpl != nil {
		var err error
		text, err = s.tmpl.RenderChat(in)
		var raised *chattmpl.RaisedError
		switch {
		case errors.As(err, &raised):
			e := badRequest("messages", "The model's chat template rejected the messages: %s", truncate(raised.Msg, 200))
			e.Err = err
			return nil, "", e
		case err != nil:
			// A template we parsed but cannot run (an unsupported
			// feature, a resource limit): fall back rather than fail
			// every chat request, and say so in the log.
			s.log.Warn("chat template failed; using the fallback format", "err", err)
			text = chattmpl.Fallback(in)
		}
	} else {
		text = chattmpl.Fallback(in)
	}
	// The template usually writes bos_token itself; tokenizing with
	// special tokens parsed and added would then give two BOS in a row.
	ids, err := s.backend.Tokenize(text, true, true)
	if err != nil {
		return nil, "", internalError(fmt.Errorf("tokenize chat prompt: %w", err))
	}
	if bos := s.backend.BOS(); bos >= 0 && len(ids) >= 2 && ids[0] == bos && ids[1] == bos {
		ids = ids[1:]
	}
	return ids, text, nil
}

// checkLength applies the served limits (I5) before anything is submitted:
// a request that does not fit is refused with the numbers and no page is
// ever allocated for it. It returns the max_tokens to run with. promptParam
// names the field the prompt came from. Every comparison is written so that
// no sum of client numbers is formed before it is known to fit.
func (s *Server) checkLength(prompt int, promptParam string, g *genParams) (int, *apiError) {
	w := s.limits.MaxContext
	maxTokens := g.maxTokens
	if prompt == 0 {
		return 0, badRequest(promptParam, "The prompt is empty.")
	}
	if prompt > s.limits.MaxPromptTokens || prompt >= w {
		return 0, contextLengthError(promptParam, w, prompt, max(maxTokens, 1))
	}
	if maxTokens == 0 {
		return w - prompt, nil
	}
	if maxTokens > w {
		e := badRequest(g.maxParam, "'%s' is too large: %d. This model's maximum context length is %d tokens, prompt included.", g.maxParam, maxTokens, w)
		e.Code = "context_length_exceeded"
		return 0, e
	}
	if maxTokens > w-prompt {
		return 0, contextLengthError(promptParam, w, prompt, maxTokens)
	}
	return maxTokens, nil
}

// acquire admits the call under its tenant's quota, charging tokens and
// pages; the caller releases the grant with what it used.
func (c *call) acquire(tokens, pages int) (*tenants.Grant, *apiError) {
	grant, err := c.s.reg.Acquire(c.s.now(), c.tenant.ID, tokens, pages)
	if err != nil {
		var qe *tenants.QuotaError
		if errors.As(err, &qe) {
			return nil, &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
				Message:    fmt.Sprintf("Rate limit reached for your API key (%s); retry after %d s.", qe.Limit, int(qe.RetryAfter/time.Second)),
				RetryAfter: qe.RetryAfter, Err: err}
		}
		if errors.Is(err, tenants.ErrCharge) {
			return nil, internalError(err) // our arithmetic, never the client's
		}
		return nil, errUnauthorized // tenant removed by a reload a moment ago
	}
	return grant, nil
}

// charge decides what a request of prompt tokens costs before it is
// admitted: the max_tokens it runs with and the worst-case KV pages it
// holds, refusing it if it can never fit the window or the tenant's page
// budget (0: none). The results are bounded: maxTokens in [1, window) and
// pages at most the window's pages, so the quota arithmetic that follows
// cannot overflow.
func (s *Server) charge(prompt int, promptParam string, g *genParams, budget int) (maxTokens, pages int, e *apiError) {
	maxTokens, e = s.checkLength(prompt, promptParam, g)
	if e != nil {
		return 0, 0, e
	}
	ps := s.limits.PageSize
	if ps <= 0 {
		return maxTokens, 0, nil
	}
	if g.maxTokens == 0 && budget > 0 {
		// An omitted max_tokens means "as much as fits": within the
		// tenant's page budget as well as the window. budget*ps cannot
		// overflow usefully past the window, so compare before multiplying.
		if budget <= s.limits.MaxContext/ps {
			maxTokens = max(1, min(maxTokens, budget*ps-prompt+1))
		}
	}
	pages = request.MaxKVPages(prompt, maxTokens, ps)
	if budget > 0 && pages > budget {
		// Never satisfiable, so not a retryable 429: the same rule the
		// scheduler applies (one formula, request.MaxKVPages).
		return 0, 0, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "kv_page_limit_exceeded", Param: g.maxParam,
			Message: fmt.Sprintf("This request needs up to %d KV pages (%d prompt tokens + %d max_tokens, %d tokens per page) but your tenant may hold at most %d; lower max_tokens or shorten the prompt.",
				pages, prompt, maxTokens, ps, budget)}
	}
	return maxTokens, pages, nil
}

// responder writes one endpoint's response shape, streaming or not.
type responder interface {
	// delta adds generated text. Streaming writes it at once (starting
	// the response on first use); non-streaming keeps it.
	delta(c *call, g *genParams, text string) error
	// finish ends a successful response: the only place a 200 body or a
	// [DONE] is written. It is choice followed by end.
	finish(c *call, g *genParams, reason string, u usageJSON) error
	// choice ends this responder's choice: streaming writes what is left
	// of it and its finish chunk; otherwise it returns the choice's
	// object for the body.
	choice(c *call, g *genParams, reason string) (any, error)
	// end ends the response once every choice has: the body with
	// choices (non-streaming), or the usage chunk and [DONE].
	end(c *call, g *genParams, choices []any, u usageJSON) error
	// logprob adds a shown token's log-probabilities (g.logprobs), before
	// the delta that carries its text.
	logprob(c *call, g *genParams, id int, lp *request.Logprobs)
	// promptLogprobs takes the prompt's log-probabilities (entry i is
	// prompt token i+1's), which come with the first token when the
	// request asked for them (echo with logprobs, prompt_logprobs).
	promptLogprobs(c *call, g *genParams, lps []request.Logprobs)
}

// generate admits, submits and relays one request. Errors before the
// first byte are returned (an HTTP error); later ones are written as an
// SSE error event by c.fail.
func (c *call) generate(prompts [][]int, promptParam string, g genParams, newResp func(index int) responder) *apiError {
	s := c.s
	if g.n > 1 || len(prompts) > 1 {
		return c.generateN(prompts, promptParam, g, newResp)
	}
	prompt, resp := prompts[0], newResp(0)
	if e := s.checkTokenIDs(&g); e != nil {
		return e
	}
	if e := s.checkConstraint(&g); e != nil {
		return e
	}
	maxTokens, pages, e := s.charge(len(prompt), promptParam, &g, c.tenant.Limits.MaxKVPages)
	if e != nil {
		return e
	}
	c.promptTokens, c.prompt = len(prompt), prompt
	grant, e := c.acquire(len(prompt)+maxTokens, pages)
	if e != nil {
		return e
	}
	used := len(prompt)
	defer func() { grant.Release(s.now(), used) }()

	if n := s.inflight.Add(1); s.cfg.MaxInFlight > 0 && int(n) > s.cfg.MaxInFlight {
		s.inflight.Add(-1)
		return errOverloaded
	}
	defer s.inflight.Add(-1)

	c.id = request.NewID()
	owner := request.Owner{Tenant: request.Tenant(c.tenant.ID), ID: c.id}
	p := request.Params{
		Owner: owner, Prompt: prompt, MaxTokens: maxTokens, Sampling: g.sampling,
		StopTokens: g.stopTokens, IgnoreEOS: g.ignoreEOS,
		// The tenant's namespace (fixed length) comes first, so the
		// client's salt only ever subdivides the tenant's own cache.
		CacheSalt: mutantNamespace(c.tenant.CacheNamespace) + "|" + g.cacheSalt, Priority: c.tenant.Limits.Priority,
	}
	// An answer picked for the replay audit records each token's
	// logprobs as it goes out, so the engine computes them for it.
	c.audited = s.audit.pick(&p.Sampling)
	c.sampling = p.Sampling
	// The effective seed, as the signed integer the API's seed takes, so
	// that a client can replay an unseeded answer.
	c.w.Header().Set("X-Seed", strconv.FormatInt(int64(g.sampling.Seed), 10))
	s.m.promptTokens.WithLabelValues(c.tenant.ID).Add(float64(len(prompt)))
	gauge := s.m.inFlight.WithLabelValues(c.tenant.ID)
	gauge.Inc()
	defer gauge.Dec()

	st, err := s.backend.Submit(c.ctx, p)
	if err != nil {
		if c.ctx.Err() != nil {
			// The client hung up before the request started: nobody to
			// answer, and not a server failure.
			c.status, c.finish, c.err = statusClientClosed, "client_closed", err
			return nil
		}
		return backendError(fmt.Errorf("submit: %w", err))
	}
	count, e := c.relay(st, owner, &g, resp)
	used += count
	if count > 0 {
		s.m.completionTokens.WithLabelValues(c.tenant.ID).Add(float64(count))
	}
	c.completionTokens = count
	if e == nil && c.audited && c.status != statusClientClosed && (c.finish == "stop" || c.finish == "length") {
		s.audit.queue(p, c.sent, c.sentLP, c.finish)
	}
	return e
}

// checkConstraint refuses what an output constraint cannot be combined
// with: it ends the value by an end-of-generation token, which the model
// must have and ignore_eos would skip.
func (s *Server) checkConstraint(g *genParams) *apiError {
	if g.sampling.Grammar == nil {
		return nil
	}
	if s.backend.EOS() < 0 {
		return unsupported(g.constraint, fmt.Sprintf("'%s' with a model that has no end-of-sequence token", g.constraint))
	}
	if g.ignoreEOS {
		return badRequest("ignore_eos", "'ignore_eos' cannot be combined with '%s': a structured output ends with the end-of-sequence token once the value is complete.", g.constraint)
	}
	return nil
}

// checkTokenIDs refuses token ids the client named (logit_bias keys,
// stop_token_ids) that are not in the model's vocabulary.
func (s *Server) checkTokenIDs(g *genParams) *apiError {
	ids := make([]int, 0, len(g.sampling.LogitBias))
	for _, b := range g.sampling.LogitBias {
		ids = append(ids, b.Token)
	}
	for _, f := range []struct {
		param string
		ids   []int
	}{{"logit_bias", ids}, {"stop_token_ids", g.stopTokens}} {
		if _, err := s.backend.Detokenize(f.ids); err != nil {
			e := badRequest(f.param, "'%s' holds a token id that is not in the model's vocabulary.", f.param)
			e.Err = err
			return e
		}
	}
	return nil
}

// relay copies tokens from st to the client, checking every token's owner
// against the connection's (I10), until the request is terminal. It
// returns the number of tokens received for this request.
func (c *call) relay(st Stream, owner request.Owner, g *genParams, resp responder) (int, *apiError) {
	s := c.s
	text := &textStream{stops: g.stop}
	tokens := st.Tokens()
	count := 0
	var last time.Time
	// abortWait ends the request at the backend and waits for its
	// terminal result, discarding any tokens still in flight (they are
	// never written).
	abortWait := func() request.Result {
		if err := s.backend.Abort(owner.Tenant, owner.ID); err != nil && !errors.Is(err, request.ErrNotFound) {
			s.log.Warn("abort failed", "id", owner.ID.String(), "err", err)
		}
		for range tokens {
		}
		return st.Result()
	}
	mismatch := func(what string, got request.Owner) *apiError {
		s.m.ownerMismatch.Inc()
		return internalError(fmt.Errorf("%w: %s for %v on the connection of %v", ErrOwnerMismatch, what, got, owner))
	}
	// clientGone ends a request whose client left (or whose drain
	// deadline passed): the request is aborted at the backend, and there
	// is nobody to answer.
	clientGone := func() *apiError {
		res := abortWait()
		c.cachedTokens = res.Usage.CachedTokens
		if s.stop.Err() != nil {
			return backendError(ErrDraining)
		}
		// 499 is nginx's "client closed request", used only in logs and
		// metrics.
		c.status, c.finish, c.err = statusClientClosed, "client_closed", c.ctx.Err()
		return nil
	}
	stopped := false
loop:
	for {
		select {
		case <-c.ctx.Done():
			return count, clientGone()
		case tok, ok := <-tokens:
			if !ok {
				if c.ctx.Err() != nil {
					// A backend closes the stream when the request's
					// context ends, and select may see that before the
					// context itself: the client left; the tokens it
					// did not take are not a broken stream.
					return count, clientGone()
				}
				break loop
			}
			if tok.Owner != owner {
				abortWait()
				return count, mismatch("token", tok.Owner)
			}
			if tok.Index != count {
				s.m.badStream.Inc()
				abortWait()
				return count, internalError(fmt.Errorf("%w: token index %d, expected %d", ErrBadStream, tok.Index, count))
			}
			if err := checkTokenLogprobs(tok, c.sampling); err != nil {
				s.m.badStream.Inc()
				abortWait()
				return count, internalError(err)
			}
			if err := checkPromptLogprobs(tok, c.sampling, c.promptTokens); err != nil {
				s.m.badStream.Inc()
				abortWait()
				return count, internalError(err)
			}
			if tok.Prompt != nil && (g.echoLogprobs || g.promptLogprobs) {
				resp.promptLogprobs(c, g, tok.Prompt)
			}
			now := s.now()
			if count == 0 {
				c.ttft = now.Sub(c.start)
				if c.index == 0 {
					// One observation per request: a sibling's first
					// token is not the client's first.
					s.m.ttft.WithLabelValues(c.tenant.ID).Observe(c.ttft.Seconds())
				}
				if c.onFirst != nil {
					c.onFirst()
				}
			} else {
				s.m.interToken.WithLabelValues(c.tenant.ID).Observe(now.Sub(last).Seconds())
			}
			last = now
			count++
			if c.audited {
				c.sent = append(c.sent, tok.ID)
				c.sentLP = append(c.sentLP, tok.Logprobs)
			}
			if tok.Logprobs != nil {
				// best_of ranks candidates by it (vLLM's
				// cumulative_logprob: every generated token).
				c.cumLogprob += float64(tok.Logprobs.Logprob)
			}
			// The text of an end-of-generation token is never shown
			// (with ignore_eos neither), nor that of a stop token id,
			// as vLLM leaves it out.
			if s.backend.IsEOG(tok.ID) || slices.Contains(g.stopTokens, tok.ID) {
				continue
			}
			if g.logprobs {
				resp.logprob(c, g, tok.ID, tok.Logprobs)
			}
			out, stop := text.push(s.backend.TokenPiece(tok.ID))
			if out != "" {
				if err := resp.delta(c, g, out); err != nil {
					abortWait()
					c.status, c.finish, c.err = statusClientClosed, "client_closed", err
					return count, nil
				}
			}
			if stop {
				stopped = true
				abortWait()
				break loop
			}
		}
	}
	res := mutantResult(st.Result())
	if res.Owner != owner {
		return count, mismatch("result", res.Owner)
	}
	c.cachedTokens = res.Usage.CachedTokens
	reason := "stop"
	switch {
	case stopped && !res.Reason.Success() && !(res.Reason == request.FinishAbort && errors.Is(res.Err, request.ErrAborted)):
		// The gateway ended it on a stop sequence, so the only acceptable
		// outcomes are a success that raced the abort, or the plain abort
		// we asked for. Anything else (an internal error, a violation
		// found in the same step) means the text cannot be vouched for.
		c.finish = res.Reason.String()
		return count, backendError(fmt.Errorf("result after a stop sequence: %w", cmp.Or(res.Err, request.ErrInternal)))
	case stopped:
		// The text up to the stop sequence is complete.
	case !res.Reason.Success():
		err := res.Err
		if err == nil {
			err = fmt.Errorf("terminal reason %v without error", res.Reason)
			if res.Reason == request.FinishAbort {
				err = request.ErrAborted
			}
		}
		c.finish = res.Reason.String()
		if res.Reason == request.FinishAbort && s.stop.Err() != nil {
			// The drain deadline passed and Shutdown aborted it; the
			// abort may reach us as the result rather than through our
			// context, but the cause is the same.
			return count, backendError(fmt.Errorf("%w: result: %w", ErrDraining, err))
		}
		return count, backendError(fmt.Errorf("result: %w", err))
	case res.Err != nil:
		s.m.abortedCompleted.Inc()
		return count, internalError(fmt.Errorf("%w: result %v carries error %v", ErrBadStream, res.Reason, res.Err))
	case res.Usage.CompletionTokens != count,
		res.Usage.PromptTokens != 0 && res.Usage.PromptTokens != c.promptTokens:
		s.m.badStream.Inc()
		return count, internalError(fmt.Errorf("%w: usage %+v, delivered %d tokens for a %d-token prompt",
			ErrBadStream, res.Usage, count, c.promptTokens))
	default:
		if res.Reason == request.FinishLength {
			reason = "length"
		}
		if tail := text.finish(); tail != "" {
			if err := resp.delta(c, g, tail); err != nil {
				c.status, c.finish, c.err = statusClientClosed, "client_closed", err
				return count, nil
			}
		}
	}
	c.finish = reason
	if c.fan != nil {
		// One choice of several: generateN writes the end.
		ch, err := resp.choice(c, g, reason)
		if err != nil {
			c.status, c.finish, c.err = statusClientClosed, "client_closed", err
		}
		c.choiceOut = ch
		return count, nil
	}
	u := usageJSON{PromptTokens: c.promptTokens, CompletionTokens: count, TotalTokens: c.promptTokens + count,
		PromptTokensDetails: &promptDetails{CachedTokens: c.cachedTokens}}
	if err := resp.finish(c, g, reason, u); err != nil {
		c.status, c.err = statusClientClosed, err
	}
	return count, nil
}

type usageJSON struct {
	PromptTokens        int            `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details,omitempty"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// sse writes server-sent events with a per-write deadline.
func (c *call) startSSE() {
	if c.fan != nil {
		// One of several choices: the first to start writes the header.
		c.fan.mu.Lock()
		defer c.fan.mu.Unlock()
		c.started = true
		if c.fan.started {
			return
		}
		c.fan.started = true
	}
	h := c.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	h.Set("X-Request-Id", c.id.String())
	c.w.WriteHeader(http.StatusOK)
	c.started = true
}

func (c *call) writeEvent(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return c.writeRaw(append(append([]byte("data: "), b...), '\n', '\n'))
}

func (c *call) writeRaw(b []byte) error {
	if c.fan != nil {
		// Choices stream concurrently; one writer at a time keeps each
		// event whole.
		c.fan.mu.Lock()
		defer c.fan.mu.Unlock()
	}
	rc := http.NewResponseController(c.w)
	_ = rc.SetWriteDeadline(c.s.now().Add(c.s.cfg.WriteTimeout)) // unsupported by some writers: best effort
	if _, err := c.w.Write(b); err != nil {
		return err
	}
	return rc.Flush()
}

// writeSSEError ends a started stream with an error event and no [DONE]:
// a client must never mistake a failed stream for a finished one.
func writeSSEError(w http.ResponseWriter, e *apiError) {
	b, _ := json.Marshal(e.body())
	w.Write(append(append([]byte("data: "), b...), '\n', '\n'))
	http.NewResponseController(w).Flush()
}

func (c *call) writeJSON(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	h := c.w.Header()
	h.Set("Content-Type", "application/json")
	if !c.id.IsZero() {
		h.Set("X-Request-Id", c.id.String())
	}
	c.w.WriteHeader(http.StatusOK)
	c.started = true
	_, err = c.w.Write(append(b, '\n'))
	return err
}

// Chat completion shapes.

type chatResponder struct {
	index int // the choice's index
	text  []byte
	// Tool calls (genParams.toolCall): the call's id, and how much of
	// its arguments went out in stream chunks (the last byte is held
	// back: it may be the call's closing brace).
	callID   string
	named    bool
	argsSent int
	// tool_choice "auto": how much of the text went out as content (it
	// stops where a call may begin).
	contentSent int
	inCall      bool
	// lp holds logprobs entries: streamed, those not yet sent (the next
	// chunk carries them); otherwise all of them.
	lp []chatLogprob
	// promptLP is the response's prompt_logprobs (never streamed).
	promptLP []map[string]promptLogprob
}

func (r *chatResponder) logprob(c *call, g *genParams, id int, lp *request.Logprobs) {
	r.lp = append(r.lp, c.chatEntry(id, lp, g.topLogprobs))
}

func (r *chatResponder) promptLogprobs(c *call, g *genParams, lps []request.Logprobs) {
	if g.promptLogprobs {
		r.promptLP = c.promptLogprobsJSON(c.prompt, lps, g.promptTop)
	}
}

type chatChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chatChunkChoice `json:"choices"`
	Usage   *usageJSON        `json:"usage,omitempty"`
}

type chatChunkChoice struct {
	Index        int           `json:"index"`
	Delta        chatDelta     `json:"delta"`
	Logprobs     *chatLogprobs `json:"logprobs"`
	FinishReason *string       `json:"finish_reason"`
}

type chatDelta struct {
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	ToolCalls []toolCallDelta `json:"tool_calls,omitempty"`
}

// toolCallDelta is a streamed piece of a tool call, in OpenAI's shape:
// the first carries id, type and name, the rest more arguments.
type toolCallDelta struct {
	Index    int               `json:"index"`
	ID       string            `json:"id,omitempty"`
	Type     string            `json:"type,omitempty"`
	Function toolFunctionDelta `json:"function"`
}

type toolFunctionDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
}

// chunk is a stream chunk of this choice; it carries the logprobs
// entries not sent yet.
func (r *chatResponder) chunk(c *call, d chatDelta, finish *string) chatChunk {
	ch := r.bare(c, d, finish)
	if len(r.lp) > 0 {
		ch.Choices[0].Logprobs = &chatLogprobs{Content: r.lp}
		r.lp = nil
	}
	return ch
}

func (r *chatResponder) bare(c *call, d chatDelta, finish *string) chatChunk {
	return chatChunk{ID: "chatcmpl-" + c.id.String(), Object: "chat.completion.chunk", Created: c.start.Unix(),
		Model:   c.s.backend.ModelID(),
		Choices: []chatChunkChoice{{Index: r.index, Delta: d, FinishReason: finish}}}
}

func (r *chatResponder) begin(c *call) error {
	c.startSSE()
	empty := ""
	// The role chunk carries no token: its logprobs wait for the text.
	return c.writeEvent(r.bare(c, chatDelta{Role: "assistant", Content: &empty}, nil))
}

func (r *chatResponder) delta(c *call, g *genParams, text string) error {
	if !g.stream {
		r.text = append(r.text, text...)
		return nil
	}
	if !c.started {
		if err := r.begin(c); err != nil {
			return err
		}
	}
	if g.toolCall {
		r.text = append(r.text, text...)
		return r.streamCall(c, false)
	}
	if g.toolAuto != nil {
		return r.streamAuto(c, g.toolSyntax, text)
	}
	return c.writeEvent(r.chunk(c, chatDelta{Content: &text}, nil))
}

// streamAuto streams an "auto" answer's text as content until a call may
// begin (Hermes: its opening tag; Llama 3 and Mistral: an answer that
// opens with "{" or "[", after leading spaces and Mistral's marker); from
// there on, the rest is kept for finish to parse.
func (r *chatResponder) streamAuto(c *call, syntax, text string) error {
	r.text = append(r.text, text...)
	if r.inCall {
		return nil
	}
	all := string(r.text)
	var end int
	if syntax != syntaxHermes {
		// A whole-answer syntax: the answer is calls if it opens like
		// them, decided at its first byte that is not a space.
		if r.contentSent == 0 {
			lead := strings.TrimLeft(all, " \t\r\n")
			if syntax == syntaxMistral && strings.HasPrefix(mistralCalls, lead) {
				return nil // only spaces, or part of the marker: undecided
			}
			lead = strings.TrimLeft(strings.TrimPrefix(lead, mistralCalls), " \t\r\n")
			switch {
			case lead == "":
				return nil
			case lead[0] == callOpens(syntax):
				r.inCall = true
				return nil
			}
		}
		end = len(all)
	} else {
		end = len(all) - heldBack(all)
		if i := strings.Index(all, hermesOpen); i >= 0 {
			end, r.inCall = i, true
		}
	}
	if end <= r.contentSent {
		return nil
	}
	more := all[r.contentSent:end]
	r.contentSent = end
	return c.writeEvent(r.chunk(c, chatDelta{Content: &more}, nil))
}

// finishAuto ends a streamed "auto" answer: its calls as deltas (one per
// call, whole), or, when it holds none, the rest of its text.
func (r *chatResponder) finishAuto(c *call, g *genParams, reason string) (string, error) {
	all := string(r.text)
	_, calls, ok := parseCalls(g.toolSyntax, all, g.toolAuto)
	if g.oneCall && len(calls) > 1 {
		calls = calls[:1]
	}
	if !ok {
		if more := all[r.contentSent:]; more != "" {
			if err := c.writeEvent(r.chunk(c, chatDelta{Content: &more}, nil)); err != nil {
				return "", err
			}
		}
		return reason, nil
	}
	for i, call := range calls {
		if err := c.writeEvent(r.chunk(c, chatDelta{ToolCalls: []toolCallDelta{{Index: i, ID: newCallID(), Type: "function",
			Function: toolFunctionDelta{Name: call.name, Arguments: call.args}}}}, nil)); err != nil {
			return "", err
		}
	}
	return "tool_calls", nil
}

// autoMessage is a non-streamed "auto" answer: its calls, if it holds
// any, with the text before them as content (null when there is none).
func autoMessage(g *genParams, text, reason string) (map[string]any, string) {
	content, calls, ok := parseCalls(g.toolSyntax, text, g.toolAuto)
	if g.oneCall && len(calls) > 1 {
		calls = calls[:1] // parallel_tool_calls: false
	}
	if !ok {
		return map[string]any{"role": "assistant", "content": text}, reason
	}
	var list []any
	for _, call := range calls {
		list = append(list, map[string]any{"id": newCallID(), "type": "function",
			"function": map[string]any{"name": call.name, "arguments": call.args}})
	}
	var cont any
	if content != "" {
		cont = content
	}
	return map[string]any{"role": "assistant", "content": cont, "tool_calls": list}, "tool_calls"
}

// streamCall writes what is new of the tool call in r.text: its header
// once the name is known, then its arguments, holding back the last byte
// until final (complete: the call's own closing brace is dropped).
func (r *chatResponder) streamCall(c *call, final bool, complete ...bool) error {
	name, args, ok := toolCallOutput(string(r.text), len(complete) > 0 && complete[0])
	if !ok {
		return nil
	}
	if !r.named {
		r.named, r.callID = true, newCallID()
		if err := c.writeEvent(r.chunk(c, chatDelta{ToolCalls: []toolCallDelta{{ID: r.callID, Type: "function",
			Function: toolFunctionDelta{Name: name}}}}, nil)); err != nil {
			return err
		}
	}
	end := len(args)
	if !final {
		end-- // may be the closing brace
	}
	if end <= r.argsSent {
		return nil
	}
	more := args[r.argsSent:end]
	r.argsSent = end
	return c.writeEvent(r.chunk(c, chatDelta{ToolCalls: []toolCallDelta{{Function: toolFunctionDelta{Arguments: more}}}}, nil))
}

// callMessage is the non-streamed message of a tool call, and the finish
// reason to send: tool_calls for a whole call, length for one cut short
// (then the arguments are what was written; before the name is known the
// text comes back as content).
func (r *chatResponder) callMessage(reason string) (map[string]any, string) {
	complete := reason == "stop"
	name, args, ok := toolCallOutput(string(r.text), complete)
	if !ok {
		return map[string]any{"role": "assistant", "content": string(r.text)}, reason
	}
	if complete {
		reason = "tool_calls"
	}
	return map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{
		"id": newCallID(), "type": "function", "function": map[string]any{"name": name, "arguments": args}}}}, reason
}

func (r *chatResponder) finish(c *call, g *genParams, reason string, u usageJSON) error {
	ch, err := r.choice(c, g, reason)
	if err != nil {
		return err
	}
	return r.end(c, g, []any{ch}, u)
}

func (r *chatResponder) choice(c *call, g *genParams, reason string) (any, error) {
	c.outputText = string(r.text)
	if !g.stream {
		msg := map[string]any{"role": "assistant", "content": string(r.text)}
		switch {
		case g.toolCall:
			msg, reason = r.callMessage(reason)
		case g.toolAuto != nil:
			msg, reason = autoMessage(g, string(r.text), reason)
		}
		var lp *chatLogprobs
		if g.logprobs {
			lp = &chatLogprobs{Content: r.lp}
			if lp.Content == nil {
				lp.Content = []chatLogprob{}
			}
		}
		return map[string]any{
			"index": r.index, "message": msg,
			"logprobs": lp, "finish_reason": reason,
		}, nil
	}
	if !c.started {
		if err := r.begin(c); err != nil {
			return nil, err
		}
	}
	if g.toolCall {
		complete := reason == "stop"
		if err := r.streamCall(c, true, complete); err != nil {
			return nil, err
		}
		if !r.named && len(r.text) > 0 {
			// Cut before the name was known: the text as content.
			text := string(r.text)
			if err := c.writeEvent(r.chunk(c, chatDelta{Content: &text}, nil)); err != nil {
				return nil, err
			}
		}
		if complete && r.named {
			reason = "tool_calls"
		}
	}
	if g.toolAuto != nil {
		var err error
		if reason, err = r.finishAuto(c, g, reason); err != nil {
			return nil, err
		}
	}
	return nil, c.writeEvent(r.chunk(c, chatDelta{}, &reason))
}

func (r *chatResponder) end(c *call, g *genParams, choices []any, u usageJSON) error {
	if !g.stream {
		body := map[string]any{
			"id": "chatcmpl-" + c.id.String(), "object": "chat.completion", "created": c.start.Unix(),
			"model": c.s.backend.ModelID(), "choices": choices, "usage": u,
		}
		if g.promptLogprobs {
			// vLLM's: the response's, one prompt for every choice.
			body["prompt_logprobs"] = r.promptLP
		}
		return c.writeJSON(body)
	}
	if g.includeUsage {
		ch := r.bare(c, chatDelta{}, nil)
		ch.Choices = []chatChunkChoice{}
		ch.Usage = &u
		if err := c.writeEvent(ch); err != nil {
			return err
		}
	}
	return c.writeRaw([]byte("data: [DONE]\n\n"))
}

// Completion shapes.

type completionResponder struct {
	index int // the choice's index
	text  []byte
	// echo is the prompt's text, sent before the choice's own (echo:
	// true); echoed says it went out (streaming: as the first delta).
	echo   string
	echoed bool
	// lp holds logprobs entries: streamed, those not yet sent (the next
	// chunk carries them); otherwise all of them. off is the text offset
	// (characters) after the last entry.
	lp  *completionLogprobs
	off int
	// echoLP are the echoed prompt's entries (echo with logprobs): the
	// echo's chunk carries them, streamed; otherwise they come first.
	echoLP *completionLogprobs
	// promptLP is the choice's prompt_logprobs (never streamed).
	promptLP []map[string]promptLogprob
}

func (r *completionResponder) promptLogprobs(c *call, g *genParams, lps []request.Logprobs) {
	if g.echoLogprobs {
		r.echoLP, _ = c.echoed(c.prompt, lps, g.topLogprobs)
		// The answer's offsets count after the echoed text, which is
		// the choice's text before them.
		r.off = utf8.RuneCountInString(r.echo)
	}
	if g.promptLogprobs {
		r.promptLP = c.promptLogprobsJSON(c.prompt, lps, g.promptTop)
	}
}

func (r *completionResponder) logprob(c *call, g *genParams, id int, lp *request.Logprobs) {
	if r.lp == nil {
		r.lp = &completionLogprobs{}
	}
	r.off = r.lp.add(c, id, lp, g.topLogprobs, r.off)
}

// sendEcho starts a streamed choice with its echoed prompt, once.
func (r *completionResponder) sendEcho(c *call) error {
	if r.echoed || r.echo == "" {
		return nil
	}
	r.echoed = true
	// The echo's chunk carries the prompt's entries, not the answer's
	// that may already wait (their text is not in it).
	ch := completionChunk{ID: "cmpl-" + c.id.String(), Object: "text_completion", Created: c.start.Unix(),
		Model: c.s.backend.ModelID(), Choices: []completionChoice{{Index: r.index, Text: r.echo, Logprobs: r.echoLP}}}
	r.echoLP = nil
	return c.writeEvent(ch)
}

type completionChunk struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []completionChoice `json:"choices"`
	Usage   *usageJSON         `json:"usage,omitempty"`
}

type completionChoice struct {
	Index        int                 `json:"index"`
	Text         string              `json:"text"`
	Logprobs     *completionLogprobs `json:"logprobs"`
	FinishReason *string             `json:"finish_reason"`
	// PromptLogprobs is vLLM's prompt_logprobs, when asked.
	PromptLogprobs []map[string]promptLogprob `json:"prompt_logprobs,omitempty"`
	// cumLogprob ranks best_of's candidates (never sent).
	cumLogprob float64
}

// chunk is a stream chunk of this choice; it carries the logprobs
// entries not sent yet (the echoed prompt's go in the echo's chunk,
// sendEcho).
func (r *completionResponder) chunk(c *call, text string, finish *string) completionChunk {
	ch := completionChunk{ID: "cmpl-" + c.id.String(), Object: "text_completion", Created: c.start.Unix(),
		Model: c.s.backend.ModelID(), Choices: []completionChoice{{Index: r.index, Text: text, FinishReason: finish}}}
	if !r.lp.empty() {
		ch.Choices[0].Logprobs, r.lp = r.lp, nil
	}
	return ch
}

func (r *completionResponder) delta(c *call, g *genParams, text string) error {
	if !g.stream {
		r.text = append(r.text, text...)
		return nil
	}
	if !c.started {
		c.startSSE()
	}
	if err := r.sendEcho(c); err != nil {
		return err
	}
	return c.writeEvent(r.chunk(c, text, nil))
}

func (r *completionResponder) finish(c *call, g *genParams, reason string, u usageJSON) error {
	ch, err := r.choice(c, g, reason)
	if err != nil {
		return err
	}
	return r.end(c, g, []any{ch}, u)
}

func (r *completionResponder) choice(c *call, g *genParams, reason string) (any, error) {
	c.outputText = string(r.text)
	if !g.stream {
		ch := completionChoice{Index: r.index, Text: r.echo + string(r.text), FinishReason: &reason, cumLogprob: c.cumLogprob,
			PromptLogprobs: r.promptLP}
		if g.logprobs {
			ch.Logprobs = r.lp
			if ch.Logprobs == nil {
				ch.Logprobs = &completionLogprobs{Tokens: []string{}, TokenLogprobs: []*float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
			}
			if e := r.echoLP; e != nil {
				// The echoed prompt's entries first.
				ch.Logprobs = &completionLogprobs{Tokens: append(e.Tokens, ch.Logprobs.Tokens...),
					TokenLogprobs: append(e.TokenLogprobs, ch.Logprobs.TokenLogprobs...),
					TopLogprobs:   append(e.TopLogprobs, ch.Logprobs.TopLogprobs...),
					TextOffset:    append(e.TextOffset, ch.Logprobs.TextOffset...)}
			}
		}
		return ch, nil
	}
	if !c.started {
		c.startSSE()
	}
	if err := r.sendEcho(c); err != nil {
		return nil, err
	}
	return nil, c.writeEvent(r.chunk(c, "", &reason))
}

func (r *completionResponder) end(c *call, g *genParams, choices []any, u usageJSON) error {
	if !g.stream {
		ch := r.chunk(c, "", nil)
		ch.Choices = make([]completionChoice, len(choices))
		for i, x := range choices {
			ch.Choices[i] = x.(completionChoice)
		}
		ch.Usage = &u
		return c.writeJSON(ch)
	}
	if g.includeUsage {
		ch := r.chunk(c, "", nil)
		ch.Choices = []completionChoice{}
		ch.Usage = &u
		if err := c.writeEvent(ch); err != nil {
			return err
		}
	}
	return c.writeRaw([]byte("data: [DONE]\n\n"))
}
