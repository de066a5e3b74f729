package kernels

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestRMSNorm(t *testing.T) {
	x := []float32{1, -2, 3, -4}
	w := []float32{1, 1, 2, 0.5}
	dst := make([]float32, 4)
	RMSNorm(dst, x, w, 1e-5)
	// mean of squares = 30/4 = 7.5
	s := 1 / float32(math.Sqrt(7.5+1e-5))
	want := []float32{1 * s, -2 * s, 3 * s * 2, -4 * s * 0.5}
	if diff := cmp.Diff(want, dst, cmpopts.EquateApprox(1e-6, 0)); diff != "" {
		t.Fatalf("RMSNorm (-want +got):\n%s", diff)
	}
	RMSNorm(x, x, w, 1e-5) // in place
	if diff := cmp.Diff(dst, x); diff != "" {
		t.Fatalf("in-place RMSNorm differs:\n%s", diff)
	}
}

func TestSoftmax(t *testing.T) {
	tests := []struct {
		name string
		in   []float32
		want []float32
	}{
		{"empty", []float32{}, []float32{}},
		{"single", []float32{-3}, []float32{1}},
		{"uniform", []float32{2, 2, 2, 2}, []float32{0.25, 0.25, 0.25, 0.25}},
		{"large values do not overflow", []float32{1000, 1001}, []float32{float32(1 / (1 + math.E)), float32(math.E / (1 + math.E))}},
		{"masked", []float32{0, float32(math.Inf(-1)), 0}, []float32{0.5, 0, 0.5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := append([]float32(nil), tt.in...)
			Softmax(x)
			if diff := cmp.Diff(tt.want, x, cmpopts.EquateApprox(1e-6, 1e-7), cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestSiLUMulAndAdd(t *testing.T) {
	gate := []float32{0, 1, -1, 10, -20}
	up := []float32{5, 2, 3, 1, 1}
	dst := make([]float32, len(gate))
	SiLUMul(dst, gate, up)
	for i, g := range gate {
		want := float64(g) / (1 + math.Exp(-float64(g))) * float64(up[i])
		if math.Abs(float64(dst[i])-want) > 1e-6*math.Max(1, math.Abs(want)) {
			t.Errorf("silu(%v)*%v = %v, want %v", g, up[i], dst[i], want)
		}
	}
	a := []float32{1, 2, 3}
	Add(a, []float32{0.5, -2, 1})
	if diff := cmp.Diff([]float32{1.5, 0, 4}, a); diff != "" {
		t.Fatalf("Add (-want +got):\n%s", diff)
	}
}

func TestExportedWrappers(t *testing.T) {
	rng := newRand(30)
	a, b := randF32(rng, 37), randF32(rng, 37)
	h := randF16(rng, 37)
	if got, want := Dot(a, b), dotRef(a, b); math.Abs(float64(got-want)) > 1e-5 {
		t.Errorf("Dot = %v, reference %v", got, want)
	}
	if got, want := DotF16(a, h), dotF16Ref(a, h); math.Abs(float64(got-want)) > 1e-5 {
		t.Errorf("DotF16 = %v, reference %v", got, want)
	}
	f := make([]float32, 37)
	F16ToF32s(f, h)
	back := make([]uint16, 37)
	F32ToF16s(back, f)
	if diff := cmp.Diff(h, back); diff != "" {
		t.Errorf("F16 round trip (-want +got):\n%s", diff)
	}
	d1, d2 := append([]float32(nil), a...), append([]float32(nil), a...)
	AxpyF16(d1, 0.5, h)
	Axpy(d2, 0.5, f)
	if diff := cmp.Diff(d1, d2, cmpopts.EquateApprox(1e-6, 1e-7)); diff != "" {
		t.Errorf("AxpyF16 vs Axpy on converted input:\n%s", diff)
	}
	// Rows 0 and 2 of h as a strided block.
	rows := make([]float32, 2*8)
	F16ToF32Rows(rows, 8, h, 16, 2, 5, nil)
	want := make([]float32, 2*8)
	copy(want[0:5], f[0:5])
	copy(want[8:13], f[16:21])
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("F16ToF32Rows (-want +got):\n%s", diff)
	}
	for _, bad := range []func(){
		func() { F16ToF32Rows(make([]float32, 64), 8, h, 16, 4, 5, nil) }, // src too short for four rows
		func() { F16ToF32Rows(rows[:12], 8, h, 16, 2, 5, nil) },
		func() { F16ToF32Rows(rows, 4, h, 16, 2, 5, nil) }, // rows would overlap
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Error("F16ToF32Rows with a short or overlapping slice did not panic")
				}
			}()
			bad()
		}()
	}
	defer func() {
		if recover() == nil {
			t.Error("Dot with unequal lengths did not panic")
		}
	}()
	Dot(a, b[:3])
}

// ulpsApart is the number of float32 values between a and b (0 if equal),
// or a large number if they differ in sign or NaN-ness.
func ulpsApart(a, b float32) uint32 {
	if math.IsNaN(float64(a)) || math.IsNaN(float64(b)) {
		if math.IsNaN(float64(a)) && math.IsNaN(float64(b)) {
			return 0
		}
		return math.MaxUint32
	}
	if a == b {
		return 0
	}
	if (a < 0) != (b < 0) {
		return math.MaxUint32
	}
	x, y := math.Float32bits(a), math.Float32bits(b)
	if x > y {
		return x - y
	}
	return y - x
}

// specialF32 returns inputs spanning exp's whole range: ordinary values,
// the ends where exp overflows or flushes to zero, zeros and infinities.
func specialF32(rng interface{ NormFloat64() float64 }, n int) []float32 {
	out := make([]float32, n)
	ends := []float32{0, float32(math.Copysign(0, -1)), 88.7, -88.7, 87.3, -87.3, 89, -89, 103.9, -103.9, 120, -120,
		float32(math.Inf(1)), float32(math.Inf(-1)), 1e-30, -1e-30, 0.34657359, -0.34657359}
	for i := range out {
		if i%5 == 0 {
			out[i] = ends[(i/5)%len(ends)]
			continue
		}
		out[i] = float32(rng.NormFloat64() * 20)
	}
	return out
}

// TestSiLUMulVariants: every SiLU kernel is within 6 ulps of the
// reference (which uses a correctly rounded exp; the kernels' exp is within
// 1 ulp, and rounding 1+exp(-g) can turn that into 4), over random lengths,
// alignments and exp's whole range, and writes nothing outside dst.
func TestSiLUMulVariants(t *testing.T) {
	rng := newRand(17)
	for _, v := range siluMulVariants {
		for _, n := range testLengths() {
			off := rng.IntN(16)
			gate := specialF32(rng, n+off)[off:]
			up := randF32(rng, n)
			dst, check := guarded(t, n, off)
			v.fn(dst, gate, up)
			check()
			want := make([]float32, n)
			siluMulRef(want, gate, up)
			for i := range want {
				if ulpsApart(dst[i], want[i]) > 6 && math.Abs(float64(dst[i]-want[i])) > 1e-36 {
					t.Fatalf("%s n=%d: silu(%g)*%g = %g, reference %g", v.name, n, gate[i], up[i], dst[i], want[i])
				}
			}
		}
		// In place, dst aliasing gate.
		g := specialF32(rng, 100)
		up := randF32(rng, 100)
		want := make([]float32, 100)
		siluMulRef(want, g, up)
		v.fn(g, g, up)
		for i := range want {
			if ulpsApart(g[i], want[i]) > 6 && math.Abs(float64(g[i]-want[i])) > 1e-36 {
				t.Fatalf("%s in place: out[%d] = %g, reference %g", v.name, i, g[i], want[i])
			}
		}
	}
}

// TestSoftmaxVariants: every softmax kernel is within 3 ulps of the
// reference, for rows with masked (-Inf) entries, huge spreads and every
// tail length; an all -Inf row gives NaN as the reference does.
func TestSoftmaxVariants(t *testing.T) {
	rng := newRand(18)
	for _, v := range softmaxVariants {
		for _, n := range testLengths() {
			x := specialF32(rng, n)
			for i := range x {
				if math.IsInf(float64(x[i]), 1) {
					x[i] = 3 // +Inf would make every output NaN
				}
			}
			got := append([]float32(nil), x...)
			want := append([]float32(nil), x...)
			v.fn(got)
			softmaxRef(want)
			for i := range want {
				if ulpsApart(got[i], want[i]) > 3 && math.Abs(float64(got[i]-want[i])) > 1e-37 {
					t.Fatalf("%s n=%d: out[%d] = %g, reference %g (input %g)", v.name, n, i, got[i], want[i], x[i])
				}
			}
		}
		masked := []float32{float32(math.Inf(-1)), float32(math.Inf(-1))}
		v.fn(masked)
		if !math.IsNaN(float64(masked[0])) {
			t.Fatalf("%s: all-masked row = %v, want NaN like the reference", v.name, masked)
		}
	}
}
