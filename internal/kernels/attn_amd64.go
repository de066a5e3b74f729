//go:build amd64 && !purego

package kernels

//go:generate go run attngen.go

func attnGemmAVX512(dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int, acc bool, alpha float32) {
	attnGemmTiled(attnGemmAVX512Kernels, 16, dst, ds, a, as, b, bs, m, n, k, acc, alpha)
}

func attnGemmAVX2(dst []float32, ds int, a []float32, as int, b []float32, bs int, m, n, k int, acc bool, alpha float32) {
	attnGemmTiled(attnGemmAVX2Kernels, 8, dst, ds, a, as, b, bs, m, n, k, acc, alpha)
}

func init() {
	if hasAVX2 {
		attnGemmVariants = append(attnGemmVariants, variant[attnGemmFn]{"avx2", attnGemmAVX2})
	}
	if hasAVX512 {
		attnGemmVariants = append(attnGemmVariants, variant[attnGemmFn]{"avx512", attnGemmAVX512})
	}
}
