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
	defer func() {
		if recover() == nil {
			t.Error("Dot with unequal lengths did not panic")
		}
	}()
	Dot(a, b[:3])
}
