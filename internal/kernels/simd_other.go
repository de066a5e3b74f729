//go:build !amd64 || purego

package kernels

// Without assembly every kernel is its reference; the variant lists exist
// so the differential tests compile (and compare the reference with
// itself).

type variant[F any] struct {
	name string
	fn   F
}

var (
	dotVariants       = []variant[func(a, b []float32) float32]{{"ref", dotRef}}
	dotF16Variants    = []variant[func(a []float32, b []uint16) float32]{{"ref", dotF16Ref}}
	axpyVariants      = []variant[func(dst []float32, a float32, x []float32)]{{"ref", axpyRef}}
	axpyF16Variants   = []variant[func(dst []float32, a float32, x []uint16)]{{"ref", axpyF16Ref}}
	f16ToF32sVariants = []variant[func(dst []float32, src []uint16)]{{"ref", f16ToF32sRef}}
	dotQ8x4Variants   = []variant[func(w []int8, ws []uint16, xq []int8, xd []float32, xc []int32, out *[4]float32)]{{"ref", dotQ8x4Ref}}
)
