package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// Sentinel errors of NewMatrix.
var (
	ErrShape       = errors.New("kernels: bad matrix shape")
	ErrUnsupported = errors.New("kernels: unsupported weight type")
	ErrDataSize    = errors.New("kernels: weight data has the wrong size")
)

// Matrix is a weight matrix of Rows x Cols elements, prepared for fast
// products. Row r holds the weights of output r; Cols is the contiguous
// (GGML ne0) dimension.
//
// F32, F16, BF16, Q4_0, Q4_K and Q6_K matrices alias the data given to
// NewMatrix (when it is suitably aligned), so the caller must keep that
// memory mapped and unchanged for the Matrix's lifetime. Q8_0 matrices are
// repacked into their own memory.
type Matrix struct {
	typ        quant.Type
	rows, cols int
	rowBytes   int // GGML bytes per row

	raw []byte    // Q4_0, Q4_K, Q6_K: GGML row-major blocks
	f32 []float32 // F32
	u16 []uint16  // F16, BF16

	// Q8_0, repacked: rows are taken four at a time (the last group padded
	// with zero rows); group g's block b holds the 4x32 quants of rows
	// 4g..4g+3 at q8q[(g*nb+b)*128:], row-major within the block, and their
	// fp16 scales at q8d[(g*nb+b)*4:]. One group's product then reads two
	// sequential streams instead of four scattered ones.
	q8q []int8
	q8d []uint16
}

// NewMatrix prepares rows x cols weights of type t from GGML row-major
// bytes. It fails if the shape is not positive, cols is not a multiple of
// the type's block size, the type is not one the kernels compute with
// (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K), or len(data) is not exactly
// rows * RowBytes(t, cols).
func NewMatrix(t quant.Type, rows, cols int, data []byte) (*Matrix, error) {
	if rows <= 0 || cols <= 0 {
		return nil, fmt.Errorf("%w: %d x %d", ErrShape, rows, cols)
	}
	switch t {
	case quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K:
	default:
		return nil, fmt.Errorf("%w: %s", ErrUnsupported, t)
	}
	rb, err := quant.RowBytes(t, cols)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrShape, err)
	}
	if rows > maxInt/rb {
		return nil, fmt.Errorf("%w: %d x %d overflows", ErrShape, rows, cols)
	}
	if len(data) != rows*rb {
		return nil, fmt.Errorf("%w: %s %d x %d needs %d bytes, got %d", ErrDataSize, t, rows, cols, rows*rb, len(data))
	}
	m := &Matrix{typ: t, rows: rows, cols: cols, rowBytes: rb}
	switch t {
	case quant.F32:
		m.f32 = viewF32(data)
	case quant.F16, quant.BF16:
		m.u16 = viewU16(data)
	case quant.Q8_0:
		m.repackQ8(data)
	default:
		m.raw = data
	}
	return m, nil
}

const maxInt = int(^uint(0) >> 1)

// littleEndian reports whether this machine stores integers as GGUF does,
// so float and half tensors can be used in place.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

