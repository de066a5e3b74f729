package hugemem

import (
	"testing"
	"unsafe"
)

// TestHugeInterior: the advised range is exactly the whole, aligned huge
// pages inside a buffer, and nothing for a buffer too small to hold one
// with room to spare.
func TestHugeInterior(t *testing.T) {
	buf := make([]byte, 5*PageBytes)
	base := uintptr(unsafe.Pointer(&buf[0]))
	for _, tc := range []struct{ off, n int }{
		{0, 5 * PageBytes}, {1, 4*PageBytes + 7}, {4096, 3 * PageBytes}, {0, MinBytes}, {0, MinBytes - 1}, {0, 100},
	} {
		b := buf[tc.off : tc.off+tc.n]
		h := interior(b)
		if tc.n < MinBytes {
			if h != nil {
				t.Errorf("%+v: %d bytes advised in a buffer under MinBytes", tc, len(h))
			}
			continue
		}
		start := uintptr(unsafe.Pointer(&h[0]))
		lo := int(start - base - uintptr(tc.off))
		switch {
		case start%PageBytes != 0 || len(h)%PageBytes != 0:
			t.Errorf("%+v: interior at %#x, %d bytes: not whole aligned huge pages", tc, start, len(h))
		case lo < 0 || lo+len(h) > tc.n:
			t.Errorf("%+v: interior [%d, %d) leaves the buffer", tc, lo, lo+len(h))
		case lo >= PageBytes || tc.n-(lo+len(h)) >= PageBytes:
			t.Errorf("%+v: interior [%d, %d) leaves a whole aligned huge page out", tc, lo, lo+len(h))
		}
	}
}

// TestMake: whatever the kernel does with the hint, Make's slice is a
// plain zeroed slice of the length asked for, small or large, and
// Collapse leaves contents alone.
func TestMake(t *testing.T) {
	for _, n := range []int{0, 1, 1000, MinBytes/4 - 1, MinBytes/4 + 12345} {
		s := Make[float32](n)
		if len(s) != n {
			t.Fatalf("Make(%d) has length %d", n, len(s))
		}
		for i, v := range s {
			if v != 0 {
				t.Fatalf("Make(%d)[%d] = %v, not zeroed", n, i, v)
			}
		}
		for i := range s {
			s[i] = float32(i)
		}
		Collapse(Bytes(s))
		for i, v := range s {
			if v != float32(i) {
				t.Fatalf("after Collapse, [%d] = %v, want %d", i, v, i)
			}
		}
		if got := len(Bytes(s)); got != 4*n {
			t.Fatalf("Bytes of %d float32s is %d bytes", n, got)
		}
	}
}
