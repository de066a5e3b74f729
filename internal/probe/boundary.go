package probe

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// boundary sends prompts around the window, streamed and not. With
// /tokenize the prompts are token ids of exact lengths; without it, text
// whose length in tokens is measured from two calibration requests.
func (p *prober) boundary(ctx context.Context) Check {
	p.progress.phase("boundary lengths around the window")
	c := Check{Name: "boundary", Verdict: Pass}
	if p.window == 0 {
		c.Verdict, c.Reason = Skip, "the window is unknown: the server lists no max_model_len and has no /tokenize; give --window"
		return c
	}
	W, ps := p.window, p.cfg.PageSize
	notes := []string{}
	if p.tokenize {
		p.boundaryIDs(ctx, &c, W, ps)
		p.tokenizeCount(ctx, &c)
	} else {
		notes = append(notes, "no /tokenize: exact −1/0/+1/+page lengths not sent")
		p.boundaryText(ctx, &c, W)
	}
	if c.Verdict == Pass {
		c.Reason = fmt.Sprintf("window %d: in-window prompts counted exactly, every over-window prompt refused with a 4xx and no token, streamed and not", W)
		if len(notes) > 0 {
			c.Reason += " (" + strings.Join(notes, "; ") + ")"
		}
	} else {
		c.Reason = fmt.Sprintf("%d boundary answers are wrong (window %d)", len(c.Evidence), W)
	}
	return c
}

// boundaryIDs sends token-id prompts at W−1, W, W+1, W+page, 2W and 10W.
func (p *prober) boundaryIDs(ctx context.Context, c *Check, W, ps int) {
	seed, e, ok := p.countTokens(ctx, pad(512))
	if !ok || len(seed) == 0 {
		c.fail(e.evidence("/tokenize answered, but not with tokens for plain text", nil))
		return
	}
	lengths := []struct {
		name string
		n    int
	}{{"window−1", W - 1}, {"window", W}, {"window+1", W + 1}, {"window+page", W + ps}, {"2×window", 2 * W}, {"10×window", 10 * W}}
	for _, l := range lengths {
		if l.n < 1 {
			continue
		}
		ids := make([]int, l.n)
		for i := range ids {
			ids[i] = seed[i%len(seed)]
		}
		for _, stream := range []bool{false, true} {
			desc := fmt.Sprintf("prompt=%d token ids (%s)", l.n, l.name)
			e := p.sendRetry(ctx, func() *exchange { return newCompletion(0, p.model, ids, 1, stream, nil, 0, desc) })
			c.Requests++
			p.judgeLength(c, e, l.n, l.n < W)
		}
	}
}

// judgeLength holds one answer to the window's rule: a prompt of n tokens
// with max_tokens 1 fits when n < W (then usage.prompt_tokens must be n),
// and must be refused with a 4xx and no token otherwise.
func (p *prober) judgeLength(c *Check, e *exchange, n int, fits bool) {
	switch {
	case e.status == 0:
		c.fail(e.evidence("no response", nil))
	case fits && e.status != http.StatusOK:
		c.fail(e.evidence(fmt.Sprintf("a %d-token prompt with max_tokens 1 fits the window but was refused", n), nil))
	case fits && e.usage == nil && !e.stream:
		c.fail(e.evidence("200 without usage", nil))
	case fits && e.usage != nil && e.usage.PromptTokens != n:
		c.fail(e.evidence(fmt.Sprintf("usage.prompt_tokens=%d for a %d-token prompt", e.usage.PromptTokens, n), nil))
	case fits:
		if why := e.incomplete(); why != "" {
			c.fail(e.evidence(why, nil))
		}
	case e.status == http.StatusOK:
		what := fmt.Sprintf("a %d-token prompt over the window answered 200", n)
		if e.usage != nil {
			what += fmt.Sprintf(" with usage.prompt_tokens=%d", e.usage.PromptTokens)
		}
		if e.text != "" || e.events > 0 {
			what += fmt.Sprintf(" and %d bytes of generated text", len(e.text))
		}
		switch {
		case e.streamErr && e.text == "":
			// Refused, but only after a 200 and the stream's headers: a
			// client that trusts the status sees success.
			what += ", then refused it with an error event inside the stream (no token)"
		case e.usage != nil && e.usage.PromptTokens > 1 && e.usage.PromptTokens < n:
			what += ": the server cut the prompt to fit instead of refusing it, and answered a prompt that was not sent"
			if strings.HasPrefix(p.server, "llama.cpp") {
				what += " (llama.cpp's context shift; --no-context-shift makes it refuse)"
			}
		}
		c.fail(e.evidence(what, nil))
	case e.status < 400 || e.status >= 500:
		c.fail(e.evidence(fmt.Sprintf("a %d-token prompt over the window answered %d, not a 4xx", n, e.status), nil))
	default:
		// A 4xx: it must carry no generated token.
		var ch chunk
		if json.Unmarshal(e.raw, &ch) == nil && len(ch.Choices) > 0 {
			c.fail(e.evidence(fmt.Sprintf("the %d refusal of an over-window prompt carries choices", e.status), nil))
		}
	}
}

