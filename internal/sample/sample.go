// Package sample turns logits into the next token: greedy, or random with
// temperature, top-k, top-p (nucleus) and min-p, after a logit bias and
// repetition, presence and frequency penalties, from a seeded generator so
// that a request with a seed reproduces exactly.
//
// The order follows vLLM and the OpenAI API: logit bias, then the
// repetition penalty (over prompt and generated tokens), then the frequency
// and presence penalties (over generated tokens only), then temperature,
// then the top-k, top-p and min-p filters on the tempered distribution, then
// a draw. Temperature 0 is greedy (the first index of the largest adjusted
// logit, as llama.cpp picks), and so is any temperature below
// MinTemperature, as in vLLM: dividing by it would overflow.
//
// A bias of -request.MaxBias bans its token (OpenAI documents -100 as a
// ban; adding it would only make the token unlikely): a banned token is
// never drawn, greedy or not, and if every token is banned Sample returns
// ErrNoCandidate.
//
// An allowed-token mask (SetAllowed, from an output constraint) is applied
// first: a token outside it is never drawn, greedy or not.
//
// A logit that is NaN or infinite never becomes a token: Sample returns
// ErrNonFinite instead, and the caller fails the request.
package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/pagewarden/pagewarden/internal/request"
)

// MinTemperature is the smallest temperature sampled at; below it the
// draw is greedy (vLLM's sampling epsilon). Tempered logits are computed in
// float64 from differences to the largest logit, so that no temperature at
// or above it can overflow.
const MinTemperature = 1e-5

// ErrNonFinite is returned for logits holding NaN or an infinity: the
// forward pass went wrong, and no token drawn from them means anything.
var ErrNonFinite = errors.New("sample: logits hold NaN or an infinity")

// ErrNoCandidate is returned when the logit bias and the allowed-token
// mask together ban every token.
var ErrNoCandidate = errors.New("sample: the logit bias or the output constraint bans every token")

// Greedy reports whether cfg always takes the argmax.
func Greedy(cfg request.Sampling) bool { return !(cfg.Temperature >= MinTemperature) }

// Adjusts reports whether cfg changes the logits before the draw (a logit
// bias or a penalty): only then does a sampler need the sequence so far
// (Accept, AcceptGenerated), and only then can greedy decoding differ from
// the raw argmax.
func Adjusts(cfg request.Sampling) bool {
	return repeating(cfg) || counting(cfg) || len(cfg.LogitBias) > 0
}

// Sampler holds one request's sampling state. It is not safe for concurrent
// use; each request owns one.
type Sampler struct {
	cfg     request.Sampling
	pcg     *rand.PCG
	rng     *rand.Rand
	history map[int]bool // tokens seen, for the repetition penalty
	counts  map[int]int  // generated tokens, for presence and frequency
	idx     []int
	probs   []float32
	allowed []uint64 // bit i set: token i may be drawn; nil: all may
}

// New returns a sampler for cfg.
func New(cfg request.Sampling) *Sampler {
	s := &Sampler{}
	s.Reset(cfg)
	return s
}

// Reset makes s a fresh sampler for cfg, keeping its buffers, so that a
// caller drawing for many requests does not allocate per token.
func (s *Sampler) Reset(cfg request.Sampling) {
	s.cfg = cfg
	if s.pcg == nil {
		s.pcg = rand.NewPCG(0, 0)
		s.rng = rand.New(s.pcg)
	}
	s.pcg.Seed(cfg.Seed, cfg.Seed^0x5851f42d4c957f2d)
	s.allowed = nil
	if repeating(cfg) {
		if s.history == nil {
			s.history = map[int]bool{}
		}
		clear(s.history)
	} else {
		s.history = nil
	}
	if counting(cfg) {
		if s.counts == nil {
			s.counts = map[int]int{}
		}
		clear(s.counts)
	} else {
		s.counts = nil
	}
}

func repeating(cfg request.Sampling) bool {
	return cfg.RepetitionPenalty > 0 && cfg.RepetitionPenalty != 1
}

