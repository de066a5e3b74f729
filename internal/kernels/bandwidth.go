package kernels

import (
	"time"
)

// StreamBytes returns the number of weight bytes one product actually
// reads: the repacked size for quantised types (Q6_K, say, is stored 30%
// above its GGML size, see Bytes), the aliased size for float types. It is
// the numerator of a product's share of the memory bandwidth.
func (m *Matrix) StreamBytes() int64 {
	n := int64(len(m.f32))*4 + int64(len(m.u16))*2 + int64(len(m.qw)) + int64(len(m.qd))*2 +
		int64(len(m.kw)) + int64(len(m.qm))*4 + int64(len(m.kdmin))*4 + int64(len(m.kmins)) +
		int64(len(m.xls)) + int64(len(m.xd))*4
	return n
}

// bwChunk is the floats one share of a bandwidth pass sums (two 256 KiB
// halves): small enough that every thread of the pool gets many, large
// enough that a share's hand-off is noise next to its 512 KiB of reads.
const bwChunk = 128 << 10

// bwSink keeps the passes' results observable, so no pass can be elided.
var bwSink float32

// ReadBandwidth measures how fast p's threads stream buf from memory: one
// pass reads every byte of buf once (a dot product of each chunk's two
// halves, the same SIMD loads the matrix-vector kernels issue), split
// over the pool as MatMul splits a product, and the best of passes runs
// is returned in bytes per second. buf must be much larger than the last
// level cache (bench uses 8x a 32 MiB L3) and hold data that was written
// (fresh zero pages may all map to one physical page). The result is the
// bound a decode step's weight and KV reads can at best be streamed at.
func ReadBandwidth(p *Pool, buf []float32, passes int) float64 {
	chunks := len(buf) / bwChunk
	if chunks == 0 || passes < 1 {
		return 0
	}
	sums := make([]float32, chunks)
	best := time.Duration(1<<63 - 1)
	for range passes {
		start := time.Now()
		p.Run(chunks, func(lo, hi int) {
			for c := lo; c < hi; c++ {
				x := buf[c*bwChunk : (c+1)*bwChunk]
				sums[c] = Dot(x[:bwChunk/2], x[bwChunk/2:])
			}
		})
		best = min(best, time.Since(start))
		for _, s := range sums {
			bwSink += s
		}
	}
	return float64(chunks*bwChunk*4) / best.Seconds()
}
