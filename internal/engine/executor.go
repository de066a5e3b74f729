package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sample"
	"github.com/pagewarden/pagewarden/internal/sched"
)

// Executor runs the scheduler's batches on the model: one forward pass over
// every item of a step (prefill chunks and decode tokens of many tenants
// together), then one sample per item that asks for it.
type Executor struct {
	e   *Engine
	smp sample.Sampler // reused for every draw: one goroutine drives Execute
	raw []float32      // a row's raw logits, kept for logprobs across the draw
}

var _ sched.Executor = (*Executor)(nil)

// Executor returns the engine's batch executor. The scheduler drives it
// from one goroutine; the engine must not be used for Generate meanwhile.
func (e *Engine) Executor() *Executor { return &Executor{e: e} }

// Execute implements sched.Executor.
func (x *Executor) Execute(ctx context.Context, b *sched.Batch) ([]sched.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	in := make([]model.Input, len(b.Items))
	for i := range b.Items {
		it := &b.Items[i]
		mode := model.LogitsNone
		switch {
		case len(it.ScorePrompt) > 0:
			// Prompt logprobs: every fed row's logits, from the same
			// forward pass (the last row is the draw's when Sample).
			mode = model.LogitsAll
		case it.Sample:
			mode = model.LogitsLast
		}
		in[i] = model.Input{Tokens: it.Tokens, View: it.View, Logits: mode}
	}
	// The rows live in the engine's scratch until the next step: everything
	// below (scores, draws, the copy for logprobs) is done with them before
	// Execute returns, and no outcome keeps a slice of them.
	logits, err := x.e.Model.ForwardReusing(x.e.Compute, in, &x.e.scratch)
	if err != nil {
		return nil, fmt.Errorf("engine: step %d: %w", b.Step, err)
	}
	out := make([]sched.Outcome, len(b.Items))
	for i := range b.Items {
		it := &b.Items[i]
		out[i].Owner = it.View.Owner()
		row := logits[i]
		if len(it.ScorePrompt) > 0 {
			if out[i].PromptLogprobs, err = x.e.promptLogprobs(it, row); err != nil {
				out[i].Err = fmt.Errorf("engine: step %d: prompt logprobs: %w", b.Step, err)
				continue
			}
			row = row[len(row)-x.e.Model.Config.Vocab:]
		}
		if !it.Sample {
			continue
		}
		if it.Sampling.Logprobs {
			// The draw adjusts the row in place; logprobs are the raw
			// distribution's (sample.Logprobs), so keep a copy. Only
			// requests that ask pay for it.
			x.raw = append(x.raw[:0], row...)
		}
		var tok int
		if it.Sampling.Forced != nil {
			// Teacher forcing (the replay audit): the token is given,
			// its logits are scored; no constraint or draw applies.
			tok, err = forced(it.Sampling.Forced, it.SampleIndex, row)
		} else {
			var allowed []uint64
			if g := it.Sampling.Grammar; g != nil {
				allowed, err = x.e.cons.mask(x.e, it.Owner, g, it.SampleIndex, it.History)
				if err != nil {
					out[i].Err = fmt.Errorf("engine: step %d: constraint: %w", b.Step, err)
					continue
				}
			}
			tok, err = DrawAllowed(&x.smp, it.Sampling, it.SampleIndex, it.History, row, allowed)
		}
		if err == nil && it.Sampling.Logprobs {
			lp := &request.Logprobs{}
			if err = sample.Logprobs(x.raw, tok, it.Sampling.TopLogprobs, lp); err == nil {
				out[i].Logprobs = lp
			}
		}
		if err != nil {
			// This request fails alone; its neighbours' logits are their own.
			out[i].Err = fmt.Errorf("engine: step %d: %w", b.Step, err)
			continue
		}
		out[i].Token = tok
	}
	x.e.cons.endStep()
	return out, nil
}

// promptLogprobs scores it.ScorePrompt from rows, the logits of every
// fed position (model.LogitsAll): entry j from row j. Each row is scored
// as sample.Logprobs scores a generated token (the same function, the
// same row bits a decode step at that position computes), so that a
// prompt scored in one prefill equals the forced decode of it.
func (e *Engine) promptLogprobs(it *sched.Item, rows []float32) ([]request.Logprobs, error) {
	vocab := e.Model.Config.Vocab
	if len(rows) != len(it.Tokens)*vocab || len(it.ScorePrompt) > len(it.Tokens) {
		return nil, fmt.Errorf("%d logit values for %d rows, %d to score", len(rows), len(it.Tokens), len(it.ScorePrompt))
	}
	out := make([]request.Logprobs, len(it.ScorePrompt))
	for j, tok := range it.ScorePrompt {
		if err := sample.Logprobs(rows[j*vocab:(j+1)*vocab], tok, it.Sampling.PromptTopLogprobs, &out[j]); err != nil {
			return nil, fmt.Errorf("prompt position %d: %w", it.View.Start()+j+1, err)
		}
	}
	return out, nil
}

// Draw picks generated token number index from logits. The generator is
// seeded from the request's seed and index, so a sequence recomputed after
// preemption (or run by another path: the run command, a server) draws
// exactly the same tokens. history is the sequence so far, prompt then
// the index tokens generated before this one: the repetition penalty reads
// all of it, the presence and frequency penalties its generated tail.
// s is a buffer, reset for the draw. Logits holding NaN or an infinity
// are an error (sample.ErrNonFinite), never a token.
func Draw(s *sample.Sampler, cfg request.Sampling, index int, history []int, logits []float32) (int, error) {
	return DrawAllowed(s, cfg, index, history, logits, nil)
}

// DrawAllowed is Draw restricted to the tokens set in allowed (an output
// constraint's mask; nil: every token).
func DrawAllowed(s *sample.Sampler, cfg request.Sampling, index int, history []int, logits []float32, allowed []uint64) (int, error) {
	adjusts := sample.Adjusts(cfg)
	if sample.Greedy(cfg) && !adjusts && allowed == nil {
		return sample.ArgmaxFinite(logits)
	}
	cfg.Seed = mixSeed(cfg.Seed, uint64(index))
	s.Reset(cfg)
	s.SetAllowed(allowed)
	if adjusts {
		// The generated tokens are the last index ones (a history
		// shorter than index, which no caller passes, is all generated).
		prompt := max(len(history)-index, 0)
		for _, t := range history[:prompt] {
			s.Accept(t)
		}
		for _, t := range history[prompt:] {
			s.AcceptGenerated(t)
		}
	}
	return s.Sample(logits)
}

// ErrForced is a teacher-forced request whose forced tokens do not cover
// the index asked for, or name a token outside the vocabulary.
var ErrForced = errors.New("engine: forced token out of range")

// forced returns generated token index of a teacher-forced request, after
// the same finiteness check a draw makes of its logits.
func forced(tokens []int, index int, logits []float32) (int, error) {
	if _, err := sample.ArgmaxFinite(logits); err != nil {
		return 0, err
	}
	if index < 0 || index >= len(tokens) || tokens[index] < 0 || tokens[index] >= len(logits) {
		return 0, fmt.Errorf("%w: index %d of %d forced tokens", ErrForced, index, len(tokens))
	}
	return tokens[index], nil
}

// mixSeed derives a per-token seed (splitmix64 finaliser).
func mixSeed(seed, index uint64) uint64 {
	z := seed + (index+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}
