package kernels

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/quant"
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

// TestF32ToF16sVariants: every F32ToF16s implementation rounds exactly as
// the reference: every half's value and the midpoints between neighbours
// (ties to even), the range's edges (overflow to infinity, subnormals,
// underflow to zero), NaNs with payloads, random bit patterns; and writes
// nothing around dst.
func TestF32ToF16sVariants(t *testing.T) {
	rng := newRand(13)
	var src []float32
	for h := range 1 << 16 {
		v := f16ToF32(uint16(h))
		src = append(src, v, math.Nextafter32(v, float32(math.Inf(1))), math.Nextafter32(v, float32(math.Inf(-1))))
		if h&0x7c00 != 0x7c00 && h&0x7fff != 0x7bff {
			// the midpoint to the next half up in magnitude
			src = append(src, (v+f16ToF32(uint16(h+1)))/2)
		}
	}
	for _, b := range []uint32{0x7f800001, 0xffc00000, 0x7fbfffff, 0x7fe01234, 0x477ff000, 0x477fefff, 0x33000000, 0x33000001, 0x32ffffff, 0x00000001, 0x80800000} {
		src = append(src, math.Float32frombits(b))
	}
	for range 1 << 16 {
		src = append(src, math.Float32frombits(rng.Uint32()))
	}
	for _, v := range f32ToF16sVariants {
		dst := make([]uint16, len(src)+8)
		v.fn(dst[4:len(src)+4], src)
		for i, x := range src {
			if got, want := dst[4+i], f32ToF16(x); got != want {
				t.Fatalf("%s: %#08x -> %#04x, want %#04x", v.name, math.Float32bits(x), got, want)
			}
		}
		for _, i := range []int{0, 1, 2, 3, len(src) + 4, len(src) + 5, len(src) + 6, len(src) + 7} {
			if dst[i] != 0 {
				t.Fatalf("%s wrote outside dst at %d", v.name, i)
			}
		}
		for _, n := range testLengths() {
			out := make([]uint16, n+1)
			v.fn(out[:n], src[:n])
			if out[n] != 0 {
				t.Fatalf("%s: length %d wrote past the end", v.name, n)
			}
		}
	}
}

// TestF16ToF32RowsVariants: strided conversion gives every row the exact
// values of the reference and writes nothing between or around the rows
// (head dimensions of the model families, and ones no whole vector
// divides).
func TestF16ToF32RowsVariants(t *testing.T) {
	rng := newRand(14)
	for _, v := range f16RowsVariants {
		for _, cols := range []int{1, 7, 8, 16, 24, 64, 80, 96, 100, 128, 256} {
			for _, rows := range []int{1, 2, 3, 5, 16, 33} {
				ss := cols + rng.IntN(3)*cols + rng.IntN(9)
				ds := cols + rng.IntN(5)
				src := make([]uint16, (rows-1)*ss+cols)
				for i := range src {
					src[i] = uint16(rng.Uint32())
				}
				n := (rows-1)*ds + cols
				dst, check := guarded(t, n, rng.IntN(8))
				for i := range dst {
					dst[i] = sentinel
				}
				var next []uint16
				if rows%2 == 0 {
					next = src // a prefetch hint only: results must not change
				}
				v.fn(dst, ds, src, ss, rows, cols, next)
				check()
				for i := range n {
					r, c := i/ds, i%ds
					want := sentinel
					if c < cols {
						want = f16ToF32Slow(src[r*ss+c])
					}
					if math.Float32bits(dst[i]) != math.Float32bits(want) {
						t.Fatalf("%s rows %d cols %d ss %d ds %d: dst[%d] = %#08x, want %#08x", v.name, rows, cols, ss, ds, i, math.Float32bits(dst[i]), math.Float32bits(want))
					}
				}
			}
		}
	}
}

