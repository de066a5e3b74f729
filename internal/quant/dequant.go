package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Dequantize decodes len(dst) elements of type t from the front of src into
// dst. len(dst) must be a multiple of t.BlockSize() and src must hold at
// least RowBytes(t, len(dst)) bytes; bytes after that are ignored. The
// results are bit-identical to ggml's scalar dequantize_row_* functions.
func Dequantize(t Type, src []byte, dst []float32) error {
	if err := checkType(t); err != nil {
		return err
	}
	need, err := RowBytes(t, len(dst))
	if err != nil {
		return err
	}
	if len(src) < need {
		return fmt.Errorf("%w: %d elements of %s need %d bytes, have %d", ErrShortBuffer, len(dst), t, need, len(src))
	}
	src = src[:need]
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = F16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case Q8_0:
		dequantQ8_0(src, dst)
	case Q4_0:
		dequantQ4_0(src, dst)
	case Q4_K:
		dequantQ4_K(src, dst)
	case Q6_K:
		dequantQ6_K(src, dst)
	case Q4_1:
		dequantQ4_1(src, dst)
	case Q5_0:
		dequantQ5_0(src, dst)
	case Q5_1:
		dequantQ5_1(src, dst)
	case Q5_K:
		dequantQ5_K(src, dst)
	case Q3_K:
		dequantQ3_K(src, dst)
	case Q2_K:
		dequantQ2_K(src, dst)
	case IQ4_NL:
		dequantIQ4_NL(src, dst)
	case IQ4_XS:
		dequantIQ4_XS(src, dst)
	}
	return nil
}

// Block layouts (little-endian, packed, as in ggml-common.h):
//
//	Q8_0 (34 bytes / 32 values):  d fp16 | qs int8[32]            x = qs*d
//	Q4_0 (18 bytes / 32 values):  d fp16 | qs u8[16]              x[j] = (lo(qs[j])-8)*d, x[j+16] = (hi(qs[j])-8)*d
//	Q4_K (144 bytes / 256 values): d fp16 | dmin fp16 | scales u8[12] | qs u8[128]
//	Q6_K (210 bytes / 256 values): ql u8[128] | qh u8[64] | scales int8[16] | d fp16

func dequantQ8_0(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[34*b : 34*b+34]
		d := F16ToF32(binary.LittleEndian.Uint16(blk))
		qs := blk[2:34]
		out := dst[:32]
		for j := range out {
			out[j] = float32(int8(qs[j])) * d
		}
		dst = dst[32:]
	}
}

func dequantQ4_0(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[18*b : 18*b+18]
		d := F16ToF32(binary.LittleEndian.Uint16(blk))
		qs := blk[2:18]
		out := dst[:32]
		for j := 0; j < 16; j++ {
			out[j] = float32(int32(qs[j]&0xf)-8) * d
			out[j+16] = float32(int32(qs[j]>>4)-8) * d
		}
		dst = dst[32:]
	}
}

// scaleMinK4 unpacks the j-th 6-bit scale and min of a Q4_K/Q5_K block from
// its 12 packed bytes: entries 0-3 keep their low 6 bits in bytes 0-3
// (scales) and 4-7 (mins); entries 4-7 keep their low 4 bits in the nibbles
// of bytes 8-11 and their top 2 bits in the spare top bits of bytes 0-7.
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xf | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

func dequantQ4_K(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[144*b : 144*b+144]
		d := F16ToF32(binary.LittleEndian.Uint16(blk[0:]))
		dmin := F16ToF32(binary.LittleEndian.Uint16(blk[2:]))
		scales := blk[4:16]
		q := blk[16:144]
		out := dst[:QK_K]
		for j, is := 0, 0; j < QK_K; j, is = j+64, is+2 {
			sc, m := scaleMinK4(is, scales)
			d1, m1 := d*float32(sc), dmin*float32(m)
			sc, m = scaleMinK4(is+1, scales)
			d2, m2 := d*float32(sc), dmin*float32(m)
			qq := q[j/2 : j/2+32]
			lo, hi := out[j:j+32], out[j+32:j+64]
			for l := range qq {
				// The explicit conversions keep the product rounded
				// before the subtraction, as ggml's scalar code does.
				lo[l] = float32(d1*float32(qq[l]&0xf)) - m1
				hi[l] = float32(d2*float32(qq[l]>>4)) - m2
			}
		}
		dst = dst[QK_K:]
	}
}

func dequantQ6_K(src []byte, dst []float32) {
	for b := 0; len(dst) > 0; b++ {
		blk := src[210*b : 210*b+210]
		ql := blk[0:128]
		qh := blk[128:192]
		sc := blk[192:208]
		d := F16ToF32(binary.LittleEndian.Uint16(blk[208:]))
		out := dst[:QK_K]
		for n := 0; n < 2; n++ {
			l4, h4, s8, y := ql[64*n:64*n+64], qh[32*n:32*n+32], sc[8*n:8*n+8], out[128*n:128*n+128]
			for l := 0; l < 32; l++ {
				is := l / 16
				q1 := int32(l4[l]&0xf|(h4[l]>>0&3)<<4) - 32
				q2 := int32(l4[l+32]&0xf|(h4[l]>>2&3)<<4) - 32
				q3 := int32(l4[l]>>4|(h4[l]>>4&3)<<4) - 32
				q4 := int32(l4[l+32]>>4|(h4[l]>>6&3)<<4) - 32
				y[l] = d * float32(int8(s8[is])) * float32(q1)
				y[l+32] = d * float32(int8(s8[is+2])) * float32(q2)
				y[l+64] = d * float32(int8(s8[is+4])) * float32(q3)
				y[l+96] = d * float32(int8(s8[is+6])) * float32(q4)
			}
		}
		dst = dst[QK_K:]
	}
}
