package kernels

import "golang.org/x/sys/unix"

// madvCollapse is MADV_COLLAPSE (Linux 6.1): make the range's memory huge
// pages now, copying it if need be.
const madvCollapse = 25

// adviseHuge asks for b's aligned interior to be backed by huge pages when
// it is first touched (MADV_HUGEPAGE). Errors are ignored: it is a hint.
func adviseHuge(b []byte) {
	if h := hugeInterior(b); h != nil {
		_ = unix.Madvise(h, unix.MADV_HUGEPAGE)
	}
}

// collapseHuge asks for b's aligned interior to be moved onto huge pages
// now (MADV_COLLAPSE), which also covers memory touched before adviseHuge.
// Older kernels refuse with EINVAL; errors are ignored: it is a hint.
func collapseHuge(b []byte) {
	if h := hugeInterior(b); h != nil {
		_ = unix.Madvise(h, unix.MADV_HUGEPAGE)
		_ = unix.Madvise(h, madvCollapse)
	}
}
