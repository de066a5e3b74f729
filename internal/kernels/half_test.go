package kernels

import (
	"math"
	"testing"
)

func TestF16ToF32Table(t *testing.T) {
	tests := []struct {
		h    uint16
		want float32
	}{
		{0x0000, 0},
		{0x3c00, 1},
		{0xc000, -2},
		{0x7bff, 65504},
		{0x0001, float32(math.Ldexp(1, -24))}, // smallest subnormal
		{0x03ff, float32(math.Ldexp(1023, -24))},
		{0x0400, float32(math.Ldexp(1, -14))}, // smallest normal
		{0x3555, 0.333251953125},
		{0x7c00, float32(math.Inf(1))},
		{0xfc00, float32(math.Inf(-1))},
	}
	for _, tt := range tests {
		if got := f16ToF32(tt.h); got != tt.want {
			t.Errorf("f16ToF32(%#04x) = %v, want %v", tt.h, got, tt.want)
		}
	}
	if got := f16ToF32(0x8000); math.Float32bits(got) != 0x80000000 {
		t.Errorf("f16ToF32(-0) = %#x bits, want negative zero", math.Float32bits(got))
	}
	if got := f16ToF32(0x7e00); !math.IsNaN(float64(got)) {
		t.Errorf("f16ToF32(NaN) = %v", got)
	}
}

// TestF16RoundTrip: every non-NaN half survives f32 and back unchanged.
func TestF16RoundTrip(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue
		}
		if got := f32ToF16(f16ToF32(h)); got != h {
			t.Fatalf("round trip %#04x -> %v -> %#04x", h, f16ToF32(h), got)
		}
	}
}

// TestF32ToF16Rounding compares against rounding done in float64 by
// brute force: the nearest half (ties to even mantissa).
func TestF32ToF16Rounding(t *testing.T) {
	rng := newRand(1)
	check := func(f float32) {
		got := f32ToF16(f)
		want := nearestHalf(f)
		if got != want {
			t.Fatalf("f32ToF16(%v [%#08x]) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	for i := 0; i < 200000; i++ {
		check(math.Float32frombits(rng.Uint32()&^(0xff<<23) | uint32(100+rng.IntN(45))<<23))
	}
	// Exact midpoints between neighbouring halves, including subnormals and
	// the overflow boundary.
	for h := uint16(0); h < 0x7bff; h += 7 {
		lo, hi := float64(f16ToF32(h)), float64(f16ToF32(h+1))
		check(float32((lo + hi) / 2))
		check(-float32((lo + hi) / 2))
	}
	check(65520) // halfway between 65504 and 65536 rounds to Inf
	check(1e-9)
}

func nearestHalf(f float32) uint16 {
	if math.IsInf(float64(f), 0) {
		return f32ToF16(f)
	}
	v := math.Abs(float64(f))
	var sign uint16
	if math.Signbit(float64(f)) {
		sign = 0x8000
	}
	best, bestErr := uint16(0), math.Inf(1)
	// Binary search for the first half >= v, then compare neighbours.
	lo, hi := 0, 0x7c00
	for lo < hi {
		mid := (lo + hi) / 2
		if float64(f16ToF32(uint16(mid))) < v {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	for _, c := range []int{lo - 1, lo} {
		if c < 0 || c > 0x7c00 {
			continue
		}
		cv := float64(f16ToF32(uint16(c)))
		if c == 0x7c00 {
			cv = 65536 // rounding treats Inf as the next step after 65504
		}
		e := math.Abs(cv - v)
		if e < bestErr || (e == bestErr && c%2 == 0) {
			best, bestErr = uint16(c), e
		}
	}
	return sign | best
}

func TestBF16(t *testing.T) {
	tests := []struct {
		f    float32
		want uint16
	}{
		{1, 0x3f80},
		{-2, 0xc000},
		{math.Float32frombits(0x3f808000), 0x3f80}, // tie, even stays
		{math.Float32frombits(0x3f818000), 0x3f82}, // tie, odd rounds up
		{math.Float32frombits(0x3f808001), 0x3f81},
		{float32(math.Inf(1)), 0x7f80},
	}
	for _, tt := range tests {
		if got := f32ToBF16(tt.f); got != tt.want {
			t.Errorf("f32ToBF16(%v) = %#04x, want %#04x", tt.f, got, tt.want)
		}
		if tt.want&0x7f80 != 0x7f80 && bf16ToF32(tt.want) != roundBF16(tt.f) {
			t.Errorf("roundBF16(%v) inconsistent", tt.f)
		}
	}
	if got := f32ToBF16(float32(math.NaN())); got&0x7f80 != 0x7f80 || got&0x7f == 0 {
		t.Errorf("f32ToBF16(NaN) = %#04x, not a NaN", got)
	}
}