func viewF32(b []byte) []float32 {
	n := len(b) / 4
	if littleEndian && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 == 0 {
		return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), n)
	}
	out := make([]float32, n)
	for i := range out {
		out[i] = float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func viewU16(b []byte) []uint16 {
	n := len(b) / 2
	if littleEndian && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%2 == 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), n)
	}
	out := make([]uint16, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

func float32frombits(u uint32) float32 { return *(*float32)(unsafe.Pointer(&u)) }

func (m *Matrix) repackQ8(data []byte) {
	nb := m.cols / qk8
	groups := (m.rows + q8Grp - 1) / q8Grp
	m.q8q = make([]int8, groups*nb*q8Grp*qk8)
	m.q8d = make([]uint16, groups*nb*q8Grp)
	for r := 0; r < m.rows; r++ {
		g, rr := r/q8Grp, r%q8Grp
		row := data[r*m.rowBytes : (r+1)*m.rowBytes]
		for b := 0; b < nb; b++ {
			blk := row[b*34 : (b+1)*34]
			gb := g*nb + b
			m.q8d[gb*q8Grp+rr] = binary.LittleEndian.Uint16(blk)
			dst := m.q8q[gb*q8Grp*qk8+rr*qk8 : gb*q8Grp*qk8+(rr+1)*qk8]
			for j := range dst {
				dst[j] = int8(blk[2+j])
			}
		}
	}
}

// Rows returns the number of rows (outputs).
func (m *Matrix) Rows() int { return m.rows }

// Cols returns the number of columns (inputs).
func (m *Matrix) Cols() int { return m.cols }

// Type returns the GGML type the weights are stored in.
func (m *Matrix) Type() quant.Type { return m.typ }

// Bytes returns the number of weight bytes one full product streams (the
// GGML size), for bandwidth accounting.
func (m *Matrix) Bytes() int { return m.rows * m.rowBytes }

// Row dequantises row r into dst[:Cols()] with the same float32 values as
// ggml's dequantize_row for the type (embedding lookup). It panics if r is
// out of range or dst is shorter than Cols().
func (m *Matrix) Row(r int, dst []float32) {
	if r < 0 || r >= m.rows {
		panic("kernels: Matrix.Row: row out of range")
	}
	dst = dst[:m.cols]
	c := m.cols
	switch m.typ {
	case quant.F32:
		copy(dst, m.f32[r*c:(r+1)*c])
	case quant.F16:
		f16ToF32sImpl(dst, m.u16[r*c:(r+1)*c])
	case quant.BF16:
		for i, h := range m.u16[r*c : (r+1)*c] {
			dst[i] = bf16ToF32(h)
		}
	case quant.Q8_0:
		nb := c / qk8
		g, rr := r/q8Grp, r%q8Grp
		for b := 0; b < nb; b++ {
			gb := g*nb + b
			dequantQ8_0Block(m.q8d[gb*q8Grp+rr], m.q8q[gb*q8Grp*qk8+rr*qk8:gb*q8Grp*qk8+(rr+1)*qk8], dst[b*qk8:(b+1)*qk8])
		}
	case quant.Q4_0:
		dequantQ4_0Row(m.raw[r*m.rowBytes:(r+1)*m.rowBytes], dst)
	case quant.Q4_K:
		dequantQ4KRow(m.raw[r*m.rowBytes:(r+1)*m.rowBytes], dst)
	case quant.Q6_K:
		dequantQ6KRow(m.raw[r*m.rowBytes:(r+1)*m.rowBytes], dst)
	}
}

// acts is one MatMul's activations in the weight's vec_dot_type.
type acts struct {
	f  []float32 // F32/F16/BF16: n*cols (the caller's x for F32)
	fo []float32 // owned buffer behind f for F16/BF16
	q  []int8    // Q8_0/Q8_K quants, n*cols
	d  []float32 // block scales, n*nb
	c  []int32   // Q8_0 bias corrections, n*nb
	bs []int16   // Q8_K bsums, n*cols/16
}

var actsPool = sync.Pool{New: func() any { return new(acts) }}

// release drops the reference to the caller's activations and returns the
// buffers to the pool.
func (a *acts) release() {
	a.f = nil
	actsPool.Put(a)
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Tuning: a share of a product smaller than minShareMACs multiply-adds is
// not worth handing to another thread (a hand-off costs a few µs), and
// activation tiles are kept under actTileBytes so they stay in L2 while a
// chunk of weight rows streams past them.
const (
	minShareMACs = 1 << 16
	actTileBytes = 256 << 10
)

// MatMul computes dst[i*Rows+r] = row r · x[i*Cols:(i+1)*Cols] for i < n,
// r < Rows, with activations converted as ggml's CPU backend converts them
// for m's type (see the package comment). Output rows are split over p;
// each weight row is streamed from memory once per call (activations are
// taken in L2-sized tiles). It panics if x or dst is shorter than needed.
func MatMul(p *Pool, dst []float32, m *Matrix, x []float32, n int) {
	if n <= 0 {
		return
	}
	rows, cols := m.rows, m.cols
	if len(x) < n*cols || len(dst) < n*rows {
		panic("kernels: MatMul: x or dst too short")
	}
	a := actsPool.Get().(*acts)
	defer a.release()
	a.prepare(p, m.typ, x[:n*cols], n, cols)

	units, per := rows, 1 // units of work: rows, or 4-row groups for Q8_0
	if m.typ == quant.Q8_0 {
		units, per = (rows+q8Grp-1)/q8Grp, q8Grp
	}
	grain := 1
	if w := per * cols * n; w < minShareMACs {
		grain = (minShareMACs + w - 1) / w
	}
	actBytes := cols * 4
	switch m.typ {
	case quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K:
		actBytes = cols + cols/8 // quants plus scales and sums
	}
	tile := max(1, actTileBytes/actBytes)
	p.RunGrain(units, grain, func(lo, hi int) {
		for t0 := 0; t0 < n; t0 += tile {
			m.mulUnits(dst, a, t0, min(n, t0+tile), lo, hi)
		}
	})
}

// prepare converts the n activation rows of x for weights of type t.
func (a *acts) prepare(p *Pool, t quant.Type, x []float32, n, cols int) {
	*a = acts{fo: a.fo, q: a.q[:0], d: a.d[:0], c: a.c[:0], bs: a.bs[:0]}
	var conv func(i int)
	switch t {
	case quant.F32:
		a.f = x
		return
	case quant.F16, quant.BF16:
		a.fo = grow(a.fo, len(x))
		a.f = a.fo
		round := roundF16
		if t == quant.BF16 {
			round = roundBF16
		}
		conv = func(i int) {
			for j, v := range x[i*cols : (i+1)*cols] {
				a.f[i*cols+j] = round(v)
			}
		}
	case quant.Q8_0, quant.Q4_0:
		nb := cols / qk8
		a.q, a.d, a.c = grow(a.q, len(x)), grow(a.d, n*nb), grow(a.c, n*nb)
		conv = func(i int) {
			quantizeQ8_0(x[i*cols:(i+1)*cols], a.q[i*cols:(i+1)*cols], a.d[i*nb:(i+1)*nb], a.c[i*nb:(i+1)*nb])
		}
	case quant.Q4_K, quant.Q6_K:
		nb := cols / qkK
		a.q, a.d, a.bs = grow(a.q, len(x)), grow(a.d, n*nb), grow(a.bs, n*nb*16)
		conv = func(i int) {
			quantizeQ8K(x[i*cols:(i+1)*cols], a.q[i*cols:(i+1)*cols], a.d[i*nb:(i+1)*nb], a.bs[i*nb*16:(i+1)*nb*16])
		}
	}
	grain := max(1, minShareMACs/cols)
	p.RunGrain(n, grain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			conv(i)
		}
	})
}

