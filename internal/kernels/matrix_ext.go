package kernels

import (
	"encoding/binary"
	"slices"
	"sync"

	"github.com/pagewarden/pagewarden/internal/hugemem"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// Products for the weight types beyond the original seven, reusing the
// existing kernels where that keeps ggml's bits (see ref_ext.go for the
// definitions):
//
//   - Q5_0 and IQ4_NL have one fp16 scale per 32 values and integer values
//     that fit in int8 (-16..15; the IQ4_NL grid -127..113), and ggml
//     multiplies them with Q8_0 activations exactly as it does Q8_0
//     weights (float(sumi) * (d_w*d_x) per block). They are repacked at
//     load into qgemm.go's Q8_0 layout, with the same scales, and take the
//     Q8_0 kernels of every tier: the products are bit-identical.
//   - Q4_1 and Q5_1 (values 0..31, a scale and a min per block) meet Q8_1
//     activations: per block (d_w*d_x)*sumi + m*s, where s is the
//     activation's fp16 d*sum. The quants are repacked as Q8_0 (same
//     scales), block-major, so that one call of the Q8_0 tile kernel with
//     a single block gives float(sumi)*(d_w*d_x) for up to 16 groups of 16
//     rows at a time; the min term and the running sum are added in Go in
//     ggml's order. Bit-identical again, at the price of a call and a few
//     float operations per block and row.
//   - Q5_K (values 0..31, 6-bit scales and mins per 32 values) is repacked
//     as Q6_K records (kgemm.go: values as bytes, one int8 scale per 16
//     values, fp16 d), block-major, with each super-block's dmin and mins
//     alongside. One call of the Q6_K tile kernel per super-block gives
//     d_w*d_x * sum(scale_j * q.q8) for up to 16 groups of rows; Go
//     subtracts dmin*d_x * sum(min_j * bsum_j) (the activation's pair sums
//     of the Q6_K layout are the per-32 sums it needs) and adds to the
//     running sum: dotQ5KRef bit for bit.
//   - Q2_K (values 0..3, a 4-bit scale and min per 16 values) goes the
//     same way with sixteen mins, and is ggml's generic product bit for bit
//     (its per-super-block dall*isum - dmin*summs is exactly this form).
//   - Q3_K (values -4..3, a 6-bit signed scale per 16 values, no min) is a
//     Q6_K matrix in all but name: repacked into ordinary (group-major)
//     Q6_K records it takes MatMul's Q6_K path unchanged; its reference
//     (dotQ3KRef) sums per super-block as Q6_K does.
//   - IQ4_XS (grid values -127..113, a 6-bit scale per 32 values, fp16 d
//     per 256) meets Q8_K activations and ggml sums per 32 values
//     (d_w*d_x*(ls-32)) * sumi. Its grid values are repacked as Q8_0 with
//     unit scales, block-major, and the activations' Q8_K quants are laid
//     out as Q8_0 ones with unit scales, so one Q8_0 tile call per 32
//     columns gives the exact integer sumi of up to 16 groups of rows
//     (float(sumi)*1 is exact below 2^24); Go applies the scales in
//     ggml's order. Bit-identical again.

// Supports reports whether NewMatrix accepts weights of type t.
func Supports(t quant.Type) bool {
	return slices.Contains(weightTypeList, t)
}

// WeightTypes returns the types NewMatrix accepts, for error messages.
func WeightTypes() []quant.Type { return slices.Clone(weightTypeList) }

var weightTypeList = []quant.Type{
	quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1,
	quant.IQ4_NL, quant.Q2_K, quant.Q3_K, quant.Q4_K, quant.Q5_K, quant.Q6_K, quant.IQ4_XS,
}

// q1GroupChunk is how many 16-row groups one Q4_1/Q5_1 tile call covers
// (its outputs and sums stay on the stack).
const q1GroupChunk = 16

// prepareExt sets up a matrix of one of the types above.
func (m *Matrix) prepareExt(data []byte) {
	switch m.typ {
	case quant.Q5_0, quant.IQ4_NL:
		m.kind = quant.Q8_0
		m.repackAsQ8(data, false)
	case quant.Q4_1, quant.Q5_1:
		m.kind = quant.Q8_0
		m.repackAsQ8(data, true)
	case quant.Q5_K, quant.Q3_K, quant.Q2_K:
		m.kind = quant.Q6_K
		m.repackKAsQ6(data)
	default: // IQ4_XS
		m.kind = quant.Q8_0
		m.repackIQ4XS(data)
	}
}

// extBlock decodes block b of a GGML row of a 32-value type into its 32
// integer values, its fp16 scale and (Q4_1/Q5_1) its fp16 min.
func extBlock(t quant.Type, row []byte, b int, v *[qk8]int8) (d, mn uint16) {
	switch t {
	case quant.Q5_0:
		blk := row[b*22 : (b+1)*22]
		qh := binary.LittleEndian.Uint32(blk[2:])
		for j := range v {
			v[j] = int8(q5Val(blk[6:22], qh, j) - 16)
		}
		return binary.LittleEndian.Uint16(blk), 0
	case quant.IQ4_NL:
		blk := row[b*18 : (b+1)*18]
		for j := range v {
			v[j] = quant.KValuesIQ4NL[q5Val(blk[2:18], 0, j)]
		}
		return binary.LittleEndian.Uint16(blk), 0
	case quant.Q4_1:
		blk := row[b*20 : (b+1)*20]
		for j := range v {
			v[j] = int8(q5Val(blk[4:20], 0, j))
		}
		return binary.LittleEndian.Uint16(blk), binary.LittleEndian.Uint16(blk[2:])
	default: // Q5_1
		blk := row[b*24 : (b+1)*24]
		qh := binary.LittleEndian.Uint32(blk[4:])
		for j := range v {
			v[j] = int8(q5Val(blk[8:24], qh, j))
		}
		return binary.LittleEndian.Uint16(blk), binary.LittleEndian.Uint16(blk[2:])
	}
}

// repackAsQ8 writes the rows' integer values and scales in qgemm.go's Q8_0
// layout: group-major ((g*nb+b) blocks) for Q5_0/IQ4_NL, so the Q8_0 paths
// of MatMul and Row use it unchanged, or block-major ((b*groups+g)) with
// the mins alongside for Q4_1/Q5_1 (mulQ1).
func (m *Matrix) repackAsQ8(data []byte, withMin bool) {
	nb := m.cols / qk8
	groups := (m.rows + qRows - 1) / qRows
	m.qw = hugemem.Alloc[byte](m.arena, groups*nb*q8GrpSize)
	m.qd = hugemem.Alloc[uint16](m.arena, groups*nb*qRows)
	if withMin {
		m.qm = hugemem.Alloc[float32](m.arena, groups*nb*qRows)
	}
	var v [qk8]int8
	for r := 0; r < m.rows; r++ {
		g, rr := r/qRows, r%qRows
		row := data[r*m.rowBytes : (r+1)*m.rowBytes]
		for b := 0; b < nb; b++ {
			d, mn := extBlock(m.typ, row, b, &v)
			gbi := g*nb + b
			if withMin {
				gbi = b*groups + g
				m.qm[gbi*qRows+rr] = f16ToF32(mn)
			}
			m.qd[gbi*qRows+rr] = d
			w := m.qw[gbi*q8GrpSize:]
			for k, q := range v {
				w[(k/4)*64+rr*4+k%4] = byte(q)
			}
		}
	}
}

// rowExt dequantises row r of a matrix of one of the types above with
// ggml's dequantize_row arithmetic.
func (m *Matrix) rowExt(r int, dst []float32) {
	switch {
	case m.xls != nil:
		m.rowIQ4XS(r, dst)
	case m.kmins != nil:
		m.rowKMin(r, dst)
	case m.kw != nil:
		m.rowK(r, dst) // Q3_K as Q6_K records
	case m.qm != nil:
		nb := m.cols / qk8
		groups := (m.rows + qRows - 1) / qRows
		g, rr := r/qRows, r%qRows
		for b := 0; b < nb; b++ {
			gbi := b*groups + g
			d, mn := f16ToF32(m.qd[gbi*qRows+rr]), m.qm[gbi*qRows+rr]
			w := m.qw[gbi*q8GrpSize:]
			for k := 0; k < qk8; k++ {
				dst[b*qk8+k] = float32(float32(int8(w[(k/4)*64+rr*4+k%4]))*d) + mn
			}
		}
	default:
		m.rowQ(r, dst)
	}
}

// mulExt is MatMul for the paths that finish in Go: Q4_1/Q5_1, Q5_K/Q2_K
// and IQ4_XS.
func (m *Matrix) mulExt(p *Pool, dst []float32, x []float32, n int) {
	switch {
	case m.xls != nil:
		m.mulIQ4XS(p, dst, x, n)
	case m.kmins != nil:
		m.mulKMin(p, dst, x, n)
	default:
		m.mulQ1(p, dst, x, n)
	}
}

// mulQ1 computes a Q4_1/Q5_1 product: Q8_1 activations (packed Q8_0 plus
// s), one Q8_0 tile call per block and chunk of groups, then ggml's
// per-block sum acc += float(sumi)*(d_w*d_x) + m*s.
func (m *Matrix) mulQ1(p *Pool, dst []float32, x []float32, n int) {
	rows, cols := m.rows, m.cols
	nb := cols / qk8
	groups := (rows + qRows - 1) / qRows
	a := actsPool.Get().(*acts)
	defer a.release()
	a.prepare(p, quant.Q8_0, x, n, cols)
	w := a.w
	ag := (n + w - 1) / w
	// s per (activation group, block, row in group), as xd is laid out.
	s := grow(a.s, ag*nb*w)
	a.s = s
	clear(s) // padding rows of the last activation group stay zero
	p.RunGrain(n, max(1, minShareMACs/cols), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			g, i := r/w, r%w
			for b := 0; b < nb; b++ {
				sum := a.c[(g*nb+b)*w+i] / qCorr(quant.Q8_0)
				s[(g*nb+b)*w+i] = q8_1Sum(x[r*cols+b*qk8:r*cols+(b+1)*qk8], sum)
			}
		}
	})
	grain := max(1, minShareMACs/(qRows*cols*n))
	p.RunGrain(groups, grain, func(lo, hi int) {
		var out, acc [q1GroupChunk * qRows * 8]float32
		for c0 := lo; c0 < hi; c0 += q1GroupChunk {
			c1 := min(hi, c0+q1GroupChunk)
			ng := c1 - c0
			for gi := 0; gi < ag; gi++ {
				accs := acc[:ng*w*qRows]
				clear(accs)
				for b := 0; b < nb; b++ {
					blk := b*groups + c0
					ab := (gi*nb + b) * w
					qTileImpl(quant.Q8_0, w, ng, m.qw[blk*q8GrpSize:(blk+ng)*q8GrpSize], m.qd[blk*qRows:(blk+ng)*qRows],
						a.q[ab*qk8:(ab+w)*qk8], a.d[ab:ab+w], a.c[ab:ab+w], out[:ng*w*qRows])
					mins := m.qm[blk*qRows : (blk+ng)*qRows]
					for g := 0; g < ng; g++ {
						mn := (*[qRows]float32)(mins[g*qRows:])
						for i, si := range s[ab : ab+w] {
							o := (g*w + i) * qRows
							ov, av := (*[qRows]float32)(out[o:]), (*[qRows]float32)(accs[o:])
							for r := range av {
								av[r] += float32(ov[r] + float32(mn[r]*si))
							}
						}
					}
				}
				for g := 0; g < ng; g++ {
					r0 := (c0 + g) * qRows
					nr := min(qRows, rows-r0)
					for i := 0; i < w && gi*w+i < n; i++ {
						o := (gi*w+i)*rows + r0
						copy(dst[o:o+nr], accs[(g*w+i)*qRows:(g*w+i)*qRows+nr])
					}
				}
			}
		}
	})
}

