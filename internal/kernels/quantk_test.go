package kernels

import (
	"math"
	"testing"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// quantKRows are activation rows of three super-blocks each that stress
// the Q8_K quantisers: random values, a zero super-block, ties for the
// largest magnitude with the negative one first (its sign must win),
// values whose scaled quants land on .5 and on 127, huge and tiny scales.
// A super-block whose largest magnitude is below 127/MaxFloat32 (about
// 3.7e-37) is outside every quantiser's domain: iscale overflows, and
// ggml's quantize_row_q8_K_ref asserts on it; activations after RMSNorm
// are nowhere near.
func quantKRows() [][]float32 {
	rng := newRand(47)
	var rows [][]float32
	for range 3 {
		rows = append(rows, randF32(rng, 3*qkK))
	}
	special := make([]float32, 3*qkK)
	for k := range special {
		switch s, j := k/qkK, k%qkK; s {
		case 0: // zeros
		case 1: // ties: -127 first, then +127; quants on halves
			special[k] = float32(j%64)/2 - 15.75
			if j == 5 {
				special[k] = -127
			}
			if j == 200 {
				special[k] = 127
			}
		default:
			special[k] = float32(rng.NormFloat64() * math.Pow(10, float64(j%60-30)))
		}
	}
	rows = append(rows, special)
	tiny := make([]float32, 3*qkK)
	for k := range tiny {
		tiny[k] = float32(rng.NormFloat64()) * 1e-30
	}
	return append(rows, tiny)
}

// TestQuantKVariants: every Q8_K activation quantiser writes exactly the
// reference's quants, scales and sum pairs, for both K-quant weight types
// and every group width, and leaves the group's other rows alone.
func TestQuantKVariants(t *testing.T) {
	const nb = 3
	for _, v := range quantKVariants {
		for _, typ := range []quant.Type{quant.Q4_K, quant.Q6_K} {
			for _, width := range []int{1, 4} {
				for ri, x := range quantKRows() {
					i := ri % width
					gq, gd, gp := make([]int8, nb*qkK*width), make([]float32, nb*width), make([]int32, nb*8*width)
					wq, wd, wp := make([]int8, nb*qkK*width), make([]float32, nb*width), make([]int32, nb*8*width)
					for j := range gq {
						gq[j], wq[j] = 77, 77
					}
					for j := range gd {
						gd[j], wd[j] = 7, 7
					}
					for j := range gp {
						gp[j], wp[j] = 7, 7
					}
					v.fn(typ, x, width, i, gq, gd, gp)
					quantizeQ8KPacked(typ, x, width, i, wq, wd, wp)
					for j := range wq {
						if gq[j] != wq[j] {
							t.Fatalf("%s %s width %d row %d: xq[%d] = %d, reference %d", v.name, typ, width, ri, j, gq[j], wq[j])
						}
					}
					for j := range wd {
						if math.Float32bits(gd[j]) != math.Float32bits(wd[j]) {
							t.Fatalf("%s %s width %d row %d: xd[%d] = %g, reference %g", v.name, typ, width, ri, j, gd[j], wd[j])
						}
					}
					for j := range wp {
						if gp[j] != wp[j] {
							t.Fatalf("%s %s width %d row %d: xp[%d] = %#x, reference %#x", v.name, typ, width, ri, j, gp[j], wp[j])
						}
					}
				}
			}
		}
	}
}
