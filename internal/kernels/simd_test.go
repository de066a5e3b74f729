package kernels

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Differential tests: every implementation usable on this CPU against the
// reference, over random lengths (not multiples of the vector widths) and
// misaligned slice starts, with guard bands around every destination.

const guard = 16 // sentinel elements on each side of a destination

var sentinel = float32(math.Float32frombits(0x7fc0dead)) // a NaN payload no kernel produces

// guarded returns a slice of n elements at offset off inside a buffer whose
// surroundings hold the sentinel, and a check function.
func guarded(t *testing.T, n, off int) ([]float32, func()) {
	buf := make([]float32, guard+off+n+guard)
	for i := range buf {
		buf[i] = sentinel
	}
	s := buf[guard+off : guard+off+n]
	return s, func() {
		t.Helper()
		for i, v := range buf {
			if i >= guard+off && i < guard+off+n {
				continue
			}
			if math.Float32bits(v) != math.Float32bits(sentinel) {
				t.Fatalf("write outside dst at buffer index %d (dst is [%d,%d))", i, guard+off, guard+off+n)
			}
		}
	}
}

func testLengths() []int {
	ls := []int{0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 257, 1000, 1031}
	rng := newRand(7)
	for range 20 {
		ls = append(ls, rng.IntN(3000))
	}
	return ls
}

// tolDot is the allowed difference between two summation orders of a dot
// product: a few ulps of sum |a*b|.
func tolDot(a []float32, b func(i int) float32) float64 {
	var mag float64
	for i := range a {
		mag += math.Abs(float64(a[i]) * float64(b(i)))
	}
	return 4e-7*float64(len(a)+8)*mag/math.Sqrt(float64(len(a)+1)) + 1e-30
}

func TestDotVariants(t *testing.T) {
	rng := newRand(8)
	for _, v := range dotVariants {
		for _, n := range testLengths() {
			for off := 0; off < 16; off += 1 + rng.IntN(5) {
				a := randF32(rng, n+off)[off:]
				b := randF32(rng, n+off+3)[3+off:]
				got, want := v.fn(a, b), dotRef(a, b)
				if math.Abs(float64(got-want)) > tolDot(a, func(i int) float32 { return b[i] }) {
					t.Fatalf("%s: n=%d off=%d: %g, reference %g", v.name, n, off, got, want)
				}
			}
		}
	}
}

func TestDotF16Variants(t *testing.T) {
	rng := newRand(9)
	for _, v := range dotF16Variants {
		for _, n := range testLengths() {
			for off := 0; off < 16; off += 1 + rng.IntN(5) {
				a := randF32(rng, n+off)[off:]
				b := randF16(rng, n+off+1)[off+1:]
				got, want := v.fn(a, b), dotF16Ref(a, b)
				if math.Abs(float64(got-want)) > tolDot(a, func(i int) float32 { return f16ToF32(b[i]) }) {
					t.Fatalf("%s: n=%d off=%d: %g, reference %g", v.name, n, off, got, want)
				}
			}
		}
	}
}

func TestAxpyVariants(t *testing.T) {
	rng := newRand(10)
	for _, v := range axpyVariants {
		for _, n := range testLengths() {
			off := rng.IntN(16)
			dst, check := guarded(t, n, off)
			init := randF32(rng, n)
			copy(dst, init)
			x := randF32(rng, n+off)[off:]
			a := float32(rng.NormFloat64())
			v.fn(dst, a, x)
			check()
			want := append([]float32(nil), init...)
			axpyRef(want, a, x)
			for i := range want {
				// The assembly fuses a*x+d into one rounding, the reference
				// rounds twice: allow one ulp of the larger term.
				if d := math.Abs(float64(dst[i] - want[i])); d > 2e-7*(math.Abs(float64(a*x[i]))+math.Abs(float64(init[i]))) {
					t.Fatalf("%s n=%d: dst[%d] = %g, reference %g", v.name, n, i, dst[i], want[i])
				}
			}
		}
	}
}

