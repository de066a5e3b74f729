//go:build !amd64 || purego

package kernels

// Without assembly every kernel is its reference; the variant lists exist
// so the differential tests compile (and compare the reference with
// itself).

// hasAsm: this build has no assembly kernels.
const hasAsm = false

// cpuLacks refuses every tier but the reference.
func cpuLacks(name string) string {
	if tierRank(name) > 0 {
		return "this build has no assembly kernels (built with the purego tag, or not for amd64)"
	}
	return ""
}

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
	f32ToF16sVariants = []variant[func(dst []uint16, src []float32)]{{"ref", f32ToF16sRef}}
	f16RowsVariants   = []variant[f16RowsFn]{{"ref", f16ToF32RowsRef}}
	qTileVariants     = []variant[qTileFn]{{"ref", qTileRef}}
	gemmF32Variants   = []variant[gemmF32Fn]{{"ref", gemmF32Ref}}
	quantQ8Variants   = []variant[quantQ8Fn]{{"ref", quantizeQ8_0Packed}}
	kTileVariants     = []variant[kTileFn]{{"ref", kTileRef}}
	quantKVariants    = []variant[quantKFn]{{"ref", quantizeQ8KPacked}}
	siluMulVariants   = []variant[func(dst, gate, up []float32)]{{"ref", siluMulRef}}
	softmaxVariants   = []variant[func(x []float32)]{{"ref", softmaxRef}}
)
