package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// testBlocks returns named inputs of n values (n a multiple of 256) that
// cover the awkward cases: zeros, constant, one outlier, all negative,
// tiny (fp16-subnormal scales), and Gaussian noise.
func testBlocks(n int) map[string][]float32 {
	rng := rand.New(rand.NewPCG(7, 8))
	gen := func(f func(i int) float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = f(i)
		}
		return x
	}
	return map[string][]float32{
		"zeros":         gen(func(int) float32 { return 0 }),
		"constant":      gen(func(int) float32 { return 0.75 }),
		"outlier":       gen(func(i int) float32 { return map[bool]float32{true: 100, false: 0.01 * float32(i%7-3)}[i%97 == 5] }),
		"negative":      gen(func(i int) float32 { return -1 - float32(i%13)/13 }),
		"tiny":          gen(func(i int) float32 { return 1e-6 * float32(rng.NormFloat64()) }),
		"gaussian":      gen(func(i int) float32 { return float32(rng.NormFloat64()) }),
		"wide gaussian": gen(func(i int) float32 { return 30 * float32(rng.NormFloat64()) }),
	}
}

func roundTrip(t *testing.T, typ Type, x []float32) []float32 {
	t.Helper()
	b, err := Quantize(typ, x)
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := RowBytes(typ, len(x)); len(b) != want {
		t.Fatalf("%s: %d bytes, want %d", typ, len(b), want)
	}
	y := make([]float32, len(x))
	if err := Dequantize(typ, b, y); err != nil {
		t.Fatal(err)
	}
	for i, v := range y {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("%s: element %d is %g", typ, i, v)
		}
	}
	return y
}

// TestRoundTripBlockBounds checks the per-element error bound that follows
// from each format, given the exact scale d = amax/127 (Q8_0) or max/-8
// (Q4_0) and the stored fp16 scale d': Q8_0 within half a step plus
// 127|d-d'|, Q4_0 within one step (the most positive value clamps at 7*d)
// plus 8|d-d'|. The fp16 term matters for tiny inputs whose d underflows.
func TestRoundTripBlockBounds(t *testing.T) {
	for name, x := range testBlocks(512) {
		for _, typ := range []Type{Q8_0, Q4_0} {
			b, _ := Quantize(typ, x)
			y := roundTrip(t, typ, x)
			bs := typ.BlockBytes()
			for blk := 0; blk < len(x)/32; blk++ {
				var amax float64
				for _, v := range x[32*blk : 32*blk+32] {
					amax = max(amax, math.Abs(float64(v)))
				}
				stored := math.Abs(float64(F16ToF32(binary.LittleEndian.Uint16(b[bs*blk:]))))
				var bound float64
				switch typ {
				case Q8_0:
					d := amax / 127
					bound = d/2 + 127*math.Abs(d-stored)
				case Q4_0:
					d := amax / 8
					bound = d + 8*math.Abs(d-stored)
				}
				bound = bound*(1+1e-6) + 1e-30
				for i := 32 * blk; i < 32*blk+32; i++ {
					if e := math.Abs(float64(x[i] - y[i])); e > bound {
						t.Fatalf("%s/%s: element %d: %g -> %g, error %g > bound %g", name, typ, i, x[i], y[i], e, bound)
					}
				}
			}
		}
	}
}

// TestRoundTripKQuants bounds the relative RMS error of the K-quants over
// realistic (Gaussian) data, and checks the degenerate inputs come back
// close in absolute terms.
func TestRoundTripKQuants(t *testing.T) {
	limits := map[Type]float64{Q4_K: 0.09, Q6_K: 0.025, Q8_0: 0.008, Q4_0: 0.1, Q4_1: 0.1, Q5_0: 0.05, Q5_1: 0.05, Q5_K: 0.045, Q3_K: 0.2, Q2_K: 0.4, IQ4_NL: 0.1, IQ4_XS: 0.1}
	for name, x := range testBlocks(4096) {
		for typ, lim := range limits {
			y := roundTrip(t, typ, x)
			var se, sx float64
			for i := range x {
				d := float64(x[i] - y[i])
				se += d * d
				sx += float64(x[i]) * float64(x[i])
			}
			switch name {
			case "gaussian", "wide gaussian", "negative":
				if rel := math.Sqrt(se / sx); rel > lim {
					t.Errorf("%s/%s: relative RMS error %.4f > %.4f", name, typ, rel, lim)
				}
			case "zeros":
				if se != 0 {
					t.Errorf("%s/%s: zeros came back with squared error %g", name, typ, se)
				}
			}
		}
	}
}

// TestQuantizeReference pins ggml's reference choices on small inputs.
func TestQuantizeReference(t *testing.T) {
	// Q8_0: amax 127 -> d = 1 exactly, q = round(x) half away from zero.
	x := make([]float32, 32)
	for i := range x {
		x[i] = float32(i) - 16.5
	}
	x[0] = -127
	b, _ := Quantize(Q8_0, x)
	if d := binary.LittleEndian.Uint16(b); d != 0x3c00 {
		t.Errorf("Q8_0 d = %#04x, want 1.0", d)
	}
	for i := 1; i < 32; i++ {
		want := int8(math.Round(float64(x[i])))
		if got := int8(b[2+i]); got != want {
			t.Errorf("Q8_0 q[%d] = %d, want %d (x=%g)", i, got, want, x[i])
		}
	}
	// Q4_0: the largest-magnitude value is negative (-8), so d = -8/-8 = 1
	// and it maps to nibble 0; +7 maps to 15.
	for i := range x {
		x[i] = 0
	}
	x[3], x[4], x[20] = -8, 7, 2.5
	b, _ = Quantize(Q4_0, x)
	if d := binary.LittleEndian.Uint16(b); d != 0x3c00 {
		t.Errorf("Q4_0 d = %#04x, want 1.0", d)
	}
	nib := func(i int) byte {
		if i < 16 {
			return b[2+i] & 0xf
		}
		return b[2+i-16] >> 4
	}
	// q = min(15, trunc(x/d + 8.5)): -8 -> 0, 7 -> 15, 2.5 -> 11, 0 -> 8.
	for i, want := range map[int]byte{3: 0, 4: 15, 20: 11, 0: 8} {
		if got := nib(i); got != want {
			t.Errorf("Q4_0 nibble %d = %d, want %d", i, got, want)
		}
	}
}

func TestNearestInt(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		want int32
	}{{0.5, 0}, {1.5, 2}, {2.5, 2}, {-0.5, 0}, {-1.5, -2}, {3.49, 3}, {-7.6, -8}, {4194303, 4194303}} {
		if got := nearestInt(tc.f); got != tc.want {
			t.Errorf("nearestInt(%g) = %d, want %d", tc.f, got, tc.want)
		}
	}
}
