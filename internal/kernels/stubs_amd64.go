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
func axpyAVX512(dst *float32, a float32, x *float32, n int)

//go:noescape
func axpyF16AVX512(dst *float32, a float32, x *uint16, n int)

//go:noescape
func dotQ8x4VNNI(w *int8, ws *uint16, xq *int8, xd *float32, xc *int32, nb int, out *[4]float32)

//go:noescape
func dotQ8x4AVX2(w *int8, ws *uint16, xq *int8, xd *float32, xc *int32, nb int, out *[4]float32)
