//go:build amd64 && !purego

package kernels

import "golang.org/x/sys/cpu"

// Feature levels this package has kernels for. AVX-512 kernels also use
// BW and VL (masked 16-bit tail loads on ymm registers) and F16C-class
// conversion, which every AVX-512 CPU with BW/VL has.
var (
	hasAVX2    = cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C
	hasAVX512  = hasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL
	hasVNNI512 = hasAVX512 && cpu.X86.HasAVX512VNNI
)

// variant is one implementation of a kernel, named for tests and
// benchmarks.
type variant[F any] struct {
	name string
	fn   F
}

// The implementations usable on this CPU, best last. Tests run every
// entry against the reference; init installs the last one.
var (
	dotVariants       = []variant[func(a, b []float32) float32]{{"ref", dotRef}}
	dotF16Variants    = []variant[func(a []float32, b []uint16) float32]{{"ref", dotF16Ref}}
	axpyVariants      = []variant[func(dst []float32, a float32, x []float32)]{{"ref", axpyRef}}
	axpyF16Variants   = []variant[func(dst []float32, a float32, x []uint16)]{{"ref", axpyF16Ref}}
	f16ToF32sVariants = []variant[func(dst []float32, src []uint16)]{{"ref", f16ToF32sRef}}
	dotQ8x4Variants   = []variant[func(w []int8, ws []uint16, xq []int8, xd []float32, xc []int32, out *[4]float32)]{{"ref", dotQ8x4Ref}}
)

func init() {
	if hasAVX2 {
		simdName = "avx2"
		dotVariants = append(dotVariants, variant[func(a, b []float32) float32]{"avx2", dotAVX2})
		dotF16Variants = append(dotF16Variants, variant[func(a []float32, b []uint16) float32]{"avx2", dotF16AVX2Go})
		f16ToF32sVariants = append(f16ToF32sVariants, variant[func(dst []float32, src []uint16)]{"avx2", f16ToF32sAVX2Go})
		dotQ8x4Variants = append(dotQ8x4Variants, variant[func([]int8, []uint16, []int8, []float32, []int32, *[4]float32)]{"avx2", dotQ8x4AVX2Go})
	}
	if hasAVX512 {
		simdName = "avx512"
		dotVariants = append(dotVariants, variant[func(a, b []float32) float32]{"avx512", dotAVX512})
		dotF16Variants = append(dotF16Variants, variant[func(a []float32, b []uint16) float32]{"avx512", dotF16AVX512Go})
		axpyVariants = append(axpyVariants, variant[func([]float32, float32, []float32)]{"avx512", axpyAVX512Go})
		axpyF16Variants = append(axpyF16Variants, variant[func([]float32, float32, []uint16)]{"avx512", axpyF16AVX512Go})
		f16ToF32sVariants = append(f16ToF32sVariants, variant[func(dst []float32, src []uint16)]{"avx512", f16ToF32sAVX512Go})
	}
	if hasVNNI512 {
		simdName = "avx512vnni"
		dotQ8x4Variants = append(dotQ8x4Variants, variant[func([]int8, []uint16, []int8, []float32, []int32, *[4]float32)]{"avx512vnni", dotQ8x4VNNIGo})
	}
	dotImpl = dotVariants[len(dotVariants)-1].fn
	dotF16Impl = dotF16Variants[len(dotF16Variants)-1].fn
	axpyImpl = axpyVariants[len(axpyVariants)-1].fn
	axpyF16Impl = axpyF16Variants[len(axpyF16Variants)-1].fn
	f16ToF32sImpl = f16ToF32sVariants[len(f16ToF32sVariants)-1].fn
	dotQ8x4Impl = dotQ8x4Variants[len(dotQ8x4Variants)-1].fn
}

// Slice wrappers: they bound every pointer the assembly reads or writes by
// the slice lengths (re-slicing panics on a short slice before any
// assembly runs).

func dotAVX512(a, b []float32) float32 {
	if len(a) == 0 {
		return 0
	}
	b = b[:len(a)]
	return dotF32AVX512(&a[0], &b[0], len(a))
}

func dotAVX2(a, b []float32) float32 {
	if len(a) == 0 {
		return 0
	}
	b = b[:len(a)]
	return dotF32AVX2(&a[0], &b[0], len(a))
}

func dotF16AVX512Go(a []float32, b []uint16) float32 {
	if len(a) == 0 {
		return 0
	}
	b = b[:len(a)]
	return dotF16AVX512(&a[0], &b[0], len(a))
}

func dotF16AVX2Go(a []float32, b []uint16) float32 {
	if len(a) == 0 {
		return 0
	}
	b = b[:len(a)]
	return dotF16AVX2(&a[0], &b[0], len(a))
}

func f16ToF32sAVX512Go(dst []float32, src []uint16) {
	if len(dst) == 0 {
		return
	}
	src = src[:len(dst)]
	f16ToF32sAVX512(&dst[0], &src[0], len(dst))
}

func f16ToF32sAVX2Go(dst []float32, src []uint16) {
	if len(dst) == 0 {
		return
	}
	src = src[:len(dst)]
	f16ToF32sAVX2(&dst[0], &src[0], len(dst))
}

func axpyAVX512Go(dst []float32, a float32, x []float32) {
	if len(dst) == 0 {
		return
	}
	x = x[:len(dst)]
	axpyAVX512(&dst[0], a, &x[0], len(dst))
}

func axpyF16AVX512Go(dst []float32, a float32, x []uint16) {
	if len(dst) == 0 {
		return
	}
	x = x[:len(dst)]
	axpyF16AVX512(&dst[0], a, &x[0], len(dst))
}

func dotQ8x4VNNIGo(w []int8, ws []uint16, xq []int8, xd []float32, xc []int32, out *[4]float32) {
	nb := len(xd)
	if nb == 0 {
		*out = [4]float32{}
		return
	}
	w, ws, xq, xc = w[:nb*q8Grp*qk8], ws[:nb*q8Grp], xq[:nb*qk8], xc[:nb]
	dotQ8x4VNNI(&w[0], &ws[0], &xq[0], &xd[0], &xc[0], nb, out)
}

func dotQ8x4AVX2Go(w []int8, ws []uint16, xq []int8, xd []float32, xc []int32, out *[4]float32) {
	nb := len(xd)
	if nb == 0 {
		*out = [4]float32{}
		return
	}
	w, ws, xq = w[:nb*q8Grp*qk8], ws[:nb*q8Grp], xq[:nb*qk8]
	dotQ8x4AVX2(&w[0], &ws[0], &xq[0], &xd[0], nil, nb, out)
}
