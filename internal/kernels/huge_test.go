package kernels

import (
	"testing"
	"unsafe"
)

// TestHugeInterior: the advised range is exactly the whole, aligned huge
// pages inside a buffer, and nothing for a buffer too small to hold one
// with room to spare.
func TestHugeInterior(t *testing.T) {
	buf := make([]byte, 5*hugeBytes)
	base := uintptr(unsafe.Pointer(&buf[0]))
	for _, tc := range []struct{ off, n int }{
		{0, 5 * hugeBytes}, {1, 4*hugeBytes + 7}, {4096, 3 * hugeBytes}, {0, hugeMin}, {0, hugeMin - 1}, {0, 100},
	} {
		b := buf[tc.off : tc.off+tc.n]
		h := hugeInterior(b)
		if tc.n < hugeMin {
			if h != nil {
				t.Errorf("%+v: %d bytes advised in a buffer under hugeMin", tc, len(h))
			}
			continue
		}
		start := uintptr(unsafe.Pointer(&h[0]))
		lo := int(start - base - uintptr(tc.off))
		switch {
		case start%hugeBytes != 0 || len(h)%hugeBytes != 0:
			t.Errorf("%+v: interior at %#x, %d bytes: not whole aligned huge pages", tc, start, len(h))
		case lo < 0 || lo+len(h) > tc.n:
			t.Errorf("%+v: interior [%d, %d) leaves the buffer", tc, lo, lo+len(h))
		case lo >= hugeBytes || tc.n-(lo+len(h)) >= hugeBytes:
			t.Errorf("%+v: interior [%d, %d) leaves a whole aligned huge page out", tc, lo, lo+len(h))
		}
	}
}