// repackIQ4XS writes IQ4_XS rows' grid values in qgemm.go's Q8_0 layout,
// block-major (32-column block b of group g at b*groups+g), with unit
// scales; the per-32 scales (ls-32) go to xls and each super-block's d to
// xd, indexed like the rows of a block.
func (m *Matrix) repackIQ4XS(data []byte) {
	nb := m.cols / qk8
	groups := (m.rows + qRows - 1) / qRows
	m.qw = hugemem.Alloc[byte](m.arena, groups*nb*q8GrpSize)
	m.qd = hugemem.Alloc[uint16](m.arena, groups*nb*qRows)
	for i := range m.qd {
		m.qd[i] = 0x3c00 // 1.0
	}
	m.xls = hugemem.Alloc[int8](m.arena, groups*nb*qRows)
	m.xd = hugemem.Alloc[float32](m.arena, groups*nb*qRows)
	for r := 0; r < m.rows; r++ {
		g, rr := r/qRows, r%qRows
		row := data[r*m.rowBytes : (r+1)*m.rowBytes]
		for b := 0; b < nb; b++ {
			blk := row[(b/8)*136 : (b/8+1)*136]
			ib := b % 8
			gbi := b*groups + g
			sh := binary.LittleEndian.Uint16(blk[2:])
			ls := int32(blk[4+ib/2]>>uint(4*(ib%2))&0x0f) | int32(sh>>uint(2*ib)&3)<<4
			m.xls[gbi*qRows+rr] = int8(ls - 32)
			m.xd[gbi*qRows+rr] = f16ToF32(binary.LittleEndian.Uint16(blk))
			w := m.qw[gbi*q8GrpSize:]
			qs := blk[8+16*ib : 8+16*ib+16]
			for k := 0; k < qk8; k++ {
				w[(k/4)*64+rr*4+k%4] = byte(quant.KValuesIQ4NL[q5Val(qs, 0, k)])
			}
		}
	}
}

