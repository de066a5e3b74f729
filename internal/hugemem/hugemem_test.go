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

// TestArena: every buffer is zeroed, 64-byte aligned, exactly as long as
// asked, and overlaps no other; a chunk starts on a huge-page boundary; a
// buffer larger than a chunk gets one of its own without throwing away
// the larger remainder of the current one; writes through one buffer
// never show in another.
func TestArena(t *testing.T) {
	var a Arena
	type span struct{ lo, hi uintptr }
	spans := map[int]span{}
	var bufs [][]byte
	sizes := []int{1, 63, 64, 65, 4096, 3 << 20, 0, 100, ArenaChunk + 5, 7, ArenaChunk / 2, 1 << 20}
	for i, n := range sizes {
		var b []byte
		if i%2 == 0 {
			b = Alloc[byte](&a, n)
		} else {
			f := Alloc[float32](&a, n)
			if len(f) != n {
				t.Fatalf("Alloc[float32](%d) has length %d", n, len(f))
			}
			b = Bytes(f)
			n *= 4
		}
		if len(b) != n {
			t.Fatalf("buffer %d: %d bytes, want %d", i, len(b), n)
		}
		for j, v := range b {
			if v != 0 {
				t.Fatalf("buffer %d byte %d = %d, not zeroed", i, j, v)
			}
		}
		if n == 0 {
			continue
		}
		lo := uintptr(unsafe.Pointer(&b[0]))
		if lo%arenaAlign != 0 {
			t.Errorf("buffer %d at %#x: not %d-byte aligned", i, lo, arenaAlign)
		}
		for j, s := range spans {
			if lo < s.hi && s.lo < lo+uintptr(n) {
				t.Fatalf("buffer %d [%#x, %#x) overlaps buffer %d [%#x, %#x)", i, lo, lo+uintptr(n), j, s.lo, s.hi)
			}
		}
		spans[i] = span{lo, lo + uintptr(n)}
		for j := range b {
			b[j] = byte(i + 1)
		}
		bufs = append(bufs, b)
		if n > ArenaChunk && lo%PageBytes != 0 {
			t.Errorf("buffer %d (%d bytes, above a chunk) at %#x: not on a huge-page boundary", i, n, lo)
		}
	}
	for i, b := range bufs {
		for j, v := range b {
			if v != b[0] {
				t.Fatalf("buffer %d byte %d = %d, want %d: another buffer wrote into it", i, j, v, b[0])
			}
		}
	}
	// The first buffer opens the first chunk; the one above a chunk must
	// not have replaced its remainder, so the buffer after it follows on.
	if first := spans[0].lo; first%PageBytes != 0 {
		t.Errorf("first buffer at %#x: a chunk does not start on a huge-page boundary", first)
	}
	if s3, s4 := spans[3], spans[4]; s4.lo != (s3.hi+arenaAlign-1)&^(arenaAlign-1) {
		t.Errorf("buffers carved in turn are not adjacent: %#x then %#x", s3.hi, s4.lo)
	}
	if big, after := spans[8], spans[9]; after.lo >= big.lo && after.lo < big.lo+ArenaChunk+PageBytes {
		t.Errorf("the buffer after the large one (at %#x) went into the large one's chunk (at %#x), throwing the larger remainder away", after.lo, big.lo)
	}
	if got := Alloc[byte](nil, 10); len(got) != 10 {
		t.Errorf("Alloc(nil, 10) has length %d", len(got))
	}
}
