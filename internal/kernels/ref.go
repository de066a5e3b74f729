package kernels

import (
	"encoding/binary"
	"math"
)

// Plain-Go reference kernels. They are the test oracle for the assembly and
// the implementation on every platform without it. The quantised vec_dot
// functions below work on GGML's own row layout: MatMul computes the same
// thing over repacked weights (qTileRef, kTileRef), and tests hold the two
// bit-identical, tying the packing to ggml's definitions. Float kernels keep
// four partial sums (readable, and 2-3x faster than one); the quantised ones
// follow ggml's scalar vec_dot functions step by step, with explicit float32
// conversions wherever ggml rounds, so that the Go compiler cannot fuse a
// multiply-add and change the bits.

func dotRef(a, b []float32) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * b[i]
		s1 += a[i+1] * b[i+1]
		s2 += a[i+2] * b[i+2]
		s3 += a[i+3] * b[i+3]
	}
	for ; i < len(a); i++ {
		s0 += a[i] * b[i]
	}
	return (s0 + s1) + (s2 + s3)
}

func dotF16Ref(a []float32, b []uint16) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * f16ToF32(b[i])
		s1 += a[i+1] * f16ToF32(b[i+1])
		s2 += a[i+2] * f16ToF32(b[i+2])
		s3 += a[i+3] * f16ToF32(b[i+3])
	}
	for ; i < len(a); i++ {
		s0 += a[i] * f16ToF32(b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

func dotBF16Ref(a []float32, b []uint16) float32 {
	b = b[:len(a)]
	var s0, s1, s2, s3 float32
	i := 0
	for ; i+4 <= len(a); i += 4 {
		s0 += a[i] * bf16ToF32(b[i])
		s1 += a[i+1] * bf16ToF32(b[i+1])
		s2 += a[i+2] * bf16ToF32(b[i+2])
		s3 += a[i+3] * bf16ToF32(b[i+3])
	}
	for ; i < len(a); i++ {
		s0 += a[i] * bf16ToF32(b[i])
	}
	return (s0 + s1) + (s2 + s3)
}

func axpyRef(dst []float32, a float32, x []float32) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += a * x[i]
	}
}

func axpyF16Ref(dst []float32, a float32, x []uint16) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += a * f16ToF32(x[i])
	}
}

func f16ToF32sRef(dst []float32, src []uint16) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = f16ToF32(src[i])
	}
}

func f32ToF16sRef(dst []uint16, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] = f32ToF16(src[i])
	}
}

func f16ToF32RowsRef(dst []float32, ds int, src []uint16, ss, rows, cols int, _ []uint16) {
	for i := range rows {
		f16ToF32sRef(dst[i*ds:i*ds+cols], src[i*ss:i*ss+cols])
	}
}

// rmsNormRef mirrors ggml_compute_forward_rms_norm followed by the weight
// multiply: the sum of squares is accumulated in float64 (ggml_float), the
// scale is 1/sqrtf(mean+eps) in float32, and each output is (x*scale)*w.
func rmsNormRef(dst, x, w []float32, eps float32) {
	x = x[:len(dst)]
	w = w[:len(dst)]
	var sum float64
	for _, v := range x {
		sum += float64(v * v)
	}
	mean := sum / float64(len(x))
	scale := 1 / float32(math.Sqrt(float64(float32(mean+float64(eps)))))
	for i, v := range x {
		dst[i] = float32(v*scale) * w[i]
	}
}