// rowIQ4XS dequantises row r of a repacked IQ4_XS matrix with
// dequantize_row_iq4_xs's arithmetic: (d*(ls-32)) * grid value.
func (m *Matrix) rowIQ4XS(r int, dst []float32) {
	nb := m.cols / qk8
	groups := (m.rows + qRows - 1) / qRows
	g, rr := r/qRows, r%qRows
	for b := 0; b < nb; b++ {
		gbi := b*groups + g
		dl := m.xd[gbi*qRows+rr] * float32(m.xls[gbi*qRows+rr])
		w := m.qw[gbi*q8GrpSize:]
		for k := 0; k < qk8; k++ {
			dst[b*qk8+k] = dl * float32(int8(w[(k/4)*64+rr*4+k%4]))
		}
	}
}

// iq4Acts are one IQ4_XS product's activations: Q8_K quants in the packed
// Q8_0 layout with unit scales (xq, xd, xc as qgemm.go describes, xc the
// -128 correction of the Q8_0 kernels), and each row's Q8_K scales.
type iq4Acts struct {
	q  []int8
	d  []float32
	c  []int32
	kd []float32 // [row][super-block]
	tq []int8    // one row's Q8_K quants, per task
}

var iq4ActsPool = sync.Pool{New: func() any { return new(iq4Acts) }}

