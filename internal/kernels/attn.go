package kernels

import "fmt"

// Small dense products for attention over a block of queries.
//
// Prefill attention multiplies a block of query rows by the keys of a
// sequence (scores) and the softmax weights by its values (outputs). Both
// are products of a few dozen rows by a few hundred short columns, far too
// small for MatMul's packed panels and far too many for one Dot per
// (query, key) pair, whose horizontal sum costs as much as the 64
// multiply-adds of a head. AttnGemm is the shape both need: a row-major A
// times a row-major B, B read as whole vectors along its rows.

// AttnGemm computes, for i < m and j < n,
//
//	dst[i*ds+j] = alpha * Σ_{t<k} a[i*as+t] * b[t*bs+j]
//
// summing each output in t order (on every tier: one FMA chain per
// output, so the tiers differ from the reference by the FMA's missing
// roundings only, a few ulps). Strides are in elements. Nothing in dst but
// the m x n block is written; a short slice panics naming the kernel
// before anything is computed. Columns are fastest in multiples of 16
// (AVX-512) or 8 (AVX2): the columns past the last whole vector take the
// reference. dst must not overlap a or b.
func AttnGemm(dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int, alpha float32) {
	if m <= 0 || n <= 0 {
		return
	}
	attnGemmCheck(dst, ds, a, as, b, bs, m, n, k)
	pick(attnGemmVariants, tier)(dst, ds, a, as, b, bs, m, n, k, false, alpha)
}

// AttnGemmAcc is AttnGemm with alpha 1 that continues each output's sum
// from the value in dst: the same FMA chain, so a sum over k split into
// consecutive calls (one per KV page, say) gives exactly the bits of one
// AttnGemm over all of k when dst starts at zero.
func AttnGemmAcc(dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int) {
	if m <= 0 || n <= 0 {
		return
	}
	attnGemmCheck(dst, ds, a, as, b, bs, m, n, k)
	pick(attnGemmVariants, tier)(dst, ds, a, as, b, bs, m, n, k, true, 1)
}

// attnGemmFn is the signature of the implementations; they may assume
// attnGemmCheck passed and m, n > 0.
type attnGemmFn = func(dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int, acc bool, alpha float32)

// attnGemmCheck panics unless every element the product reads or writes
// lies inside its slice (the last row's last element is the furthest).
func attnGemmCheck(dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int) {
	if k < 0 || ds < n || (m > 1 && as < k) || (k > 1 && bs < n) {
		panic(fmt.Sprintf("kernels: AttnGemm %dx%dx%d with strides dst %d, a %d, b %d", m, n, k, ds, as, bs))
	}
	if len(dst) < (m-1)*ds+n {
		panic(fmt.Sprintf("kernels: AttnGemm dst has %d elements, %d rows of stride %d need %d", len(dst), m, ds, (m-1)*ds+n))
	}
	if k > 0 && len(a) < (m-1)*as+k {
		panic(fmt.Sprintf("kernels: AttnGemm a has %d elements, %d rows of stride %d need %d", len(a), m, as, (m-1)*as+k))
	}
	if k > 0 && len(b) < (k-1)*bs+n {
		panic(fmt.Sprintf("kernels: AttnGemm b has %d elements, %d rows of stride %d need %d", len(b), k, bs, (k-1)*bs+n))
	}
}

// attnGemmRef is the reference: each output summed in t order, the rows
// of b streamed in order (an axpy per term) so that plain Go reads memory
// sequentially.
func attnGemmRef(dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int, acc bool, alpha float32) {
	for i := 0; i < m; i++ {
		dr := dst[i*ds : i*ds+n]
		if !acc {
			clear(dr)
		}
		for t := 0; t < k; t++ {
			x := a[i*as+t]
			br := b[t*bs : t*bs+n]
			for j, y := range br {
				dr[j] += x * y
			}
		}
		for j := range dr {
			dr[j] *= alpha
		}
	}
}

