package kernels

import "encoding/binary"

// Row dequantisation, producing the same float32 bits as ggml's scalar
// dequantize_row_* (each multiply and subtract rounded separately).

func dequantQ4KRow(row []byte, dst []float32) {
	for b := 0; b < len(dst)/qkK; b++ {
		blk := row[b*144 : (b+1)*144]
		d := f16ToF32(binary.LittleEndian.Uint16(blk[0:]))
		dmin := f16ToF32(binary.LittleEndian.Uint16(blk[2:]))
		scales, qs := blk[4:16], blk[16:144]
		out := dst[b*qkK : (b+1)*qkK]
		for j := 0; j < 8; j++ {
			sc, m := q4KScaleMin(j, scales)
			d1 := float32(d * float32(sc))
			m1 := float32(dmin * float32(m))
			q := qs[(j/2)*32 : (j/2)*32+32]
			for l := 0; l < 32; l++ {
				v := q[l] & 0x0f
				if j%2 == 1 {
					v = q[l] >> 4
				}
				out[j*32+l] = float32(d1*float32(v)) - m1
			}
		}
	}
}

func dequantQ6KRow(row []byte, dst []float32) {
	for b := 0; b < len(dst)/qkK; b++ {
		blk := row[b*210 : (b+1)*210]
		ql, qh, scales := blk[0:128], blk[128:192], blk[192:208]
		d := f16ToF32(binary.LittleEndian.Uint16(blk[208:]))
		out := dst[b*qkK : (b+1)*qkK]
		for i := range out {
			ds := float32(d * float32(int8(scales[i/16])))
			out[i] = ds * float32(q6KValue(ql, qh, i))
		}
	}
}
