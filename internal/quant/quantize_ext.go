package quant

import (
	"encoding/binary"
	"math"
)

// Quantisers for Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K (ggml's
// quantize_row_*_ref) and IQ4_NL, IQ4_XS (quantize_iq4_nl/_xs without an
// importance matrix): what llama-quantize runs for these types when it has
// no importance matrix, byte for byte (golden_ext_test.go).

// minMax returns the smallest and largest of x, as ggml's scans find them.
func minMax(x []float32) (lo, hi float32) {
	lo, hi = math.MaxFloat32, -math.MaxFloat32
	for _, v := range x {
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// packQ5 stores 32 values of 0..31 (0..15 for Q4_1) as nibbles (value j in
// the low nibble of qs[j%16] for j < 16, high nibble otherwise) and returns
// their fifth bits as the qh word.
func packQ5(L *[32]uint8, qs []byte) uint32 {
	var qh uint32
	for j := 0; j < 16; j++ {
		qs[j] = L[j]&0xf | (L[j+16]&0xf)<<4
		qh |= uint32(L[j]>>4&1)<<j | uint32(L[j+16]>>4&1)<<(j+16)
	}
	return qh
}

// quantBlockQ4_1: d = (max-min)/15, m = min, q = min(15, trunc((x-min)/d
// + 0.5)) computed with 1/d.
func quantBlockQ4_1(x []float32, blk []byte) {
	lo, hi := minMax(x)
	d := (hi - lo) / 15
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	binary.LittleEndian.PutUint16(blk[2:], F32ToF16(lo))
	var L [32]uint8
	for j, v := range x {
		// C: MIN(15, (int8_t)(x0 + 0.5f)).
		q := int32(int8(int32(float32(float32(v-lo)*id) + 0.5)))
		L[j] = uint8(min(15, q))
	}
	packQ5(&L, blk[4:20])
}

// quantBlockQ5_0: the value of largest magnitude maps to -16 (d =
// max/-16); q = min(31, trunc(x/d + 16.5)).
func quantBlockQ5_0(x []float32, blk []byte) {
	var amax, mx float32
	for _, v := range x {
		if a := abs32(v); amax < a {
			amax, mx = a, v
		}
	}
	d := mx / -16
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	var L [32]uint8
	for j, v := range x {
		q := int32(int8(int32(float32(v*id) + 16.5)))
		L[j] = uint8(min(31, q))
	}
	binary.LittleEndian.PutUint32(blk[2:], packQ5(&L, blk[6:22]))
}

// quantBlockQ5_1: d = (max-min)/31, m = min, q = trunc((x-min)/d + 0.5)
// (ggml does not clamp: the largest value lands on 31 or, by rounding of
// 1/d, on 32 whose fifth bit is dropped, exactly as here).
func quantBlockQ5_1(x []float32, blk []byte) {
	lo, hi := minMax(x)
	d := (hi - lo) / 31
	var id float32
	if d != 0 {
		id = 1 / d
	}
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	binary.LittleEndian.PutUint16(blk[2:], F32ToF16(lo))
	var L [32]uint8
	for j, v := range x {
		L[j] = uint8(int32(float32(float32(v-lo)*id) + 0.5))
	}
	binary.LittleEndian.PutUint32(blk[4:], packQ5(&L, blk[8:24]))
}

// quantBlockQ5_K is ggml's quantize_row_q5_K_ref for one super-block: as
// Q4_K (eight groups of 32 with 6-bit scales and mins) with 5-bit values,
// the fifth bits kept in qh.
func quantBlockQ5_K(x []float32, blk []byte) {
	var L [QK_K]uint8
	quantScaleMinK(x, blk, &L, 31, -0.5, 15)
	qh, qs := blk[16:48], blk[48:176]
	clear(qh)
	for c := 0; c < 4; c++ {
		for l := 0; l < 32; l++ {
			lo, hi := L[64*c+l], L[64*c+32+l]
			qs[32*c+l] = lo&0xf | (hi&0xf)<<4
			qh[l] |= (lo>>4&1)<<(2*c) | (hi>>4&1)<<(2*c+1)
		}
	}
}

// quantBlockQ2_K is ggml's quantize_row_q2_K_ref for one super-block:
// sixteen groups of 16 values in 0..3, each with a 4-bit scale and min
// relative to the block's fp16 d and dmin (fitted with absolute errors).
func quantBlockQ2_K(x []float32, blk []byte) {
	var (
		L       [QK_K]uint8
		laux    [16]uint8
		weights [16]float32
		mins    [16]float32
		scales  [16]float32
	)
	var maxScale, maxMin float32
	for j := 0; j < 16; j++ {
		g := x[16*j : 16*j+16]
		for l, v := range g {
			weights[l] = abs32(v)
		}
		scales[j], mins[j] = makeQKX2(3, g, weights[:], L[16*j:16*j+16], laux[:], -0.5, 0.1, 15, true)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	sc := blk[0:16]
	clear(sc)
	var dh, mh uint16
	if maxScale > 0 {
		iscale := 15 / maxScale
		for j := range sc {
			sc[j] = uint8(nearestInt(iscale * scales[j]))
		}
		dh = F32ToF16(maxScale / 15)
	}
	if maxMin > 0 {
		iscale := 15 / maxMin
		for j := range sc {
			sc[j] |= uint8(nearestInt(iscale*mins[j])) << 4
		}
		mh = F32ToF16(maxMin / 15)
	}
	binary.LittleEndian.PutUint16(blk[80:], dh)
	binary.LittleEndian.PutUint16(blk[82:], mh)
	df, mf := F16ToF32(dh), F16ToF32(mh)
	for j := 0; j < 16; j++ {
		d := df * float32(sc[j]&0xf)
		if d == 0 {
			continue
		}
		dm := mf * float32(sc[j]>>4)
		for ii := 0; ii < 16; ii++ {
			L[16*j+ii] = uint8(clamp(nearestInt((x[16*j+ii]+dm)/d), 0, 3))
		}
	}
	packQ2(&L, blk[16:80])
}

// packQ2 stores 256 two-bit values as Q2_K/Q3_K do: value 128h+32s+l at
// bits 2s of qs[32h+l].
func packQ2(L *[QK_K]uint8, qs []byte) {
	for h := 0; h < 2; h++ {
		for l := 0; l < 32; l++ {
			qs[32*h+l] = L[128*h+l] | L[128*h+l+32]<<2 | L[128*h+l+64]<<4 | L[128*h+l+96]<<6
		}
	}
}

// makeQ3 is ggml's make_q3_quants with do_rmse: symmetric quantisation of
// x to [-nmax, nmax-1], refined by up to five passes that move single
// values when that raises the fit; L receives the values plus nmax. It
// returns the scale.
func makeQ3(nmax int32, x []float32, L []int8) float32 {
	var amax, mx float32
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	if amax < groupMaxEps {
		clear(L[:len(x)])
		return 0
	}
	iscale := -float32(nmax) / mx
	var sumlx, suml2 float32
	for i, v := range x {
		l := clamp(nearestInt(iscale*v), -nmax, nmax-1)
		L[i] = int8(l)
		w := float32(v * v)
		sumlx += float32(float32(w*v) * float32(l))
		suml2 += float32(float32(w*float32(l)) * float32(l))
	}
	for itry := 0; itry < 5; itry++ {
		changed := 0
		for i, v := range x {
			w := float32(v * v)
			li := float32(L[i])
			slx := sumlx - float32(float32(w*v)*li)
			if slx > 0 {
				sl2 := suml2 - float32(float32(w*li)*li)
				nl := clamp(nearestInt(float32(v*sl2)/slx), -nmax, nmax-1)
				if nl != int32(L[i]) {
					fl := float32(nl)
					slx += float32(float32(w*v) * fl)
					sl2 += float32(float32(w*fl) * fl)
					if sl2 > 0 && float32(float32(slx*slx)*suml2) > float32(float32(sumlx*sumlx)*sl2) {
						L[i], sumlx, suml2 = int8(nl), slx, sl2
						changed++
					}
				}
			}
		}
		if changed == 0 {
			break
		}
	}
	for i := range x {
		L[i] += int8(nmax)
	}
	if suml2 > 0 {
		return sumlx / suml2
	}
	return 0
}

// quantBlockQ3_K is ggml's quantize_row_q3_K_ref for one super-block:
// sixteen groups of 16 values in -4..3 with 6-bit signed scales relative to
// the block's fp16 d; the values' third bits go to hmask.
func quantBlockQ3_K(x []float32, blk []byte) {
	var (
		L      [QK_K]int8
		scales [16]float32
	)
	var maxScale, amax float32
	for j := 0; j < 16; j++ {
		scales[j] = makeQ3(4, x[16*j:16*j+16], L[16*j:16*j+16])
		if a := abs32(scales[j]); a > amax {
			amax, maxScale = a, scales[j]
		}
	}
	hmask, qs, sc := blk[0:32], blk[32:96], blk[96:108]
	clear(sc)
	var dh uint16
	if maxScale != 0 {
		iscale := -32 / maxScale
		for j := 0; j < 16; j++ {
			l := clamp(int32(int8(nearestInt(iscale*scales[j]))), -32, 31) + 32
			if j < 8 {
				sc[j] = uint8(l & 0xf)
			} else {
				sc[j-8] |= uint8(l&0xf) << 4
			}
			sc[8+j%4] |= uint8(l>>4) << (2 * (j / 4))
		}
		dh = F32ToF16(1 / iscale)
	}
	binary.LittleEndian.PutUint16(blk[108:], dh)
	df := F16ToF32(dh)
	for j := 0; j < 16; j++ {
		lo := sc[j%8]
		if j >= 8 {
			lo >>= 4
		}
		s := int32(lo&0xf|(sc[8+j%4]>>(2*(j/4))&3)<<4) - 32
		d := df * float32(s)
		if d == 0 {
			continue
		}
		for ii := 0; ii < 16; ii++ {
			L[16*j+ii] = int8(clamp(nearestInt(x[16*j+ii]/d), -4, 3) + 4)
		}
	}
	clear(hmask)
	var U [QK_K]uint8
	for j, v := range L {
		u := uint8(v)
		if u > 3 {
			hmask[j%32] |= 1 << (j / 32)
			u -= 4
		}
		U[j] = u
	}
	packQ2(&U, qs)
}

// bestIndexIQ4 is ggml's best_index_int8 over the IQ4 grid: the index of
// the level nearest x (the lower one on a tie).
func bestIndexIQ4(x float32) uint8 {
	v := &KValuesIQ4NL
	if x <= float32(v[0]) {
		return 0
	}
	if x >= float32(v[15]) {
		return 15
	}
	ml, mu := 0, 15
	for mu-ml > 1 {
		mav := (ml + mu) / 2
		if x < float32(v[mav]) {
			mu = mav
		} else {
			ml = mav
		}
	}
	if x-float32(v[mu-1]) < float32(v[mu])-x {
		return uint8(mu - 1)
	}
	return uint8(mu)
}

// iq4Scale is the block-scale search of ggml's quantize_row_iq4_nl_impl
// without an importance matrix (weights x², ntry 7, as llama-quantize runs
// it): the grid is fitted to the block's largest value, then 15 other
// scales are tried, keeping the best least-squares one.
func iq4Scale(xb []float32) float32 {
	var amax, mx float32
	for _, v := range xb {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	if amax < groupMaxEps {
		return 0
	}
	v0 := float32(KValuesIQ4NL[0])
	fit := func(id float32) (sumqx, sumq2 float32) {
		for _, x := range xb {
			q := float32(KValuesIQ4NL[bestIndexIQ4(id*x)])
			w := float32(x * x)
			sumqx += float32(float32(w*q) * x)
			sumq2 += float32(float32(w*q) * q)
		}
		return sumqx, sumq2
	}
	d := -mx / v0
	sumqx, sumq2 := fit(1 / d)
	d = 0
	if sumq2 > 0 {
		d = sumqx / sumq2
	}
	best := d * sumqx
	for itry := -7; itry <= 7; itry++ {
		sumqx, sumq2 := fit(float32(itry+int(KValuesIQ4NL[0])) / mx)
		if sumq2 > 0 && float32(sumqx*sumqx) > float32(best*sumq2) {
			d = sumqx / sumq2
			best = d * sumqx
		}
	}
	return d
}

// quantBlockIQ4_NL is ggml's quantize_iq4_nl (no importance matrix) for one
// block of 32: the fitted scale as fp16, each value the grid level nearest
// x/scale.
func quantBlockIQ4_NL(x []float32, blk []byte) {
	d := iq4Scale(x)
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	var id float32
	if d != 0 {
		id = 1 / d
	}
	for j := 0; j < 16; j++ {
		blk[2+j] = bestIndexIQ4(id*x[j]) | bestIndexIQ4(id*x[j+16])<<4
	}
}

// quantBlockIQ4_XS is ggml's quantize_iq4_xs (no importance matrix) for
// one super-block: each block of 32 fitted as IQ4_NL, the fitted scales
// quantised to 6 bits relative to d = -max_scale/32.
func quantBlockIQ4_XS(x []float32, blk []byte) {
	var scales [8]float32
	var maxScale, amaxScale float32
	for ib := range scales {
		scales[ib] = iq4Scale(x[32*ib : 32*ib+32])
		if a := abs32(scales[ib]); a > amaxScale {
			amaxScale, maxScale = a, scales[ib]
		}
	}
	d := -maxScale / 32
	binary.LittleEndian.PutUint16(blk, F32ToF16(d))
	var id float32
	if d != 0 {
		id = 1 / d
	}
	var sh uint16
	sl, qs := blk[4:8], blk[8:136]
	for ib := range scales {
		l := clamp(nearestInt(id*scales[ib]), -32, 31)
		dl := d * float32(l)
		var idl float32
		if dl != 0 {
			idl = 1 / dl
		}
		xb := x[32*ib : 32*ib+32]
		for j := 0; j < 16; j++ {
			qs[16*ib+j] = bestIndexIQ4(idl*xb[j]) | bestIndexIQ4(idl*xb[j+16])<<4
		}
		l += 32
		if ib%2 == 0 {
			sl[ib/2] = uint8(l & 0xf)
		} else {
			sl[ib/2] |= uint8(l&0xf) << 4
		}
		sh |= uint16(l>>4) << (2 * ib)
	}
	binary.LittleEndian.PutUint16(blk[2:], sh)
}