// mulIQ4XS computes an IQ4_XS product: per 32 columns one Q8_0 tile call
// for up to 16 groups of rows gives each row's exact sumi, and
// acc += (float(d_w*d_x)*(ls-32)) * sumi follows ggml_vec_dot_iq4_xs_q8_K.
func (m *Matrix) mulIQ4XS(p *Pool, dst []float32, x []float32, n int) {
	rows, cols := m.rows, m.cols
	nb, nsb := cols/qk8, cols/qkK
	groups := (rows + qRows - 1) / qRows
	w := qGroupWidth(n)
	ag := (n + w - 1) / w
	a := iq4ActsPool.Get().(*iq4Acts)
	defer iq4ActsPool.Put(a)
	a.q, a.d, a.c = grow(a.q, ag*w*cols), grow(a.d, ag*w*nb), grow(a.c, ag*w*nb)
	a.kd = grow(a.kd, ag*w*nsb)
	for i := range a.d {
		a.d[i] = 1
	}
	corr := qCorr(quant.Q8_0)
	p.RunGrain(ag*w, max(1, minShareMACs/cols), func(lo, hi int) {
		q := make([]int8, cols)
		bs := make([]int16, cols/16)
		for r := lo; r < hi; r++ {
			gi, i := r/w, r%w
			if r < n {
				quantizeQ8K(x[r*cols:(r+1)*cols], q, a.kd[r*nsb:(r+1)*nsb], bs)
			} else {
				clear(q)
				clear(a.kd[r*nsb : (r+1)*nsb])
			}
			for b := 0; b < nb; b++ {
				ab := gi*nb + b
				var sum int32
				for k := 0; k < qk8; k++ {
					v := q[b*qk8+k]
					a.q[(ab*8+k/4)*w*4+i*4+k%4] = v
					sum += int32(v)
				}
				a.c[ab*w+i] = corr * sum
			}
		}
	})
	grain := max(1, minShareMACs/(qRows*cols*n))
	p.RunGrain(groups, grain, func(lo, hi int) {
		var out, acc [q1GroupChunk * qRows * 8]float32
		for c0 := lo; c0 < hi; c0 += q1GroupChunk {
			c1 := min(hi, c0+q1GroupChunk)
			ng := c1 - c0
			for gi := 0; gi < ag; gi++ {
				accs := acc[:ng*w*qRows]
				clear(accs)
				for b := 0; b < nb; b++ {
					blk := b*groups + c0
					ab := (gi*nb + b) * w
					qTileImpl(quant.Q8_0, w, ng, m.qw[blk*q8GrpSize:(blk+ng)*q8GrpSize], m.qd[blk*qRows:(blk+ng)*qRows],
						a.q[ab*qk8:(ab+w)*qk8], a.d[ab:ab+w], a.c[ab:ab+w], out[:ng*w*qRows])
					for g := 0; g < ng; g++ {
						dw := (*[qRows]float32)(m.xd[(blk+g)*qRows:])
						ls := (*[qRows]int8)(m.xls[(blk+g)*qRows:])
						for i := 0; i < w; i++ {
							xd := a.kd[(gi*w+i)*nsb+b/8]
							o := (g*w + i) * qRows
							ov, av := (*[qRows]float32)(out[o:]), (*[qRows]float32)(accs[o:])
							for r := range av {
								dl := float32(float32(dw[r]*xd) * float32(ls[r]))
								av[r] += float32(dl * ov[r])
							}
						}
					}
				}
				for g := 0; g < ng; g++ {
					r0 := (c0 + g) * qRows
					nr := min(qRows, rows-r0)
					for i := 0; i < w && gi*w+i < n; i++ {
						o := (gi*w+i)*rows + r0
						copy(dst[o:o+nr], accs[(g*w+i)*qRows:(g*w+i)*qRows+nr])
					}
				}
			}
		}
	})
}

