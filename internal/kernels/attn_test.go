package kernels

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestAttnGemmVariants: every AttnGemm implementation of this CPU computes
// each output within the rounding bound of a k-term sum of the exact
// (float64) product, for every tile shape and tail (rows past the 6-row
// tiles, column vectors past the widest panel, columns past the last
// vector), with strides wider than the block, and writes nothing outside
// the m x n block of dst.
func TestAttnGemmVariants(t *testing.T) {
	rng := newRand(70)
	type shape struct{ m, n, k int }
	var shapes []shape
	for _, m := range []int{1, 2, 3, 5, 6, 7, 12, 13, 30} {
		for _, n := range []int{1, 7, 8, 9, 16, 24, 33, 64, 80, 96, 130} {
			for _, k := range []int{0, 1, 3, 64, 129} {
				shapes = append(shapes, shape{m, n, k})
			}
		}
	}
	for _, v := range attnGemmVariants {
		for _, s := range shapes {
			ds, as, bs := s.n+rng.IntN(5), s.k+rng.IntN(5), s.n+rng.IntN(20)
			a := randF32(rng, max(0, (s.m-1)*as+s.k))
			b := randF32(rng, max(0, (s.k-1)*bs+s.n))
			const sentinel = -12345.5
			dst := make([]float32, (s.m-1)*ds+s.n+7)
			for i := range dst {
				dst[i] = sentinel
			}
			alpha := float32(0.125 + rng.Float64())
			v.fn(dst, ds, a, as, b, bs, s.m, s.n, s.k, alpha)
			for idx, got := range dst {
				i, j := idx/ds, idx%ds
				if i >= s.m || j >= s.n {
					if got != sentinel {
						t.Fatalf("%s %+v: wrote dst[%d] (row %d col %d) outside the block", v.name, s, idx, i, j)
					}
					continue
				}
				var exact, mag float64
				for u := 0; u < s.k; u++ {
					p := float64(a[i*as+u]) * float64(b[u*bs+j])
					exact += p
					mag += math.Abs(p)
				}
				exact *= float64(alpha)
				bound := float64(s.k+2)*0x1p-24*mag*float64(alpha) + 1e-30
				if math.Abs(float64(got)-exact) > bound {
					t.Fatalf("%s %+v: dst[%d][%d] = %g, exact %g (bound %g)", v.name, s, i, j, got, exact, bound)
				}
			}
		}
	}
}

// TestAttnGemmInstalled: AttnGemm runs the installed tier's variant, and
// refuses short slices and strides narrower than the block with a panic
// naming the kernel before it touches anything.
func TestAttnGemmInstalled(t *testing.T) {
	rng := newRand(71)
	a, b := randF32(rng, 4*64), randF32(rng, 64*48)
	got, want := make([]float32, 4*48), make([]float32, 4*48)
	AttnGemm(got, 48, a, 64, b, 48, 4, 48, 64, 0.5)
	pick(attnGemmVariants, tier)(want, 48, a, 64, b, 48, 4, 48, 64, 0.5)
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("AttnGemm[%d] = %g, the installed %s variant %g", i, got[i], Implementation(), want[i])
		}
	}
	for _, c := range []struct {
		name string
		call func()
		want string
	}{
		{"short dst", func() { AttnGemm(got[:100], 48, a, 64, b, 48, 4, 48, 64, 1) }, "dst has 100 elements"},
		{"short a", func() { AttnGemm(got, 48, a[:200], 64, b, 48, 4, 48, 64, 1) }, "a has 200 elements"},
		{"short b", func() { AttnGemm(got, 48, a, 64, b[:1000], 48, 4, 48, 64, 1) }, "b has 1000 elements"},
		{"narrow dst stride", func() { AttnGemm(got, 40, a, 64, b, 48, 4, 48, 64, 1) }, "strides dst 40"},
		{"narrow b stride", func() { AttnGemm(got, 48, a, 64, b, 16, 4, 48, 64, 1) }, "b 16"},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(fmt.Sprint(r), c.want) || !strings.Contains(fmt.Sprint(r), "AttnGemm") {
					t.Fatalf("panic %v, want one naming AttnGemm and %q", r, c.want)
				}
			}()
			c.call()
		})
	}
}

// BenchmarkAttnGemm: the two products of a prefill attention block (30
// query rows, head dim 64, 512 keys) on every variant, in GFLOP/s.
func BenchmarkAttnGemm(b *testing.B) {
	rng := newRand(72)
	const m, hd, n = 30, 64, 512
	q, kt, s := randF32(rng, m*hd), randF32(rng, hd*n), make([]float32, m*n)
	v, o := randF32(rng, n*hd), make([]float32, m*hd)
	for _, vr := range attnGemmVariants {
		b.Run(vr.name, func(b *testing.B) {
			for range b.N {
				vr.fn(s, n, q, hd, kt, n, m, n, hd, 0.125)
				vr.fn(o, hd, s, n, v, hd, m, hd, n, 1)
			}
			b.ReportMetric(float64(4*m*hd*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
