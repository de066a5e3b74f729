package kernels

import (
	"encoding/binary"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// Reference products for the weight types llama-quantize mixes into K-quant
// files (Q4_1, Q5_0, Q5_1, IQ4_NL: its fall-backs for rows that are not a
// multiple of 256) and the remaining K and IQ4 types. Each is ggml's
// generic (scalar) ggml_vec_dot_<type>_<vec_dot_type> step for step, over
// GGML's own row layout, with an explicit float32 conversion wherever C
// rounds (except Q5_K, summed as Q4_K is: see dotQ5KRef);
// testdata/ggml-vecdot-ref.bin holds ggml's own results for them.
// MatMul reaches the same bits through repacked weights where it has a
// fast path (matrix_ext.go).

// quantizeQ8_1 quantises x into Q8_1 blocks as ggml's x86
// quantize_row_q8_1 does: quants and fp16 scale exactly as quantizeQ8_0,
// plus s = fp16(d*sum(quants)) with d = amax/127 before fp16 rounding (the
// weight-side mins of Q4_1/Q5_1 meet it). q receives len(x) quants; d and s
// one float32 (fp16-rounded) per block.
func quantizeQ8_1(x []float32, q []int8, d, s []float32) {
	nb := len(x) / qk8
	var sum [1]int32
	for b := 0; b < nb; b++ {
		xb := x[b*qk8 : (b+1)*qk8]
		quantizeQ8_0(xb, q[b*qk8:(b+1)*qk8], d[b:b+1], sum[:])
		s[b] = q8_1Sum(xb, sum[0])
	}
}

// q8_1Sum is a Q8_1 block's s for the block's values xb whose quants sum to
// sum.
func q8_1Sum(xb []float32, sum int32) float32 {
	var amax float32
	for _, v := range xb {
		amax = max(amax, abs32(v))
	}
	return f16ToF32(f32ToF16(float32(amax/127) * float32(sum)))
}

// q5Val is value j (0..31) of a 32-value block with nibbles qs[16] and
// fifth bits qh (0 for the 4-bit types): value j in the low nibble of
// qs[j%16] for j < 16, the high nibble for j >= 16; bit j of qh is its
// bit 4.
func q5Val(qs []byte, qh uint32, j int) int32 {
	v := int32(qs[j%16])
	if j >= 16 {
		v >>= 4
	}
	return v&0x0f | int32(qh>>uint(j)&1)<<4
}

// dotQ4_1Ref is ggml_vec_dot_q4_1_q8_1 over one Q4_1 row (20-byte blocks:
// fp16 d, fp16 m, 16 bytes of nibbles): per block (d_w*d_x)*sumi + m*s,
// summed in block order.
func dotQ4_1Ref(row []byte, xq []int8, xd, xs []float32) float32 {
	return dotQ1Ref(row, 20, false, xq, xd, xs)
}

// dotQ5_1Ref is ggml_vec_dot_q5_1_q8_1 (24-byte blocks: fp16 d, fp16 m,
// u32 qh, 16 bytes of nibbles).
func dotQ5_1Ref(row []byte, xq []int8, xd, xs []float32) float32 {
	return dotQ1Ref(row, 24, true, xq, xd, xs)
}

func dotQ1Ref(row []byte, bb int, five bool, xq []int8, xd, xs []float32) float32 {
	nb := len(xd)
	row, xq, xs = row[:nb*bb], xq[:nb*qk8], xs[:nb]
	var acc float32
	for b := 0; b < nb; b++ {
		blk := row[b*bb : (b+1)*bb]
		var qh uint32
		qs := blk[4:20]
		if five {
			qh, qs = binary.LittleEndian.Uint32(blk[4:]), blk[8:24]
		}
		var sumi int32
		for j := 0; j < qk8; j++ {
			sumi += q5Val(qs, qh, j) * int32(xq[b*qk8+j])
		}
		d := float32(f16ToF32(binary.LittleEndian.Uint16(blk)) * xd[b])
		m := f16ToF32(binary.LittleEndian.Uint16(blk[2:]))
		acc += float32(float32(d*float32(sumi)) + float32(m*xs[b]))
	}
	return acc
}

// dotQ5_0Ref is ggml_vec_dot_q5_0_q8_0 over one Q5_0 row (22-byte blocks:
// fp16 d, u32 qh, 16 bytes of nibbles; values stored +16): as Q8_0, the
// sum in block order of float(sumi) * (d_w*d_x).
func dotQ5_0Ref(row []byte, xq []int8, xd []float32) float32 {
	nb := len(xd)
	row, xq = row[:nb*22], xq[:nb*qk8]
	var acc float32
	for b := 0; b < nb; b++ {
		blk := row[b*22 : (b+1)*22]
		qh := binary.LittleEndian.Uint32(blk[2:])
		var sumi int32
		for j := 0; j < qk8; j++ {
			sumi += (q5Val(blk[6:22], qh, j) - 16) * int32(xq[b*qk8+j])
		}
		d := float32(f16ToF32(binary.LittleEndian.Uint16(blk)) * xd[b])
		acc += float32(d * float32(sumi))
	}
	return acc
}

// dotIQ4NLRef is ggml_vec_dot_iq4_nl_q8_0 over one IQ4_NL row (18-byte
// blocks: fp16 d, 16 bytes of 4-bit indices into quant.KValuesIQ4NL).
func dotIQ4NLRef(row []byte, xq []int8, xd []float32) float32 {
	nb := len(xd)
	row, xq = row[:nb*18], xq[:nb*qk8]
	var acc float32
	for b := 0; b < nb; b++ {
		blk := row[b*18 : (b+1)*18]
		var sumi int32
		for j := 0; j < qk8; j++ {
			sumi += int32(quant.KValuesIQ4NL[q5Val(blk[2:18], 0, j)]) * int32(xq[b*qk8+j])
		}
		d := float32(xd[b] * f16ToF32(binary.LittleEndian.Uint16(blk)))
		acc += float32(d * float32(sumi))
	}
	return acc
}

// dotQ5KRef is the Q5_K product (176-byte blocks: fp16 d, fp16 dmin, 12
// scale bytes as Q4_K, qh[32], qs[128]) with Q8_K activations, in the
// per-super-block form of dotQ4KRef: d_w*d_x * sum(scale_j * q.q8) -
// dmin*d_x * sum(min_j * bsums), added to the running sum block by block.
// The integer sums are ggml's exactly; ggml's generic code spreads the
// first over eight float lanes instead (and its x86 code over vector
// lanes), so the result is within float rounding of ggml's, not bit-equal
// (TestExtDotMatchesGGML bounds the difference). This form is what the
// repacked kernel (mulQ5K) can reproduce bit for bit.
func dotQ5KRef(row []byte, xq []int8, xd []float32, xbs []int16) float32 {
	nb := len(xd)
	row, xq, xbs = row[:nb*176], xq[:nb*qkK], xbs[:nb*16]
	var acc float32
	var a [qkK]int8
	for b := 0; b < nb; b++ {
		blk := row[b*176 : (b+1)*176]
		for k := range a {
			a[k] = int8(q5KValue(blk, k))
		}
		var isum, msum int32
		for j := 0; j < 8; j++ {
			sc, m := q4KScaleMin(j, blk[4:16])
			msum += int32(m) * (int32(xbs[b*16+2*j]) + int32(xbs[b*16+2*j+1]))
			isum += int32(sc) * dot32i8((*[32]int8)(a[32*j:]), (*[32]int8)(xq[b*qkK+32*j:]))
		}
		d := float32(f16ToF32(binary.LittleEndian.Uint16(blk)) * xd[b])
		dmin := float32(f16ToF32(binary.LittleEndian.Uint16(blk[2:])) * xd[b])
		acc += float32(d*float32(isum)) - float32(dmin*float32(msum))
	}
	return acc
}

// q5KValue is value k (0..255) of a Q5_K block: nibble as in Q4_K (values
// 64c..64c+31 low nibbles of qs[32c:], 64c+32.. high nibbles), bit 4 from
// bit k/32 of qh[k%32].
func q5KValue(blk []byte, k int) int32 {
	j, l := k/32, k%32
	v := blk[48+32*(j/2)+l]
	if j%2 == 1 {
		v >>= 4
	}
	return int32(v&0x0f | (blk[16+l]>>uint(j)&1)<<4)
}

// q3KScale is the i-th (0..15) scale of a Q3_K block's 12 scale bytes,
// minus 32 (see quant's dequantQ3_K).
func q3KScale(s []byte, i int) int32 {
	lo := s[i%8]
	if i >= 8 {
		lo >>= 4
	}
	return int32(lo&0x0f|(s[8+i%4]>>uint(2*(i/4))&3)<<4) - 32
}

// q3KValue is value k (0..255) of a Q3_K block (hmask[32], qs[64]): two
// bits at 2s of qs[32h+l] for k = 128h+32s+l, minus 4 unless bit s+4h of
// hmask[l] is set.
func q3KValue(blk []byte, k int) int32 {
	h, s, l := k/128, k%128/32, k%32
	v := int32(blk[32+32*h+l] >> uint(2*s) & 3)
	if blk[l]>>uint(s+4*h)&1 == 0 {
		v -= 4
	}
	return v
}

// dotQ3KRef is the Q3_K product (110-byte blocks: hmask[32], qs[64], 12
// scale bytes, fp16 d) with Q8_K activations, in the per-super-block form
// of dotQ6KRef: d_w*d_x * sum over 16-value groups of (scale-32) * (q.q8).
// ggml's generic code spreads that integer sum over eight float lanes, so
// the result is within float rounding of ggml's (TestExtDotMatchesGGML),
// and bit for bit what MatMul's Q6_K kernels give on the repacked blocks.
func dotQ3KRef(row []byte, xq []int8, xd []float32) float32 {
	nb := len(xd)
	row, xq = row[:nb*110], xq[:nb*qkK]
	var acc float32
	var a [qkK]int8
	for b := 0; b < nb; b++ {
		blk := row[b*110 : (b+1)*110]
		for k := range a {
			a[k] = int8(q3KValue(blk, k))
		}
		var isum int32
		for g := 0; g < 16; g++ {
			isum += q3KScale(blk[96:108], g) * dot16i8((*[16]int8)(a[16*g:]), (*[16]int8)(xq[b*qkK+16*g:]))
		}
		d := float32(f16ToF32(binary.LittleEndian.Uint16(blk[108:])) * xd[b])
		acc += float32(d * float32(isum))
	}
	return acc
}

// dotQ2KRef is ggml_vec_dot_q2_K_q8_K over one Q2_K row (84-byte blocks:
// 16 scale bytes (scale low nibble, min high nibble), qs[64], fp16 d, fp16
// dmin): per super-block dall*isum - dmin*summs.
func dotQ2KRef(row []byte, xq []int8, xd []float32, xbs []int16) float32 {
	nb := len(xd)
	row, xq, xbs = row[:nb*84], xq[:nb*qkK], xbs[:nb*16]
	var sumf float32
	for b := 0; b < nb; b++ {
		blk := row[b*84 : (b+1)*84]
		xb := xq[b*qkK : (b+1)*qkK]
		var summs, isum int32
		for j := 0; j < 16; j++ {
			summs += int32(xbs[b*16+j]) * int32(blk[j]>>4)
		}
		for k := 0; k < qkK; k++ {
			h, s, l := k/128, k%128/32, k%32
			isum += int32(blk[k/16]&0x0f) * int32(blk[16+32*h+l]>>uint(2*s)&3) * int32(xb[k])
		}
		dall := float32(xd[b] * f16ToF32(binary.LittleEndian.Uint16(blk[80:])))
		dmin := float32(xd[b] * f16ToF32(binary.LittleEndian.Uint16(blk[82:])))
		sumf += float32(float32(dall*float32(isum)) - float32(dmin*float32(summs)))
	}
	return sumf
}

// dotIQ4XSRef is ggml_vec_dot_iq4_xs_q8_K over one IQ4_XS row (136-byte
// blocks: fp16 d, u16 scales_h, scales_l[4], qs[128]): per 32-value
// sub-block, (d_w*d_x*(ls-32)) * sumi, summed in order.
func dotIQ4XSRef(row []byte, xq []int8, xd []float32) float32 {
	nb := len(xd)
	row, xq = row[:nb*136], xq[:nb*qkK]
	var sumf float32
	for b := 0; b < nb; b++ {
		blk := row[b*136 : (b+1)*136]
		xb := xq[b*qkK : (b+1)*qkK]
		d4d8 := float32(f16ToF32(binary.LittleEndian.Uint16(blk)) * xd[b])
		sh := binary.LittleEndian.Uint16(blk[2:])
		for ib := 0; ib < 8; ib++ {
			ls := int32(blk[4+ib/2]>>uint(4*(ib%2))&0x0f) | int32(sh>>uint(2*ib)&3)<<4
			dl := float32(d4d8 * float32(ls-32))
			var sumi int32
			for j := 0; j < 32; j++ {
				sumi += int32(quant.KValuesIQ4NL[q5Val(blk[8+16*ib:8+16*ib+16], 0, j)]) * int32(xb[32*ib+j])
			}
			sumf += float32(dl * float32(sumi))
		}
	}
	return sumf
}
