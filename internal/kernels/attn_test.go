package kernels

import (
	"fmt"
	"math"
	"slices"
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
			for _, acc := range []bool{false, true} {
				ds, as, bs := s.n+rng.IntN(5), s.k+rng.IntN(5), s.n+rng.IntN(20)
				a := randF32(rng, max(0, (s.m-1)*as+s.k))
				b := randF32(rng, max(0, (s.k-1)*bs+s.n))
				const sentinel = -12345.5
				dst := make([]float32, (s.m-1)*ds+s.n+7)
				for i := range dst {
					dst[i] = sentinel
				}
				alpha := float32(0.125 + rng.Float64())
				init := randF32(rng, len(dst))
				if acc {
					alpha = 1
					for i := range dst {
						if i/ds < s.m && i%ds < s.n {
							dst[i] = init[i]
						}
					}
				}
				v.fn(dst, ds, a, as, b, bs, s.m, s.n, s.k, acc, alpha)
				for idx, got := range dst {
					i, j := idx/ds, idx%ds
					if i >= s.m || j >= s.n {
						if got != sentinel {
							t.Fatalf("%s %+v acc=%v: wrote dst[%d] (row %d col %d) outside the block", v.name, s, acc, idx, i, j)
						}
						continue
					}
					var exact, mag float64
					if acc {
						exact, mag = float64(init[idx]), math.Abs(float64(init[idx]))
					}
					for u := 0; u < s.k; u++ {
						p := float64(a[i*as+u]) * float64(b[u*bs+j])
						exact += p
						mag += math.Abs(p)
					}
					exact *= float64(alpha)
					bound := float64(s.k+2)*0x1p-24*mag*float64(alpha) + 1e-30
					if math.Abs(float64(got)-exact) > bound {
						t.Fatalf("%s %+v acc=%v: dst[%d][%d] = %g, exact %g (bound %g)", v.name, s, acc, i, j, got, exact, bound)
					}
				}
			}
		}
	}
}

// TestAttnGemmSameChain: the properties attention's two paths rest on, on
// every variant, bit for bit. A product over k split into consecutive
// AttnGemmAcc calls (one per KV page) equals one call over all of k; and
// A x B equals (Bᵀ x Aᵀ)ᵀ when both products' columns are whole vectors
// (multiples of 16), since each output is the same FMA chain over k
// whichever operand is broadcast.
func TestAttnGemmSameChain(t *testing.T) {
	rng := newRand(73)
	for _, v := range attnGemmVariants {
		for _, sh := range []struct{ m, n, k, split int }{{3, 16, 64, 16}, {30, 48, 64, 5}, {7, 64, 96, 33}, {1, 32, 1, 1}, {16, 80, 128, 64}} {
			m, n, k := sh.m, sh.n, sh.k
			a, b := randF32(rng, m*k), randF32(rng, k*n)
			whole := make([]float32, m*n)
			v.fn(whole, n, a, k, b, n, m, n, k, false, 1)
			split := make([]float32, m*n)
			for k0 := 0; k0 < k; k0 += sh.split {
				k1 := min(k, k0+sh.split)
				v.fn(split, n, a[k0:], k, b[k0*n:], n, m, n, k1-k0, true, 1)
			}
			// Transposed: Bᵀ (n x k) times Aᵀ (k x mp), mp = m padded
			// to whole vectors with zero columns.
			mp := (m + 15) &^ 15
			bt, at := make([]float32, n*k), make([]float32, k*mp)
			for u := range k {
				for j := range n {
					bt[j*k+u] = b[u*n+j]
				}
				for i := range m {
					at[u*mp+i] = a[i*k+u]
				}
			}
			tr := make([]float32, n*mp)
			v.fn(tr, mp, bt, k, at, mp, n, mp, k, false, 1)
			for i := range m {
				for j := range n {
					w := whole[i*n+j]
					if math.Float32bits(split[i*n+j]) != math.Float32bits(w) {
						t.Fatalf("%s %+v: split over k [%d][%d] = %g, whole %g", v.name, sh, i, j, split[i*n+j], w)
					}
					if math.Float32bits(tr[j*mp+i]) != math.Float32bits(w) {
						t.Fatalf("%s %+v: transposed product [%d][%d] = %g, direct %g", v.name, sh, i, j, tr[j*mp+i], w)
					}
				}
			}
		}
	}
}