func TestAxpyF16Variants(t *testing.T) {
	rng := newRand(11)
	for _, v := range axpyF16Variants {
		for _, n := range testLengths() {
			off := rng.IntN(16)
			dst, check := guarded(t, n, off)
			init := randF32(rng, n)
			copy(dst, init)
			x := randF16(rng, n+off)[off:]
			a := float32(rng.NormFloat64())
			v.fn(dst, a, x)
			check()
			want := append([]float32(nil), init...)
			axpyF16Ref(want, a, x)
			for i := range want {
				if d := math.Abs(float64(dst[i] - want[i])); d > 2e-7*(math.Abs(float64(a*f16ToF32(x[i])))+math.Abs(float64(init[i]))) {
					t.Fatalf("%s n=%d: dst[%d] = %g, reference %g", v.name, n, i, dst[i], want[i])
				}
			}
		}
	}
}

// TestF16ToF32sVariants: conversion is exact, so results must match
// bit for bit, including subnormals, infinities and NaN payloads.
func TestF16ToF32sVariants(t *testing.T) {
	rng := newRand(12)
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	for _, v := range f16ToF32sVariants {
		dst, check := guarded(t, len(all), 3)
		v.fn(dst, all)
		check()
		for i, h := range all {
			if math.Float32bits(dst[i]) != math.Float32bits(f16ToF32Slow(h)) {
				t.Fatalf("%s: %#04x -> %#08x, want %#08x", v.name, h, math.Float32bits(dst[i]), math.Float32bits(f16ToF32Slow(h)))
			}
		}
		for _, n := range testLengths() {
			off := rng.IntN(16)
			dst, check := guarded(t, n, off)
			src := all[off*97 : off*97+n]
			v.fn(dst, src)
			check()
		}
	}
}

// TestDotQ8x4Variants: the quantised group kernels are bit-identical to the
// reference, for every block count, including extreme quants (-128 weights,
// ±127 activations) that would saturate a careless 16-bit pairing.
func TestDotQ8x4Variants(t *testing.T) {
	rng := newRand(13)
	for _, v := range dotQ8x4Variants {
		for _, nb := range []int{0, 1, 2, 3, 5, 18, 64, 176} {
			for trial := 0; trial < 6; trial++ {
				woff, xoff := rng.IntN(16), rng.IntN(16)
				w := make([]int8, woff+nb*128)[woff:]
				ws := make([]uint16, nb*4)
				for i := range w {
					switch trial {
					case 0:
						w[i] = -128
					case 1:
						w[i] = 127
					default:
						w[i] = int8(rng.Uint32())
					}
				}
				for i := range ws {
					ws[i] = f32ToF16(float32(rng.NormFloat64() * 0.01))
				}
				x := randF32(rng, nb*32)
				if trial < 2 {
					for i := range x {
						x[i] = float32(1 - 2*(i%2)) // quantises to ±127
					}
				}
				xq := make([]int8, xoff+nb*32)[xoff:]
				xd, xc := make([]float32, nb), make([]int32, nb)
				quantizeQ8_0(x, xq, xd, xc)
				var got, want [4]float32
				got = [4]float32{sentinel, sentinel, sentinel, sentinel}
				v.fn(w, ws, xq, xd, xc, &got)
				dotQ8x4Ref(w, ws, xq, xd, xc, &want)
				if diff := cmp.Diff(bits4(want), bits4(got)); diff != "" {
					t.Fatalf("%s nb=%d trial=%d: (-ref +got bits):\n%s\nref %v got %v", v.name, nb, trial, diff, want, got)
				}
			}
		}
	}
}

func bits4(v [4]float32) [4]uint32 {
	return [4]uint32{math.Float32bits(v[0]), math.Float32bits(v[1]), math.Float32bits(v[2]), math.Float32bits(v[3])}
}
