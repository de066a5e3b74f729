//go:build amd64 && !purego

package kernels

// Assembly kernels (dot_amd64.s, q8_amd64.s). Pointers must cover n
// elements; the Go wrappers in simd_amd64.go check slice lengths first.

//go:noescape
func dotF32AVX512(a, b *float32, n int) float32

//go:noescape
func dotF32AVX2(a, b *float32, n int) float32

//go:noescape
func dotF16AVX512(a *float32, b *uint16, n int) float32

//go:noescape
func dotF16AVX2(a *float32, b *uint16, n int) float32

//go:noescape
func f16ToF32sAVX512(dst *float32, src *uint16, n int)

//go:noescape
func f16ToF32sAVX2(dst *float32, src *uint16, n int)

//go:noescape
func f32ToF16sAVX2(dst *uint16, src *float32, n int)

//go:noescape
func f16ToF32RowsAVX2(dst *float32, ds int, src *uint16, ss int, rows, cols int, pf *uint16)

//go:noescape
func axpyAVX512(dst *float32, a float32, x *float32, n int)

//go:noescape
func axpyF16AVX512(dst *float32, a float32, x *uint16, n int)

//go:noescape
func quantQ8_0AVX512(x *float32, nb int, q *int8, step int, d *float32, c *int32, corr int32)

//go:noescape
func expSubAVX512(dst, src *float32, n int, c float32)

//go:noescape
func siluMulAVX512(dst, gate, up *float32, n int)

//go:noescape
func gemmF32Rows1(w *float32, ws int, x *float32, cols, kc, nrows int, dst *float32)