// kMinCount is the number of mins per super-block of a type on the
// min-carrying K path: Q5_K one per 32 values, Q2_K one per 16.
func kMinCount(t quant.Type) int {
	if t == quant.Q2_K {
		return 16
	}
	return 8
}

// kBlock decodes one GGML super-block of a K-type that is run as Q6_K
// records: its 256 values (Q6_K's value+32 bytes hold them), the int8
// scale of each 16-value group, the fp16 d, and (Q5_K, Q2_K) the fp16
// dmin and the mins.
func kBlock(t quant.Type, blk []byte, v *[qkK]int8, sc *[16]int8, mins *[16]uint8) (d, dmin uint16) {
	switch t {
	case quant.Q5_K:
		for k := range v {
			v[k] = int8(q5KValue(blk, k))
		}
		for j := 0; j < 8; j++ {
			s, m := q4KScaleMin(j, blk[4:16])
			sc[2*j], sc[2*j+1], mins[j] = int8(s), int8(s), m
		}
		return binary.LittleEndian.Uint16(blk), binary.LittleEndian.Uint16(blk[2:])
	case quant.Q3_K:
		for k := range v {
			v[k] = int8(q3KValue(blk, k))
		}
		for j := range sc {
			sc[j] = int8(q3KScale(blk[96:108], j))
		}
		return binary.LittleEndian.Uint16(blk[108:]), 0
	default: // Q2_K
		for k := range v {
			h, s, l := k/128, k%128/32, k%32
			v[k] = int8(blk[16+32*h+l] >> uint(2*s) & 3)
		}
		for j := range sc {
			sc[j], mins[j] = int8(blk[j]&0x0f), blk[j]>>4
		}
		return binary.LittleEndian.Uint16(blk[80:]), binary.LittleEndian.Uint16(blk[82:])
	}
}

