package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/pagewarden/pagewarden/internal/hugemem"
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
// F32, F16 and BF16 matrices under 4 MiB alias the data given to NewMatrix
// (when it is suitably aligned), so the caller must keep that memory mapped
// and unchanged for the Matrix's lifetime; larger ones are copied onto huge
// pages (huge.go), as quantised matrices are repacked into their own memory.
type Matrix struct {
	typ        quant.Type
	kind       quant.Type // the type whose kernels compute the product (matrix_ext.go)
	rows, cols int
	rowBytes   int // GGML bytes per row

	f32 []float32 // F32
	u16 []uint16  // F16, BF16

	// Q8_0 and Q4_0, repacked into groups of 16 rows (the last padded with
	// zero rows) so that a group's product reads one sequential stream of
	// quants and one of scales; the layout is described in qgemm.go.
	qw []byte
	qd []uint16

	// Q4_K and Q6_K, repacked into 16-row groups (kgemm.go).
	kw []byte

	// Q4_1 and Q5_1: each block's fp16 min as float32, block-major
	// (matrix_ext.go); their quants are in qw/qd, block-major too.
	qm []float32
	// Q5_K: values and scales in kw as Q6_K records, block-major; each
	// super-block's dmin (float32) and 6-bit mins alongside (matrix_ext.go).
	kdmin []float32
	kmins []uint8
	// IQ4_XS: the grid values in qw (Q8_0 layout, block-major, unit
	// scales in qd), each 32 values' 6-bit scale minus 32 and each
	// super-block's d alongside (matrix_ext.go).
	xls []int8
	xd  []float32

	// arena is where the buffers above are carved from while NewMatrixIn
	// makes them (nil: each is made on its own); it is cleared after.
	arena *hugemem.Arena
}

// NewMatrix prepares rows x cols weights of type t from GGML row-major
// bytes. It fails if the shape is not positive, cols is not a multiple of
// the type's block size, the type is not one the kernels compute with
// (Supports, WeightTypes), or len(data) is not exactly rows *
// RowBytes(t, cols).
func NewMatrix(t quant.Type, rows, cols int, data []byte) (*Matrix, error) {
	return NewMatrixIn(nil, t, rows, cols, data)
}

// NewMatrixIn is NewMatrix with the matrix's own buffers carved from a
// (see hugemem.Arena): a model's loader passes one arena for all its
// matrices, so that its weights lie on huge pages end to end.
func NewMatrixIn(a *hugemem.Arena, t quant.Type, rows, cols int, data []byte) (*Matrix, error) {
	if rows <= 0 || cols <= 0 {
		return nil, fmt.Errorf("%w: %d x %d", ErrShape, rows, cols)
	}
	if !Supports(t) {
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
	m := &Matrix{typ: t, kind: t, rows: rows, cols: cols, rowBytes: rb, arena: a}
	switch t {
	case quant.F32:
		m.f32 = viewF32(data)
		if len(data) >= hugemem.MinBytes {
			buf := hugemem.Alloc[float32](m.arena, len(m.f32))
			copy(buf, m.f32)
			m.f32 = buf
		}
	case quant.F16, quant.BF16:
		m.u16 = viewU16(data)
		if len(data) >= hugemem.MinBytes {
			buf := hugemem.Alloc[uint16](m.arena, len(m.u16))
			copy(buf, m.u16)
			m.u16 = buf
		}
	case quant.Q8_0, quant.Q4_0:
		m.repackQ(data)
	case quant.Q4_K, quant.Q6_K:
		m.repackK(data)
	default:
		m.prepareExt(data)
	}
	m.settleHuge()
	m.arena = nil
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
	case quant.Q8_0, quant.Q4_0:
		m.rowQ(r, dst)
	case quant.Q4_K, quant.Q6_K:
		m.rowK(r, dst)
	default:
		m.rowExt(r, dst)
	}
}

