package hugemem

import "golang.org/x/sys/unix"

// madvCollapse is MADV_COLLAPSE (Linux 6.1): make the range's memory huge
// pages now, copying it if need be.
const madvCollapse = 25

// advise asks for b's aligned interior to be backed by huge pages when it
// is first touched (MADV_HUGEPAGE). Errors are ignored: it is a hint.
func advise(b []byte) {
	if h := interior(b); h != nil {
		_ = unix.Madvise(h, unix.MADV_HUGEPAGE)
	}
}

// collapse asks for b's aligned interior to be moved onto huge pages now
// (MADV_COLLAPSE). Older kernels refuse with EINVAL, and page-cache pages
// of a file mapping cannot be collapsed; errors are ignored: it is a hint.
func collapse(b []byte) {
	if h := interior(b); h != nil {
		_ = unix.Madvise(h, unix.MADV_HUGEPAGE)
		_ = unix.Madvise(h, madvCollapse)
	}
}