// repackKAsQ6 writes Q5_K, Q3_K or Q2_K rows as Q6_K records (kgemm.go).
// Q3_K has no mins: its records are group-major and MatMul's Q6_K path
// runs them as they are. Q5_K and Q2_K records are block-major (record
// s*groups+g holds super-block s of group g), with each super-block's
// dmin and mins alongside for mulKMin.
func (m *Matrix) repackKAsQ6(data []byte) {
	nb := m.cols / qkK
	groups := (m.rows + qRows - 1) / qRows
	bb := m.typ.BlockBytes()
	withMin := m.typ != quant.Q3_K
	nm := kMinCount(m.typ)
	m.kw = hugemem.Alloc[byte](m.arena, groups*nb*k6RecBytes)
	if withMin {
		m.kdmin = hugemem.Alloc[float32](m.arena, groups*nb*qRows)
		m.kmins = hugemem.Alloc[uint8](m.arena, groups*nb*qRows*nm)
	}
	var (
		v    [qkK]int8
		sc   [16]int8
		mins [16]uint8
	)
	for r := 0; r < m.rows; r++ {
		g, rr := r/qRows, r%qRows
		row := data[r*m.rowBytes : (r+1)*m.rowBytes]
		for s := 0; s < nb; s++ {
			d, dmin := kBlock(m.typ, row[s*bb:(s+1)*bb], &v, &sc, &mins)
			rec := g*nb + s
			if withMin {
				rec = s*groups + g
				m.kdmin[rec*qRows+rr] = f16ToF32(dmin)
				copy(m.kmins[(rec*qRows+rr)*nm:(rec*qRows+rr+1)*nm], mins[:nm])
			}
			dst := m.kw[rec*k6RecBytes : (rec+1)*k6RecBytes]
			for k, q := range v {
				dst[(k/4)*64+rr*4+k%4] = byte(q + 32)
			}
			for gi, c := range sc {
				dst[4096+(gi/2)*32+rr*2+gi%2] = byte(c)
			}
			binary.LittleEndian.PutUint16(dst[4352+rr*2:], d)
		}
	}
}

// rowKMin dequantises row r of a repacked Q5_K or Q2_K matrix with
// dequantize_row_q5_K's (q2_K's) arithmetic: (d*scale)*q - dmin*min.
func (m *Matrix) rowKMin(r int, dst []float32) {
	nb := m.cols / qkK
	groups := (m.rows + qRows - 1) / qRows
	nm := kMinCount(m.typ)
	g, rr := r/qRows, r%qRows
	for s := 0; s < nb; s++ {
		rec := s*groups + g
		src := m.kw[rec*k6RecBytes : (rec+1)*k6RecBytes]
		d := f16ToF32(binary.LittleEndian.Uint16(src[4352+rr*2:]))
		dmin := m.kdmin[rec*qRows+rr]
		mins := m.kmins[(rec*qRows+rr)*nm : (rec*qRows+rr+1)*nm]
		for k := 0; k < qkK; k++ {
			gi := k / 16
			dl := d * float32(int8(src[4096+(gi/2)*32+rr*2+gi%2]))
			ml := dmin * float32(mins[k*nm/qkK])
			v := int32(src[(k/4)*64+rr*4+k%4]) - 32
			dst[s*qkK+k] = float32(dl*float32(v)) - ml
		}
	}
}