// acts is one MatMul's activations in the weight's vec_dot_type.
type acts struct {
	f  []float32 // F32/F16/BF16: n*cols (the caller's x for F32)
	fo []float32 // owned buffer behind f for F16/BF16
	q  []int8    // Q8_0 (packed, see qgemm.go) or Q8_K quants (kgemm.go)
	d  []float32 // block scales
	c  []int32   // Q8_0: per-block corrections; Q8_K: bsum pairs
	s  []float32 // Q8_1 (Q4_1/Q5_1 weights): fp16 d*sum per block, laid out as d
	w  int       // activation-group width
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
// taken in L2-sized tiles) and, where the CPU allows, meets several
// activation rows per load. It panics if x or dst is shorter than needed.
func MatMul(p *Pool, dst []float32, m *Matrix, x []float32, n int) {
	if n <= 0 {
		return
	}
	rows, cols := m.rows, m.cols
	if len(x) < n*cols || len(dst) < n*rows {
		panic("kernels: MatMul: x or dst too short")
	}
	x, dst = x[:n*cols], dst[:n*rows]
	if m.typ == quant.F32 {
		// Units are groups of 4 rows, the tiled kernel's height.
		units := (rows + 3) / 4
		grain := max(1, minShareMACs/(4*cols*n))
		p.RunGrain(units, grain, func(lo, hi int) {
			gemmF32Impl(dst, rows, m.f32, cols, 4*lo, min(rows, 4*hi), x, n)
		})
		return
	}
	if m.qm != nil || m.kmins != nil || m.xls != nil {
		m.mulExt(p, dst, x, n)
		return
	}
	a := actsPool.Get().(*acts)
	defer a.release()
	a.prepare(p, m.kind, x, n, cols)

	units, per := rows, 1 // units of work: rows, or 16-row groups
	packed := m.qw != nil || m.kw != nil
	if packed {
		units, per = (rows+qRows-1)/qRows, qRows
	}
	grain := 1
	if w := per * cols * n; w < minShareMACs {
		grain = (minShareMACs + w - 1) / w
	}
	actBytes := cols * 4
	switch m.kind {
	case quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K:
		actBytes = cols + cols/8 // quants plus scales and sums
	}
	tile := max(1, actTileBytes/actBytes)
	if packed {
		tile = max(1, tile/a.w) // in activation groups
	}
	p.RunGrain(units, grain, func(lo, hi int) {
		if packed {
			groups := (n + a.w - 1) / a.w
			for t0 := 0; t0 < groups; t0 += tile {
				if m.qw != nil {
					m.mulQGroups(dst, a, n, t0, min(groups, t0+tile), lo, hi)
				} else {
					m.mulKGroups(dst, a, n, t0, min(groups, t0+tile), lo, hi)
				}
			}
			return
		}
		for t0 := 0; t0 < n; t0 += tile {
			m.mulUnits(dst, a, t0, min(n, t0+tile), lo, hi)
		}
	})
}

// prepare converts the n activation rows of x for weights of type t.
func (a *acts) prepare(p *Pool, t quant.Type, x []float32, n, cols int) {
	*a = acts{fo: a.fo, q: a.q[:0], d: a.d[:0], c: a.c[:0], s: a.s[:0]}
	var conv func(i int)
	tasks := n
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
		w := qGroupWidth(n)
		groups := (n + w - 1) / w
		a.w = w
		a.q, a.d, a.c = grow(a.q, groups*w*cols), grow(a.d, groups*w*nb), grow(a.c, groups*w*nb)
		corr := qCorr(t)
		tasks = groups * w
		conv = func(r int) {
			g, i := r/w, r%w
			xq := a.q[g*w*cols : (g+1)*w*cols]
			xd, xc := a.d[g*w*nb:(g+1)*w*nb], a.c[g*w*nb:(g+1)*w*nb]
			if r >= n {
				clearPackedRow(nb, w, i, xq, xd, xc)
				return
			}
			quantQ8Impl(x[r*cols:(r+1)*cols], w, i, corr, xq, xd, xc)
		}
	case quant.Q4_K, quant.Q6_K:
		nb := cols / qkK
		w := kGroupWidth(n)
		groups := (n + w - 1) / w
		a.w = w
		a.q, a.d, a.c = grow(a.q, groups*w*cols), grow(a.d, groups*w*nb), grow(a.c, groups*w*nb*8)
		tasks = groups * w
		var zero []float32
		if tasks > n {
			zero = make([]float32, cols) // padding rows quantise to zeros
		}
		conv = func(r int) {
			g, i := r/w, r%w
			xq := a.q[g*w*cols : (g+1)*w*cols]
			xd, xp := a.d[g*w*nb:(g+1)*w*nb], a.c[g*w*nb*8:(g+1)*w*nb*8]
			xr := zero
			if r < n {
				xr = x[r*cols : (r+1)*cols]
			}
			quantKImpl(t, xr, w, i, xq, xd, xp)
		}
	}
	grain := max(1, minShareMACs/cols)
	p.RunGrain(tasks, grain, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			conv(i)
		}
	})
}

