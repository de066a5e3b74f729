package model

import (
	"math"
	"testing"
)

func TestRopeAngles(t *testing.T) {
	base := Config{HeadDim: 16, RopeDims: 16, RopeBase: 10000, RopeFreqScale: 1}
	n := base.RopeDims / 2
	cos, sin := make([]float32, n), make([]float32, n)
	base.ropeAngles(0, cos, sin)
	for i := 0; i < n; i++ {
		if cos[i] != 1 || sin[i] != 0 {
			t.Fatalf("position 0 pair %d: cos %g sin %g, want 1 and 0", i, cos[i], sin[i])
		}
	}
	// Pair i of position p turns by p * base^(-2i/d).
	base.ropeAngles(100, cos, sin)
	for i := 0; i < n; i++ {
		want := 100 * math.Pow(10000, -2*float64(i)/16)
		if d := math.Abs(math.Atan2(float64(sin[i]), float64(cos[i])) - math.Remainder(want, 2*math.Pi)); d > 1e-4 {
			t.Errorf("pair %d: angle off by %g", i, d)
		}
	}
	// Llama 3's per-frequency factors, all equal to f, are linear scaling
	// by 1/f; and the run.c formula agrees with ggml's to float precision.
	ff := Config{HeadDim: 16, RopeDims: 16, RopeBase: 10000, RopeFreqScale: 1, RopeFreqFactors: []float32{4, 4, 4, 4, 4, 4, 4, 4}}
	lin := Config{HeadDim: 16, RopeDims: 16, RopeBase: 10000, RopeFreqScale: 0.25}
	runc := Config{HeadDim: 16, RopeDims: 16, RopeBase: 10000, RopeFreqScale: 1, RopeRunC: true}
	c1, s1 := make([]float32, n), make([]float32, n)
	c2, s2 := make([]float32, n), make([]float32, n)
	for _, pos := range []int{1, 7, 513, 2047} {
		ff.ropeAngles(pos, c1, s1)
		lin.ropeAngles(pos, c2, s2)
		for i := range c1 {
			if c1[i] != c2[i] || s1[i] != s2[i] {
				t.Fatalf("pos %d pair %d: freq factors 4 give (%g,%g), linear 1/4 gives (%g,%g)", pos, i, c1[i], s1[i], c2[i], s2[i])
			}
		}
		base.ropeAngles(pos, c1, s1)
		runc.ropeAngles(pos, c2, s2)
		for i := range c1 {
			if math.Abs(float64(c1[i]-c2[i])) > 2e-3 || math.Abs(float64(s1[i]-s2[i])) > 2e-3 {
				t.Fatalf("pos %d pair %d: ggml (%g,%g) vs run.c (%g,%g)", pos, i, c1[i], s1[i], c2[i], s2[i])
			}
		}
	}
}

func TestApplyRopeNeoxIsPermutedNormal(t *testing.T) {
	c := Config{HeadDim: 8, RopeDims: 8, RopeBase: 10000, RopeFreqScale: 1}
	cos, sin := make([]float32, 4), make([]float32, 4)
	c.ropeAngles(5, cos, sin)
	x := []float32{1, 2, 3, 4, 5, 6, 7, 8}
	// NeoX order: the first half holds the pairs' first elements.
	perm := []int{0, 2, 4, 6, 1, 3, 5, 7}
	y := make([]float32, 8)
	for i, p := range perm {
		y[i] = x[p]
	}
	c.applyRope(x, 1, cos, sin)
	n := c
	n.RopeStyle = RopeNeox
	n.applyRope(y, 1, cos, sin)
	for i, p := range perm {
		if y[i] != x[p] {
			t.Fatalf("neox[%d] = %g, normal[%d] = %g", i, y[i], p, x[p])
		}
	}
}
