package kernels

import "github.com/pagewarden/pagewarden/internal/hugemem"

// Weights on huge pages (see package hugemem): the buffers a Matrix
// streams are made with hugemem.Make or carved from the loader's
// hugemem.Arena (NewMatrixIn), advised before they are first
// written, and collapsed once written (for memory the Go heap had already
// touched, and for buffers copied from a file mapping).

// settleHuge collapses the matrix's streamed buffers onto huge pages once
// they are written.
func (m *Matrix) settleHuge() {
	for _, b := range [][]byte{hugemem.Bytes(m.f32), hugemem.Bytes(m.u16), m.qw, hugemem.Bytes(m.qd), hugemem.Bytes(m.qm),
		m.kw, hugemem.Bytes(m.kdmin), m.kmins, hugemem.Bytes(m.xls), hugemem.Bytes(m.xd)} {
		hugemem.Collapse(b)
	}
}
