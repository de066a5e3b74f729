package quant

import (
	"encoding/binary"
	"math"
)

// Reference quantisers for Q4_1, Q5_0, Q5_1 and Q5_K: ggml's
// quantize_row_*_ref, which is also what llama-quantize runs for these
// types when it has no importance matrix.

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
	var (
		L       [QK_K]uint8
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
		scales[j], mins[j] = makeQKX2(31, g, weights[:], L[32*j:32*j+32], laux[:], -0.5, 0.1, 15)
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
			L[32*j+ii] = uint8(clamp(nearestInt((x[32*j+ii]+dm)/d), 0, 31))
		}
	}
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