// tokenizeCount checks that a text prompt's usage.prompt_tokens is the
// server's own /tokenize count for the same text.
func (p *prober) tokenizeCount(ctx context.Context, c *Check) {
	text := "Count me. " + pad(min(p.promptBytes(), max(p.window-8, 8)))
	// With the special tokens (a BOS) that a completion's text prompt
	// gets too.
	t := p.send(ctx, tokenizeExchange(p.tok, p.model, text, true))
	_, count, _, err := parseTokenize(t.raw)
	if t.status != http.StatusOK || err != nil || count < 1 {
		c.fail(t.evidence("/tokenize did not count a plain text", nil))
		return
	}
	if count >= p.window {
		return // cannot happen with a byte-or-more-per-token tokenizer
	}
	for _, stream := range []bool{false, true} {
		e := p.sendRetry(ctx, func() *exchange {
			return newCompletion(0, p.model, text, 1, stream, nil, 0, fmt.Sprintf("text prompt (%d bytes, /tokenize: %d tokens)", len(text), count))
		})
		c.Requests++
		p.judgeLength(c, e, count, true)
	}
}

// boundaryText, without a tokenizer, measures prompt_tokens for a text at
// n and 2n repetitions (it must grow linearly: prompt_tokens=1 for both is
// the incident), then sends text predicted at 2W and 10W tokens, which
// must be refused.
func (p *prober) boundaryText(ctx context.Context, c *Check, W int) {
	const unit = "The ledger lists every page. "
	n := max(min(W/4, 2000)/len(unit), 2)
	count := func(reps int) (*exchange, int) {
		e := p.sendRetry(ctx, func() *exchange {
			return newCompletion(0, p.model, strings.Repeat(unit, reps), 1, false, nil, 0, fmt.Sprintf("text prompt (%d repetitions of %q)", reps, unit))
		})
		c.Requests++
		if e.status != http.StatusOK || e.usage == nil {
			c.fail(e.evidence("a short text prompt did not get a 200 with usage", nil))
			return e, -1
		}
		return e, e.usage.PromptTokens
	}
	e1, p1 := count(n)
	e2, p2 := count(2 * n)
	if p1 < 0 || p2 < 0 {
		return
	}
	per := float64(p2-p1) / float64(n)
	base := float64(p1) - per*float64(n)
	if per < 1 || base < -1 || base > 32 {
		ev := e2.evidence(fmt.Sprintf("usage.prompt_tokens=%d for %d repetitions and %d for %d: not a tokenizer's count", p1, n, p2, 2*n), nil)
		ev.Bytes = clip(e1.raw, 200) + " | " + clip(e2.raw, 200)
		c.fail(ev)
		return
	}
	for _, mult := range []int{2, 10} {
		reps := int(float64(mult*W)/per) + 1
		text := strings.Repeat(unit, reps)
		for _, stream := range []bool{false, true} {
			e := p.sendRetry(ctx, func() *exchange {
				return newCompletion(0, p.model, text, 1, stream, nil, 0, fmt.Sprintf("text prompt of about %d tokens (%d×window)", mult*W, mult))
			})
			c.Requests++
			p.judgeLength(c, e, mult*W, false)
		}
	}
}
