package kernels

import "testing"

// BenchmarkPoolRunWork: a Run the size of a decode step's matmul (64 units
// of about 0.3µs each), where the split and the hand-off matter.
func BenchmarkPoolRunWork(b *testing.B) {
	x := make([]float32, 64*256)
	for i := range x {
		x[i] = float32(i%7) * 0.25
	}
	out := make([]float32, 64)
	fn := func(lo, hi int) {
		for i := lo; i < hi; i++ {
			var s float32
			for _, v := range x[i*256 : (i+1)*256] {
				s += v * v
			}
			out[i] = s
		}
	}
	for _, threads := range []int{1, 2} {
		p := NewPool(threads)
		b.Run(map[int]string{1: "t1", 2: "t2"}[threads], func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				p.RunGrain(len(out), 4, fn)
			}
		})
		p.Close()
	}
}
