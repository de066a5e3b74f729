package model_test

import (
	"testing"
)

// TestStepBytes checks the decode bandwidth accounting against the
// model's shape: the weights are counted once per step whatever the batch,
// the keys and values once per attended position and sequence.
func TestStepBytes(t *testing.T) {
	for _, name := range []string{"tiny", "tiny-q8_0", "135m-q8_0"} {
		t.Run(name, func(t *testing.T) {
			m := builtin(t, name)
			c := m.Config
			w := m.StepBytes(nil, 4)
			// Lower bound: a dense projection has at least Q8_0's 34 bytes
			// per 32 weights (F32 has 4 per weight); the output adds
			// Vocab x Dim.
			perLayer := c.Dim*(c.QDim()+2*c.KVDim()) + c.QDim()*c.Dim + 3*c.Dim*c.FFN
			minBytes := int64(perLayer*c.Layers+c.Vocab*c.Dim) * 34 / 32
			if w < minBytes || w > 4*minBytes*32/34 {
				t.Fatalf("weights %d bytes per step, want %d..%d for the shape", w, minBytes, 4*minBytes*32/34)
			}
			kv := int64(c.Layers * 2 * c.KVDim())
			tests := []struct {
				positions []int
				elem      int
				want      int64
			}{
				{[]int{0}, 4, w + kv*4},
				{[]int{9}, 2, w + 10*kv*2},
				{[]int{3, 127, 0}, 4, w + (4+128+1)*kv*4},
			}
			for _, tc := range tests {
				if got := m.StepBytes(tc.positions, tc.elem); got != tc.want {
					t.Errorf("StepBytes(%v, %d) = %d, want %d", tc.positions, tc.elem, got, tc.want)
				}
			}
		})
	}
}
