package model

import (
	"fmt"
	"unsafe"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/hugemem"
	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// Proj is a set of projections of one input whose outputs lie side by
// side: for input row i, output row i holds every projection's outputs in
// order (Q then K then V; gate then up).
//
// Projections whose weights share a type are fused at load time into one
// Matrix with their rows concatenated. A step then makes one product
// instead of three (or two): one worker-pool barrier and one activation
// quantisation instead of several, which is most of a small model's decode
// overhead. Every output is still the dot product of its own weight row with
// the same activations, so the results are bit-identical to separate
// products (TestFusedProjectionsExact checks it).
type Proj struct {
	mats []*kernels.Matrix
	rows int // total output width
}

// Rows returns the width of the combined output.
func (p *Proj) Rows() int { return p.rows }

// Matrices returns the matrices whose rows, in order, make the output: one
// when every projection was fused.
func (p *Proj) Matrices() []*kernels.Matrix { return p.mats }

// mul computes the combined outputs of n rows of x into dst (n x Rows).
// tmp is scratch for projections that could not be fused.
func (p *Proj) mul(pool *kernels.Pool, dst, x []float32, n int, tmp *[]float32) {
	if len(p.mats) == 1 {
		kernels.MatMul(pool, dst, p.mats[0], x, n)
		return
	}
	off := 0
	for _, m := range p.mats {
		r := m.Rows()
		if n == 1 {
			kernels.MatMul(pool, dst[off:off+r], m, x, 1)
		} else {
			*tmp = grow(*tmp, n*r)
			kernels.MatMul(pool, *tmp, m, x, n)
			for i := 0; i < n; i++ {
				copy(dst[i*p.rows+off:i*p.rows+off+r], (*tmp)[i*r:(i+1)*r])
			}
		}
		off += r
	}
}

// newProj prepares the projections ts (all with the same column count) as
// one Proj, fusing neighbours that share a type when fuse is set, its
// matrices carved from arena (nil: each made on its own).
//
// Quantised weights are repacked by NewMatrix into memory of its own, so
// their rows are concatenated into a transient buffer first. Float weights
// are used in place by NewMatrix; they are fused only when their bytes
// already lie back to back in the file (as the tensors of one layer usually
// do), so fusing never copies a float model into the heap.
func newProj(arena *hugemem.Arena, fuse bool, cols int, ts []*gguf.TensorInfo) (Proj, error) {
	var p Proj
	for i := 0; i < len(ts); {
		j := i + 1
		for fuse && j < len(ts) && joinable(ts[j-1], ts[j]) {
			j++
		}
		rows, size := 0, 0
		for _, t := range ts[i:j] {
			rows += int(t.Dims[1])
			size += len(t.Data)
		}
		data := ts[i].Data
		if j-i > 1 {
			if isFloat(ts[i].Type) {
				// joinable checked that the tensors are adjacent in one
				// mapping: the span is the concatenation.
				data = unsafe.Slice(unsafe.SliceData(ts[i].Data), size)
			} else {
				data = make([]byte, 0, size)
				for _, t := range ts[i:j] {
					data = append(data, t.Data...)
				}
			}
		}
		mx, err := kernels.NewMatrixIn(arena, ts[i].Type, rows, cols, data)
		if err != nil {
			return Proj{}, fmt.Errorf("model: tensor %s: %w", ts[i].Name, err)
		}
		p.mats = append(p.mats, mx)
		p.rows += rows
		i = j
	}
	return p, nil
}

func isFloat(t quant.Type) bool {
	return t == quant.F32 || t == quant.F16 || t == quant.BF16
}

// fuseRowAlign is the row count every fused part but the last must be a
// multiple of. The kernels compute a row the same way wherever it sits in
// a full group (16 rows for the quantised types, 4 for F32) but may use
// another instruction sequence for the rows of a short last group; with
// aligned parts, exactly the rows that were in a short group alone are in
// the fused matrix's short group.
const fuseRowAlign = 16

// joinable reports whether b's rows can be appended to a's in one Matrix.
func joinable(a, b *gguf.TensorInfo) bool {
	if a.Type != b.Type || len(a.Data) == 0 || len(b.Data) == 0 {
		return false
	}
	if len(a.Dims) != 2 || a.Dims[1]%fuseRowAlign != 0 {
		return false
	}
	if !isFloat(a.Type) {
		return true
	}
	end := uintptr(unsafe.Pointer(unsafe.SliceData(a.Data))) + uintptr(len(a.Data))
	return end == uintptr(unsafe.Pointer(unsafe.SliceData(b.Data)))
}

// StepBytes is what one decode step reads from memory, for the bandwidth
// bound: every projection's and the output's weights once (the bytes the
// kernels stream, kernels.Matrix.StreamBytes), whatever the batch, plus,
// for each sequence in the step, the keys and values of every position its
// new token attends to: positions[i] is the position of sequence i's new
// token, so it reads positions[i]+1 of them per layer, kvElem bytes per
// value (4 for an F32 cache, 2 for F16). Norm vectors, biases and the one
// embedding row are left out (under 0.1% of a step).
func (m *Model) StepBytes(positions []int, kvElem int) int64 {
	var n int64
	for _, mx := range m.Matrices() {
		n += mx.StreamBytes()
	}
	perPos := int64(m.Config.Layers) * 2 * int64(m.Config.KVDim()) * int64(kvElem)
	for _, p := range positions {
		n += int64(p+1) * perPos
	}
	return n
}

// Matrices lists the weight matrices a decode step streams: every layer's
// projections and the output.
func (m *Model) Matrices() []*kernels.Matrix {
	var ms []*kernels.Matrix
	for i := range m.W.Layers {
		l := &m.W.Layers[i]
		ms = append(ms, l.QKV.Matrices()...)
		ms = append(ms, l.O)
		ms = append(ms, l.GateUp.Matrices()...)
		ms = append(ms, l.Down)
	}
	return append(ms, m.W.Output)
}