// TestQTileVariants: the packed Q8_0/Q4_0 tile kernels are bit-identical
// to the reference for every group width MatMul uses and every block
// count, including extreme quants (-128 weights, ±127 activations) that
// would saturate a careless 16-bit pairing.
func TestQTileVariants(t *testing.T) {
	rng := newRand(13)
	for _, v := range qTileVariants {
		for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_0} {
			for _, width := range []int{1, 4, 8} {
				for _, nb := range []int{0, 1, 2, 3, 5, 18, 64} {
					for trial := 0; trial < 4; trial++ {
						rows := qRows
						if trial == 3 {
							rows = 5 // a padded group
						}
						cols := nb * qk8
						data := randWeights(rng, typ, rows, max(cols, qk8))
						if trial < 2 {
							fill := byte(0x80) // Q8_0: -128; Q4_0: nibbles 0 (value -8)
							if trial == 1 {
								fill = 0x7f // Q8_0: 127; Q4_0: 15 and 7
							}
							bb := typ.BlockBytes()
							for o := 0; o < len(data); o += bb {
								for j := 2; j < bb; j++ {
									data[o+j] = fill
								}
							}
						}
						var wq []byte
						var wd []uint16
						if nb > 0 {
							m, err := NewMatrix(typ, rows, cols, data[:rows*nb*typ.BlockBytes()])
							if err != nil {
								t.Fatal(err)
							}
							wq, wd = m.qw, m.qd
						}
						x := randF32(rng, width*cols)
						if trial < 2 {
							for i := range x {
								x[i] = float32(1 - 2*(i%2)) // quantises to ±127
							}
						}
						xoff := rng.IntN(16)
						xq := make([]int8, xoff+width*cols)[xoff:]
						xd, xc := make([]float32, width*nb), make([]int32, width*nb)
						for i := 0; i < width; i++ {
							if trial == 2 && i == width-1 && width > 1 {
								clearPackedRow(nb, width, i, xq, xd, xc)
								continue
							}
							quantizeQ8_0Packed(x[i*cols:(i+1)*cols], width, i, qCorr(typ), xq, xd, xc)
						}
						ng := 1
						if trial == 2 && nb > 0 {
							// Several weight groups in one call.
							ng = 3
							m, err := NewMatrix(typ, ng*qRows, cols, randWeights(rng, typ, ng*qRows, cols))
							if err != nil {
								t.Fatal(err)
							}
							wq, wd = m.qw, m.qd
						}
						got, check := guarded(t, ng*width*qRows, rng.IntN(8))
						want := make([]float32, ng*width*qRows)
						v.fn(typ, width, ng, wq, wd, xq, xd, xc, got)
						check()
						qTileRef(typ, width, ng, wq, wd, xq, xd, xc, want)
						if diff := cmp.Diff(bitsOf(want), bitsOf(got)); diff != "" {
							t.Fatalf("%s %s width=%d nb=%d trial=%d: (-ref +got bits):\n%s", v.name, typ, width, nb, trial, diff)
						}
					}
				}
			}
		}
	}
}

// TestGemmF32Variants: the tiled F32 products agree with one reference dot
// per output to float rounding, over odd column counts (masked tails),
// several column chunks, every activation-tile width and row ranges that
// leave rows outside the groups of four; outputs outside the range stay
// untouched.
func TestGemmF32Variants(t *testing.T) {
	rng := newRand(14)
	for _, v := range gemmF32Variants {
		for _, sh := range [][4]int{{4, 16, 1, 0}, {12, 1031, 1, 0}, {10, 37, 1, 2}, {9, 17, 7, 1}, {13, 1100, 13, 2}, {8, 3, 2, 0}, {21, 515, 6, 5}, {7, 64, 3, 3}} {
			rows, cols, n, r0 := sh[0], sh[1], sh[2], sh[3]
			w := randF32(rng, rows*cols)
			x := randF32(rng, n*cols)
			ds := rows + 2
			got, check := guarded(t, n*ds, 1)
			for i := range got {
				got[i] = sentinel
			}
			v.fn(got, ds, w, cols, r0, rows, x, n)
			check()
			for i := 0; i < n; i++ {
				for r := 0; r < ds; r++ {
					g := got[i*ds+r]
					if r < r0 || r >= rows {
						if math.Float32bits(g) != math.Float32bits(sentinel) {
							t.Fatalf("%s %v: wrote dst[%d][%d] outside the row range", v.name, sh, i, r)
						}
						continue
					}
					wr := w[r*cols : (r+1)*cols]
					want := dotRef(x[i*cols:(i+1)*cols], wr)
					if math.Abs(float64(g-want)) > tolDot(wr, func(j int) float32 { return x[i*cols+j] }) {
						t.Fatalf("%s %v: dst[%d][%d] = %g, reference %g", v.name, sh, i, r, g, want)
					}
				}
			}
		}
	}
}

func bitsOf(v []float32) []uint32 {
	out := make([]uint32, len(v))
	for i, f := range v {
		out[i] = math.Float32bits(f)
	}
	return out
}