// mulKMin computes a Q5_K or Q2_K product: Q8_K activations packed for
// Q6_K weights, one Q6_K tile call per super-block and chunk of groups,
// then acc += tile - (dmin*d_x)*msum per super-block, where msum sums each
// min times its values' activation sum (the Q6_K pair sums are the per-16
// sums; Q5_K adds each pair). That is dotQ5KRef, and ggml's
// ggml_vec_dot_q2_K_q8_K, bit for bit.
func (m *Matrix) mulKMin(p *Pool, dst []float32, x []float32, n int) {
	rows, cols := m.rows, m.cols
	nb := cols / qkK
	groups := (rows + qRows - 1) / qRows
	nm := kMinCount(m.typ)
	a := actsPool.Get().(*acts)
	defer a.release()
	a.prepare(p, quant.Q6_K, x, n, cols)
	w := a.w
	ag := (n + w - 1) / w
	grain := max(1, minShareMACs/(qRows*cols*n))
	p.RunGrain(groups, grain, func(lo, hi int) {
		var out, acc [q1GroupChunk * qRows * 4]float32
		for c0 := lo; c0 < hi; c0 += q1GroupChunk {
			c1 := min(hi, c0+q1GroupChunk)
			ng := c1 - c0
			for gi := 0; gi < ag; gi++ {
				accs := acc[:ng*w*qRows]
				clear(accs)
				for s := 0; s < nb; s++ {
					rec := s*groups + c0
					ab := (gi*nb + s) * w
					xp := a.c[ab*8 : (ab+w)*8]
					kTileImpl(quant.Q6_K, w, ng, m.kw[rec*k6RecBytes:(rec+ng)*k6RecBytes],
						a.q[ab*qkK:(ab+w)*qkK], a.d[ab:ab+w], xp, out[:ng*w*qRows])
					for i := 0; i < w; i++ {
						// The activation sums each min applies to: the
						// Q6_K pair halves (per 16 values), or whole
						// pairs (per 32) for Q5_K.
						var bs [16]int32
						for j := 0; j < 8; j++ {
							pr := uint32(xp[j*w+i])
							lo, hi := int32(int16(pr)), int32(int16(pr>>16))
							if nm == 16 {
								bs[2*j], bs[2*j+1] = lo, hi
							} else {
								bs[j] = lo + hi
							}
						}
						xd := a.d[ab+i]
						for g := 0; g < ng; g++ {
							o := (g*w + i) * qRows
							base := (rec + g) * qRows
							dmins := (*[qRows]float32)(m.kdmin[base:])
							ov, av := (*[qRows]float32)(out[o:]), (*[qRows]float32)(accs[o:])
							for r := range av {
								var msum int32
								if nm == 16 {
									mn := (*[16]uint8)(m.kmins[(base+r)*16:])
									for j := range mn {
										msum += int32(mn[j]) * bs[j]
									}
								} else {
									mn := (*[8]uint8)(m.kmins[(base+r)*8:])
									for j := range mn {
										msum += int32(mn[j]) * bs[j]
									}
								}
								dmin := float32(dmins[r] * xd)
								av[r] += ov[r] - float32(dmin*float32(msum))
							}
						}
					}
				}
				for g := 0; g < ng; g++ {
					r0 := (c0 + g) * qRows
					nr := min(qRows, rows-r0)
					for i := 0; i < w && gi*w+i < n; i++ {
						o := (gi*w+i)*rows + r0
						copy(dst[o:o+nr], accs[(g*w+i)*qRows:(g*w+i)*qRows+nr])
					}
				}
			}
		}
	})
}
