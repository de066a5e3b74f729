package quant

import "encoding/binary"

// Decoders for the types llama-quantize mixes into K-quant files (Q4_1,
// Q5_0, Q5_1 and IQ4_NL are its fall-backs for rows that are not a multiple
// of 256) and the remaining K-quant and IQ4 types. As in dequant.go every
// multiply and add is rounded to float32 on its own, as ggml's scalar
// dequantize_row_* does when compiled without contraction.
//
// Block layouts (little-endian, packed, as in ggml-common.h):
//
//	Q4_1   (20 B / 32):  d fp16 | m fp16 | qs u8[16]          x = q*d + m
//	Q5_0   (22 B / 32):  d fp16 | qh u32 | qs u8[16]          x = (q-16)*d
//	Q5_1   (24 B / 32):  d fp16 | m fp16 | qh u32 | qs u8[16] x = q*d + m
//	       4-bit parts as Q4_0 (value j low nibble of qs[j], j+16 high
//	       nibble); bit j of qh is bit 4 of value j.
//	Q5_K   (176 B / 256): d | dmin | scales u8[12] (as Q4_K) | qh u8[32] | qs u8[128]
//	       qs as Q4_K; bit 2c (2c+1) of qh[l] is bit 4 of value 64c+l (64c+32+l).
//	Q3_K   (110 B / 256): hmask u8[32] | qs u8[64] | scales u8[12] | d fp16
//	Q2_K   (84 B / 256):  scales u8[16] | qs u8[64] | d fp16 | dmin fp16
//	IQ4_NL (18 B / 32):  d fp16 | qs u8[16]                    x = d*kvaluesIQ4NL[q]
//	IQ4_XS (136 B / 256): d fp16 | scales_h u16 | scales_l u8[4] | qs u8[128]

// KValuesIQ4NL is ggml's kvalues_iq4nl: the 16 levels of IQ4_NL and IQ4_XS,
// a non-uniform grid fitted to normally distributed weights.
var KValuesIQ4NL = [16]int8{-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113}

// Q5Value returns value j (0..31) of a Q4_1/Q5_x style block's packed
// nibbles qs[16] and high bits qh (0 for Q4_1), without offset.
func q5Value(qs []byte, qh uint32, j int) int32 {
	v := int32(qs[j%16])
	if j >= 16 {
		v >>= 4
	}
	return v&0xf | int32(qh>>uint(j)&1)<<4
}

func dequantQ4_1(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[20*b : 20*b+20]
		d := F16ToF32(binary.LittleEndian.Uint16(blk))
		m := F16ToF32(binary.LittleEndian.Uint16(blk[2:]))
		for j := range dst[:32] {
			dst[j] = float32(float32(q5Value(blk[4:20], 0, j))*d) + m
		}
		dst = dst[32:]
	}
}

func dequantQ5_0(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[22*b : 22*b+22]
		d := F16ToF32(binary.LittleEndian.Uint16(blk))
		qh := binary.LittleEndian.Uint32(blk[2:])
		for j := range dst[:32] {
			dst[j] = float32(q5Value(blk[6:22], qh, j)-16) * d
		}
		dst = dst[32:]
	}
}

func dequantQ5_1(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[24*b : 24*b+24]
		d := F16ToF32(binary.LittleEndian.Uint16(blk))
		m := F16ToF32(binary.LittleEndian.Uint16(blk[2:]))
		qh := binary.LittleEndian.Uint32(blk[4:])
		for j := range dst[:32] {
			dst[j] = float32(float32(q5Value(blk[8:24], qh, j))*d) + m
		}
		dst = dst[32:]
	}
}

func dequantQ5_K(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[176*b : 176*b+176]
		d := F16ToF32(binary.LittleEndian.Uint16(blk[0:]))
		dmin := F16ToF32(binary.LittleEndian.Uint16(blk[2:]))
		scales, qh, qs := blk[4:16], blk[16:48], blk[48:176]
		out := dst[:QK_K]
		for j := 0; j < 8; j++ {
			sc, m := scaleMinK4(j, scales)
			dj, mj := d*float32(sc), dmin*float32(m)
			q := qs[(j/2)*32 : (j/2)*32+32]
			y := out[32*j : 32*j+32]
			for l := range y {
				v := q[l] & 0xf
				if j%2 == 1 {
					v = q[l] >> 4
				}
				v |= (qh[l] >> uint(j) & 1) << 4
				y[l] = float32(dj*float32(v)) - mj
			}
		}
		dst = dst[QK_K:]
	}
}

