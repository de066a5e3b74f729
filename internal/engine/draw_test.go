package engine

import (
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sample"
)

// TestDrawCountsGeneratedTokensOnly: Draw hands the sampler the last index
// tokens of history as generated (presence and frequency count them) and
// the rest as prompt (they do not), and a logit bias reaches greedy draws.
func TestDrawCountsGeneratedTokensOnly(t *testing.T) {
	logits := []float32{3, 2, 1}
	var s sample.Sampler
	for _, tc := range []struct {
		name    string
		cfg     request.Sampling
		history []int
		index   int
		want    int
	}{
		{"no knob", request.Sampling{}, []int{0, 0}, 1, 0},
		{"presence, token 0 in the prompt", request.Sampling{PresencePenalty: 2}, []int{0, 1}, 1, 0},
		{"presence, token 0 generated", request.Sampling{PresencePenalty: 2}, []int{1, 0}, 1, 1},
		{"frequency, token 0 generated twice", request.Sampling{FrequencyPenalty: 0.75}, []int{2, 0, 0}, 2, 1},
		{"frequency, once", request.Sampling{FrequencyPenalty: 0.75}, []int{0, 0}, 1, 0},
		{"repetition reads the prompt", request.Sampling{RepetitionPenalty: 2}, []int{0}, 0, 1},
		{"bias", request.Sampling{LogitBias: []request.TokenBias{{Token: 0, Bias: -request.MaxBias}, {Token: 2, Bias: 1.5}}}, nil, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Draw(&s, tc.cfg, tc.index, tc.history, slices.Clone(logits))
			if err != nil || got != tc.want {
				t.Errorf("Draw = %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}