// attnKernel is one register-blocked tile of the assembly (attngen.go):
// rows and column vectors fixed by the function, byte strides.
type attnKernel = func(dst *float32, ds int, a *float32, as int, b *float32, bs int, k int, acc int, alpha float32)

// attnGemmTiled covers the m x n block with kernels from table
// (table[r-1][c-1]: r rows, c vectors of lanes columns): row tiles of the
// table's height inside column panels of its width, so a panel of b (k x
// width) is read from cache by every row tile after the first. Columns
// past the last whole vector take the reference.
func attnGemmTiled(table [][]attnKernel, lanes int, dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int, acc bool, alpha float32) {
	maxR, maxC := len(table), len(table[0])
	ac := 0
	if acc {
		ac = 1
	}
	vec := n / lanes * lanes
	var a0 *float32
	if k > 0 {
		a0 = &a[0]
	}
	for j0 := 0; j0 < vec; j0 += maxC * lanes {
		c := min(maxC, (vec-j0)/lanes)
		var bp *float32
		if k > 0 {
			bp = &b[j0]
		}
		for i0 := 0; i0 < m; i0 += maxR {
			r := min(maxR, m-i0)
			ap := a0
			if k > 0 {
				ap = &a[i0*as]
			}
			table[r-1][c-1](&dst[i0*ds+j0], 4*ds, ap, 4*as, bp, 4*bs, k, ac, alpha)
		}
	}
	if vec < n {
		var bt []float32
		if k > 0 {
			bt = b[vec:]
		}
		attnGemmRef(dst[vec:], ds, a, as, bt, bs, m, n-vec, k, acc, alpha)
	}
}

// attnGemmVariants: the implementations this build and CPU have, in tier
// order (attn_amd64.go adds the assembly); AttnGemm takes the installed
// tier's at each call, so SetTier needs no hook here.
var attnGemmVariants = []variant[attnGemmFn]{{"ref", attnGemmRef}}

// attnLaneVariants: the column width of each tier's AttnGemm tiles (the
// reference takes any width).
var attnLaneVariants = []variant[int]{{"ref", 1}}

// AttnLanes is the column count the installed tier's AttnGemm computes in
// whole vectors: a caller that pads its columns (decode's query heads of
// one KV head) pads to a multiple of this, not beyond, since each padded
// column costs as much as a real one. Columns past the last whole vector
// take the reference loop, so any n works; this only says which n is
// cheapest.
func AttnLanes() int { return pick(attnLaneVariants, tier) }

// AttnSoftmax is Softmax for a row of attention scores, followed, when f16
// is set, by rounding each weight to F16 and back (nearest even): what
// ggml's non-flash attention does before it multiplies an F16 cache's
// values. Like Softmax it subtracts the maximum, sums the exponentials in
// float64 and multiplies by the float32 inverse of the sum; the SIMD tiers
// differ from the reference only in the order of that float64 sum.
func AttnSoftmax(x []float32, f16 bool) {
	if len(x) == 0 {
		return
	}
	pick(attnSoftmaxVariants, tier)(x, f16)
}

// attnSoftmaxRef is the reference: softmaxRef, then the rounding.
func attnSoftmaxRef(x []float32, f16 bool) {
	softmaxRef(x)
	if f16 {
		for i, v := range x {
			x[i] = f16ToF32(f32ToF16(v))
		}
	}
}

var attnSoftmaxVariants = []variant[func(x []float32, f16 bool)]{{"ref", attnSoftmaxRef}}

// RoundF16s rounds each element of x to the nearest F16 value (ties to
// even) in place, as ggml rounds an F32 operand it multiplies with an F16
// matrix (the queries of attention over an F16 cache).
func RoundF16s(x []float32) {
	if len(x) == 0 {
		return
	}
	pick(roundF16sVariants, tier)(x)
}

func roundF16sRef(x []float32) {
	for i, v := range x {
		x[i] = f16ToF32(f32ToF16(v))
	}
}

var roundF16sVariants = []variant[func(x []float32)]{{"ref", roundF16sRef}}
