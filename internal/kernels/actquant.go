package kernels

import "math"

// Activation quantisation: how ggml's CPU backend turns a float32 activation
// row into the vec_dot_type of the weight before the dot product. These run
// once per activation row per MatMul, so they are plain Go in every build.

const (
	qk8 = 32  // values per Q8_0 / Q4_0 block
	qkK = 256 // values per K-quant super-block
)

// quantizeQ8_0 quantises x (a multiple of 32 long) into Q8_0 blocks the way
// ggml's x86 quantize_row_q8_0 does (the AVX path that produced the
// project's goldens): per block d = amax/127, stored as fp16; the quants
// are round-half-even(x * (127/amax)). q receives len(x) quants, d the
// fp16-rounded scale of each block as float32, and s the sum of each
// block's quants. MatMul uses quantizeQ8_0Packed, the same arithmetic
// writing qgemm.go's layout.
func quantizeQ8_0(x []float32, q []int8, d []float32, s []int32) {
	nb := len(x) / qk8
	for b := 0; b < nb; b++ {
		xb := x[b*qk8 : (b+1)*qk8]
		qb := q[b*qk8 : (b+1)*qk8]
		var id float32
		d[b], id = q8Scale(xb)
		var sum int32
		for j, v := range xb {
			qv := int8(math.RoundToEven(float64(v * id)))
			qb[j] = qv
			sum += int32(qv)
		}
		s[b] = sum
	}
}

// q8Scale is a Q8_0 block's scale as stored (amax/127, fp16-rounded) and
// the multiplier that quantises the block (127/amax, 0 for a zero block).
func q8Scale(xb []float32) (d, id float32) {
	var amax float32
	for _, v := range xb {
		if a := abs32(v); a > amax {
			amax = a
		}
	}
	if amax != 0 {
		id = 127 / amax
	}
	return f16ToF32(f32ToF16(amax / 127)), id
}

// quantizeQ8K quantises x (a multiple of 256 long) into Q8_K super-blocks
// following ggml's quantize_row_q8_K_ref: the scale comes from the value of
// largest magnitude (first one on ties, sign kept), iscale = -127/max, quants
// are round-half-even(iscale*x) capped at 127, d = 1/iscale, and bsums are
// the sums of each 16 quants.
func quantizeQ8K(x []float32, q []int8, d []float32, bsums []int16) {
	nb := len(x) / qkK
	for b := 0; b < nb; b++ {
		xb := x[b*qkK : (b+1)*qkK]
		qb := q[b*qkK : (b+1)*qkK]
		bs := bsums[b*16 : (b+1)*16]
		var amax, max float32
		for _, v := range xb {
			if a := abs32(v); a > amax {
				amax, max = a, v
			}
		}
		if amax == 0 {
			d[b] = 0
			clear(qb)
			clear(bs)
			continue
		}
		iscale := -127 / max
		for j, v := range xb {
			qv := math.RoundToEven(float64(iscale * v))
			if qv > 127 {
				qv = 127
			}
			qb[j] = int8(qv)
		}
		for j := range bs {
			var s int16
			for _, v := range qb[j*16 : (j+1)*16] {
				s += int16(v)
			}
			bs[j] = s
		}
		d[b] = 1 / iscale
	}
}

func abs32(v float32) float32 {
	return math.Float32frombits(math.Float32bits(v) &^ (1 << 31))
}
