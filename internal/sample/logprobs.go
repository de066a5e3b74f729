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
	maxL := float64(logits[best])
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l) - maxL)
	}
	lse := maxL + math.Log(sum)
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
