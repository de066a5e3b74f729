package quant

import (
	"math/rand/v2"
	"testing"
)

var benchTypes = []Type{F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS}

// BenchmarkDequantize measures decoding a 4096-element row (SetBytes is
// the output size, so MB/s compare across types).
func BenchmarkDequantize(b *testing.B) {
	const n = 4096
	rng := rand.New(rand.NewPCG(1, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for _, typ := range benchTypes {
		src, err := Quantize(typ, x)
		if err != nil {
			b.Fatal(err)
		}
		dst := make([]float32, n)
		b.Run(typ.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(4 * n)
			for b.Loop() {
				if err := Dequantize(typ, src, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkQuantize(b *testing.B) {
	const n = 4096
	rng := rand.New(rand.NewPCG(1, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for _, typ := range benchTypes {
		b.Run(typ.String(), func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(4 * n)
			for b.Loop() {
				if _, err := Quantize(typ, x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