// TestAttnLanes: every AttnGemm variant says its tile width, and a
// product's real columns have the same bits whether the columns are
// padded to that width or to a wider one (16, 32): each output is one FMA
// chain over k in whichever whole vector holds it, which is what makes
// decode's padding to AttnLanes free of any change in output.
func TestAttnLanes(t *testing.T) {
	if got, want := names(attnLaneVariants), names(attnGemmVariants); !slices.Equal(got, want) {
		t.Fatalf("lane widths for %v, kernels %v", got, want)
	}
	forEachTier(t, func(t *testing.T) {
		l := AttnLanes()
		if l < 1 || l > 16 {
			t.Fatalf("AttnLanes() = %d", l)
		}
		rng := newRand(72)
		const m, k = 16, 64
		for _, group := range []int{1, 3, 4, 7, 8, 9} {
			a, q := randF32(rng, m*k), randF32(rng, k*group)
			prod := func(n int) []float32 {
				b := make([]float32, k*n)
				for d := range k {
					copy(b[d*n:d*n+group], q[d*group:(d+1)*group])
				}
				out := make([]float32, m*n)
				AttnGemm(out, n, a, k, b, n, m, n, k, 0.125)
				return out
			}
			n := (group + l - 1) / l * l
			got := prod(n)
			for _, wide := range []int{16, 32} {
				nw := (group + wide - 1) / wide * wide
				want := prod(nw)
				for i := range m {
					for j := range group {
						if got[i*n+j] != want[i*nw+j] {
							t.Fatalf("group %d: [%d,%d] = %g padded to %d columns, %g padded to %d", group, i, j, got[i*n+j], n, want[i*nw+j], nw)
						}
					}
				}
			}
		}
	})
}

// TestAttnGemmInstalled: AttnGemm runs the installed tier's variant, and
// refuses short slices and strides narrower than the block with a panic
// naming the kernel before it touches anything.
func TestAttnGemmInstalled(t *testing.T) {
	rng := newRand(71)
	a, b := randF32(rng, 4*64), randF32(rng, 64*48)
	got, want := make([]float32, 4*48), make([]float32, 4*48)
	AttnGemm(got, 48, a, 64, b, 48, 4, 48, 64, 0.5)
	pick(attnGemmVariants, tier)(want, 48, a, 64, b, 48, 4, 48, 64, false, 0.5)
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
				vr.fn(s, n, q, hd, kt, n, m, n, hd, false, 0.125)
				vr.fn(o, hd, s, n, v, hd, m, hd, n, false, 1)
			}
			b.ReportMetric(float64(4*m*hd*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// TestAttnSoftmaxVariants: every AttnSoftmax implementation is within 3
// ulps of the reference (which is Softmax's), for rows with masked (-Inf)
// entries, huge spreads and every tail length; with f16 set every weight
// is an F16 value at most one F16 step from the reference's (a weight one
// float32 ulp away may round the other way); an all -Inf row gives NaN as
// the reference does.
func TestAttnSoftmaxVariants(t *testing.T) {
	rng := newRand(74)
	for _, v := range attnSoftmaxVariants {
		for _, n := range testLengths() {
			x := specialF32(rng, n)
			for i := range x {
				if math.IsInf(float64(x[i]), 1) {
					x[i] = 3 // +Inf would make every output NaN
				}
			}
			for _, f16 := range []bool{false, true} {
				got := append([]float32(nil), x...)
				want := append([]float32(nil), x...)
				v.fn(got, f16)
				attnSoftmaxRef(want, f16)
				for i := range want {
					if !f16 {
						if ulpsApart(got[i], want[i]) > 3 && math.Abs(float64(got[i]-want[i])) > 1e-37 {
							t.Fatalf("%s n=%d: out[%d] = %g, reference %g (input %g)", v.name, n, i, got[i], want[i], x[i])
						}
						continue
					}
					g, w := f32ToF16(got[i]), f32ToF16(want[i])
					if f16ToF32(g) != got[i] && !math.IsNaN(float64(got[i])) {
						t.Fatalf("%s n=%d f16: out[%d] = %g is not an F16 value", v.name, n, i, got[i])
					}
					if d := int(g) - int(w); d > 1 || d < -1 {
						t.Fatalf("%s n=%d f16: out[%d] = %g, reference %g (input %g)", v.name, n, i, got[i], want[i], x[i])
					}
				}
			}
		}
		masked := []float32{float32(math.Inf(-1)), float32(math.Inf(-1))}
		v.fn(masked, false)
		if !math.IsNaN(float64(masked[0])) {
			t.Fatalf("%s: all-masked row = %v, want NaN like the reference", v.name, masked)
		}
	}
}

// TestRoundF16sVariants: every RoundF16s implementation gives exactly the
// reference's F16 round trip (nearest even, overflow to Inf, subnormals,
// NaN kept NaN) for every tail length.
func TestRoundF16sVariants(t *testing.T) {
	rng := newRand(75)
	for _, v := range roundF16sVariants {
		for _, n := range testLengths() {
			x := specialF32(rng, n)
			for i := range x {
				switch rng.IntN(4) {
				case 0:
					x[i] *= 1e-5 // F16 subnormal range
				case 1:
					x[i] *= 3e4 // near and past the F16 maximum
				}
			}
			got := append([]float32(nil), x...)
			want := append([]float32(nil), x...)
			v.fn(got)
			roundF16sRef(want)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) && !(got[i] != got[i] && want[i] != want[i]) {
					t.Fatalf("%s n=%d: round(%g) = %g, reference %g", v.name, n, x[i], got[i], want[i])
				}
			}
		}
	}
}
