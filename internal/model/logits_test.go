package model_test

import (
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
)

// TestLogitsOneProduct checks how Forward hands out the logits it computes
// in one product for the whole batch: inputs that want none get nil, the
// others get exactly their rows (bit-identical to a step of their own, as
// MatMul is batch-invariant), and no input's slice can grow into its
// neighbour's.
func TestLogitsOneProduct(t *testing.T) {
	for _, name := range []string{"tiny", "tiny-q8_0"} {
		t.Run(name, func(t *testing.T) {
			m := builtin(t, name)
			vocab := m.Config.Vocab
			prompts := [][]int{tokens(11, 5, vocab), tokens(12, 3, vocab), tokens(13, 4, vocab), tokens(14, 6, vocab)}
			modes := []model.LogitsMode{model.LogitsLast, model.LogitsNone, model.LogitsAll, model.LogitsLast}

			solo := newRunner(t, m, kvcache.F32, 32)
			want := make([][]float32, len(prompts))
			for i, p := range prompts {
				want[i] = solo.step(part{solo.seq("s"), p, modes[i]})[0]
			}
			mix := newRunner(t, m, kvcache.F32, 32)
			var parts []part
			for i, p := range prompts {
				parts = append(parts, part{mix.seq("s"), p, modes[i]})
			}
			got := mix.step(parts...)
			for i := range prompts {
				rows := map[model.LogitsMode]int{model.LogitsNone: 0, model.LogitsLast: 1, model.LogitsAll: len(prompts[i])}[modes[i]]
				if len(got[i]) != rows*vocab || cap(got[i]) != rows*vocab {
					t.Fatalf("input %d (mode %v): %d logits, capacity %d; want %d rows of %d", i, modes[i], len(got[i]), cap(got[i]), rows, vocab)
				}
				if rows == 0 {
					if got[i] != nil {
						t.Errorf("input %d wants no logits, got a non-nil slice", i)
					}
					continue
				}
				if !slices.Equal(got[i], want[i]) {
					t.Errorf("input %d: batched logits differ from a step of its own (relative %.3g)", i, relDiff(got[i], want[i]))
				}
			}
		})
	}
}
