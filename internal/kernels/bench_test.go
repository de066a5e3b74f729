package kernels

import (
	"fmt"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/hugemem"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// Benchmarks report GB/s of weight bytes (b.SetBytes), so a memory-bound
// kernel can be compared directly with the machine's read bandwidth, and
// MatMul also GFLOP/s (2*rows*cols*n per call), for compute-bound batches. Each
// case runs every kernel tier this machine has (forced, as
// PAGEWARDEN_KERNELS does: "avx2" next to "avx512vnni" on an AVX-512
// machine) and the plain-Go reference ("ref") in the same run; F32 also
// runs "dots", one dot product per output as before the tiled kernels.
// Example:
//
//	go test ./internal/kernels -run '^$' -bench 'MatMul/Q4_K/2048x2048/n1/' -benchtime 20x

var benchShapes = [][2]int{{576, 576}, {1536, 576}, {2048, 2048}, {5632, 2048}}

func BenchmarkDot(b *testing.B) {
	rng := newRand(20)
	for _, n := range []int{576, 2048, 5632} {
		x, y := randF32(rng, n), randF32(rng, n)
		h := randF16(rng, n)
		for _, v := range dotVariants {
			b.Run(fmt.Sprintf("F32/%d/%s", n, v.name), func(b *testing.B) {
				b.SetBytes(int64(8 * n))
				b.ReportAllocs()
				var s float32
				for b.Loop() {
					s += v.fn(x, y)
				}
				_ = s
			})
		}
		for _, v := range dotF16Variants {
			b.Run(fmt.Sprintf("F16/%d/%s", n, v.name), func(b *testing.B) {
				b.SetBytes(int64(6 * n))
				b.ReportAllocs()
				var s float32
				for b.Loop() {
					s += v.fn(x, h)
				}
				_ = s
			})
		}
	}
}

func BenchmarkMatMul(b *testing.B) {
	rng := newRand(21)
	types := []quant.Type{quant.F32, quant.F16, quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K}
	pools := map[int]*Pool{1: NewPool(1), 2: NewPool(2)}
	defer pools[1].Close()
	defer pools[2].Close()
	for _, typ := range types {
		for _, sh := range benchShapes {
			rows, cols := sh[0], sh[1]
			if cols%typ.BlockSize() != 0 {
				continue
			}
			m, err := NewMatrix(typ, rows, cols, randWeights(rng, typ, rows, cols))
			if err != nil {
				b.Fatal(err)
			}
			for _, n := range []int{1, 8, 128} {
				x := randF32(rng, n*cols)
				dst := make([]float32, n*rows)
				for _, impl := range append(Tiers(), "dots") {
					if impl == "ref" && n > 8 {
						continue // minutes per shape; ref is the oracle, not a contender
					}
					if impl == "dots" && typ != quant.F32 {
						continue
					}
					for _, threads := range []int{1, 2} {
						name := fmt.Sprintf("%s/%dx%d/n%d/%s/t%d", typ, rows, cols, n, impl, threads)
						b.Run(name, func(b *testing.B) {
							best := Implementation()
							defer SetTier(best)
							if impl == "dots" {
								// F32 as before the tiled kernels: one
								// dot per output, best tier's dot.
								saved := gemmF32Impl
								gemmF32Impl = gemmF32Generic
								defer func() { gemmF32Impl = saved }()
							} else if err := SetTier(impl); err != nil {
								b.Fatal(err)
							}
							b.SetBytes(int64(m.Bytes()))
							b.ReportAllocs()
							for b.Loop() {
								MatMul(pools[threads], dst, m, x, n)
							}
							b.ReportMetric(2*float64(rows*cols*n)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
						})
					}
				}
			}
		}
	}
}

// BenchmarkQTile runs the packed Q8_0/Q4_0 tile kernels on cache-resident
// data (one 16-row weight group of 2048 columns), to separate compute speed
// from memory speed. GMAC/s counts int8 multiply-adds.
func BenchmarkQTile(b *testing.B) {
	rng := newRand(22)
	const cols = 2048
	nb := cols / qk8
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_0} {
		m, err := NewMatrix(typ, qRows, cols, randWeights(rng, typ, qRows, cols))
		if err != nil {
			b.Fatal(err)
		}
		for _, width := range []int{1, 4, 8} {
			x := randF32(rng, width*cols)
			xq, xd, xc := make([]int8, width*cols), make([]float32, width*nb), make([]int32, width*nb)
			for i := 0; i < width; i++ {
				quantizeQ8_0Packed(x[i*cols:(i+1)*cols], width, i, qCorr(typ), xq, xd, xc)
			}
			out := make([]float32, width*qRows)
			for _, v := range qTileVariants {
				if v.name == "ref" {
					continue
				}
				b.Run(fmt.Sprintf("%s/w%d/%s", typ, width, v.name), func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						v.fn(typ, width, 1, m.qw, m.qd, xq, xd, xc, out)
					}
					b.ReportMetric(float64(qRows*cols*width)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
				})
			}
		}
	}
}

