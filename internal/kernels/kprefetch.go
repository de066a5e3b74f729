package kernels

import (
	"sync/atomic"
	"time"
)

// K-quant prefetching.
//
// The K-quant matrix-vector kernels (decode's Q4_K and Q6_K products, and
// the types that run on them) exist twice in assembly: as they were, and
// with one PREFETCHT0 per cache line of a super-block record ahead,
// spread through the loop (8 KiB or more ahead on AVX2, two records on
// AVX-512 VNNI: kPrefetchRecords in asmgen.go). Which is faster depends
// on the machine: on one 2-core EPYC VM the prefetching AVX2 Q4_K kernel
// read 22-28 GB/s from DRAM against 15-17 without, on another an earlier
// prefetching try read 19-24 against 33-37. Both give the same bits;
// CalibrateKPrefetch times them on a model's own matrices and keeps the
// prefetching ones unless the others are clearly faster.

// kPrefetchOn selects the prefetching K-quant matrix-vector kernels.
var kPrefetchOn atomic.Bool

// KPrefetch reports whether the prefetching K-quant kernels are in use.
func KPrefetch() bool { return kPrefetchOn.Load() }

// SetKPrefetch selects the prefetching K-quant kernels (or not) and
// returns the previous setting.
func SetKPrefetch(on bool) bool { return kPrefetchOn.Swap(on) }

// kCalibrateMin is the fewest K-quant bytes worth timing: below it the
// matrices stay in the last-level cache and show nothing of DRAM.
// kCalibrateMax bounds what is timed, so that a large model's load does
// not pay six passes over all its weights.
const (
	kCalibrateMin = 96 << 20
	kCalibrateMax = 512 << 20
)

// CalibrateKPrefetch times one matrix-vector product of every K-quant
// matrix in ms, up to kCalibrateMax bytes of them (one thread, as a decode
// step streams them), with and without prefetching, three rounds
// interleaved, and keeps the prefetching kernels unless the others' best
// round is at least 5% faster. (It used to need the prefetching ones 5%
// faster; with the prefetches spread through the kernels, the AVX-512
// VNNI tier timed the two within 5% on the 2-core EPYC VM and decoded the
// 1.1B Q4_K_M at one thread at 35 tok/s without prefetch, 42 with.) It
// returns the choice and the best times; with fewer than kCalibrateMin
// bytes of K-quant weights, or on a tier without assembly, it changes
// nothing and returns zero times.
func CalibrateKPrefetch(ms []*Matrix) (on bool, without, with time.Duration) {
	var ks []*Matrix
	var bytes int64
	cols, rows := 0, 0
	for _, m := range ms {
		if m != nil && m.kw != nil && bytes < kCalibrateMax {
			ks = append(ks, m)
			bytes += m.StreamBytes()
			cols, rows = max(cols, m.cols), max(rows, m.rows)
		}
	}
	if bytes < kCalibrateMin || !hasAsm || tier == 0 {
		return kPrefetchOn.Load(), 0, 0
	}
	x := make([]float32, cols)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	dst := make([]float32, rows)
	best := [2]time.Duration{1<<63 - 1, 1<<63 - 1}
	for range 3 {
		for i, pf := range []bool{false, true} {
			kPrefetchOn.Store(pf)
			start := time.Now()
			for _, m := range ks {
				MatMul(nil, dst[:m.rows], m, x[:m.cols], 1)
			}
			best[i] = min(best[i], time.Since(start))
		}
	}
	on = best[0] >= best[1]*95/100
	kPrefetchOn.Store(on)
	return on, best[0], best[1]
}
