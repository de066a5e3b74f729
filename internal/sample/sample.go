// Package sample turns logits into the next token: greedy, or random with
// temperature, top-k, top-p (nucleus), min-p and a repetition penalty, from
// a seeded generator so that a request with a seed reproduces exactly.
//
// The order follows vLLM and the OpenAI API: repetition penalty, then
// temperature, then the top-k, top-p and min-p filters on the tempered
// distribution, then a draw. Temperature 0 is greedy (the first index of
// the largest logit, as llama.cpp picks).
package sample

import (
	"math"
	"math/rand/v2"
	"slices"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Sampler holds one request's sampling state. It is not safe for concurrent
// use; each request owns one.
type Sampler struct {
	cfg     request.Sampling
	rng     *rand.Rand
	history map[int]bool // tokens seen, for the repetition penalty
	idx     []int
	probs   []float32
}

// New returns a sampler for cfg.
func New(cfg request.Sampling) *Sampler {
	s := &Sampler{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5851f42d4c957f2d))}
	if penalizing(cfg) {
		s.history = map[int]bool{}
	}
	return s
}

func penalizing(cfg request.Sampling) bool {
	return cfg.RepetitionPenalty > 0 && cfg.RepetitionPenalty != 1
}

// Greedy reports whether the sampler always takes the argmax.
func (s *Sampler) Greedy() bool { return !(s.cfg.Temperature > 0) }

// Accept records a token of the context (prompt or generated) for the
// repetition penalty.
func (s *Sampler) Accept(tok int) {
	if s.history != nil {
		s.history[tok] = true
	}
}

// Argmax returns the first index of the largest value.
func Argmax(logits []float32) int {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	return best
}

// Sample picks the next token from logits, which it may modify.
func (s *Sampler) Sample(logits []float32) int {
	if s.history != nil {
		p := s.cfg.RepetitionPenalty
		for tok := range s.history {
			if tok < 0 || tok >= len(logits) {
				continue
			}
			// As in CTRL / llama.cpp: shrink positive logits, grow negative.
			if logits[tok] > 0 {
				logits[tok] /= p
			} else {
				logits[tok] *= p
			}
		}
	}
	if s.Greedy() {
		return Argmax(logits)
	}
	inv := 1 / s.cfg.Temperature
	n := len(logits)
	s.idx = s.idx[:0]
	for i := 0; i < n; i++ {
		s.idx = append(s.idx, i)
	}
	idx := s.idx
	byLogit := func(a, b int) int {
		switch {
		case logits[a] > logits[b]:
			return -1
		case logits[a] < logits[b]:
			return 1
		}
		return a - b
	}
	k := s.cfg.TopK
	if k > 0 && k < n {
		// Partial selection would do; a full sort of the candidates is
		// simple and the top-k case keeps it short.
		slices.SortFunc(idx, byLogit)
		idx = idx[:k]
	} else {
		slices.SortFunc(idx, byLogit)
	}
	// Softmax over the surviving candidates, tempered.
	maxL := logits[idx[0]] * inv
	s.probs = s.probs[:0]
	var sum float64
	for _, i := range idx {
		p := float32(math.Exp(float64(logits[i]*inv - maxL)))
		s.probs = append(s.probs, p)
		sum += float64(p)
	}
	probs := s.probs
	for i := range probs {
		probs[i] = float32(float64(probs[i]) / sum)
	}
	keep := len(idx)
	if tp := s.cfg.TopP; tp > 0 && tp < 1 {
		var cum float32
		for i, p := range probs {
			cum += p
			if cum >= tp {
				keep = i + 1
				break
			}
		}
	}
	if mp := s.cfg.MinP; mp > 0 && mp <= 1 {
		floor := probs[0] * mp
		for i := 1; i < keep; i++ {
			if probs[i] < floor {
				keep = i
				break
			}
		}
	}
	var total float32
	for _, p := range probs[:keep] {
		total += p
	}
	u := s.rng.Float32() * total
	for i, p := range probs[:keep] {
		u -= p
		if u < 0 {
			return idx[i]
		}
	}
	return idx[keep-1]
}