// mulUnits computes the outputs of work units [lo, hi) for activation rows
// [i0, i1). The weight unit is the outer loop so it is read from memory once
// and from cache for the remaining activation rows.
func (m *Matrix) mulUnits(dst []float32, a *acts, i0, i1, lo, hi int) {
	rows, cols := m.rows, m.cols
	switch m.typ {
	case quant.F32:
		for r := lo; r < hi; r++ {
			w := m.f32[r*cols : (r+1)*cols]
			for i := i0; i < i1; i++ {
				dst[i*rows+r] = dotImpl(a.f[i*cols:(i+1)*cols], w)
			}
		}
	case quant.F16, quant.BF16:
		dot := dotF16Impl
		if m.typ == quant.BF16 {
			dot = dotBF16Impl
		}
		for r := lo; r < hi; r++ {
			w := m.u16[r*cols : (r+1)*cols]
			for i := i0; i < i1; i++ {
				dst[i*rows+r] = dot(a.f[i*cols:(i+1)*cols], w)
			}
		}
	case quant.Q8_0:
		nb := cols / qk8
		var out [4]float32
		for g := lo; g < hi; g++ {
			w := m.q8q[g*nb*q8Grp*qk8 : (g+1)*nb*q8Grp*qk8]
			ws := m.q8d[g*nb*q8Grp : (g+1)*nb*q8Grp]
			nr := min(q8Grp, rows-g*q8Grp)
			for i := i0; i < i1; i++ {
				dotQ8x4Impl(w, ws, a.q[i*cols:(i+1)*cols], a.d[i*nb:(i+1)*nb], a.c[i*nb:(i+1)*nb], &out)
				copy(dst[i*rows+g*q8Grp:i*rows+g*q8Grp+nr], out[:nr])
			}
		}
	case quant.Q4_0, quant.Q4_K, quant.Q6_K:
		nb := cols / m.typ.BlockSize()
		for r := lo; r < hi; r++ {
			w := m.raw[r*m.rowBytes : (r+1)*m.rowBytes]
			for i := i0; i < i1; i++ {
				xq, xd := a.q[i*cols:(i+1)*cols], a.d[i*nb:(i+1)*nb]
				var v float32
				switch m.typ {
				case quant.Q4_0:
					v = dotQ4_0Impl(w, xq, xd)
				case quant.Q4_K:
					v = dotQ4KImpl(w, xq, xd, a.bs[i*nb*16:(i+1)*nb*16])
				default:
					v = dotQ6KImpl(w, xq, xd)
				}
				dst[i*rows+r] = v
			}
		}
	}
}
