//go:build amd64 && !purego

package kernels

//go:generate go run attngen.go

import "math"

func attnGemmAVX512(dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int, acc bool, alpha float32) {
	attnGemmTiled(attnGemmAVX512Kernels, 16, dst, ds, a, as, b, bs, m, n, k, acc, alpha)
}

func attnGemmAVX2(dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int, acc bool, alpha float32) {
	attnGemmTiled(attnGemmAVX2Kernels, 8, dst, ds, a, as, b, bs, m, n, k, acc, alpha)
}

func init() {
	if hasAVX2 {
		attnGemmVariants = append(attnGemmVariants, variant[attnGemmFn]{"avx2", attnGemmAVX2})
		attnLaneVariants = append(attnLaneVariants, variant[int]{"avx2", 8})
		attnSoftmaxVariants = append(attnSoftmaxVariants, variant[func([]float32, bool)]{"avx2", attnSoftmaxAVX2})
		roundF16sVariants = append(roundF16sVariants, variant[func([]float32)]{"avx2", func(x []float32) { roundF16sSIMD(x, 8, attnScaleAVX2) }})
	}
	if hasAVX512 {
		attnGemmVariants = append(attnGemmVariants, variant[attnGemmFn]{"avx512", attnGemmAVX512})
		attnLaneVariants = append(attnLaneVariants, variant[int]{"avx512", 16})
		attnSoftmaxVariants = append(attnSoftmaxVariants, variant[func([]float32, bool)]{"avx512", attnSoftmaxAVX512})
		roundF16sVariants = append(roundF16sVariants, variant[func([]float32)]{"avx512", func(x []float32) { roundF16sSIMD(x, 16, attnScaleAVX512) }})
	}
}

// attnSoftmaxSIMD runs AttnSoftmax with one tier's kernels: the whole
// vectors in assembly, the tail (fewer than lanes elements) in Go with
// the same operations.
func attnSoftmaxSIMD(x []float32, f16 bool, lanes int, maxFn func(*float32, int) float32, expSub func(dst, src *float32, n int, c float32),
	sumFn func(*float32, int) float64, scaleFn func(*float32, int, float32, int)) {
	if len(x) == 0 {
		return
	}
	v := len(x) &^ (lanes - 1)
	mx := float32(math.Inf(-1))
	if v > 0 {
		mx = maxFn(&x[0], v)
	}
	for _, e := range x[v:] {
		if e > mx {
			mx = e
		}
	}
	expSub(&x[0], &x[0], len(x), mx)
	var sum float64
	if v > 0 {
		sum = sumFn(&x[0], v)
	}
	for _, e := range x[v:] {
		sum += float64(e)
	}
	inv := float32(1 / sum)
	round := 0
	if f16 {
		round = 1
	}
	if v > 0 {
		scaleFn(&x[0], v, inv, round)
	}
	for i := v; i < len(x); i++ {
		x[i] *= inv
		if f16 {
			x[i] = f16ToF32(f32ToF16(x[i]))
		}
	}
}

func attnSoftmaxAVX512(x []float32, f16 bool) {
	attnSoftmaxSIMD(x, f16, 16, attnMaxAVX512, expSubAVX512, attnSumAVX512, attnScaleAVX512)
}

func attnSoftmaxAVX2(x []float32, f16 bool) {
	attnSoftmaxSIMD(x, f16, 8, attnMaxAVX2, expSubAVX2, attnSumAVX2, attnScaleAVX2)
}

// roundF16sSIMD rounds the whole vectors of x with a scaling kernel (by 1,
// which is exact) and the tail in Go.
func roundF16sSIMD(x []float32, lanes int, scaleFn func(*float32, int, float32, int)) {
	v := len(x) &^ (lanes - 1)
	if v > 0 {
		scaleFn(&x[0], v, 1, 1)
	}
	roundF16sRef(x[v:])
}
