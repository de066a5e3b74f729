package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Quantize encodes src as type t, following ggml's reference
// quantize_row_*_ref functions (no importance matrix). len(src) must be a
// multiple of t.BlockSize(). Every Supported type can be written; IQ4_NL
// and IQ4_XS follow quantize_iq4_nl/_xs without an importance matrix (what
// llama-quantize runs; ggml's _ref for them is a cruder one-pass fit).
// Inputs holding NaN or infinities give unspecified (but non-panicking)
// results for the block types, as in ggml.
func Quantize(t Type, src []float32) ([]byte, error) {
	if err := checkType(t); err != nil {
		return nil, err
	}
	n, err := RowBytes(t, len(src))
	if err != nil {
		return nil, err
	}
	out := make([]byte, n)
	switch t {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(out[2*i:], F32ToF16(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(out[2*i:], F32ToBF16(v))
		}
	case Q8_0:
		for b := 0; b < len(src)/32; b++ {
			quantBlockQ8_0(src[32*b:32*b+32], out[34*b:34*b+34])
		}
	case Q4_0:
		for b := 0; b < len(src)/32; b++ {
			quantBlockQ4_0(src[32*b:32*b+32], out[18*b:18*b+18])
		}
	case Q4_K:
		for b := 0; b < len(src)/QK_K; b++ {
			quantBlockQ4_K(src[QK_K*b:QK_K*b+QK_K], out[144*b:144*b+144])
		}
	case Q6_K:
		for b := 0; b < len(src)/QK_K; b++ {
			quantBlockQ6_K(src[QK_K*b:QK_K*b+QK_K], out[210*b:210*b+210])
		}
	case Q4_1:
		for b := 0; b < len(src)/32; b++ {
			quantBlockQ4_1(src[32*b:32*b+32], out[20*b:20*b+20])
		}
	case Q5_0:
		for b := 0; b < len(src)/32; b++ {
			quantBlockQ5_0(src[32*b:32*b+32], out[22*b:22*b+22])
		}
	case Q5_1:
		for b := 0; b < len(src)/32; b++ {
			quantBlockQ5_1(src[32*b:32*b+32], out[24*b:24*b+24])
		}
	case Q5_K:
		for b := 0; b < len(src)/QK_K; b++ {
			quantBlockQ5_K(src[QK_K*b:QK_K*b+QK_K], out[176*b:176*b+176])
		}
	case Q3_K:
		for b := 0; b < len(src)/QK_K; b++ {
			quantBlockQ3_K(src[QK_K*b:QK_K*b+QK_K], out[110*b:110*b+110])
		}
	case Q2_K:
		for b := 0; b < len(src)/QK_K; b++ {
			quantBlockQ2_K(src[QK_K*b:QK_K*b+QK_K], out[84*b:84*b+84])
		}
	case IQ4_NL:
		for b := 0; b < len(src)/32; b++ {
			quantBlockIQ4_NL(src[32*b:32*b+32], out[18*b:18*b+18])
		}
	case IQ4_XS:
		for b := 0; b < len(src)/QK_K; b++ {
			quantBlockIQ4_XS(src[QK_K*b:QK_K*b+QK_K], out[136*b:136*b+136])
		}
	default:
		return nil, fmt.Errorf("%w %s (quantize)", ErrUnsupported, t)
	}
	return out, nil
}

func abs32(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ (1 << 31)) }

// quantBlockQ8_0: d = amax/127, q = round(x/d) computed as x*(1/d), rounding
// half away from zero (C roundf).
func quantBlockQ8_0(x []float32, blk []byte) {
	var amax float32
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax = a
		}
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	for j, v := range x {
		blk[2+j] = byte(int8(math.Round(float64(v * id))))
	}
}

// quantBlockQ4_0: the value of largest magnitude maps to -8 (d = max/-8), so
// the full range [-8, 7] is used on that side; q = min(15, trunc(x/d + 8.5)).
func quantBlockQ4_0(x []float32, blk []byte) {
	var amax, max float32
	for _, v := range x {
		if a := abs32(v); amax < a {
			amax, max = a, v
		}
	}
	d := max / -8
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	for j := 0; j < 16; j++ {
		x0 := float32(x[j] * id)
		x1 := float32(x[j+16] * id)
		blk[2+j] = q4nib(x0) | q4nib(x1)<<4
	}
}

func q4nib(v float32) byte {
	q := int32(int8(int32(v + 8.5))) // C: (int8_t)(x + 8.5f)
	if q > 15 {
		q = 15
	}
	return byte(q) & 0xf
}

// nearestInt rounds to the nearest integer, ties to even, by ggml's
// 1.5*2^23 trick (valid for |f| <= 4194303; other inputs give garbage, as in
// ggml, never a panic). The float32 conversion stops the compiler fusing a
// caller's multiply into the addition.
func nearestInt(f float32) int32 {
	v := float32(f) + 12582912
	return int32(math.Float32bits(v)&0x007fffff) - 0x00400000
}

