package probe

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// prefixTrials bounds the trials per direction of the prefix-cache check
// when the other key's first attempt is answered busy.
const prefixTrials = 4

// busy reports whether status is the server saying it is full.
func busy(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

// prefixCache: a key's repeated prompt reports cached tokens; the same
// prompt from another key reports none. Both directions between the first
// two keys. The count is usage.prompt_tokens_details.cached_tokens, or,
// from llama.cpp's server, the prompt tokens it did not evaluate.
func (p *prober) prefixCache(ctx context.Context) Check {
	p.progress.phase("prefix-cache isolation")
	c := Check{Name: "prefix-cache", Verdict: Pass}
	hits, crossHits := 0, 0
	source := ""
	nums := map[string]any{}
	inconclusive := 0
	for _, pair := range [][2]int{{0, 1}, {1, 0}} {
		owner, other := pair[0], pair[1]
		var first, again, foreign *exchange
		answered := false
		// A trial compares first attempts only: a busy answer (429/503)
		// to the other key's request may come after the server has
		// prefilled, and so cached, the prompt under that key, and a
		// retry would then rightly hit that key's own cache and look like
		// a cross-tenant hit. Such a trial is inconclusive and a fresh
		// one starts with a new unique prompt.
		for trial := 0; trial < prefixTrials && ctx.Err() == nil; trial++ {
			prompt := fmt.Sprintf("Cache probe %s. %s", randomToken(16), pad(min(p.promptBytes(), 4000)))
			mk := func(k int, what string) func() *exchange {
				return func() *exchange { return newCompletion(k, p.model, prompt, 1, false, nil, 0, what) }
			}
			first = p.sendRetry(ctx, mk(owner, fmt.Sprintf("a fresh prompt, first time from key %d", owner)))
			again = p.sendRetry(ctx, mk(owner, fmt.Sprintf("the same prompt again from key %d", owner)))
			foreign = p.send(ctx, mk(other, fmt.Sprintf("key %d's prompt, sent by key %d", owner, other))())
			c.Requests += 3
			if busy(foreign.status) {
				inconclusive++
				continue
			}
			answered = true
			for _, e := range []*exchange{first, again, foreign} {
				if e.status != http.StatusOK {
					c.fail(e.evidence(fmt.Sprintf("answered %d", e.status), nil))
					answered = false
				}
			}
			break
		}
		if !answered {
			continue // this direction has nothing to compare
		}
		firstN, _ := first.cachedTokens()
		againN, src := again.cachedTokens()
		foreignN, _ := foreign.cachedTokens()
		source = orElse(source, src)
		pre := fmt.Sprintf("key%d_", owner)
		nums[pre+"first_cached"], nums[pre+"again_cached"], nums[pre+"other_key_cached"] = firstN, againN, foreignN
		nums[pre+"first_ms"], nums[pre+"again_ms"], nums[pre+"other_key_ms"] = ms(first.elapsed), ms(again.elapsed), ms(foreign.elapsed)
		if againN > 0 {
			hits++
		}
		if foreignN > 0 {
			crossHits++
			if !p.cfg.OneTenant {
				c.fail(foreign.evidence(fmt.Sprintf("key %d's first request for key %d's prompt reported %d cached tokens (%s): it hit another tenant's cache", other, owner, foreignN, src), nil))
			}
		}
	}
	nums["inconclusive_trials"] = inconclusive
	if source != "" {
		nums["cached_from"] = source
	}
	c.Numbers = nums
	switch {
	case c.Verdict == Fail && crossHits > 0:
		c.Reason = "a prompt reported cached tokens from another key's cache"
		if strings.HasPrefix(p.server, "llama.cpp") {
			c.Reason += " (llama.cpp's server has no tenants: every key shares its slots' caches; say --one-tenant if the keys are one tenant)"
		}
	case c.Verdict == Fail:
		c.Reason = "a cache request failed"
	case p.cfg.OneTenant:
		// Never a pass: two keys of one tenant may share a cache.
		c.Verdict = Skip
		c.Reason = fmt.Sprintf("not applicable: the keys are one tenant to the server, so sharing its cache is by design (the other key's request hit the cache in %d of 2 directions)", crossHits)
	case inconclusive > 0 && hits == 0 && crossHits == 0 && source == "":
		c.Verdict = Skip
		c.Reason = fmt.Sprintf("not measured: the other key's first attempt was answered busy (429/503) in %d trials", inconclusive)
	case source == "":
		c.Verdict = Skip
		c.Reason = "the answers do not say how many prompt tokens came from a cache (no usage.prompt_tokens_details.cached_tokens, no llama.cpp timings): isolation cannot be seen from outside"
	case hits == 0:
		c.Verdict = Skip
		c.Reason = fmt.Sprintf("a repeated prompt reported no cached tokens (%s): no prefix cache to isolate, or it missed", source)
	default:
		c.Reason = fmt.Sprintf("a key's repeated prompt hits its cache; the same prompt from another key does not (%s)", source)
	}
	return c
}

// errorHygiene sends malformed requests and holds every error of the run
// to OpenAI's JSON shape without traces.
func (p *prober) errorHygiene(ctx context.Context) Check {
	p.progress.phase("error hygiene")
	c := Check{Name: "errors", Verdict: Pass}
	type bad struct {
		what, method, path string
		key                int
		body               string
	}
	var cases []bad
	for k := 0; k < min(len(p.cfg.Keys), 2); k++ {
		secret := p.canaries.mint(k)
		m := p.model
		cases = append(cases,
			bad{"a body that is not JSON", "POST", "/v1/completions", k, `{"model": "` + m + `", "prompt": "` + secret},
			bad{"no prompt", "POST", "/v1/completions", k, `{"model": "` + m + `", "max_tokens": 4}`},
			bad{"max_tokens=-1", "POST", "/v1/completions", k, `{"model": "` + m + `", "prompt": "` + secret + `", "max_tokens": -1}`},
			bad{"max_tokens of the wrong type", "POST", "/v1/completions", k, `{"model": "` + m + `", "prompt": "` + secret + `", "max_tokens": "ten"}`},
			bad{"messages of the wrong type", "POST", "/v1/chat/completions", k, `{"model": "` + m + `", "messages": "` + secret + `"}`},
			bad{"an unknown model", "POST", "/v1/completions", k, `{"model": "pw-probe-no-such-model-` + secret + `", "prompt": "hi", "max_tokens": 1}`},
		)
	}
	cases = append(cases,
		bad{"a made-up key", "POST", "/v1/completions", keyInvalid, `{"model": "` + p.model + `", "prompt": "hi", "max_tokens": 1}`},
		bad{"no key", "POST", "/v1/completions", keyNone, `{"model": "` + p.model + `", "prompt": "hi", "max_tokens": 1}`},
	)
	for _, b := range cases {
		e := p.send(ctx, &exchange{key: b.key, method: b.method, path: b.path, body: []byte(b.body), desc: b.method + " " + b.path + " with " + b.what})
		c.Requests++
		if e.status < 400 || e.status >= 500 {
			c.fail(e.evidence(fmt.Sprintf("%s answered %d, not a 4xx", b.what, e.status), nil))
		}
	}
	// Every error answer of the whole run so far, these included.
	p.mu.Lock()
	all := append([]*exchange(nil), p.all...)
	p.mu.Unlock()
	errs, optional := 0, 0
	for _, e := range all {
		if e.status < 400 {
			continue
		}
		errs++
		if m := traceIn(e.raw); e.optional && m != "" {
			c.fail(e.evidence(fmt.Sprintf("%d: the error body holds %q, a piece of a stack trace or an internal path", e.status, m), nil))
		} else if e.optional {
			optional++ // not an OpenAI endpoint: its shape is the server's own
		} else if why := errorShape(e.raw); why != "" {
			c.fail(e.evidence(fmt.Sprintf("%d: %s", e.status, why), nil))
		} else if m := traceIn(e.raw); m != "" {
			c.fail(e.evidence(fmt.Sprintf("%d: the error body holds %q, a piece of a stack trace or an internal path", e.status, m), nil))
		} else if ct := e.header.Get("Content-Type"); !strings.Contains(ct, "json") {
			c.fail(e.evidence(fmt.Sprintf("%d: Content-Type %q for a JSON error", e.status, ct), nil))
		}
	}
	c.Numbers = map[string]any{"error_answers": errs}
	if optional > 0 {
		c.Numbers["non_openai_endpoint_errors"] = optional
	}
	if c.Verdict == Pass {
		c.Reason = fmt.Sprintf("%d malformed requests refused with a 4xx; all %d error answers of the run are OpenAI-shaped JSON without traces", len(cases), errs-optional)
		if optional > 0 {
			c.Reason += fmt.Sprintf(" (and %d error answers of endpoints outside the OpenAI API, /tokenize, /props, /slots and the like, without traces)", optional)
		}
	} else {
		c.Reason = fmt.Sprintf("%d error answers are wrong", len(c.Evidence))
	}
	return c
}

// overload sends a burst from one key at once: each answer must be a
// complete 200, or a 429/503 with a Retry-After and a JSON error.
func (p *prober) overload(ctx context.Context) Check {
	n := 96
	if p.cfg.Quick {
		n = 24
	}
	p.progress.phase(fmt.Sprintf("overload: a burst of %d concurrent requests from key 0", n))
	c := Check{Name: "overload", Verdict: Pass}
	maxTok := 16
	prompt := "Overload probe. " + pad(min(p.promptBytes()/2, 2000))
	out := make([]*exchange, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = p.send(ctx, newCompletion(0, p.model, prompt, maxTok, i%2 == 1, nil, 0, "burst request"))
		}()
	}
	wg.Wait()
	c.Requests = n
	refused, ok := 0, 0
	promptTokens := map[int]int{}
	for _, e := range out {
		switch {
		case e.status == 0:
			c.fail(e.evidence("no response", nil))
		case e.status == http.StatusOK:
			if why := e.incomplete(); why != "" {
				c.fail(e.evidence(why, nil))
				continue
			}
			ok++
			if e.usage != nil {
				promptTokens[e.usage.PromptTokens]++
			}
		case e.status == http.StatusTooManyRequests || e.status == http.StatusServiceUnavailable:
			refused++
			if why := retryAfter(e.header.Get("Retry-After")); why != "" {
				c.fail(e.evidence(fmt.Sprintf("%d %s", e.status, why), nil))
			}
			if why := errorShape(e.raw); why != "" {
				c.fail(e.evidence(fmt.Sprintf("%d: %s", e.status, why), nil))
			}
		default:
			c.fail(e.evidence(fmt.Sprintf("answered %d to a burst (want 200, 429 or 503)", e.status), nil))
		}
	}
	if len(promptTokens) > 1 {
		// One prompt, so one count: a different one is someone else's
		// usage, or garbage.
		for _, e := range out {
			if e.status == http.StatusOK && e.usage != nil && promptTokens[e.usage.PromptTokens] < max(2, ok/2) {
				c.fail(e.evidence(fmt.Sprintf("usage.prompt_tokens=%d, while the same prompt counted %v in the other answers", e.usage.PromptTokens, promptTokens), nil))
			}
		}
	}
	c.Numbers = map[string]any{"burst": n, "ok": ok, "refused": refused}
	switch {
	case c.Verdict == Fail:
		c.Reason = fmt.Sprintf("%d answers to the burst were wrong", len(c.Evidence))
	case refused == 0:
		c.Verdict = Skip
		c.Reason = fmt.Sprintf("all %d concurrent requests were served completely; the server was not pushed into refusing (use a key with a concurrency limit)", n)
	default:
		c.Reason = fmt.Sprintf("%d complete answers and %d refusals (429/503 with Retry-After and a JSON error)", ok, refused)
	}
	return c
}

// ms is d in milliseconds to a tenth.
func ms(d time.Duration) float64 { return math.Round(float64(d)/1e5) / 10 }

// retryAfter reports what is wrong with a Retry-After value, or "".
func retryAfter(v string) string {
	if v == "" {
		return "without Retry-After"
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return ""
	}
	if _, err := http.ParseTime(v); err == nil {
		return ""
	}
	return fmt.Sprintf("with Retry-After %q (neither seconds nor an HTTP date)", v)
}
