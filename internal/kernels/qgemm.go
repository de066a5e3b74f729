package kernels

import (
	"encoding/binary"
	"math"

	"github.com/pagewarden/pagewarden/internal/hugemem"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// Blocked products of Q8_0 and Q4_0 weights with Q8_0 activations.
//
// Both sides are repacked so that the innermost step of the SIMD kernels is
// "16 weight rows times 4 bytes of one activation row": a 64-byte vector
// holding 4 consecutive quants of 16 rows meets 4 activation bytes
// broadcast to every lane, and lane r accumulates row r's exact integer dot
// product (AVX-512 VNNI VPDPBUSD does this in one instruction). No
// horizontal sums are needed, the weight vector is loaded once for a whole
// group of activation rows, and a group of weight rows is one sequential
// stream.
//
// Weights (NewMatrix), rows taken 16 at a time (the last group padded with
// zero rows), per group g and block b of 32 columns:
//
//	Q8_0: qw[(g*nb+b)*512 + k4*64 + r*4 + t] = quant 4*k4+t of row r (int8)
//	Q4_0: qw[(g*nb+b)*256 + j*64 + r*4 + t]  = GGML byte 2+4j+t of row r's
//	      block: low nibble = quant 4j+t, high nibble = quant 4j+t+16,
//	      both stored +8 (k4 groups j and j+4)
//	qd[(g*nb+b)*16 + r] = row r's fp16 block scale
//
// Activations (per MatMul call), rows taken width at a time (qGroupWidth;
// padding rows are zero), per group a and block b:
//
//	xq[((a*nb+b)*8 + k4)*width*4 + i*4 + t] = quant 4*k4+t of row i
//	xd[(a*nb+b)*width + i] = the block's scale, xc[...] = corr * sum(quants)
//
// where corr undoes the offset that makes weights unsigned for VPDPBUSD:
// -128 for Q8_0 (weights XOR 0x80 = w+128), -8 for Q4_0 (nibbles are
// value+8).

const (
	qRows     = 16  // weight rows per packed group
	q8GrpSize = 512 // bytes of one Q8_0 group block
	q4GrpSize = 256 // bytes of one Q4_0 group block
)

// qGroupWidth is the activation-group width used for n rows: each width
// has its own VNNI kernel, and wider groups share each weight load among
// more rows. Padding costs compute only, which decode (n small) has to
// spare.
func qGroupWidth(n int) int {
	switch {
	case n <= 1:
		return 1
	case n <= 4:
		return 4
	}
	return 8
}

// qGroupBytes is the size of one packed 16-row block of weights of type t.
func qGroupBytes(t quant.Type) int {
	if t == quant.Q4_0 {
		return q4GrpSize
	}
	return q8GrpSize
}

// qCorr is the per-block correction factor for weights of type t.
func qCorr(t quant.Type) int32 {
	if t == quant.Q4_0 {
		return -8
	}
	return -128
}

// repackQ interleaves GGML Q8_0 or Q4_0 rows into 16-row groups.
func (m *Matrix) repackQ(data []byte) {
	nb := m.cols / qk8
	groups := (m.rows + qRows - 1) / qRows
	gb := qGroupBytes(m.typ)
	m.qw = hugemem.Alloc[byte](m.arena, groups*nb*gb)
	m.qd = hugemem.Alloc[uint16](m.arena, groups*nb*qRows)
	blkBytes := m.typ.BlockBytes()
	for r := 0; r < m.rows; r++ {
		g, rr := r/qRows, r%qRows
		row := data[r*m.rowBytes : (r+1)*m.rowBytes]
		for b := 0; b < nb; b++ {
			blk := row[b*blkBytes : (b+1)*blkBytes]
			gbi := g*nb + b
			m.qd[gbi*qRows+rr] = binary.LittleEndian.Uint16(blk)
			dst := m.qw[gbi*gb:]
			for c := 0; c < blkBytes-2; c += 4 {
				copy(dst[c/4*64+rr*4:c/4*64+rr*4+4], blk[2+c:2+c+4])
			}
		}
	}
}

// rowQ dequantises row r of a packed Q8_0 or Q4_0 matrix (or one repacked
// as Q8_0, matrix_ext.go) into dst.
func (m *Matrix) rowQ(r int, dst []float32) {
	nb := m.cols / qk8
	g, rr := r/qRows, r%qRows
	gb := qGroupBytes(m.kind)
	for b := 0; b < nb; b++ {
		gbi := g*nb + b
		d := f16ToF32(m.qd[gbi*qRows+rr])
		w := m.qw[gbi*gb : (gbi+1)*gb]
		out := dst[b*qk8 : (b+1)*qk8]
		if m.kind == quant.Q8_0 {
			for k := 0; k < qk8; k++ {
				out[k] = float32(int8(w[k/4*64+rr*4+k%4])) * d
			}
			continue
		}
		for k := 0; k < 16; k++ {
			v := w[k/4*64+rr*4+k%4]
			out[k] = float32(int32(v&0x0f)-8) * d
			out[k+16] = float32(int32(v>>4)-8) * d
		}
	}
}

// quantQ8Fn is the signature of the activation quantisers.
type quantQ8Fn = func(x []float32, width, i int, corr int32, xq []int8, xd []float32, xc []int32)

// quantizeQ8_0Packed quantises one activation row x as quantizeQ8_0 does,
// writing row i of a packed activation group (xq, xd, xc cover the group:
// nb*32*width, nb*width, nb*width).
func quantizeQ8_0Packed(x []float32, width, i int, corr int32, xq []int8, xd []float32, xc []int32) {
	nb := len(x) / qk8
	for b := 0; b < nb; b++ {
		xb := (*[qk8]float32)(x[b*qk8:])
		var id float32
		xd[b*width+i], id = q8Scale(xb[:])
		var sum int32
		q := xq[b*qk8*width:]
		for j, v := range xb {
			qv := int8(math.RoundToEven(float64(v * id)))
			q[(j/4)*width*4+i*4+j%4] = qv
			sum += int32(qv)
		}
		xc[b*width+i] = corr * sum
	}
}

// clearPackedRow zeroes row i of a packed activation group (padding).
func clearPackedRow(nb, width, i int, xq []int8, xd []float32, xc []int32) {
	for b := 0; b < nb; b++ {
		for k4 := 0; k4 < 8; k4++ {
			o := (b*8+k4)*width*4 + i*4
			clear(xq[o : o+4])
		}
		xd[b*width+i] = 0
		xc[b*width+i] = 0
	}
}

// qTileFn is the signature of the tile implementations.
type qTileFn = func(t quant.Type, width, ng int, w []byte, wd []uint16, xq []int8, xd []float32, xc []int32, out []float32)

// qTileRef is the reference tile: ng consecutive packed 16-row weight
// groups (w, wd: nb blocks each) times one packed activation group of
// width rows (xq, xd). For each activation i and row r it computes
// ggml_vec_dot_q8_0_q8_0 (or _q4_0_q8_0) over the nb blocks: the sum, in
// block order, of float(exact int dot) * (d_w*d_x), each product rounded
// to float32, into out[(g*width+i)*16+r]. xc is unused (the corrections
// are for the SIMD kernels).
func qTileRef(t quant.Type, width, ng int, w []byte, wd []uint16, xq []int8, xd []float32, _ []int32, out []float32) {
	nb := len(wd) / (qRows * ng)
	gb := qGroupBytes(t)
	w, xq, xd, out = w[:ng*nb*gb], xq[:nb*qk8*width], xd[:nb*width], out[:ng*width*qRows]
	var wv [qRows][qk8]int8 // one block of the group, decoded
	var xv [qk8]int8        // one block of one activation row
	for g := 0; g < ng; g++ {
		acc := out[g*width*qRows : (g+1)*width*qRows]
		clear(acc)
		for b := 0; b < nb; b++ {
			wb := w[(g*nb+b)*gb : (g*nb+b+1)*gb]
			for r := range wv {
				for k := 0; k < qk8; k++ {
					if t == quant.Q8_0 {
						wv[r][k] = int8(wb[(k/4)*64+r*4+k%4])
					} else if v := wb[(k%16/4)*64+r*4+k%4]; k < 16 {
						wv[r][k] = int8(v&0x0f) - 8
					} else {
						wv[r][k] = int8(v>>4) - 8
					}
				}
			}
			xb := xq[b*qk8*width : (b+1)*qk8*width]
			for i := 0; i < width; i++ {
				for k := range xv {
					xv[k] = xb[(k/4)*width*4+i*4+k%4]
				}
				for r := range wv {
					var sumi int32
					for k, x := range xv {
						sumi += int32(wv[r][k]) * int32(x)
					}
					d := float32(f16ToF32(wd[(g*nb+b)*qRows+r]) * xd[b*width+i])
					acc[i*qRows+r] += float32(float32(sumi) * d)
				}
			}
		}
	}
}
