package kernels

import (
	"encoding/binary"
	"math"

	"github.com/pagewarden/pagewarden/internal/hugemem"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// Blocked products of Q4_K and Q6_K weights with Q8_K activations, in the
// same scheme as qgemm.go: 16 weight rows share every vector, lane r holds
// row r, and every integer sum is exact, so the float combination can
// follow ggml's order per row and the result is bit-identical to
// dotQ4KRef / dotQ6KRef over the GGML bytes.
//
// Weights are repacked per 16-row group g and super-block s (256 columns)
// into one contiguous record, so a group's product is one sequential
// stream:
//
//	Q4_K (k4RecBytes = 2368):
//	  [0, 2048)     quants: byte (c*8+t)*64 + r*4 + u = GGML qs[32c+4t+u] of
//	                row r: low nibble = value 64c+4t+u (sub-block 2c), high
//	                nibble = value 64c+32+4t+u (sub-block 2c+1)
//	  [2048, 2176)  6-bit scales, byte j*16 + r = scale of sub-block j
//	  [2176, 2304)  6-bit mins in pairs, byte p*32 + r*2 + h = min of
//	                sub-block 2p+h
//	  [2304, 2336)  fp16 d of rows 0..15, [2336, 2368) fp16 dmin
//	Q6_K (k6RecBytes = 4384; 30% above GGML's 210 bytes per row, the price
//	of unpacked 6-bit values):
//	  [0, 4096)     values + 32 (0..63): byte k4*64 + r*4 + u = value 4*k4+u
//	  [4096, 4352)  int8 scales in pairs, byte p*32 + r*2 + h = scale of
//	                16-value group 2p+h
//	  [4352, 4384)  fp16 d of rows 0..15
//
// Activations (per MatMul call) are Q8_K, rows taken kGroupWidth at a time
// (padding rows zero), per group a and super-block s:
//
//	xq[((a*nb+s)*64 + k4)*width*4 + i*4 + u] = quant 4*k4+u of row i
//	xd[(a*nb+s)*width + i] = the super-block's d
//	xp[((a*nb+s)*8 + p)*width + i] = two int16 (low, high) for VPDPWSSD:
//	  Q4_K: sums of sub-blocks 2p and 2p+1 (p < 4; zero above)
//	  Q6_K: sums of 16-value groups 2p and 2p+1
const (
	k4RecBytes = 2368
	k6RecBytes = 4384
)

// kGroupWidth is the activation-group width for n rows (see qGroupWidth);
// the K-quant kernels keep five accumulators per activation row, so four
// rows fill the registers.
func kGroupWidth(n int) int {
	if n <= 1 {
		return 1
	}
	return 4
}

func kRecBytes(t quant.Type) int {
	if t == quant.Q6_K {
		return k6RecBytes
	}
	return k4RecBytes
}

// repackK interleaves GGML Q4_K or Q6_K rows into 16-row groups.
func (m *Matrix) repackK(data []byte) {
	nb := m.cols / qkK
	groups := (m.rows + qRows - 1) / qRows
	rec := kRecBytes(m.typ)
	m.kw = hugemem.Alloc[byte](m.arena, groups*nb*rec)
	var vals [qkK]int8
	for r := 0; r < m.rows; r++ {
		g, rr := r/qRows, r%qRows
		row := data[r*m.rowBytes : (r+1)*m.rowBytes]
		for s := 0; s < nb; s++ {
			dst := m.kw[(g*nb+s)*rec : (g*nb+s+1)*rec]
			if m.typ == quant.Q4_K {
				blk := (*[144]byte)(row[s*144:])
				for c := 0; c < 4; c++ {
					for t := 0; t < 8; t++ {
						copy(dst[(c*8+t)*64+rr*4:(c*8+t)*64+rr*4+4], blk[16+32*c+4*t:16+32*c+4*t+4])
					}
				}
				for j := 0; j < 8; j++ {
					sc, mn := q4KScaleMin(j, blk[4:16])
					dst[2048+j*16+rr] = sc
					dst[2176+(j/2)*32+rr*2+j%2] = mn
				}
				copy(dst[2304+rr*2:2304+rr*2+2], blk[0:2])
				copy(dst[2336+rr*2:2336+rr*2+2], blk[2:4])
				continue
			}
			blk := (*[210]byte)(row[s*210:])
			unpackQ6K(blk, &vals)
			for k := 0; k < qkK; k++ {
				dst[(k/4)*64+rr*4+k%4] = byte(vals[k] + 32)
			}
			for gi := 0; gi < 16; gi++ {
				dst[4096+(gi/2)*32+rr*2+gi%2] = blk[192+gi]
			}
			copy(dst[4352+rr*2:4352+rr*2+2], blk[208:210])
		}
	}
}

// rowK dequantises row r of a packed Q4_K or Q6_K matrix into dst with
// ggml's dequantize_row arithmetic.
func (m *Matrix) rowK(r int, dst []float32) {
	nb := m.cols / qkK
	g, rr := r/qRows, r%qRows
	rec := kRecBytes(m.kind)
	for s := 0; s < nb; s++ {
		src := m.kw[(g*nb+s)*rec : (g*nb+s+1)*rec]
		out := dst[s*qkK : (s+1)*qkK]
		if m.kind == quant.Q4_K {
			d := f16ToF32(binary.LittleEndian.Uint16(src[2304+rr*2:]))
			dmin := f16ToF32(binary.LittleEndian.Uint16(src[2336+rr*2:]))
			for j := 0; j < 8; j++ {
				d1 := float32(d * float32(src[2048+j*16+rr]))
				m1 := float32(dmin * float32(src[2176+(j/2)*32+rr*2+j%2]))
				for l := 0; l < 32; l++ {
					out[j*32+l] = float32(d1*float32(k4Value(src, rr, j, l))) - m1
				}
			}
			continue
		}
		d := f16ToF32(binary.LittleEndian.Uint16(src[4352+rr*2:]))
		for k := range out {
			gi := k / 16
			ds := float32(d * float32(int8(src[4096+(gi/2)*32+rr*2+gi%2])))
			out[k] = ds * float32(int32(src[(k/4)*64+rr*4+k%4])-32)
		}
	}
}

// k4Value is value l of sub-block j of row rr in a packed Q4_K record.
func k4Value(rec []byte, rr, j, l int) int32 {
	c, h := j/2, j%2
	b := rec[(c*8+l/4)*64+rr*4+l%4]
	if h == 1 {
		b >>= 4
	}
	return int32(b & 0x0f)
}

// quantKFn is the signature of the packed Q8_K activation quantisers.
type quantKFn = func(t quant.Type, x []float32, width, i int, xq []int8, xd []float32, xp []int32)

// quantizeQ8KPacked quantises one activation row x as quantizeQ8K does,
// writing row i of a packed activation group for weights of type t (xq,
// xd, xp cover the group: nb*256*width, nb*width, nb*8*width).
func quantizeQ8KPacked(t quant.Type, x []float32, width, i int, xq []int8, xd []float32, xp []int32) {
	nb := len(x) / qkK
	for s := 0; s < nb; s++ {
		xb := (*[qkK]float32)(x[s*qkK:])
		q := xq[s*qkK*width : (s+1)*qkK*width]
		p := xp[s*8*width : (s+1)*8*width]
		var amax, mx float32
		for _, v := range xb {
			if a := abs32(v); a > amax {
				amax, mx = a, v
			}
		}
		if amax == 0 {
			xd[s*width+i] = 0
			for k4 := 0; k4 < 64; k4++ {
				clear(q[k4*width*4+i*4 : k4*width*4+i*4+4])
			}
			for j := 0; j < 8; j++ {
				p[j*width+i] = 0
			}
			continue
		}
		iscale := -127 / mx
		var bs [16]int16
		for k, v := range xb {
			qv := math.RoundToEven(float64(iscale * v))
			if qv > 127 {
				qv = 127
			}
			q[(k/4)*width*4+i*4+k%4] = int8(qv)
			bs[k/16] += int16(qv)
		}
		xd[s*width+i] = 1 / iscale
		for j := 0; j < 8; j++ {
			var lo, hi int16
			if t == quant.Q6_K {
				lo, hi = bs[2*j], bs[2*j+1]
			} else if j < 4 {
				lo, hi = bs[4*j]+bs[4*j+1], bs[4*j+2]+bs[4*j+3]
			}
			p[j*width+i] = int32(uint32(uint16(lo)) | uint32(uint16(hi))<<16)
		}
	}
}

// kTileFn is the signature of the K-quant tile implementations.
type kTileFn = func(t quant.Type, width, ng int, w []byte, xq []int8, xd []float32, xp []int32, out []float32)

// kTileRef is the reference tile: ng consecutive packed 16-row weight
// groups (w: nb records each) times one packed activation group of width
// rows, out[(g*width+i)*16+r] = ggml_vec_dot_q4_K_q8_K (or _q6_K_q8_K) of
// row r with activation i. The integer sums are formed as dotQ4KRef and
// dotQ6KRef form them (any order gives the same integers) and the float
// combination is theirs, step for step.
func kTileRef(t quant.Type, width, ng int, w []byte, xq []int8, xd []float32, xp []int32, out []float32) {
	rec := kRecBytes(t)
	nb := len(w) / (rec * ng)
	xq, xd, xp, out = xq[:nb*qkK*width], xd[:nb*width], xp[:nb*8*width], out[:ng*width*qRows]
	var wv [qRows][qkK]int8 // one record, decoded: Q4_K nibbles, Q6_K values
	var xv [qkK]int8        // one super-block of one activation row
	for g := 0; g < ng; g++ {
		acc := out[g*width*qRows : (g+1)*width*qRows]
		clear(acc)
		for s := 0; s < nb; s++ {
			src := w[(g*nb+s)*rec : (g*nb+s+1)*rec]
			for r := range wv {
				for k := 0; k < qkK; k++ {
					if t == quant.Q4_K {
						wv[r][k] = int8(k4Value(src, r, k/32, k%32))
					} else {
						wv[r][k] = int8(int32(src[(k/4)*64+r*4+k%4]) - 32)
					}
				}
			}
			xs := xq[s*qkK*width : (s+1)*qkK*width]
			for i := 0; i < width; i++ {
				for k := range xv {
					xv[k] = xs[(k/4)*width*4+i*4+k%4]
				}
				pairs := xp[s*8*width : (s+1)*8*width]
				for r := range wv {
					if t == quant.Q4_K {
						var isum, msum int32
						for j := 0; j < 8; j++ {
							isum += int32(src[2048+j*16+r]) * dot32i8((*[32]int8)(wv[r][32*j:]), (*[32]int8)(xv[32*j:]))
							bsj := int32(int16(uint32(pairs[(j/2)*width+i]) >> (16 * (j % 2))))
							msum += int32(src[2176+(j/2)*32+r*2+j%2]) * bsj
						}
						d := float32(f16ToF32(binary.LittleEndian.Uint16(src[2304+r*2:])) * xd[s*width+i])
						dmin := float32(f16ToF32(binary.LittleEndian.Uint16(src[2336+r*2:])) * xd[s*width+i])
						acc[i*qRows+r] += float32(d*float32(isum)) - float32(dmin*float32(msum))
						continue
					}
					var isum int32
					for gi := 0; gi < 16; gi++ {
						isum += int32(int8(src[4096+(gi/2)*32+r*2+gi%2])) * dot16i8((*[16]int8)(wv[r][16*gi:]), (*[16]int8)(xv[16*gi:]))
					}
					d := float32(f16ToF32(binary.LittleEndian.Uint16(src[4352+r*2:])) * xd[s*width+i])
					acc[i*qRows+r] += float32(d * float32(isum))
				}
			}
		}
	}
}