// softmaxRef mirrors ggml's soft_max over one row: subtract the max,
// exponentiate in float32, sum in float64, multiply by the reciprocal.
func softmaxRef(x []float32) {
	if len(x) == 0 {
		return
	}
	max := float32(math.Inf(-1))
	for _, v := range x {
		if v > max {
			max = v
		}
	}
	var sum float64
	for i, v := range x {
		e := float32(math.Exp(float64(v - max)))
		x[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// siluMulRef is ggml's swiglu: silu(g) = g/(1+expf(-g)), times up.
func siluMulRef(dst, gate, up []float32) {
	gate = gate[:len(dst)]
	up = up[:len(dst)]
	for i, g := range gate {
		s := g / (1 + float32(math.Exp(float64(-g))))
		dst[i] = s * up[i]
	}
}

func addRef(dst, x []float32) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += x[i]
	}
}

// dotQ8_0Ref is ggml_vec_dot_q8_0_q8_0 over one GGML Q8_0 row (34-byte
// blocks: fp16 d, 32 int8 quants): the sum, in block order, of
// float(int dot) * (d_w*d_x), each product rounded to float32. MatMul
// computes this with packed weights (qTileRef); this form over GGML bytes
// is the test oracle tying the packing to ggml's definition.
func dotQ8_0Ref(row []byte, xq []int8, xd []float32) float32 {
	nb := len(xd)
	row, xq = row[:nb*34], xq[:nb*qk8]
	var acc float32
	for b := 0; b < nb; b++ {
		blk := (*[34]byte)(row[b*34:])
		xb := (*[qk8]int8)(xq[b*qk8:])
		var sumi int32
		for j := range xb {
			sumi += int32(int8(blk[2+j])) * int32(xb[j])
		}
		d := float32(f16ToF32(binary.LittleEndian.Uint16(blk[:])) * xd[b])
		acc += float32(float32(sumi) * d)
	}
	return acc
}

// dotQ4_0Ref is ggml_vec_dot_q4_0_q8_0 over one GGML Q4_0 row (18-byte
// blocks: fp16 d, 16 bytes of nibbles; the low nibbles are values 0..15 of
// the block, the high nibbles values 16..31, each stored with +8 bias).
// Like dotQ8_0Ref it is the oracle for the packed kernels.
func dotQ4_0Ref(row []byte, xq []int8, xd []float32) float32 {
	nb := len(xd)
	row, xq = row[:nb*18], xq[:nb*qk8]
	var acc float32
	for b := 0; b < nb; b++ {
		blk := (*[18]byte)(row[b*18:])
		xb := (*[qk8]int8)(xq[b*qk8:])
		var sumi int32
		for j := 0; j < 16; j++ {
			v0 := int32(blk[2+j]&0x0f) - 8
			v1 := int32(blk[2+j]>>4) - 8
			sumi += v0*int32(xb[j]) + v1*int32(xb[j+16])
		}
		d := float32(f16ToF32(binary.LittleEndian.Uint16(blk[:])) * xd[b])
		acc += float32(float32(sumi) * d)
	}
	return acc
}

// q4KScaleMin unpacks the j-th 6-bit (scale, min) pair of a Q4_K block's
// 12 scale bytes (ggml's get_scale_min_k4): pairs 0-3 sit in the low six
// bits of bytes 0-3 and 4-7; pairs 4-7 take their low four bits from bytes
// 8-11 and their top two from the spare high bits of bytes 0-7.
func q4KScaleMin(j int, s []byte) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0x0f | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// dotQ4KRef is ggml_vec_dot_q4_K_q8_K over one Q4_K row (144-byte blocks:
// fp16 d, fp16 dmin, 12 scale bytes, 128 bytes of nibbles; each 32-byte
// run of qs holds sub-block 2k in its low nibbles and 2k+1 in its high
// ones). Per super-block: d_w*d_x * sum(scale_j * q.q8) - dmin*d_x *
// sum(min_j * bsums); the integer sums are exact.
func dotQ4KRef(row []byte, xq []int8, xd []float32, xbs []int16) float32 {
	nb := len(xd)
	row, xq, xbs = row[:nb*144], xq[:nb*qkK], xbs[:nb*16]
	var acc float32
	var a [qkK]int8 // the block's 4-bit values, in element order
	for b := 0; b < nb; b++ {
		blk := (*[144]byte)(row[b*144:])
		xb := (*[qkK]int8)(xq[b*qkK:])
		bs := (*[16]int16)(xbs[b*16:])
		for c := 0; c < 4; c++ {
			q := (*[32]byte)(blk[16+32*c:])
			lo, hi := (*[32]int8)(a[64*c:]), (*[32]int8)(a[64*c+32:])
			for l := range q {
				lo[l] = int8(q[l] & 0x0f)
				hi[l] = int8(q[l] >> 4)
			}
		}
		var isum, msum int32
		for j := 0; j < 8; j++ {
			sc, m := q4KScaleMin(j, blk[4:16])
			msum += int32(m) * (int32(bs[2*j]) + int32(bs[2*j+1]))
			isum += int32(sc) * dot32i8((*[32]int8)(a[32*j:]), (*[32]int8)(xb[32*j:]))
		}
		d := float32(f16ToF32(binary.LittleEndian.Uint16(blk[0:])) * xd[b])
		dmin := float32(f16ToF32(binary.LittleEndian.Uint16(blk[2:])) * xd[b])
		acc += float32(d*float32(isum)) - float32(dmin*float32(msum))
	}
	return acc
}

// dot32i8 is the exact integer dot product of 32 signed bytes.
func dot32i8(a, b *[32]int8) int32 {
	var s0, s1 int32
	for l := 0; l < 32; l += 2 {
		s0 += int32(a[l]) * int32(b[l])
		s1 += int32(a[l+1]) * int32(b[l+1])
	}
	return s0 + s1
}

// q6KValue returns the i-th (0..255) 6-bit value of a Q6_K block, minus 32.
// Layout per 128-value half h: ql[64h:64h+64] holds low nibbles (values
// l and l+64 share ql[l], values l+32 and l+96 share ql[l+32]), qh[32h+l]
// holds the two high bits of values l, l+32, l+64, l+96 at shifts 0,2,4,6.
func q6KValue(ql, qh []byte, i int) int32 {
	h, k := i/128, i%128
	quarter, l := k/32, k%32
	lo := ql[64*h+l+32*(quarter%2)]
	if quarter >= 2 {
		lo >>= 4
	}
	hi := (qh[32*h+l] >> (2 * quarter)) & 3
	return int32(lo&0x0f|hi<<4) - 32
}

// dotQ6KRef is ggml_vec_dot_q6_K_q8_K over one Q6_K row (210-byte blocks:
// ql[128], qh[64], 16 int8 scales, fp16 d). Per super-block:
// d_w*d_x * sum over 16-value groups of scale_g * (q.q8).
func dotQ6KRef(row []byte, xq []int8, xd []float32) float32 {
	nb := len(xd)
	row, xq = row[:nb*210], xq[:nb*qkK]
	var acc float32
	var a [qkK]int8 // the block's values minus 32, in element order
	for b := 0; b < nb; b++ {
		blk := (*[210]byte)(row[b*210:])
		xb := (*[qkK]int8)(xq[b*qkK:])
		unpackQ6K(blk, &a)
		var isum int32
		for g := 0; g < 16; g++ {
			isum += int32(int8(blk[192+g])) * dot16i8((*[16]int8)(a[16*g:]), (*[16]int8)(xb[16*g:]))
		}
		d := float32(f16ToF32(binary.LittleEndian.Uint16(blk[208:])) * xd[b])
		acc += float32(d * float32(isum))
	}
	return acc
}

// unpackQ6K expands a Q6_K block's 256 6-bit values (minus 32), with the
// layout q6KValue describes, four values per step.
func unpackQ6K(blk *[210]byte, a *[qkK]int8) {
	for h := 0; h < 2; h++ {
		ql := (*[64]byte)(blk[64*h:])
		qh := (*[32]byte)(blk[128+32*h:])
		out := (*[128]int8)(a[128*h:])
		for l := 0; l < 32; l++ {
			hb := qh[l]
			out[l] = int8(ql[l]&0x0f|(hb&3)<<4) - 32
			out[l+32] = int8(ql[l+32]&0x0f|(hb>>2&3)<<4) - 32
			out[l+64] = int8(ql[l]>>4|(hb>>4&3)<<4) - 32
			out[l+96] = int8(ql[l+32]>>4|(hb>>6&3)<<4) - 32
		}
	}
}

// dot16i8 is the exact integer dot product of 16 signed bytes.
func dot16i8(a, b *[16]int8) int32 {
	var s0, s1 int32
	for l := 0; l < 16; l += 2 {
		s0 += int32(a[l]) * int32(b[l])
		s1 += int32(a[l+1]) * int32(b[l+1])
	}
	return s0 + s1
}
