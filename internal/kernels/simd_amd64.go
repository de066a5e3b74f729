//go:build amd64 && !purego

package kernels

//go:generate go run asmgen.go

import (
	"math"
	"strings"

	"golang.org/x/sys/cpu"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// Feature levels this package has kernels for. AVX-512 kernels also use
// BW and VL (masked 16-bit tail loads on ymm registers) and F16C-class
// conversion, which every AVX-512 CPU with BW/VL has.
var (
	hasAVX2    = cpu.X86.HasAVX2 && cpu.X86.HasFMA && cpu.X86.HasF16C
	hasAVX512  = hasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL
	hasVNNI512 = hasAVX512 && cpu.X86.HasAVX512VNNI
	hasAVXVNNI = hasAVX2 && cpu.X86.HasAVXVNNI
)

// hasAsm: this build has assembly kernels.
const hasAsm = true

// cpuLacks names the CPU features tier name needs that this CPU lacks, or
// returns "" if it can run the tier.
func cpuLacks(name string) string {
	var miss []string
	need := func(ok bool, feature string) {
		if !ok {
			miss = append(miss, feature)
		}
	}
	r := tierRank(name)
	if r >= tierRank("avx2") {
		need(cpu.X86.HasAVX2, "AVX2")
		need(cpu.X86.HasFMA, "FMA")
		need(cpu.X86.HasF16C, "F16C")
	}
	if name == "avxvnni" {
		// Not implied by the tiers above it: an AVX-512 CPU may lack
		// AVX-VNNI (Skylake-SP, Ice Lake-SP), and an AVX-VNNI one AVX-512
		// (Alder Lake, Sierra Forest).
		need(cpu.X86.HasAVXVNNI, "AVX_VNNI")
	}
	if r >= tierRank("avx512") {
		need(cpu.X86.HasAVX512F, "AVX512F")
		need(cpu.X86.HasAVX512BW, "AVX512BW")
		need(cpu.X86.HasAVX512VL, "AVX512VL")
	}
	if r >= tierRank("avx512vnni") {
		need(cpu.X86.HasAVX512VNNI, "AVX512_VNNI")
	}
	if len(miss) == 0 {
		return ""
	}
	return "the CPU lacks " + strings.Join(miss, ", ")
}

// variant is one implementation of a kernel, named for tests and
// benchmarks.
type variant[F any] struct {
	name string
	fn   F
}

// The implementations usable on this CPU, in tier order (each named for
// the tier it needs, see tier.go). Tests run every entry against the
// reference; init installs the best tier's.
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

func init() {
	if hasAVX2 {
		dotVariants = append(dotVariants, variant[func(a, b []float32) float32]{"avx2", dotAVX2})
		dotF16Variants = append(dotF16Variants, variant[func(a []float32, b []uint16) float32]{"avx2", dotF16AVX2Go})
		f16ToF32sVariants = append(f16ToF32sVariants, variant[func(dst []float32, src []uint16)]{"avx2", f16ToF32sAVX2Go})
		f32ToF16sVariants = append(f32ToF16sVariants, variant[func(dst []uint16, src []float32)]{"avx2", f32ToF16sAVX2Go})
		f16RowsVariants = append(f16RowsVariants, variant[f16RowsFn]{"avx2", f16ToF32RowsAVX2Go})
		qTileVariants = append(qTileVariants, variant[qTileFn]{"avx2", qTileAVX2})
		gemmF32Variants = append(gemmF32Variants, variant[gemmF32Fn]{"avx2", gemmF32AVX2})
		kTileVariants = append(kTileVariants, variant[kTileFn]{"avx2", kTileAVX2})
		axpyVariants = append(axpyVariants, variant[func([]float32, float32, []float32)]{"avx2", axpyAVX2Go})
		axpyF16Variants = append(axpyF16Variants, variant[func([]float32, float32, []uint16)]{"avx2", axpyF16AVX2Go})
		siluMulVariants = append(siluMulVariants, variant[func(dst, gate, up []float32)]{"avx2", siluMulAVX2Go})
		softmaxVariants = append(softmaxVariants, variant[func(x []float32)]{"avx2", softmaxAVX2})
		quantQ8Variants = append(quantQ8Variants, variant[quantQ8Fn]{"avx2", quantizeQ8_0PackedAVX2})
		quantKVariants = append(quantKVariants, variant[quantKFn]{"avx2", quantizeQ8KPackedAVX2})
	}
	if hasAVX512 {
		dotVariants = append(dotVariants, variant[func(a, b []float32) float32]{"avx512", dotAVX512})
		dotF16Variants = append(dotF16Variants, variant[func(a []float32, b []uint16) float32]{"avx512", dotF16AVX512Go})
		axpyVariants = append(axpyVariants, variant[func([]float32, float32, []float32)]{"avx512", axpyAVX512Go})
		axpyF16Variants = append(axpyF16Variants, variant[func([]float32, float32, []uint16)]{"avx512", axpyF16AVX512Go})
		f16ToF32sVariants = append(f16ToF32sVariants, variant[func(dst []float32, src []uint16)]{"avx512", f16ToF32sAVX512Go})
		gemmF32Variants = append(gemmF32Variants, variant[gemmF32Fn]{"avx512", gemmF32AVX512})
		quantQ8Variants = append(quantQ8Variants, variant[quantQ8Fn]{"avx512", quantizeQ8_0PackedAVX512})
		siluMulVariants = append(siluMulVariants, variant[func(dst, gate, up []float32)]{"avx512", siluMulAVX512Go})
		softmaxVariants = append(softmaxVariants, variant[func(x []float32)]{"avx512", softmaxAVX512})
	}
	if hasAVXVNNI {
		qTileVariants = append(qTileVariants, variant[qTileFn]{"avxvnni", qTileAVXVNNI})
	}
	if hasVNNI512 {
		qTileVariants = append(qTileVariants, variant[qTileFn]{"avx512vnni", qTileVNNI})
		kTileVariants = append(kTileVariants, variant[kTileFn]{"avx512vnni", kTileVNNI})
	}
	ts := Tiers()
	install(tierRank(ts[len(ts)-1]))
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

func f32ToF16sAVX2Go(dst []uint16, src []float32) {
	if len(dst) == 0 {
		return
	}
	src = src[:len(dst)]
	f32ToF16sAVX2(&dst[0], &src[0], len(dst))
}

// f16ToF32RowsAVX2Go converts with one call per block of rows when each
// row is a whole number of 8-half vectors, else row by row.
func f16ToF32RowsAVX2Go(dst []float32, ds int, src []uint16, ss, rows, cols int, next []uint16) {
	if rows <= 0 || cols <= 0 {
		return
	}
	_, _ = dst[(rows-1)*ds+cols-1], src[(rows-1)*ss+cols-1]
	if cols%8 != 0 {
		for i := range rows {
			f16ToF32sAVX2(&dst[i*ds], &src[i*ss], cols)
		}
		return
	}
	var pf *uint16
	if len(next) >= (rows-1)*ss+cols {
		pf = &next[0] // only prefetched: a hint, but kept inside next
	}
	f16ToF32RowsAVX2(&dst[0], 4*ds, &src[0], 2*ss, rows, cols, pf)
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

// qTileVNNI runs the AVX-512 VNNI tile kernel for the group width.
func qTileVNNI(t quant.Type, width, ng int, w []byte, wd []uint16, xq []int8, xd []float32, xc []int32, out []float32) {
	if ng <= 0 {
		return
	}
	nb := len(wd) / (qRows * ng)
	out = out[:ng*width*qRows]
	if nb == 0 {
		clear(out)
		return
	}
	w, wd, xq, xd, xc = w[:ng*nb*qGroupBytes(t)], wd[:ng*nb*qRows], xq[:nb*qk8*width], xd[:nb*width], xc[:nb*width]
	var k func(w *byte, wd *uint16, xq *int8, xd *float32, xc *int32, nb, ng int, out *float32)
	q4 := t == quant.Q4_0
	if width == 1 {
		// Decode: the groups as two sequential streams (gemm*VNNIw1x2), an
		// odd last group alone.
		k, k2 := gemmQ8VNNIw1, gemmQ8VNNIw1x2
		if q4 {
			k, k2 = gemmQ4VNNIw1, gemmQ4VNNIw1x2
		}
		pairs := ng / 2
		if pairs > 0 {
			k2(&w[0], &wd[0], &xq[0], &xd[0], &xc[0], nb, pairs, &out[0])
		}
		if g := 2 * pairs; g < ng {
			k(&w[g*nb*qGroupBytes(t)], &wd[g*nb*qRows], &xq[0], &xd[0], &xc[0], nb, 1, &out[g*qRows])
		}
		return
	}
	switch {
	case width == 4 && q4:
		k = gemmQ4VNNIw4
	case width == 4:
		k = gemmQ8VNNIw4
	case width == 8 && q4:
		k = gemmQ4VNNIw8
	case width == 8:
		k = gemmQ8VNNIw8
	default:
		panic("kernels: no VNNI tile kernel for this group width")
	}
	k(&w[0], &wd[0], &xq[0], &xd[0], &xc[0], nb, ng, &out[0])
}

// qYmmKernels are the ymm Q8_0/Q4_0 tile kernels of one instruction set
// (AVX2, or AVX-VNNI: same layouts, registers and float arithmetic, the
// same exact integer sums by other instructions).
type qYmmKernels struct {
	w1   [2]func(w *byte, wd *uint16, xq *int8, xd *float32, xc *int32, nb, width int, out *float32)
	x2   [2]func(w, w2 *byte, wd, wd2 *uint16, xq *int8, xd *float32, xc *int32, nb int, out, out2 *float32)
	w4a4 [2]func(w *byte, wd *uint16, xq *int8, xd *float32, xc *int32, nb, half int, out *float32)
	w8a4 [2]func(w *byte, wd *uint16, xq *int8, xd *float32, xc *int32, nb, half int, out *float32)
}

// Index 0 is Q8_0, 1 is Q4_0.
var (
	qAVX2Kernels = qYmmKernels{
		w1:   [2]func(*byte, *uint16, *int8, *float32, *int32, int, int, *float32){gemmQ8AVX2, gemmQ4AVX2},
		x2:   [2]func(*byte, *byte, *uint16, *uint16, *int8, *float32, *int32, int, *float32, *float32){gemmQ8AVX2x2, gemmQ4AVX2x2},
		w4a4: [2]func(*byte, *uint16, *int8, *float32, *int32, int, int, *float32){gemmQ8AVX2w4a4, gemmQ4AVX2w4a4},
		w8a4: [2]func(*byte, *uint16, *int8, *float32, *int32, int, int, *float32){gemmQ8AVX2w8a4, gemmQ4AVX2w8a4},
	}
	qAVXVNNIKernels = qYmmKernels{
		w1:   [2]func(*byte, *uint16, *int8, *float32, *int32, int, int, *float32){gemmQ8AVXVNNI, gemmQ4AVXVNNI},
		x2:   [2]func(*byte, *byte, *uint16, *uint16, *int8, *float32, *int32, int, *float32, *float32){gemmQ8AVXVNNIx2, gemmQ4AVXVNNIx2},
		w4a4: [2]func(*byte, *uint16, *int8, *float32, *int32, int, int, *float32){gemmQ8AVXVNNIw4a4, gemmQ4AVXVNNIw4a4},
		w8a4: [2]func(*byte, *uint16, *int8, *float32, *int32, int, int, *float32){gemmQ8AVXVNNIw8a4, gemmQ4AVXVNNIw8a4},
	}
)

// qTileAVX2 runs the AVX2 tile kernels.
func qTileAVX2(t quant.Type, width, ng int, w []byte, wd []uint16, xq []int8, xd []float32, xc []int32, out []float32) {
	qTileYmm(&qAVX2Kernels, t, width, ng, w, wd, xq, xd, xc, out)
}

// qTileAVXVNNI runs the AVX-VNNI tile kernels.
func qTileAVXVNNI(t quant.Type, width, ng int, w []byte, wd []uint16, xq []int8, xd []float32, xc []int32, out []float32) {
	qTileYmm(&qAVXVNNIKernels, t, width, ng, w, wd, xq, xd, xc, out)
}

// qTileYmm runs the ymm tile kernels ks: for one activation row the
// 16-row kernel, for groups of 4 or 8 the 8-row kernels that share each
// weight load among 4 activation rows.
func qTileYmm(ks *qYmmKernels, t quant.Type, width, ng int, w []byte, wd []uint16, xq []int8, xd []float32, xc []int32, out []float32) {
	if ng <= 0 {
		return
	}
	nb := len(wd) / (qRows * ng)
	out = out[:ng*width*qRows]
	if nb == 0 {
		clear(out)
		return
	}
	gb := qGroupBytes(t)
	w, wd, xq, xd, xc = w[:ng*nb*gb], wd[:ng*nb*qRows], xq[:nb*qk8*width], xd[:nb*width], xc[:nb*width]
	ti := 0
	if t == quant.Q4_0 {
		ti = 1
	}
	if width == 1 {
		// Decode: groups g and pairs+g side by side (two sequential
		// streams), an odd last group alone.
		k, k2 := ks.w1[ti], ks.x2[ti]
		pairs := ng / 2
		for g := 0; g < pairs; g++ {
			h := g + pairs
			k2(&w[g*nb*gb], &w[h*nb*gb], &wd[g*nb*qRows], &wd[h*nb*qRows], &xq[0], &xd[0], &xc[0], nb, &out[g*qRows], &out[h*qRows])
		}
		if g := 2 * pairs; g < ng {
			k(&w[g*nb*gb], &wd[g*nb*qRows], &xq[0], &xd[0], &xc[0], nb, width, &out[g*qRows])
		}
		return
	}
	var k func(w *byte, wd *uint16, xq *int8, xd *float32, xc *int32, nb, half int, out *float32)
	switch width {
	case 4:
		k = ks.w4a4[ti]
	case 8:
		k = ks.w8a4[ti]
	default:
		panic("kernels: no ymm tile kernel for this group width")
	}
	for g := 0; g < ng; g++ {
		for i := 0; i < width; i += 4 {
			for h := 0; h < 2; h++ {
				k(&w[g*nb*gb], &wd[g*nb*qRows], &xq[4*i], &xd[i], &xc[i], nb, h, &out[(g*width+i)*qRows+8*h])
			}
		}
	}
}

// gemmF32AVX512 runs the 4 x a tiled kernels over weight rows [r0, r1) in
// column chunks (f32ChunkCols); rows left over from the groups of four take
// dot products.
//
// Every output is computed with the same arithmetic whatever n and
// whichever tile holds it: per column chunk (fixed boundaries), lane j of
// its accumulator sums the products of columns j mod 16 in order, the
// lanes are folded by one fixed tree, and the chunk sums are added to dst
// in order. A sequence's results therefore do not depend on which other
// sequences share the batch, bit for bit.
func gemmF32AVX512(dst []float32, ds int, w []float32, cols, r0, r1 int, x []float32, n int) {
	if n <= 0 || r1 <= r0 {
		return
	}
	// Bounds every kernel access stays within (a short slice panics here).
	_, _, _ = w[r1*cols-1], x[n*cols-1], dst[(n-1)*ds+r1-1]
	if n == 1 {
		full := r0 + (r1-r0)&^3
		if full > r0 {
			gemmF32Rows1(&w[r0*cols], 4*cols, &x[0], cols, f32ChunkCols(cols), full-r0, &dst[r0])
		}
		gemmF32Dots(dotImpl, dst, ds, w, cols, full, r1, x, n)
		return
	}
	gemmF32Tiled(gemmF32Kernels[:], dst, ds, w, cols, r0, r1, x, n)
}

// gemmF32AVX2 is gemmF32AVX512 with the AVX2 kernels: one activation row
// takes gemmF32AVX2Rows1 (two long weight streams, the 4 x a tiles'
// arithmetic, so its outputs are the bits it gets in any batch).
func gemmF32AVX2(dst []float32, ds int, w []float32, cols, r0, r1 int, x []float32, n int) {
	if n <= 0 || r1 <= r0 {
		return
	}
	_, _, _ = w[r1*cols-1], x[n*cols-1], dst[(n-1)*ds+r1-1]
	if n == 1 {
		full := r0 + (r1-r0)&^3
		if full > r0 {
			gemmF32AVX2Rows1(&w[r0*cols], 4*cols, &x[0], cols, f32ChunkCols(cols), full-r0, &dst[r0])
		}
		gemmF32Dots(dotImpl, dst, ds, w, cols, full, r1, x, n)
		return
	}
	gemmF32Tiled(gemmF32AVX2Kernels[:], dst, ds, w, cols, r0, r1, x, n)
}

// gemmF32Tiled runs the 4 x a tile kernels ks (ks[a-1] takes a activation
// rows) over weight rows [r0, r1) in column chunks (f32ChunkCols); rows
// left over from the groups of four take dot products. The caller has
// checked the bounds.
func gemmF32Tiled(ks []func(w *float32, ws int, x *float32, xs int, k int, dst *float32, ds int), dst []float32, ds int, w []float32, cols, r0, r1 int, x []float32, n int) {
	full := r0 + (r1-r0)&^3
	maxA := len(ks)
	kcMax := f32ChunkCols(cols)
	for i := 0; i < n; i++ {
		clear(dst[i*ds+r0 : i*ds+full])
	}
	if n*cols*4 <= f32ActBytes {
		// All activations stay in L2: finish each group of rows before the
		// next, so the weights are read in order (chunk-major order would
		// turn them into a strided read, which DRAM serves far slower).
		for r := r0; r < full; r += 4 {
			for k0 := 0; k0 < cols; k0 += kcMax {
				kc := min(kcMax, cols-k0)
				wp := &w[r*cols+k0]
				for i := 0; i < n; i += maxA {
					a := min(maxA, n-i)
					ks[a-1](wp, 4*cols, &x[i*cols+k0], 4*cols, kc, &dst[i*ds+r], 4*ds)
				}
			}
		}
	} else {
		// Activations in L2-sized passes; within a pass, one column chunk
		// of them stays in L2 while every group of rows meets it.
		pass := max(maxA, f32ActBytes/(4*kcMax)/maxA*maxA)
		for i0 := 0; i0 < n; i0 += pass {
			i1 := min(n, i0+pass)
			for k0 := 0; k0 < cols; k0 += kcMax {
				kc := min(kcMax, cols-k0)
				for r := r0; r < full; r += 4 {
					wp := &w[r*cols+k0]
					for i := i0; i < i1; i += maxA {
						a := min(maxA, i1-i)
						ks[a-1](wp, 4*cols, &x[i*cols+k0], 4*cols, kc, &dst[i*ds+r], 4*ds)
					}
				}
			}
		}
	}
	gemmF32Dots(dotImpl, dst, ds, w, cols, full, r1, x, n)
}

// quantizeQ8_0PackedAVX512 is quantizeQ8_0Packed in assembly.
func quantizeQ8_0PackedAVX512(x []float32, width, i int, corr int32, xq []int8, xd []float32, xc []int32) {
	nb := len(x) / qk8
	if nb == 0 {
		return
	}
	if i < 0 || i >= width {
		panic("kernels: quantizeQ8_0Packed: row outside its group")
	}
	xq, xd, xc = xq[:nb*qk8*width], xd[:nb*width], xc[:nb*width]
	quantQ8_0AVX512(&x[0], nb, &xq[4*i], 4*width, &xd[i], &xc[i], corr)
}

// quantizeQ8_0PackedAVX2 is quantizeQ8_0Packed in AVX2 assembly.
func quantizeQ8_0PackedAVX2(x []float32, width, i int, corr int32, xq []int8, xd []float32, xc []int32) {
	nb := len(x) / qk8
	if nb == 0 {
		return
	}
	if i < 0 || i >= width {
		panic("kernels: quantizeQ8_0Packed: row outside its group")
	}
	xq, xd, xc = xq[:nb*qk8*width], xd[:nb*width], xc[:nb*width]
	quantQ8_0AVX2(&x[0], nb, &xq[4*i], 4*width, &xd[i], &xc[i], corr)
}

// quantizeQ8KPackedAVX2 is quantizeQ8KPacked with the quantisation in AVX2
// assembly; the sums of 16 are paired here as the weight type needs.
func quantizeQ8KPackedAVX2(t quant.Type, x []float32, width, i int, xq []int8, xd []float32, xp []int32) {
	nb := len(x) / qkK
	if nb == 0 {
		return
	}
	if i < 0 || i >= width {
		panic("kernels: quantizeQ8KPacked: row outside its group")
	}
	xq, xd, xp = xq[:nb*qkK*width], xd[:nb*width], xp[:nb*8*width]
	var bs [16 * 16]int16 // sums of 16 for up to 16 super-blocks per call
	for s0 := 0; s0 < nb; s0 += 16 {
		n := min(16, nb-s0)
		quantQ8KAVX2(&x[s0*qkK], n, &xq[s0*qkK*width+4*i], 4*width, &xd[s0*width+i], &bs[0])
		for s := 0; s < n; s++ {
			b := bs[s*16 : (s+1)*16]
			p := xp[(s0+s)*8*width:]
			for j := 0; j < 8; j++ {
				var lo, hi int16
				if t == quant.Q6_K {
					lo, hi = b[2*j], b[2*j+1]
				} else if j < 4 {
					lo, hi = b[4*j]+b[4*j+1], b[4*j+2]+b[4*j+3]
				}
				p[j*width+i] = int32(uint32(uint16(lo)) | uint32(uint16(hi))<<16)
			}
		}
	}
}

// kTileVNNI runs the AVX-512 VNNI K-quant tile kernel for the group width.
func kTileVNNI(t quant.Type, width, ng int, w []byte, xq []int8, xd []float32, xp []int32, out []float32) {
	if ng <= 0 {
		return
	}
	rec := kRecBytes(t)
	nb := len(w) / (rec * ng)
	out = out[:ng*width*qRows]
	if nb == 0 {
		clear(out)
		return
	}
	w, xq, xd, xp = w[:ng*nb*rec], xq[:nb*qkK*width], xd[:nb*width], xp[:nb*8*width]
	var k func(w *byte, xq *int8, xd *float32, xp *int32, nb, ng int, out *float32)
	q6 := t == quant.Q6_K
	switch {
	case width == 1 && q6 && kPrefetchOn.Load():
		k = gemmQ6KVNNIw1pf
	case width == 1 && q6:
		k = gemmQ6KVNNIw1
	case width == 1 && kPrefetchOn.Load():
		k = gemmQ4KVNNIw1pf
	case width == 1:
		k = gemmQ4KVNNIw1
	case width == 4 && q6:
		k = gemmQ6KVNNIw4
	case width == 4:
		k = gemmQ4KVNNIw4
	default:
		panic("kernels: no VNNI K-quant kernel for this group width")
	}
	k(&w[0], &xq[0], &xd[0], &xp[0], nb, ng, &out[0])
}

func siluMulAVX512Go(dst, gate, up []float32) {
	if len(dst) == 0 {
		return
	}
	gate, up = gate[:len(dst)], up[:len(dst)]
	siluMulAVX512(&dst[0], &gate[0], &up[0], len(dst))
}

func axpyAVX2Go(dst []float32, a float32, x []float32) {
	if len(dst) == 0 {
		return
	}
	x = x[:len(dst)]
	axpyAVX2(&dst[0], a, &x[0], len(dst))
}

func axpyF16AVX2Go(dst []float32, a float32, x []uint16) {
	if len(dst) == 0 {
		return
	}
	x = x[:len(dst)]
	axpyF16AVX2(&dst[0], a, &x[0], len(dst))
}

func siluMulAVX2Go(dst, gate, up []float32) {
	if len(dst) == 0 {
		return
	}
	gate, up = gate[:len(dst)], up[:len(dst)]
	siluMulAVX2(&dst[0], &gate[0], &up[0], len(dst))
}

// softmaxAVX512 is softmaxRef with the exponentials in assembly (about 1
// ulp from the correctly rounded exp); the max, the float64 sum and the
// scaling are the reference's, in its order.
func softmaxAVX512(x []float32) { softmaxWith(expSubAVX512, x) }

// softmaxAVX2 is softmaxAVX512 with the AVX2 exponentials.
func softmaxAVX2(x []float32) { softmaxWith(expSubAVX2, x) }

// softmaxWith is softmaxRef with the exponentials from expSub.
func softmaxWith(expSub func(dst, src *float32, n int, c float32), x []float32) {
	if len(x) == 0 {
		return
	}
	max := float32(math.Inf(-1))
	for _, v := range x {
		if v > max {
			max = v
		}
	}
	expSub(&x[0], &x[0], len(x), max)
	var sum float64
	for _, e := range x {
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// kTileAVX2 runs the AVX2 K-quant kernels: each call covers one half (8
// rows) of a 16-row weight group and one or two activation rows, so every
// output is computed with kTileRef's arithmetic, independently of the
// others.
func kTileAVX2(t quant.Type, width, ng int, w []byte, xq []int8, xd []float32, xp []int32, out []float32) {
	if ng <= 0 {
		return
	}
	rec := kRecBytes(t)
	nb := len(w) / (rec * ng)
	out = out[:ng*width*qRows]
	if nb == 0 {
		clear(out)
		return
	}
	w, xq, xd, xp = w[:ng*nb*rec], xq[:nb*qkK*width], xd[:nb*width], xp[:nb*8*width]
	q6 := t == quant.Q6_K
	if width == 1 {
		// Decode: one pass over each group's records, all 16 rows.
		k := gemmQ4KAVX2x16
		switch pf := kPrefetchOn.Load(); {
		case q6 && pf:
			k = gemmQ6KAVX2x16pf
		case q6:
			k = gemmQ6KAVX2x16
		case pf:
			k = gemmQ4KAVX2x16pf
		}
		for g := 0; g < ng; g++ {
			k(&w[g*nb*rec], &xq[0], &xd[0], &xp[0], nb, &out[g*qRows])
		}
		return
	}
	var k func(w *byte, xq *int8, xd *float32, xp *int32, nb, half int, out *float32)
	a := 1
	switch {
	case width == 4 && q6:
		k, a = gemmQ6KAVX2w4a2, 2
	case width == 4:
		k, a = gemmQ4KAVX2w4a2, 2
	default:
		panic("kernels: no AVX2 K-quant kernel for this group width")
	}
	for g := 0; g < ng; g++ {
		for i := 0; i < width; i += a {
			for h := 0; h < 2; h++ {
				k(&w[g*nb*rec], &xq[4*i], &xd[i], &xp[i], nb, h, &out[(g*width+i)*qRows+8*h])
			}
		}
	}
}