func counting(cfg request.Sampling) bool {
	return cfg.PresencePenalty != 0 || cfg.FrequencyPenalty != 0
}

// SetAllowed restricts the next draws to the tokens whose bit is set in
// mask (bit i of mask[i/64]); nil lifts the restriction. Reset clears it.
// The sampler reads mask and does not keep it past the next Reset.
func (s *Sampler) SetAllowed(mask []uint64) { s.allowed = mask }

// Greedy reports whether the sampler always takes the argmax.
func (s *Sampler) Greedy() bool { return Greedy(s.cfg) }

// Accept records a prompt token, for the repetition penalty.
func (s *Sampler) Accept(tok int) {
	if s.history != nil {
		s.history[tok] = true
	}
}

// AcceptGenerated records a generated token: for the repetition penalty
// as Accept does, and counted for the presence and frequency penalties.
func (s *Sampler) AcceptGenerated(tok int) {
	s.Accept(tok)
	if s.counts != nil {
		s.counts[tok]++
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

// ArgmaxFinite is Argmax for logits that must all be finite: it returns
// ErrNonFinite rather than an index chosen by a NaN's comparisons.
func ArgmaxFinite(logits []float32) (int, error) {
	if len(logits) == 0 {
		return 0, ErrNonFinite
	}
	best := 0
	for i, v := range logits {
		// v-v is 0 for finite v and NaN for NaN and both infinities.
		if v-v != 0 {
			return 0, ErrNonFinite
		}
		if v > logits[best] {
			best = i
		}
	}
	return best, nil
}

// Sample picks the next token from logits, which it may modify. It fails
// with ErrNonFinite, and draws nothing, if a logit is NaN or infinite, and
// with ErrNoCandidate if the logit bias bans every token.
func (s *Sampler) Sample(logits []float32) (int, error) {
	best, err := ArgmaxFinite(logits)
	if err != nil {
		return 0, err
	}
	if s.allowed != nil || Adjusts(s.cfg) {
		s.mask(logits)
		s.adjust(logits)
		// Banned tokens are -Inf now; every other logit is finite.
		best = Argmax(logits)
		if math.IsInf(float64(logits[best]), -1) {
			return 0, ErrNoCandidate
		}
	}
	if s.Greedy() {
		return best, nil
	}
	inv := 1 / float64(s.cfg.Temperature)
	n := len(logits)
	byLogit := func(a, b int) int {
		switch {
		case logits[a] > logits[b]:
			return -1
		case logits[a] < logits[b]:
			return 1
		}
		return a - b
	}
	// The candidates, best first. Only as many as the filters can keep are
	// sorted: top-k needs k; top-p alone needs the nucleus, found by
	// sorting a growing prefix until it holds top_p of the mass, which is
	// exact and usually stops at a few dozen tokens.
	var idx []int
	topPDone := false
	switch k := s.cfg.TopK; {
	case k > 0 && k < n:
		idx = s.topN(logits, k, byLogit)
	case s.cfg.TopP > 0 && s.cfg.TopP < 1:
		idx, topPDone = s.nucleus(logits, inv, byLogit), true
	default:
		idx = s.topN(logits, n, byLogit)
	}
	// Softmax over the surviving candidates, tempered: every exponent is
	// at most 0 and the first is exactly 0, so sum >= 1.
	maxL := float64(logits[idx[0]])
	s.probs = s.probs[:0]
	var sum float64
	for _, i := range idx {
		p := float32(math.Exp((float64(logits[i]) - maxL) * inv))
		s.probs = append(s.probs, p)
		sum += float64(p)
	}
	probs := s.probs
	for i := range probs {
		probs[i] = float32(float64(probs[i]) / sum)
	}
	keep := len(idx)
	// Candidates of probability 0 (banned, or too unlikely for float32)
	// sort last; without them the draw's rounding fallback below can
	// never land on one.
	for keep > 1 && probs[keep-1] == 0 {
		keep--
	}
	if tp := s.cfg.TopP; tp > 0 && tp < 1 && !topPDone {
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
			return idx[i], nil
		}
	}
	// Rounding left u at or above 0 after the last candidate: it is the
	// draw's upper end, which belongs to the last kept candidate.
	return idx[keep-1], nil
}

// mask sets the logit of every token outside the allowed mask to -Inf.
func (s *Sampler) mask(logits []float32) {
	if s.allowed == nil {
		return
	}
	ninf := float32(math.Inf(-1))
	for lo := 0; lo < len(logits); lo += 64 {
		var w uint64
		if lo/64 < len(s.allowed) {
			w = s.allowed[lo/64]
		}
		if w == ^uint64(0) {
			continue
		}
		hi := min(lo+64, len(logits))
		for i := lo; i < hi; i++ {
			if w&(1<<(i-lo)) == 0 {
				logits[i] = ninf
			}
		}
	}
}

// adjust applies the logit bias and the penalties to logits, in vLLM's
// order. Token ids outside logits are skipped (the scheduler admits only
// ids in the vocabulary). A banned token's logit becomes -Inf.
func (s *Sampler) adjust(logits []float32) {
	n := len(logits)
	for _, b := range s.cfg.LogitBias {
		if b.Token < 0 || b.Token >= n {
			continue
		}
		if b.Bias <= -request.MaxBias {
			logits[b.Token] = float32(math.Inf(-1))
		} else {
			logits[b.Token] += b.Bias
		}
	}
	if s.history != nil {
		p := s.cfg.RepetitionPenalty
		for tok := range s.history {
			if tok < 0 || tok >= n {
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
	// OpenAI's formula: logit -= count*frequency + (count > 0)*presence.
	for tok, c := range s.counts {
		if tok < 0 || tok >= n {
			continue
		}
		logits[tok] -= float32(c)*s.cfg.FrequencyPenalty + s.cfg.PresencePenalty
	}
}

// topN returns the indexes of the m largest logits, best first (ties by
// lower index), in s.idx.
func (s *Sampler) topN(logits []float32, m int, cmp func(a, b int) int) []int {
	n := len(logits)
	s.idx = s.idx[:0]
	if m >= n {
		for i := 0; i < n; i++ {
			s.idx = append(s.idx, i)
		}
		slices.SortFunc(s.idx, cmp)
		return s.idx
	}
	// A min-heap (by cmp, worst at the root) of the m best seen so far.
	h := s.idx
	worse := func(a, b int) bool { return cmp(a, b) > 0 }
	down := func(i int) {
		for {
			l, r, w := 2*i+1, 2*i+2, i
			if l < len(h) && worse(h[l], h[w]) {
				w = l
			}
			if r < len(h) && worse(h[r], h[w]) {
				w = r
			}
			if w == i {
				return
			}
			h[i], h[w] = h[w], h[i]
			i = w
		}
	}
	for i := 0; i < n; i++ {
		if len(h) < m {
			h = append(h, i)
			for j := len(h) - 1; j > 0; {
				p := (j - 1) / 2
				if !worse(h[j], h[p]) {
					break
				}
				h[j], h[p] = h[p], h[j]
				j = p
			}
			continue
		}
		if cmp(i, h[0]) < 0 {
			h[0] = i
			down(0)
		}
	}
	slices.SortFunc(h, cmp)
	s.idx = h
	return h
}

// nucleus returns the smallest best-first prefix of the candidates whose
// tempered probability, normalised over the whole vocabulary, reaches TopP.
func (s *Sampler) nucleus(logits []float32, inv float64, cmp func(a, b int) int) []int {
	n := len(logits)
	maxL := float64(logits[Argmax(logits)])
	var sum float64
	for _, l := range logits {
		sum += math.Exp((float64(l) - maxL) * inv)
	}
	need := float64(s.cfg.TopP) * sum
	for m := 64; ; m *= 16 {
		idx := s.topN(logits, min(m, n), cmp)
		var cum float64
		for j, i := range idx {
			cum += math.Exp((float64(logits[i]) - maxL) * inv)
			if cum >= need {
				return idx[:j+1]
			}
		}
		if m >= n {
			return idx
		}
	}
}