func clamp(v, lo, hi int32) int32 {
	return max(lo, min(hi, v))
}

// makeQKX2 is ggml's make_qkx2_quants: it picks a scale and a min for a
// group of values quantized to [0, nmax] by trying nstep+1 candidate scales
// and keeping the one with the smallest weighted squared error. It returns
// the scale and the (positive) min to subtract. mad weighs absolute
// instead of squared errors (ggml's use_mad, which Q2_K sets).
func makeQKX2(nmax int32, x, w []float32, L, laux []uint8, rmin, rdelta float32, nstep int, mad bool) (scale, theMin float32) {
	lo, hi := x[0], x[0]
	sumW := w[0]
	sumX := sumW * x[0]
	for i := 1; i < len(x); i++ {
		lo = min(lo, x[i])
		hi = max(hi, x[i])
		sumW += w[i]
		sumX += float32(w[i] * x[i])
	}
	if lo > 0 {
		lo = 0
	}
	if hi == lo {
		for i := range L[:len(x)] {
			L[i] = 0
		}
		return 0, -lo
	}
	iscale := float32(nmax) / (hi - lo)
	scale = 1 / iscale
	var bestErr float32
	for i := range x {
		l := clamp(nearestInt(iscale*(x[i]-lo)), 0, nmax)
		L[i] = uint8(l)
		bestErr += float32(w[i] * qkx2Err(float32(float32(scale*float32(l))+lo)-x[i], mad))
	}
	for is := 0; is <= nstep; is++ {
		iscale = (float32(rmin+float32(rdelta*float32(is))) + float32(nmax)) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i := range x {
			l := clamp(nearestInt(iscale*(x[i]-lo)), 0, nmax)
			laux[i] = uint8(l)
			fl := float32(l)
			wl := w[i] * fl
			sumL += wl
			sumL2 += float32(wl * fl)
			sumXL += float32(wl * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var cur float32
			for i := range x {
				cur += float32(w[i] * qkx2Err(float32(float32(thisScale*float32(laux[i]))+thisMin)-x[i], mad))
			}
			if cur < bestErr {
				copy(L[:len(x)], laux[:len(x)])
				bestErr, scale, lo = cur, thisScale, thisMin
			}
		}
	}
	return scale, -lo
}

// qkx2Err is make_qkx2_quants' error of one value: |diff| or diff².
func qkx2Err(diff float32, mad bool) float32 {
	if mad {
		return abs32(diff)
	}
	return float32(diff * diff)
}

// groupMaxEps is ggml's GROUP_MAX_EPS: groups whose largest magnitude is
// below it quantize to zero.
const groupMaxEps = 1e-15

// makeQX is ggml's make_qx_quants with rmse_type 1 (weights x²) and no
// importance matrix: symmetric quantization to [-nmax, nmax-1], stored in L
// with nmax added. It returns the scale.
func makeQX(nmax int32, x []float32, L []int8) float32 {
	var amax, mx float32
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	if amax < groupMaxEps {
		for i := range L[:len(x)] {
			L[i] = 0
		}
		return 0
	}
	fn := float32(nmax)
	iscale := -fn / mx
	var sumlx, suml2 float32
	for i, v := range x {
		l := clamp(nearestInt(iscale*v), -nmax, nmax-1)
		L[i] = int8(l + nmax)
		w := float32(v * v)
		fl := float32(l)
		sumlx += float32(float32(w*v) * fl)
		suml2 += float32(float32(w*fl) * fl)
	}
	var scale float32
	if suml2 != 0 {
		scale = sumlx / suml2
	}
	best := scale * sumlx
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(fn + float32(0.1*float32(is))) / mx
		sumlx, suml2 = 0, 0
		for _, v := range x {
			l := clamp(nearestInt(iscale*v), -nmax, nmax-1)
			w := float32(v * v)
			fl := float32(l)
			sumlx += float32(float32(w*v) * fl)
			suml2 += float32(float32(w*fl) * fl)
		}
		if suml2 > 0 && float32(sumlx*sumlx) > float32(best*suml2) {
			for i, v := range x {
				L[i] = int8(nmax + clamp(nearestInt(iscale*v), -nmax, nmax-1))
			}
			scale = sumlx / suml2
			best = scale * sumlx
		}
	}
	return scale
}

// quantBlockQ4_K is ggml's quantize_row_q4_K_ref for one super-block:
// eight groups of 32, each with a 6-bit scale and 6-bit min relative to the
// block's fp16 d and dmin.
func quantBlockQ4_K(x []float32, blk []byte) {
	var L [QK_K]uint8
	quantScaleMinK(x, blk, &L, 15, -1, 20)
	q := blk[16:144]
	for j := 0; j < QK_K; j += 64 {
		for l := 0; l < 32; l++ {
			q[j/2+l] = L[j+l] | L[j+l+32]<<4
		}
	}
}

