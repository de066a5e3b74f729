package engine

import (
	"fmt"
	"time"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sample"
)

// BenchResult is one llama-bench-style measurement.
type BenchResult struct {
	Prefill   time.Duration // one pass over the prompt
	Decode    time.Duration // n single-token steps after it
	PromptLen int
	Generated int
}

// Bench runs a prompt of promptLen tokens in one prefill pass, then genLen
// greedy decode steps (end-of-generation tokens are not honoured, as with
// llama-bench), timing both. Token ids are a fixed pseudo-random sequence so
// runs are comparable.
func (e *Engine) Bench(promptLen, genLen int) (BenchResult, error) {
	r := BenchResult{PromptLen: promptLen, Generated: genLen}
	seq := e.KV.NewSequence(request.Owner{Tenant: "bench", ID: request.NewID()})
	defer e.KV.Release(seq)
	vocab := e.Model.Config.Vocab
	prompt := make([]int, promptLen)
	x := uint32(12345)
	for i := range prompt {
		x = x*1664525 + 1013904223
		prompt[i] = int(x>>8) % vocab
	}
	start := time.Now()
	logits, err := e.step(seq, prompt, model.LogitsLast, true)
	if err != nil {
		return r, err
	}
	r.Prefill = time.Since(start)
	start = time.Now()
	for i := 0; i < genLen; i++ {
		next := sample.Argmax(logits)
		if logits, err = e.step(seq, []int{next}, model.LogitsLast, true); err != nil {
			return r, err
		}
	}
	r.Decode = time.Since(start)
	return r, nil
}

// BenchBatch measures batched decode as llama-batched-bench does (-npp
// promptLen -ntg genLen -npl seqs): seqs sequences, each with its own
// prompt of promptLen tokens (prefilled one sequence at a time, not timed
// as decode), then genLen steps that each decode one greedy token for every
// sequence in a single forward pass. Decode is the time of those steps;
// aggregate decode speed is seqs*genLen/Decode. The engine's KV pool must
// hold seqs*(promptLen+genLen) positions (Options.Pages).
func (e *Engine) BenchBatch(seqs, promptLen, genLen int) (BenchResult, error) {
	r := BenchResult{PromptLen: promptLen, Generated: genLen}
	if seqs < 1 || promptLen < 1 || genLen < 0 {
		return r, fmt.Errorf("engine: BenchBatch(%d, %d, %d): want at least one sequence and one prompt token", seqs, promptLen, genLen)
	}
	vocab := e.Model.Config.Vocab
	ss := make([]*kvcache.Sequence, seqs)
	for i := range ss {
		ss[i] = e.KV.NewSequence(request.Owner{Tenant: "bench", ID: request.NewID()})
		defer e.KV.Release(ss[i])
	}
	next := make([]int, seqs)
	x := uint32(12345)
	start := time.Now()
	for i, seq := range ss {
		// Distinct prompts, so that the sequences decode distinct tokens
		// (and read distinct KV pages) as independent requests would.
		prompt := make([]int, promptLen)
		for j := range prompt {
			x = x*1664525 + 1013904223
			prompt[j] = int(x>>8) % vocab
		}
		logits, err := e.step(seq, prompt, model.LogitsLast, true)
		if err != nil {
			return r, err
		}
		next[i] = sample.Argmax(logits)
	}
	r.Prefill = time.Since(start)
	in := make([]model.Input, seqs)
	start = time.Now()
	for range genLen {
		for i, seq := range ss {
			if err := e.KV.Reserve(seq, 1); err != nil {
				return r, err
			}
			v, err := e.KV.Begin(seq, 1)
			if err != nil {
				return r, err
			}
			in[i] = model.Input{Tokens: next[i : i+1 : i+1], View: v, Logits: model.LogitsLast}
		}
		out, err := e.Model.ForwardReusing(e.Compute, in, &e.scratch)
		if err != nil {
			return r, err
		}
		for i := range in {
			if err := e.KV.Commit(in[i].View); err != nil {
				return r, err
			}
			next[i] = sample.Argmax(out[i])
		}
	}
	r.Decode = time.Since(start)
	return r, nil
}
