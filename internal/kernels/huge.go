package kernels

import "unsafe"

// Weights on huge pages.
//
// Decode streams every weight once per token, and with 4 KiB pages that is
// a TLB miss every 4 KiB of every stream; under virtualisation each miss
// walks two page tables. On the 2-core EPYC VM the project is measured on,
// the same F32 matrix-vector kernel read 18-25 GB/s from memory on 4 KiB
// pages and 28-37 GB/s on 2 MiB pages (a scratch benchmark rotating over
// 480 MiB). So the memory a Matrix streams is asked of the kernel as
// transparent huge pages: advised before it is first written, and
// collapsed after (for memory the Go heap had already touched). Both are
// hints: where the kernel has no transparent huge pages, or refuses, the
// buffers stay on ordinary pages and nothing else changes.

// hugeBytes is the size of a huge page; hugeMin the smallest buffer worth
// advising (it must contain at least one aligned huge page).
const (
	hugeBytes = 2 << 20
	hugeMin   = 2 * hugeBytes
)

// makeHuge returns a zeroed slice of n elements whose memory is advised
// for huge pages (when it is at least hugeMin bytes).
func makeHuge[T any](n int) []T {
	s := make([]T, n)
	if b := bytesOf(s); len(b) >= hugeMin {
		adviseHuge(b)
	}
	return s
}

// bytesOf views s's memory as bytes.
func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	var zero T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(zero)))
}

// hugeInterior is the part of b made of whole, aligned huge pages.
func hugeInterior(b []byte) []byte {
	if len(b) < hugeMin {
		return nil
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	lo := int((start+hugeBytes-1)&^(hugeBytes-1) - start)
	hi := lo + (len(b)-lo)&^(hugeBytes-1)
	if hi <= lo {
		return nil
	}
	return b[lo:hi]
}

// settleHuge collapses the matrix's streamed buffers onto huge pages once
// they are written.
func (m *Matrix) settleHuge() {
	for _, b := range [][]byte{bytesOf(m.f32), bytesOf(m.u16), m.qw, bytesOf(m.qd), bytesOf(m.qm),
		m.kw, bytesOf(m.kdmin), m.kmins, bytesOf(m.xls), bytesOf(m.xd)} {
		if len(b) >= hugeMin {
			collapseHuge(b)
		}
	}
}