// mulQGroups computes, for a packed Q8_0/Q4_0 matrix, the outputs of weight
// groups [lo, hi) for activation groups [g0, g1). The weight group is the
// outer loop so it is read from memory once and from cache for the
// remaining activation groups. A single activation row (decode) takes all
// full groups in one call, writing straight into dst.
func (m *Matrix) mulQGroups(dst []float32, a *acts, n, g0, g1, lo, hi int) {
	rows, cols := m.rows, m.cols
	nb := cols / qk8
	gb := qGroupBytes(m.kind)
	w := a.w
	if n == 1 {
		full := min(hi, rows/qRows)
		if full > lo {
			qTileImpl(m.kind, 1, full-lo, m.qw[lo*nb*gb:full*nb*gb], m.qd[lo*nb*qRows:full*nb*qRows], a.q[:cols], a.d[:nb], a.c[:nb], dst[lo*qRows:full*qRows])
			lo = full
		}
	}
	if lo >= hi {
		return
	}
	out := getTileBuf()
	defer tileBufs.Put(out)
	for g := lo; g < hi; g++ {
		wq := m.qw[g*nb*gb : (g+1)*nb*gb]
		wd := m.qd[g*nb*qRows : (g+1)*nb*qRows]
		r0 := g * qRows
		nr := min(qRows, rows-r0)
		for ag := g0; ag < g1; ag++ {
			qTileImpl(m.kind, w, 1, wq, wd, a.q[ag*w*cols:(ag+1)*w*cols], a.d[ag*w*nb:(ag+1)*w*nb], a.c[ag*w*nb:(ag+1)*w*nb], out[:w*qRows])
			placeTile(dst, out[:w*qRows], ag*w, min(w, n-ag*w), rows, r0, nr)
		}
	}
}

// tileBufs holds the tile kernels' output buffers: a buffer on the stack
// would escape to the heap anyway (the kernels are called through
// function values), one 512-byte allocation per share of every matrix
// product, which cost about 5% of a decode step in allocation and
// collection.
var tileBufs = sync.Pool{New: func() any { return new([qRows * 8]float32) }}

func getTileBuf() *[qRows * 8]float32 { return tileBufs.Get().(*[qRows * 8]float32) }

// placeTile copies the first k activation rows of a tile's outputs (16
// per activation row) to rows [r0, r0+nr) of dst's activation rows i0,
// i0+1, ... (6-7% of a 16-sequence decode step on AVX2: the stores, into
// the logits rows above all; an inlined fixed-size copy instead of copy's
// memmove call did not change that).
func placeTile(dst, out []float32, i0, k, rows, r0, nr int) {
	for i := range k {
		o := (i0+i)*rows + r0
		copy(dst[o:o+nr], out[i*qRows:i*qRows+nr])
	}
}

// mulKGroups is mulQGroups for packed Q4_K/Q6_K matrices.
func (m *Matrix) mulKGroups(dst []float32, a *acts, n, g0, g1, lo, hi int) {
	rows, cols := m.rows, m.cols
	nb := cols / qkK
	rec := kRecBytes(m.kind)
	w := a.w
	if n == 1 {
		full := min(hi, rows/qRows)
		if full > lo {
			kTileImpl(m.kind, 1, full-lo, m.kw[lo*nb*rec:full*nb*rec], a.q[:cols], a.d[:nb], a.c[:nb*8], dst[lo*qRows:full*qRows])
			lo = full
		}
	}
	if lo >= hi {
		return
	}
	out := getTileBuf()
	defer tileBufs.Put(out)
	for g := lo; g < hi; g++ {
		wk := m.kw[g*nb*rec : (g+1)*nb*rec]
		r0 := g * qRows
		nr := min(qRows, rows-r0)
		for ag := g0; ag < g1; ag++ {
			kTileImpl(m.kind, w, 1, wk, a.q[ag*w*cols:(ag+1)*w*cols], a.d[ag*w*nb:(ag+1)*w*nb], a.c[ag*w*nb*8:(ag+1)*w*nb*8], out[:w*qRows])
			placeTile(dst, out[:w*qRows], ag*w, min(w, n-ag*w), rows, r0, nr)
		}
	}
}

// mulUnits computes the outputs of rows [lo, hi) for activation rows
// [i0, i1) of the F16 and BF16 matrices. The weight row is the outer loop
// so it is read from memory once and from cache for the remaining
// activation rows.
func (m *Matrix) mulUnits(dst []float32, a *acts, i0, i1, lo, hi int) {
	rows, cols := m.rows, m.cols
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
}
