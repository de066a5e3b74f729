package engine

import (
	"time"

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
	logits, err := e.step(seq, prompt, model.LogitsLast)
	if err != nil {
		return r, err
	}
	r.Prefill = time.Since(start)
	start = time.Now()
	for i := 0; i < genLen; i++ {
		next := sample.Argmax(logits)
		if logits, err = e.step(seq, []int{next}, model.LogitsLast); err != nil {
			return r, err
		}
	}
	r.Decode = time.Since(start)
	return r, nil
}
