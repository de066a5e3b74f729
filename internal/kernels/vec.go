package kernels

// Exported vector kernels. Each checks lengths (a mismatch is a bug in the
// caller, never outside input) and calls the implementation chosen for this
// CPU in init (simd_amd64.go) or the reference.

// Implementations, replaced at start-up by faster ones where the CPU allows.
// Tests call both these and the *Ref functions directly.
var (
	dotImpl       = dotRef
	dotF16Impl    = dotF16Ref
	dotBF16Impl   = dotBF16Ref
	axpyImpl      = axpyRef
	axpyF16Impl   = axpyF16Ref
	f16ToF32sImpl = f16ToF32sRef
	f32ToF16sImpl = f32ToF16sRef
	f16RowsImpl   = f16ToF32RowsRef
	qTileImpl     = qTileRef
	gemmF32Impl   = gemmF32Generic
	quantQ8Impl   = quantizeQ8_0Packed
	kTileImpl     = kTileRef
	quantKImpl    = quantizeQ8KPacked
	siluMulImpl   = siluMulRef
	softmaxImpl   = softmaxRef
)

func mustLen(op string, got, want int) {
	if got != want {
		panic("kernels: " + op + ": length mismatch")
	}
}

// Dot returns the dot product of a and b, which must have equal lengths.
func Dot(a, b []float32) float32 {
	mustLen("Dot", len(b), len(a))
	return dotImpl(a, b)
}

// DotF16 returns the dot product of a with the half-precision vector b.
func DotF16(a []float32, b []uint16) float32 {
	mustLen("DotF16", len(b), len(a))
	return dotF16Impl(a, b)
}

// Axpy adds a*x to dst.
func Axpy(dst []float32, a float32, x []float32) {
	mustLen("Axpy", len(x), len(dst))
	axpyImpl(dst, a, x)
}

// AxpyF16 adds a*x to dst, x in half precision.
func AxpyF16(dst []float32, a float32, x []uint16) {
	mustLen("AxpyF16", len(x), len(dst))
	axpyF16Impl(dst, a, x)
}

// F16ToF32s converts src to float32 into dst (equal lengths).
func F16ToF32s(dst []float32, src []uint16) {
	mustLen("F16ToF32s", len(src), len(dst))
	f16ToF32sImpl(dst, src)
}

// f16RowsFn converts rows rows of cols halves, src rows ss elements apart,
// into dst rows ds elements apart; next (may be nil) is prefetched.
type f16RowsFn = func(dst []float32, ds int, src []uint16, ss, rows, cols int, next []uint16)

// F16ToF32Rows converts rows rows of cols halves, the rows of src ss
// elements apart, into dst with its rows ds elements apart: a KV head's
// rows out of a page that interleaves every head, in one call (attention
// made one call per row before, and a short call per 128-byte row left
// DRAM's latency exposed). next, if not nil, is where the caller reads
// next, laid out as src (the same KV head's rows in its next page): its
// lines are prefetched meanwhile, a hint only. It panics if dst or src is
// too short.
func F16ToF32Rows(dst []float32, ds int, src []uint16, ss, rows, cols int, next []uint16) {
	if rows <= 0 || cols <= 0 {
		return
	}
	if ds < cols || ss < cols || len(dst) < (rows-1)*ds+cols || len(src) < (rows-1)*ss+cols {
		panic("kernels: F16ToF32Rows: overlapping rows or a slice too short")
	}
	f16RowsImpl(dst, ds, src, ss, rows, cols, next)
}

// F32ToF16s rounds src to half precision (nearest even) into dst, as
// F16C's VCVTPS2PH does (a NaN keeps its sign and the top of its payload,
// made quiet).
func F32ToF16s(dst []uint16, src []float32) {
	mustLen("F32ToF16s", len(src), len(dst))
	f32ToF16sImpl(dst, src)
}

// RMSNorm sets dst = x / sqrt(mean(x²) + eps) * w, as llama.cpp's rms_norm
// followed by the norm-weight multiply. dst may alias x.
func RMSNorm(dst, x, w []float32, eps float32) {
	mustLen("RMSNorm", len(x), len(dst))
	mustLen("RMSNorm", len(w), len(dst))
	rmsNormRef(dst, x, w, eps)
}

// Softmax replaces x by softmax(x) in place, as ggml's soft_max: subtract
// the max, exponentiate, sum in float64, scale by the reciprocal.
func Softmax(x []float32) { softmaxImpl(x) }

// SiLUMul sets dst = silu(gate) * up elementwise; dst may alias either.
func SiLUMul(dst, gate, up []float32) {
	mustLen("SiLUMul", len(gate), len(dst))
	mustLen("SiLUMul", len(up), len(dst))
	siluMulImpl(dst, gate, up)
}

// Add sets dst += x elementwise.
func Add(dst, x []float32) {
	mustLen("Add", len(x), len(dst))
	addRef(dst, x)
}
