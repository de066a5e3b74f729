package kernels

import (
	"encoding/binary"
	"math"
	"os"
	"testing"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// extTypes are the weight types of ref_ext.go, in the order of
// testdata/ggml-vecdot-ref.bin.
var extTypes = []quant.Type{quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q5_K, quant.Q3_K, quant.Q2_K, quant.IQ4_NL, quant.IQ4_XS}

// TestExtDotMatchesGGML holds each reference product to ggml's own.
// testdata/ggml-vecdot-ref.bin was written by a driver (kept outside the
// repository) compiled with ggml's src/ggml-quants.c and
// src/ggml-cpu/quants.c (ggml-org/ggml commit d99724f2, gcc -O2
// -ffp-contract=off, so the *_generic vec_dot functions). For the first
// two input cases of ../quant/testdata/ggml-quantize-ref.bin, first 512
// values x: weights = x quantised by ggml's reference quantiser of the
// type, activations a[i] = x[(7i+3) mod 512] * (i%3 ? 1 : -1) quantised by
// quantize_row_q8_{0,1,K}_ref. Per case: u32 n, then per type the weight
// bytes, the activation bytes and ggml's float32 result. The products must
// agree bit for bit (Q5_K, Q3_K: to float rounding, see dotQ5KRef).
func TestExtDotMatchesGGML(t *testing.T) {
	data, err := os.ReadFile("testdata/ggml-vecdot-ref.bin")
	if err != nil {
		t.Fatal(err)
	}
	le16 := binary.LittleEndian.Uint16
	for c := 0; len(data) > 0; c++ {
		n := int(binary.LittleEndian.Uint32(data))
		data = data[4:]
		for _, typ := range extTypes {
			wb, _ := quant.RowBytes(typ, n)
			w := data[:wb]
			data = data[wb:]
			xq := make([]int8, n)
			var got float32
			switch typ {
			case quant.Q4_1, quant.Q5_1: // Q8_1: fp16 d, fp16 s, 32 quants
				nb := n / 32
				xd, xs := make([]float32, nb), make([]float32, nb)
				for b := 0; b < nb; b++ {
					blk := data[36*b:]
					xd[b], xs[b] = f16ToF32(le16(blk)), f16ToF32(le16(blk[2:]))
					for j := 0; j < 32; j++ {
						xq[32*b+j] = int8(blk[4+j])
					}
				}
				data = data[36*nb:]
				if typ == quant.Q4_1 {
					got = dotQ4_1Ref(w, xq, xd, xs)
				} else {
					got = dotQ5_1Ref(w, xq, xd, xs)
				}
			case quant.Q5_0, quant.IQ4_NL: // Q8_0
				nb := n / 32
				xd := make([]float32, nb)
				for b := 0; b < nb; b++ {
					blk := data[34*b:]
					xd[b] = f16ToF32(le16(blk))
					for j := 0; j < 32; j++ {
						xq[32*b+j] = int8(blk[2+j])
					}
				}
				data = data[34*nb:]
				if typ == quant.Q5_0 {
					got = dotQ5_0Ref(w, xq, xd)
				} else {
					got = dotIQ4NLRef(w, xq, xd)
				}
			default: // Q8_K: float32 d, 256 quants, 16 int16 bsums
				nb := n / 256
				xd, bs := make([]float32, nb), make([]int16, 16*nb)
				for b := 0; b < nb; b++ {
					blk := data[292*b:]
					xd[b] = math.Float32frombits(binary.LittleEndian.Uint32(blk))
					for j := 0; j < 256; j++ {
						xq[256*b+j] = int8(blk[4+j])
					}
					for j := 0; j < 16; j++ {
						bs[16*b+j] = int16(le16(blk[260+2*j:]))
					}
				}
				data = data[292*nb:]
				switch typ {
				case quant.Q5_K:
					got = dotQ5KRef(w, xq, xd, bs)
				case quant.Q3_K:
					got = dotQ3KRef(w, xq, xd)
				case quant.Q2_K:
					got = dotQ2KRef(w, xq, xd, bs)
				case quant.IQ4_XS:
					got = dotIQ4XSRef(w, xq, xd)
				}
			}
			want := math.Float32frombits(binary.LittleEndian.Uint32(data))
			data = data[4:]
			if typ == quant.Q5_K || typ == quant.Q3_K {
				// Summed per super-block as Q4_K/Q6_K are (dotQ5KRef,
				// dotQ3KRef), not over ggml's eight float lanes: float
				// rounding apart.
				if d := math.Abs(float64(got - want)); d > 1e-5*math.Abs(float64(want)) {
					t.Errorf("case %d %s: reference product %g, ggml %g (diff %g)", c, typ, got, want, d)
				}
				continue
			}
			if math.Float32bits(got) != math.Float32bits(want) {
				t.Errorf("case %d %s: reference product %g (%#08x), ggml %g (%#08x)", c, typ, got, math.Float32bits(got), want, math.Float32bits(want))
			}
		}
	}
}
