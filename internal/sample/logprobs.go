package sample

import (
	"math"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Logprobs fills dst with the natural-log probabilities of token tok and
// of the k most likely tokens (best first, ties by lower id) under the
// softmax of logits over the whole vocabulary. logits are the raw model
// output, before the logit bias, penalties, temperature, filters and any
// output constraint: OpenAI and vLLM (its default raw_logprobs mode)
// report that distribution, so a log-probability says what the model
// thought of the token, not how the sampler happened to draw it, and a
// teacher-forced replay can recompute it without the sampler's state.
//
// The log-sum-exp is computed in float64 from differences to the largest
// logit, so no finite logit overflows it, and every result is at most 0;
// the float32 result is clamped at -MaxFloat32 so that it stays finite.
// dst.Top's storage is reused. It fails with ErrNonFinite for logits
// holding NaN or an infinity, like Sample.
func Logprobs(logits []float32, tok, k int, dst *request.Logprobs) error {
	best, err := ArgmaxFinite(logits)
	if err != nil {
		return err
	}
	if tok < 0 || tok >= len(logits) {
		return ErrNoCandidate
	}
	maxL := logits[best]
	// Σ exp(l - max): each term by exp32 (float32, <3e-7 relative: a
	// log-probability off by <3e-7), summed in float64. It is the
	// whole vocabulary's cost, paid per token by the requests that ask;
	// exp32 is several times math.Exp's speed.
	var sum float64
	for _, l := range logits {
		sum += float64(exp32(l - maxL))
	}
	lse := float64(maxL) + math.Log(sum)
	lp := func(i int) float32 {
		v := float64(logits[i]) - lse
		if v > 0 { // rounding of a sum of 1: the token holds all the mass
			v = 0
		}
		return float32(max(v, -math.MaxFloat32))
	}
	dst.Logprob = lp(tok)
	k = min(max(k, 0), len(logits))
	top := dst.Top[:0]
	// Insertion into a sorted list of at most k (≤ MaxTopLogprobs): one
	// comparison per logit in the common case that it is not among the
	// best k seen so far.
	for i, l := range logits {
		if len(top) == k && (k == 0 || l <= logits[top[k-1].ID]) {
			continue
		}
		j := len(top)
		if j < k {
			top = append(top, request.TokenLogprob{})
		} else {
			j = k - 1
		}
		for j > 0 && logits[top[j-1].ID] < l {
			top[j] = top[j-1]
			j--
		}
		top[j] = request.TokenLogprob{ID: i}
	}
	for j := range top {
		top[j].Logprob = lp(top[j].ID)
	}
	dst.Top = top
	return nil
}

// exp32 is e^x for x <= 0 (a logit less the largest), relative error
// below 3e-7 (a few float32 roundings) where the result is a normal
// float32, 0 below about -87.3.
// Cody-Waite reduction x = k ln2 + r, |r| <= ln2/2, and a degree-6
// Taylor polynomial of e^r (its remainder r^7/7! < 6e-8 there). Plain
// float32 arithmetic, so a given machine gives the same bits every time
// (the audit compares them).
func exp32(x float32) float32 {
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693359375 // few mantissa bits: k*ln2hi is exact
		ln2lo = -2.12194440e-4
	)
	if x < -87.3 {
		return 0
	}
	k := float32(int32(x*log2e - 0.5)) // round to nearest for x <= 0
	r := x - k*ln2hi - k*ln2lo
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	return p * math.Float32frombits(uint32(int32(k)+127)<<23)
}