// quantScaleMinK is what ggml's quantize_row_q4_K_ref and _q5_K_ref share
// for one super-block: fit each group of 32 a scale and a min
// (make_qkx2_quants with levels 0..nmax, rmin and nstep), write the block's
// fp16 d and dmin and the 6-bit scales and mins (blk[0:16], the layout of
// both types), and set L to each value's level against the rounded scales.
func quantScaleMinK(x []float32, blk []byte, L *[QK_K]uint8, nmax int32, rmin float32, nstep int) {
	var (
		laux    [32]uint8
		weights [32]float32
		mins    [8]float32
		scales  [8]float32
	)
	var maxScale, maxMin float32
	for j := 0; j < 8; j++ {
		g := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range g {
			sumX2 += float32(v * v)
		}
		avX := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range g {
			weights[l] = avX + abs32(v)
		}
		scales[j], mins[j] = makeQKX2(nmax, g, weights[:], L[32*j:32*j+32], laux[:], rmin, 0.1, nstep, false)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	sc := blk[4:16]
	clear(sc)
	for j := 0; j < 8; j++ {
		ls := min(63, uint8(nearestInt(invScale*scales[j])))
		lm := min(63, uint8(nearestInt(invMin*mins[j])))
		if j < 4 {
			sc[j] = ls
			sc[j+4] = lm
		} else {
			sc[j+4] = ls&0xf | (lm&0xf)<<4
			sc[j-4] |= (ls >> 4) << 6
			sc[j] |= (lm >> 4) << 6
		}
	}
	dh, mh := F32ToF16(maxScale/63), F32ToF16(maxMin/63)
	binary.LittleEndian.PutUint16(blk[0:], dh)
	binary.LittleEndian.PutUint16(blk[2:], mh)
	df, mf := F16ToF32(dh), F16ToF32(mh)
	for j := 0; j < 8; j++ {
		s, m := scaleMinK4(j, sc)
		d := df * float32(s)
		if d == 0 {
			continue
		}
		dm := mf * float32(m)
		for ii := 0; ii < 32; ii++ {
			L[32*j+ii] = uint8(clamp(nearestInt((x[32*j+ii]+dm)/d), 0, nmax))
		}
	}
}

// quantBlockQ6_K is ggml's quantize_row_q6_K_ref for one super-block:
// sixteen groups of 16 with int8 scales relative to the block's fp16 d, and
// 6-bit quants split into low nibbles (ql) and high 2-bit pairs (qh).
func quantBlockQ6_K(x []float32, blk []byte) {
	var (
		L      [QK_K]int8
		scales [16]float32
	)
	var maxScale, maxAbsScale float32
	for ib := 0; ib < 16; ib++ {
		s := makeQX(32, x[16*ib:16*ib+16], L[16*ib:16*ib+16])
		scales[ib] = s
		if a := abs32(s); a > maxAbsScale {
			maxAbsScale, maxScale = a, s
		}
	}
	clear(blk)
	if maxAbsScale < groupMaxEps {
		return // all zero, d = +0
	}
	iscale := -128 / maxScale
	dh := F32ToF16(1 / iscale)
	binary.LittleEndian.PutUint16(blk[208:], dh)
	sc := blk[192:208]
	for ib := 0; ib < 16; ib++ {
		sc[ib] = byte(int8(min(127, nearestInt(iscale*scales[ib]))))
	}
	df := F16ToF32(dh)
	for j := 0; j < 16; j++ {
		d := df * float32(int8(sc[j]))
		if d == 0 {
			continue
		}
		for ii := 0; ii < 16; ii++ {
			L[16*j+ii] = int8(clamp(nearestInt(x[16*j+ii]/d), -32, 31) + 32)
		}
	}
	ql, qh := blk[0:128], blk[128:192]
	for j := 0; j < QK_K; j += 128 {
		o, h := ql[j/2:j/2+64], qh[j/4:j/4+32]
		for l := 0; l < 32; l++ {
			q1 := uint8(L[j+l]) & 0xf
			q2 := uint8(L[j+l+32]) & 0xf
			q3 := uint8(L[j+l+64]) & 0xf
			q4 := uint8(L[j+l+96]) & 0xf
			o[l] = q1 | q3<<4
			o[l+32] = q2 | q4<<4
			h[l] = uint8(L[j+l])>>4 | (uint8(L[j+l+32])>>4)<<2 | (uint8(L[j+l+64])>>4)<<4 | (uint8(L[j+l+96])>>4)<<6
		}
	}
}
