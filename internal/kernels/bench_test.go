package kernels

import (
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// Benchmarks report GB/s of weight bytes (b.SetBytes), so a memory-bound
// kernel can be compared directly with the machine's read bandwidth. Each
// case runs the dispatched implementation ("simd") and the plain-Go
// reference ("ref") in the same run. Example:
//
//	go test ./internal/kernels -run '^$' -bench 'MatMul/Q8_0/2048x2048/n1' -benchtime 20x

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
			for _, n := range []int{1, 8} {
				x := randF32(rng, n*cols)
				dst := make([]float32, n*rows)
				for _, impl := range []string{"simd", "ref"} {
					for _, threads := range []int{1, 2} {
						name := fmt.Sprintf("%s/%dx%d/n%d/%s/t%d", typ, rows, cols, n, impl, threads)
						b.Run(name, func(b *testing.B) {
							if impl == "ref" {
								defer useRef()()
							}
							b.SetBytes(int64(m.Bytes()))
							b.ReportAllocs()
							for b.Loop() {
								MatMul(pools[threads], dst, m, x, n)
							}
						})
					}
				}
			}
		}
	}
}
