package kernels

import (
	"encoding/binary"
	"math"
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// FuzzVecKernels: the element-wise kernels of every tier agree with the
// references on inputs made of arbitrary bytes (float32 bit patterns: NaN,
// Inf, subnormals, exp's whole range; fp16 patterns for axpy-F16) at every
// length and tail, and write nothing outside dst. Tolerances are the
// differential tests': one fused rounding for axpy, 6 ulps for SiLU, 3 for
// softmax; two NaNs are equal. The Q8_0 and Q8_K activation quantisers
// must match exactly on every finite row (activations are never NaN or
// Inf, nor blocks of magnitude below 1e-36; what a quantiser makes of
// those is left open).
func FuzzVecKernels(f *testing.F) {
	f.Add([]byte("\x00\x00\x80\x3f\x00\x00\x00\xc0\xff\xff\xff\x7f\x00\x00\x80\x7f some more bytes to fill a vector or two"), uint32(0x3f800000))
	f.Add(make([]byte, 4*37), uint32(0xbf000000))
	f.Fuzz(func(t *testing.T, data []byte, abits uint32) {
		n := len(data) / 4
		raw := make([]float32, n)
		for i := range raw {
			raw[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		// axpy's fused rounding differs from the reference's two where
		// a*x overflows or cancels against dst, so it gets finite values
		// of moderate size (any bytes map to one).
		moderate := func(v float32, b byte) float32 {
			if math.IsNaN(float64(v)) || math.Abs(float64(v)) > 1e18 {
				return float32(int8(b)) / 8
			}
			return v
		}
		a := moderate(math.Float32frombits(abits), byte(abits))
		x, d0 := make([]float32, n), make([]float32, n)
		h := make([]uint16, n)
		for i := range raw {
			x[i] = moderate(raw[i], data[4*i])
			d0[i] = moderate(raw[(i+1)%n], data[4*i+1])
			h[i] = binary.LittleEndian.Uint16(data[4*i+2:])
		}
		for _, v := range axpyVariants[1:] {
			got, check := guarded(t, n, n%7)
			copy(got, d0)
			v.fn(got, a, x)
			check()
			want := append([]float32(nil), d0...)
			axpyRef(want, a, x)
			for i := range want {
				if !sameBits(got[i], want[i]) && math.Abs(float64(got[i]-want[i])) > 2e-7*(math.Abs(float64(a*x[i]))+math.Abs(float64(d0[i])))+1e-38 {
					t.Fatalf("%s: axpy out[%d] = %g, reference %g", v.name, i, got[i], want[i])
				}
			}
		}
		for _, v := range axpyF16Variants[1:] {
			got, check := guarded(t, n, n%5)
			copy(got, d0)
			v.fn(got, a, h)
			check()
			want := append([]float32(nil), d0...)
			axpyF16Ref(want, a, h)
			for i := range want {
				if !sameBits(got[i], want[i]) && math.Abs(float64(got[i]-want[i])) > 2e-7*(math.Abs(float64(a*f16ToF32(h[i])))+math.Abs(float64(d0[i])))+1e-38 {
					t.Fatalf("%s: axpy-F16 out[%d] = %g, reference %g (x %#04x)", v.name, i, got[i], want[i], h[i])
				}
			}
		}
		for _, v := range siluMulVariants[1:] {
			got, check := guarded(t, n, n%3)
			v.fn(got, raw, x)
			check()
			want := make([]float32, n)
			siluMulRef(want, raw, x)
			for i := range want {
				if !sameBits(got[i], want[i]) && ulpsApart(got[i], want[i]) > 6 && math.Abs(float64(got[i]-want[i])) > 1e-36 {
					t.Fatalf("%s: silu(%g)*%g = %g, reference %g", v.name, raw[i], x[i], got[i], want[i])
				}
			}
		}
		if nb := n / qk8; nb > 0 {
			act := make([]float32, nb*qk8)
			for i := range act {
				if v := raw[i]; !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
					act[i] = v
				}
			}
			// A block too small for 127/amax to be finite is outside
			// the domain (see quantKRows): zero it.
			for b := 0; b < nb; b++ {
				blk := act[b*qk8 : (b+1)*qk8]
				var amax float64
				for _, v := range blk {
					amax = max(amax, math.Abs(float64(v)))
				}
				if amax < 1e-36 {
					clear(blk)
				}
			}
			width := 1 + int(abits%8)
			row := int(abits>>3) % width
			wq, wd, wc := make([]int8, nb*qk8*width), make([]float32, nb*width), make([]int32, nb*width)
			quantizeQ8_0Packed(act, width, row, -128, wq, wd, wc)
			for _, v := range quantQ8Variants[1:] {
				gq, gd, gc := make([]int8, nb*qk8*width), make([]float32, nb*width), make([]int32, nb*width)
				v.fn(act, width, row, -128, gq, gd, gc)
				for i := range wq {
					if gq[i] != wq[i] {
						t.Fatalf("%s: quant %d = %d, reference %d", v.name, i, gq[i], wq[i])
					}
				}
				for b := range wd {
					if !sameBits(gd[b], wd[b]) || gc[b] != wc[b] {
						t.Fatalf("%s: block %d: d %g c %d, reference d %g c %d", v.name, b, gd[b], gc[b], wd[b], wc[b])
					}
				}
			}
		}
		if n > 0 {
			// Q8_K: one super-block made of the finite values, repeated
			// (blocks too small for iscale to be finite are outside the
			// domain: see quantKRows).
			act := make([]float32, qkK)
			var amax float64
			for i := range act {
				if v := raw[i%n]; !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
					act[i] = v
					amax = max(amax, math.Abs(float64(v)))
				}
			}
			if amax != 0 && amax < 1e-36 {
				clear(act)
			}
			width := 1 + 3*int(abits%2)
			row := int(abits>>1) % width
			for _, typ := range []quant.Type{quant.Q4_K, quant.Q6_K} {
				wq, wd, wp := make([]int8, qkK*width), make([]float32, width), make([]int32, 8*width)
				quantizeQ8KPacked(typ, act, width, row, wq, wd, wp)
				for _, v := range quantKVariants[1:] {
					gq, gd, gp := make([]int8, qkK*width), make([]float32, width), make([]int32, 8*width)
					v.fn(typ, act, width, row, gq, gd, gp)
					if !slices.Equal(gq, wq) || !sameBits(gd[row], wd[row]) || !slices.Equal(gp, wp) {
						t.Fatalf("%s %s: Q8_K quantisation differs from the reference", v.name, typ)
					}
				}
			}
		}
		row := make([]float32, n)
		for i, v := range raw {
			if math.IsInf(float64(v), 1) {
				v = 3 // +Inf makes every output NaN: tested once below
			}
			row[i] = v
		}
		for _, v := range softmaxVariants[1:] {
			got := append([]float32(nil), row...)
			want := append([]float32(nil), row...)
			v.fn(got)
			softmaxRef(want)
			for i := range want {
				if !sameBits(got[i], want[i]) && ulpsApart(got[i], want[i]) > 3 && math.Abs(float64(got[i]-want[i])) > 1e-37 {
					t.Fatalf("%s: softmax out[%d] = %g, reference %g (input %g)", v.name, i, got[i], want[i], row[i])
				}
			}
		}
	})
}
