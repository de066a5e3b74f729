package sched

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// TestPromptLogprobsCore: a request asking for prompt logprobs gets
// exactly one per prompt token after the first, each the owner-echo
// model's for its own position and token (the harness checks them with
// the first token; no other token carries any), whatever the chunking,
// the prefix cache (which it then does not use) or a preemption that
// recomputes its prompt; its neighbours get none.
func TestPromptLogprobsCore(t *testing.T) {
	for _, tc := range []struct {
		name               string
		prompt, max, batch int
		top                int
		pages, pageSize    int
		prefix, gold       bool
	}{
		{name: "one token", prompt: 1, max: 3, batch: 64, pages: 24, pageSize: 8},
		{name: "two tokens", prompt: 2, max: 3, batch: 64, top: 2, pages: 24, pageSize: 8},
		{name: "one step", prompt: 21, max: 4, batch: 64, top: 5, pages: 24, pageSize: 8},
		{name: "chunks of 3", prompt: 21, max: 4, batch: 3, pages: 24, pageSize: 8},
		{name: "chunks of 8 (page-aligned)", prompt: 40, max: 2, batch: 8, top: 1, pages: 24, pageSize: 8},
		{name: "prefix cache", prompt: 40, max: 2, batch: 5, pages: 24, pageSize: 8, prefix: true},
		{name: "preempted", prompt: 12, max: 3, batch: 3, pages: 12, pageSize: 2, gold: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			window := 64
			if tc.gold {
				window = 16
			}
			o := harnessOpts{window: window, pageSize: tc.pageSize, pages: tc.pages, batchTokens: tc.batch, maxRunning: 8, prefix: tc.prefix}
			if tc.gold {
				o.policy = map[request.Tenant]TenantPolicy{"gold": {Priority: 1}}
			}
			h := newHarness(t, o)
			if tc.prefix {
				// The same prompt once without prompt logprobs, so that
				// the cache holds it.
				p := h.mkParams("acme", tc.prompt, 1)
				p.Prompt = make([]int, tc.prompt)
				if err := h.submitParams(p); err != nil {
					t.Fatal(err)
				}
				h.drain(t)
			}
			var gold request.Owner
			if tc.gold {
				gold = h.submit(t, "gold", 2, 13)
			}
			p := h.mkParams("acme", tc.prompt, tc.max)
			if tc.prefix {
				p.Prompt = make([]int, tc.prompt)
			}
			p.Sampling.PromptLogprobs, p.Sampling.PromptTopLogprobs = true, tc.top
			if err := h.submitParams(p); err != nil {
				t.Fatal(err)
			}
			other := h.submit(t, "other", 5, 2)
			var preempted int
			for i := 0; !h.core.Idle(); i++ {
				if i > 1000 {
					t.Fatal("no quiescence")
				}
				rd := h.step(t)
				for _, o := range rd.Preempted {
					if o == p.Owner {
						preempted++
					}
				}
			}
			for _, o := range []request.Owner{p.Owner, other} {
				if r := h.results[o]; !r.Reason.Success() {
					t.Fatalf("%v: %v (%v)", o, r.Reason, r.Err)
				}
			}
			if tc.prefix && h.results[p.Owner].Usage.CachedTokens != 0 {
				t.Errorf("a request scoring its prompt was served %d cached tokens", h.results[p.Owner].Usage.CachedTokens)
			}
			if tc.gold {
				if preempted == 0 {
					t.Errorf("never preempted (gold %v)", h.results[gold].Reason)
				}
				t.Logf("preempted %d times", preempted)
			}
			h.checkFree(t)
		})
	}
}

// TestPromptLogprobsWrongCount: an executor that scores more or fewer
// prompt positions than asked fails that request alone (internal error),
// never hands out a partial list.
func TestPromptLogprobsWrongCount(t *testing.T) {
	for _, delta := range []int{-1, 1} {
		h := newHarness(t, harnessOpts{window: 64, pageSize: 8, pages: 24, batchTokens: 64, maxRunning: 8})
		p := h.mkParams("acme", 9, 2)
		p.Sampling.PromptLogprobs = true
		if err := h.submitParams(p); err != nil {
			t.Fatal(err)
		}
		rd := h.ready(t)
		outs, err := h.exec.Execute(nil, rd.Batch)
		if err != nil {
			t.Fatal(err)
		}
		if delta < 0 {
			outs[0].PromptLogprobs = outs[0].PromptLogprobs[:len(outs[0].PromptLogprobs)-1]
		} else {
			outs[0].PromptLogprobs = append(outs[0].PromptLogprobs, request.Logprobs{})
		}
		if err := h.core.Advance(rd.Batch, outs, nil); err != nil {
			t.Fatal(err)
		}
		h.drain(t)
		if r := h.results[p.Owner]; r.Reason.Success() || !errors.Is(r.Err, request.ErrInternal) || len(h.tokens[p.Owner]) != 0 {
			t.Fatalf("delta %d: %v (%v) after %d tokens", delta, r.Reason, r.Err, len(h.tokens[p.Owner]))
		}
		h.checkFree(t)
	}
}