// q3KScale returns the i-th (0..15) 6-bit scale of a Q3_K block, minus 32:
// the low four bits are the nibbles of bytes 0-7 (scales 0-7 low nibbles,
// 8-15 high nibbles) and the top two bits come in pairs from bytes 8-11
// (byte 8+i%4, bits 2*(i/4)).
func q3KScale(s []byte, i int) int32 {
	lo := s[i%8]
	if i >= 8 {
		lo >>= 4
	}
	hi := s[8+i%4] >> uint(2*(i/4)) & 3
	return int32(lo&0xf|hi<<4) - 32
}

// q3KValue returns value k (0..255) of a Q3_K block: two low bits from qs
// (value 128h + 32s + l at bits 2s of qs[32h+l]), minus 4 unless the
// value's bit (s+4h) of hmask[l] is set.
func q3KValue(hmask, qs []byte, k int) int32 {
	h, s, l := k/128, k%128/32, k%32
	v := int32(qs[32*h+l] >> uint(2*s) & 3)
	if hmask[l]>>uint(s+4*h)&1 == 0 {
		v -= 4
	}
	return v
}

func dequantQ3_K(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[110*b : 110*b+110]
		hmask, qs, scales := blk[0:32], blk[32:96], blk[96:108]
		d := F16ToF32(binary.LittleEndian.Uint16(blk[108:]))
		out := dst[:QK_K]
		for k := range out {
			dl := d * float32(q3KScale(scales, k/16))
			out[k] = dl * float32(q3KValue(hmask, qs, k))
		}
		dst = dst[QK_K:]
	}
}

func dequantQ2_K(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[84*b : 84*b+84]
		scales, qs := blk[0:16], blk[16:80]
		d := F16ToF32(binary.LittleEndian.Uint16(blk[80:]))
		dmin := F16ToF32(binary.LittleEndian.Uint16(blk[82:]))
		out := dst[:QK_K]
		for k := range out {
			// Value 128h + 32s + l sits at bits 2s of qs[32h+l]; its
			// 16-value group k/16 has the scale (low nibble) and min.
			h, s, l := k/128, k%128/32, k%32
			sc := scales[k/16]
			dl, ml := d*float32(sc&0xf), dmin*float32(sc>>4)
			out[k] = float32(dl*float32(qs[32*h+l]>>uint(2*s)&3)) - ml
		}
		dst = dst[QK_K:]
	}
}

func dequantIQ4_NL(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[18*b : 18*b+18]
		d := F16ToF32(binary.LittleEndian.Uint16(blk))
		for j := range dst[:32] {
			dst[j] = d * float32(KValuesIQ4NL[q5Value(blk[2:18], 0, j)])
		}
		dst = dst[32:]
	}
}

// iq4XSScale returns sub-block ib's (0..7) 6-bit scale of an IQ4_XS block,
// minus 32: low four bits from the nibbles of scales_l, top two from
// scales_h.
func iq4XSScale(blk []byte, ib int) int32 {
	sh := binary.LittleEndian.Uint16(blk[2:])
	lo := blk[4+ib/2] >> uint(4*(ib%2)) & 0xf
	return int32(lo|uint8(sh>>uint(2*ib)&3)<<4) - 32
}

func dequantIQ4_XS(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[136*b : 136*b+136]
		d := F16ToF32(binary.LittleEndian.Uint16(blk))
		for ib := 0; ib < 8; ib++ {
			dl := d * float32(iq4XSScale(blk, ib))
			qs := blk[8+16*ib : 8+16*ib+16]
			for j := range dst[32*ib : 32*ib+32] {
				dst[32*ib+j] = dl * float32(KValuesIQ4NL[q5Value(qs, 0, j)])
			}
		}
		dst = dst[QK_K:]
	}
}
