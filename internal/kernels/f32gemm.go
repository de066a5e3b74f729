package kernels

// F32 matrix products over several activation rows.
//
// A gemmF32 implementation computes dst[i*ds+r] = w_r . x_i for weight rows
// r in [r0, r1) (w_r = w[r*cols:(r+1)*cols]) and activation rows i < n
// (x_i = x[i*cols:(i+1)*cols]); nothing else in dst is written.

// gemmF32Fn is the signature of the implementations.
type gemmF32Fn = func(dst []float32, ds int, w []float32, cols, r0, r1 int, x []float32, n int)

// gemmF32Ref is the reference: one dotRef per output.
func gemmF32Ref(dst []float32, ds int, w []float32, cols, r0, r1 int, x []float32, n int) {
	gemmF32Dots(dotRef, dst, ds, w, cols, r0, r1, x, n)
}

// gemmF32Generic is gemmF32Ref with the fastest dot kernel, for CPUs
// without a tiled kernel.
func gemmF32Generic(dst []float32, ds int, w []float32, cols, r0, r1 int, x []float32, n int) {
	gemmF32Dots(dotImpl, dst, ds, w, cols, r0, r1, x, n)
}

// gemmF32Dots computes one dot product per output, weight row outermost so
// each row is read from memory once and from cache for the remaining
// activation rows.
func gemmF32Dots(dot func(a, b []float32) float32, dst []float32, ds int, w []float32, cols, r0, r1 int, x []float32, n int) {
	for r := r0; r < r1; r++ {
		wr := w[r*cols : (r+1)*cols]
		for i := 0; i < n; i++ {
			dst[i*ds+r] = dot(x[i*cols:(i+1)*cols], wr)
		}
	}
}

// Blocking of the tiled kernels: a chunk of at most f32KC columns of four
// weight rows and six activation rows (30 KiB at most) stays in L1 while
// the micro-kernel runs over it, and the activation rows of one pass over
// the weights (f32ActBytes) stay in L2.
const (
	f32KC       = 768
	f32ActBytes = 384 << 10
)

// f32ChunkCols splits cols into equal chunks of at most f32KC columns
// (multiples of 16 but the last). It depends on cols alone, never on the
// batch, so every output is summed in the same order however it is
// batched; and an even split avoids short tail chunks, which break the
// weight rows into a read pattern the hardware prefetchers follow badly.
func f32ChunkCols(cols int) int {
	chunks := (cols + f32KC - 1) / f32KC
	kc := (cols + chunks - 1) / chunks
	return (kc + 15) &^ 15
}