// TestImportPromptLogprobs: over a handoff, the prefill node's export
// carries the prompt logprobs and the decode node hands them out with the
// first token; an import whose prompt logprobs are not exactly those
// asked (one short, one too many, sent when none were asked, an
// alternative too many) is refused like a wrong page count.
func TestImportPromptLogprobs(t *testing.T) {
	o := harnessOpts{window: 64, pageSize: 8, pages: 24, batchTokens: 5, maxRunning: 8}
	pre := newHarness(t, o)
	p := pre.mkParams("acme", 19, 3)
	p.Sampling.PromptLogprobs, p.Sampling.PromptTopLogprobs = true, 2
	ex := prefillOn(t, pre, p)
	if len(ex.PromptLogprobs) != 18 {
		t.Fatalf("export carries %d prompt logprobs for 19 prompt tokens", len(ex.PromptLogprobs))
	}
	plain := p
	plain.Sampling.PromptLogprobs, plain.Sampling.PromptTopLogprobs = false, 0
	extraTop := append([]request.Logprobs(nil), ex.PromptLogprobs...)
	extraTop[3].Top = append(extraTop[3].Top, request.TokenLogprob{ID: 9, Logprob: -30})
	for _, tc := range []struct {
		name   string
		p      request.Params
		prompt []request.Logprobs
		ok     bool
	}{
		{"exact", p, ex.PromptLogprobs, true},
		{"one short", p, ex.PromptLogprobs[1:], false},
		{"one too many", p, append(append([]request.Logprobs(nil), ex.PromptLogprobs...), ex.PromptLogprobs[0]), false},
		{"none asked", plain, ex.PromptLogprobs, false},
		{"none sent", p, nil, false},
		{"an alternative too many", p, extraTop, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dec := newHarness(t, o)
			q := tc.p
			q.Owner = dec.owner("acme")
			a, err := dec.lim.Admit(q)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := dec.core.Reserve(a); err != nil {
				t.Fatal(err)
			}
			dec.params[q.Owner] = q
			for i := range ex.Pages {
				if err := dec.core.ImportPage(q.Owner, i, ex.Filled[i], ex.Pages[i]); err != nil {
					t.Fatal(err)
				}
			}
			err = dec.core.CommitImportPrompt(q.Owner, ex.Tokens, ex.FirstToken, ex.FirstLogprobs, tc.prompt)
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, kvcache.ErrHandoff)) {
				t.Fatalf("commit: %v", err)
			}
			dec.drain(t)
			res := dec.results[q.Owner]
			if tc.ok != res.Reason.Success() {
				t.Fatalf("result %v (%v)", res.Reason, res.Err)
			}
			dec.checkFree(t)
		})
	}
}

// TestPromptLogprobsChunkCap: a request scoring its prompt computes at
// most MaxScoredRows positions a step (each needs a row of logits), so a
// 300-token prompt under a 512-token budget takes three steps; its
// neighbour's prompt does not score and goes in one, and the prompt
// logprobs are all there in order (the harness checks them).
func TestPromptLogprobsChunkCap(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 512, pageSize: 16, pages: 64, batchTokens: 512, maxRunning: 8})
	p := h.mkParams("acme", 300, 2)
	p.Sampling.PromptLogprobs = true
	if err := h.submitParams(p); err != nil {
		t.Fatal(err)
	}
	var steps []string
	for i := 0; !h.core.Idle(); i++ {
		if i > 100 {
			t.Fatal("no quiescence")
		}
		h.step(t)
		steps = append(steps, h.last...)
	}
	want := []string{"acme:128", "acme:128", "acme:44", "acme:1"}
	if !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
	if r := h.results[p.Owner]; !r.Reason.Success() {
		t.Fatalf("%v (%v)", r.Reason, r.Err)
	}
	q := h.mkParams("acme", 300, 1)
	if err := h.submitParams(q); err != nil {
		t.Fatal(err)
	}
	h.step(t)
	if !slices.Equal(h.last, []string{"acme:300"}) {
		t.Errorf("a prompt that does not score its tokens ran %v", h.last)
	}
	h.drain(t)
	h.checkFree(t)
}

// TestBackgroundRunsAlone: a background request (the audit's re-score,
// request.BackgroundPriority) never shares a step with another request's
// work — it waits while a customer decodes and runs once the node is
// idle — and one holding pages that a customer needs is preempted or
// finishes (no deadlock), so every request ends and the pages come back.
func TestBackgroundRunsAlone(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pages     int
		fg, fgMax int // the customer's prompt and max tokens
		bgFirst   bool
	}{
		{name: "customer running first", pages: 24, fg: 5, fgMax: 6},
		// 8 pages: the background request's 3 and the customer's 7
		// do not fit together.
		{name: "background started first, customer short of pages", pages: 8, fg: 50, fgMax: 4, bgFirst: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, harnessOpts{window: 64, pageSize: 8, pages: tc.pages, batchTokens: 8, maxRunning: 8})
			bg := h.mkParams("_audit", 20, 1)
			bg.Priority = request.BackgroundPriority
			bg.Sampling.PromptLogprobs = true
			fg := h.mkParams("acme", tc.fg, tc.fgMax)
			first, second := fg, bg
			if tc.bgFirst {
				first, second = bg, fg
			}
			if err := h.submitParams(first); err != nil {
				t.Fatal(err)
			}
			h.step(t)
			if err := h.submitParams(second); err != nil {
				t.Fatal(err)
			}
			for i := 0; !h.core.Idle(); i++ {
				if i > 1000 {
					t.Fatal("no quiescence: a background request and a customer wait for each other")
				}
				h.step(t)
				tenants := map[string]bool{}
				for _, it := range h.last {
					tenants[it[:strings.IndexByte(it, ':')]] = true
				}
				if tenants["_audit"] && len(tenants) > 1 {
					t.Fatalf("a background request shared a step: %v", h.last)
				}
			}
			for _, o := range []request.Owner{bg.Owner, fg.Owner} {
				if r := h.results[o]; !r.Reason.Success() {
					t.Fatalf("%v: %v (%v)", o, r.Reason, r.Err)
				}
			}
			h.checkFree(t)
		})
	}
}