// BenchmarkKTile runs the packed Q4_K/Q6_K tile kernels of every tier on
// cache-resident data (one 16-row weight group of 2048 columns).
func BenchmarkKTile(b *testing.B) {
	rng := newRand(23)
	const cols = 2048
	nb := cols / qkK
	for _, typ := range []quant.Type{quant.Q4_K, quant.Q6_K} {
		m, err := NewMatrix(typ, qRows, cols, randWeights(rng, typ, qRows, cols))
		if err != nil {
			b.Fatal(err)
		}
		for _, width := range []int{1, 4} {
			x := randF32(rng, width*cols)
			xq, xd, xp := make([]int8, width*cols), make([]float32, width*nb), make([]int32, width*nb*8)
			for i := 0; i < width; i++ {
				quantizeQ8KPacked(typ, x[i*cols:(i+1)*cols], width, i, xq, xd, xp)
			}
			out := make([]float32, width*qRows)
			for _, v := range kTileVariants {
				b.Run(fmt.Sprintf("%s/w%d/%s", typ, width, v.name), func(b *testing.B) {
					b.ReportAllocs()
					for b.Loop() {
						v.fn(typ, width, 1, m.kw, xq, xd, xp, out)
					}
					b.ReportMetric(float64(qRows*cols*width)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GMAC/s")
				})
			}
		}
	}
}

// BenchmarkMatVecBest is decode's matrix-vector product, one thread, timed
// as the fastest single product of the run rather than the mean: on a
// shared machine the mean measures the other tenants, the best what the
// kernel and the memory manage (other work only ever slows a product).
// bestGB/s counts the bytes the kernel streams (Matrix.StreamBytes, so
// repacked Q6_K counts its 30% extra). 32000x2048 is the 1.1B model's
// output matrix: beyond a 32 MiB L3 for Q4_K, Q6_K and Q8_0; 5632x2048 its
// FFN, partly cache-resident. Compare with bench's read bandwidth.
//
//	go test ./internal/kernels -run '^$' -bench MatVecBest -benchtime 100x
func BenchmarkMatVecBest(b *testing.B) {
	rng := newRand(24)
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_K, quant.Q6_K} {
		for _, sh := range [][2]int{{5632, 2048}, {32000, 2048}} {
			rows, cols := sh[0], sh[1]
			m, err := NewMatrix(typ, rows, cols, randWeights(rng, typ, rows, cols))
			if err != nil {
				b.Fatal(err)
			}
			x := randF32(rng, cols)
			dst := make([]float32, rows)
			for _, tier := range Tiers() {
				if tier == "ref" {
					continue
				}
				b.Run(fmt.Sprintf("%s/%dx%d/%s", typ, rows, cols, tier), func(b *testing.B) {
					installed := Implementation()
					defer SetTier(installed)
					if err := SetTier(tier); err != nil {
						b.Fatal(err)
					}
					best := time.Duration(1<<63 - 1)
					for b.Loop() {
						start := time.Now()
						MatMul(nil, dst, m, x, 1)
						best = min(best, time.Since(start))
					}
					b.ReportMetric(float64(m.StreamBytes())/best.Seconds()/1e9, "bestGB/s")
				})
			}
		}
	}
}

// BenchmarkKStream streams K-quant matrices shaped as eight layers of the
// 1.1B Q4_K_M's (fused QKV 2560x2048, attention output 2048x2048 and
// gate+up 11264x2048 in Q4_K; down 2048x5632 in Q6_K every other layer,
// Q4_K otherwise), about 250 MB carved from one arena as the model loader
// does, so each product reads from memory, not cache, as in decode. It
// reports GB/s of the bytes each type's kernels stream (best pass of the
// run), per tier, with and without K-quant prefetch:
//
//	go test ./internal/kernels -run '^$' -bench KStream -benchtime 5x
func BenchmarkKStream(b *testing.B) {
	rng := newRand(31)
	arena := &hugemem.Arena{}
	var ms []*Matrix
	var bytes [2]int64 // Q4_K, Q6_K
	for l := 0; l < 8; l++ {
		for _, sh := range [][2]int{{2560, 2048}, {2048, 2048}, {11264, 2048}, {2048, 5632}} {
			typ := quant.Q4_K
			if sh[1] == 5632 && l%2 == 0 {
				typ = quant.Q6_K
			}
			m, err := NewMatrixIn(arena, typ, sh[0], sh[1], randWeights(rng, typ, sh[0], sh[1]))
			if err != nil {
				b.Fatal(err)
			}
			ms = append(ms, m)
			bytes[btoi(typ == quant.Q6_K)] += m.StreamBytes()
		}
	}
	x := randF32(rng, 5632)
	dst := make([]float32, 11264)
	installed, pf := Implementation(), KPrefetch()
	defer SetKPrefetch(pf)
	defer SetTier(installed)
	for _, tier := range Tiers() {
		if tier == "ref" {
			continue
		}
		for _, on := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/prefetch=%v", tier, on), func(b *testing.B) {
				if err := SetTier(tier); err != nil {
					b.Fatal(err)
				}
				SetKPrefetch(on)
				best := [2]time.Duration{1<<63 - 1, 1<<63 - 1}
				for b.Loop() {
					var took [2]time.Duration
					for _, m := range ms {
						start := time.Now()
						MatMul(nil, dst[:m.rows], m, x[:m.cols], 1)
						took[btoi(m.kind == quant.Q6_K)] += time.Since(start)
					}
					best[0], best[1] = min(best[0], took[0]), min(best[1], took[1])
				}
				b.ReportMetric(float64(bytes[0])/best[0].Seconds()/1e9, "Q4_K-GB/s")
				b.ReportMetric(float64(bytes[1])/best[1].Seconds()/1e9, "Q6_K-GB/s")
			})
		}
	}
}

func btoi(v bool) int {
	if v {
		return 1
	}
	return 0
}
