package sched

import (
	"context"
	"errors"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched/ownerecho"
)

// The owner-echo model's arithmetic is package ownerecho, shared with the
// whole-system simulation in internal/sim.

// echoNext is the token the owner-echo model samples after reading
// history, when every position it read is owner's own and correct: what
// the simulation expects, computed without any KV memory.
func echoNext(o request.Owner, salt string, history []int, vocab int) int {
	return ownerecho.Next(o, salt, history, vocab, 0)
}

// echoNextWindow is echoNext for a model that attends to the last window
// positions only (0: all of them).
func echoNextWindow(o request.Owner, salt string, history []int, vocab, window int) int {
	return ownerecho.Next(o, salt, history, vocab, window)
}

// echoExecutor is the owner-echo fake model. For each item it writes, for
// every new position, the owner tag, token and position through the View,
// then reads every position the View exposes and samples the hash of what
// it read. A read of anything but the item's own correctly written KV
// (another owner's page, a scrubbed or poisoned page, a stale epoch's
// content, a page computed from other tokens) changes the token, and is also counted in foreign.
type echoExecutor struct {
	vocab int
	// fail, when set, decides per item whether to fail it (fault
	// injection) and batchFail whether to fail the whole batch.
	fail      func(i int) bool
	batchFail func() bool

	// salt gives a request's cache salt (part of what its KV depends on,
	// as far as sharing goes); nil means none.
	salt func(request.Owner) string
	// window, when positive, makes it a sliding-window model: it samples
	// from the last window positions only, so the pages before them may
	// have been given back (Config.Window); it still checks every
	// position it can read, and that none it needs was given back.
	window int

	foreign []string // descriptions of reads that were not the owner's
	items   int
	batches int
}

var errInjected = errors.New("sched test: injected executor failure")

func (e *echoExecutor) saltOf(o request.Owner) string {
	if e.salt == nil {
		return ""
	}
	return e.salt(o)
}

func (e *echoExecutor) Execute(_ context.Context, b *Batch) ([]Outcome, error) {
	e.batches++
	if e.batchFail != nil && e.batchFail() {
		return nil, errInjected
	}
	outs := make([]Outcome, len(b.Items))
	for i, it := range b.Items {
		e.items++
		if e.fail != nil && e.fail(i) {
			outs[i].Owner, outs[i].Err = it.View.Owner(), errInjected
			continue
		}
		outs[i].Owner = it.View.Owner()
		outs[i].Token = e.run(it)
		for j, tok := range it.ScorePrompt {
			outs[i].PromptLogprobs = append(outs[i].PromptLogprobs, echoPromptLogprobs(it.View.Start()+j+1, tok, it.Sampling.PromptTopLogprobs))
		}
	}
	return outs, nil
}

// echoPromptLogprobs is the owner-echo model's prompt logprobs for token
// tok at position pos (with top alternatives): its value names both, so
// a harness can check that every position was scored once, in order,
// with its own token.
func echoPromptLogprobs(pos, tok, top int) request.Logprobs {
	l := request.Logprobs{Logprob: -float32(pos*harnessVocab + tok)}
	for k := range top {
		l.Top = append(l.Top, request.TokenLogprob{ID: k, Logprob: -float32(k)})
	}
	return l
}

func (e *echoExecutor) run(it Item) int {
	v := it.View
	tags := ownerecho.Chain(it.Owner.Tenant, e.saltOf(it.Owner), it.History)
	ps := v.PageSize()
	start := v.Start()
	// Write the new positions.
	for j, tok := range it.Tokens {
		pos := start + j
		k, vv := v.K(0, pos/ps), v.V(0, pos/ps)
		off := (pos % ps) * 2
		k[off], k[off+1] = ownerecho.Split(tags[pos])
		vv[off], vv[off+1] = float32(tok), float32(pos+1)
	}
	// Read everything the view exposes, page by page: from the first
	// page it still holds (the earlier ones, given back behind the
	// window, must read as nothing).
	h := uint64(ownerecho.Seed)
	first := v.FirstPage()
	for page := range first {
		if len(v.K(0, page)) != 0 || len(v.V(0, page)) != 0 {
			e.foreign = append(e.foreign, fmt.Sprintf("%v: page %d, given back, still reads", it.Owner, page))
		}
	}
	end := start + len(it.Tokens)
	if e.window == 0 && first > 0 || e.window > 0 && first*ps > max(0, start-e.window+1) {
		e.foreign = append(e.foreign, fmt.Sprintf("%v: pages before %d given back, the step at %d needs positions from %d (window %d)",
			it.Owner, first, start, max(0, start-e.window+1), e.window))
	}
	pos := first * ps
	for page := first; page < v.NumPages(); page++ {
		k, vv := v.K(0, page), v.V(0, page)
		for off := 0; off+1 < len(k); off += 2 {
			want := [4]float32{-1, -1, -1, float32(pos + 1)}
			if pos < len(it.History) {
				want[0], want[1] = ownerecho.Split(tags[pos])
				want[2] = float32(it.History[pos])
			}
			got := [4]float32{k[off], k[off+1], vv[off], vv[off+1]}
			if got != want && len(e.foreign) < 16 {
				e.foreign = append(e.foreign, fmt.Sprintf("%v read position %d: %v, want %v", it.Owner, pos, got, want))
			}
			if e.window == 0 || pos >= end-e.window {
				h = ownerecho.Fold(h, got)
			}
			pos++
		}
	}
	if pos != end {
		e.foreign = append(e.foreign, fmt.Sprintf("%v read up to position %d, the step covers %d", it.Owner, pos, end))
	}
	return int(h % uint64(e.vocab))
}