// TestQuantQ8Variants: the activation quantisers write the same quants,
// scales and corrections as the reference, bit for bit, in every group
// position, for ordinary rows, all-zero blocks, ties (x*id exactly .5),
// huge and tiny magnitudes and fp16-subnormal scales; nothing outside the
// row's slots is written.
func TestQuantQ8Variants(t *testing.T) {
	rng := newRand(15)
	const nb = 9
	rows := [][]float32{}
	for range 6 {
		rows = append(rows, randF32(rng, nb*32))
	}
	special := make([]float32, nb*32)
	for j := range special {
		switch b := j / 32; b {
		case 0: // zeros
		case 1: // ties: amax 127 makes id 1
			special[j] = float32(j%32) - 15.5
			if j%32 == 0 {
				special[j] = 127
			}
		case 2:
			special[j] = float32(rng.NormFloat64() * 1e30)
		case 3:
			special[j] = float32(rng.NormFloat64() * 1e-6) // fp16-subnormal d
		case 4:
			special[j] = float32(rng.NormFloat64() * 1e-30) // d flushes to 0
		default:
			special[j] = float32(rng.NormFloat64()) * float32(b)
		}
	}
	rows = append(rows, special)
	for _, v := range quantQ8Variants {
		for _, width := range []int{1, 4, 8} {
			for ri, x := range rows {
				i := ri % width
				corr := int32(-128)
				if ri%2 == 1 {
					corr = -8
				}
				gq, gd, gc := make([]int8, nb*32*width), make([]float32, nb*width), make([]int32, nb*width)
				wq, wd, wc := make([]int8, nb*32*width), make([]float32, nb*width), make([]int32, nb*width)
				for j := range gq {
					gq[j], wq[j] = 77, 77
				}
				for j := range gd {
					gd[j], wd[j], gc[j], wc[j] = sentinel, sentinel, 5, 5
				}
				v.fn(x, width, i, corr, gq, gd, gc)
				quantizeQ8_0Packed(x, width, i, corr, wq, wd, wc)
				if diff := cmp.Diff(wq, gq); diff != "" {
					t.Fatalf("%s width %d row %d: quants (-ref +got):\n%s", v.name, width, ri, diff)
				}
				if diff := cmp.Diff(bitsOf(wd), bitsOf(gd)); diff != "" {
					t.Fatalf("%s width %d row %d: scales (-ref +got):\n%s", v.name, width, ri, diff)
				}
				if diff := cmp.Diff(wc, gc); diff != "" {
					t.Fatalf("%s width %d row %d: corrections (-ref +got):\n%s", v.name, width, ri, diff)
				}
			}
		}
	}
}

// TestKTileVariants: the packed Q4_K/Q6_K tile kernels are bit-identical to
// the reference for every group width, several groups per call, and
// extreme blocks (all nibbles 15 or 0, 6-bit values 63 or 0, scales and
// mins 63, Q6_K scales -128, activations ±127).
func TestKTileVariants(t *testing.T) {
	rng := newRand(16)
	for _, v := range kTileVariants {
		for _, typ := range []quant.Type{quant.Q4_K, quant.Q6_K} {
			for _, width := range []int{1, 4} {
				for _, nb := range []int{0, 1, 3} {
					for trial := 0; trial < 4; trial++ {
						ng := 1 + trial%2
						rows, cols := ng*qRows, nb*qkK
						data := randWeights(rng, typ, rows, max(cols, qkK))[:rows*nb*typ.BlockBytes()]
						if trial >= 2 {
							fill := byte(0xff)
							if trial == 3 {
								fill = 0
							}
							bb := typ.BlockBytes()
							for o := 0; o < len(data); o += bb {
								if typ == quant.Q4_K {
									for j := 4; j < bb; j++ {
										data[o+j] = fill | 0x3f&^fill // scales/mins 63 either way
									}
									for j := 16; j < bb; j++ {
										data[o+j] = fill
									}
								} else {
									for j := 0; j < 192; j++ {
										data[o+j] = fill
									}
									for j := 192; j < 208; j++ {
										data[o+j] = 0x80 // scale -128
									}
								}
							}
						}
						var wk []byte
						if nb > 0 {
							m, err := NewMatrix(typ, rows, cols, data)
							if err != nil {
								t.Fatal(err)
							}
							wk = m.kw
						}
						x := randF32(rng, width*cols)
						if trial >= 2 {
							for i := range x {
								x[i] = float32(1 - 2*((i/3)%2))
							}
						}
						xq, xd, xp := make([]int8, width*cols), make([]float32, width*nb), make([]int32, width*nb*8)
						for i := 0; i < width; i++ {
							quantizeQ8KPacked(typ, x[i*cols:(i+1)*cols], width, i, xq, xd, xp)
						}
						got, check := guarded(t, ng*width*qRows, rng.IntN(8))
						want := make([]float32, ng*width*qRows)
						v.fn(typ, width, ng, wk, xq, xd, xp, got)
						check()
						kTileRef(typ, width, ng, wk, xq, xd, xp, want)
						if diff := cmp.Diff(bitsOf(want), bitsOf(got)); diff != "" {
							t.Fatalf("%s %s width=%d nb=%d trial=%d: (-ref +got bits):\n%s", v.name, typ, width, nb, trial, diff)
						}
					}
				}
			}
		}
	}
}
