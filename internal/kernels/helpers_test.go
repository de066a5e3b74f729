package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"

	"github.com/pagewarden/pagewarden/internal/quant"
)

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)) }

func randF32(rng *rand.Rand, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(rng.NormFloat64())
	}
	return out
}

func randF16(rng *rand.Rand, n int) []uint16 {
	out := make([]uint16, n)
	for i := range out {
		out[i] = f32ToF16(float32(rng.NormFloat64()))
	}
	return out
}

// randWeights returns random but well-formed GGML bytes for rows x cols
// weights of type t: any bit pattern is a valid block except a NaN or Inf
// scale, so quants are random and the fp16 scales small and finite.
func randWeights(rng *rand.Rand, t quant.Type, rows, cols int) []byte {
	rb, err := quant.RowBytes(t, cols)
	if err != nil {
		panic(err)
	}
	b := make([]byte, rows*rb)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	scale := func(off int, mag float64) {
		binary.LittleEndian.PutUint16(b[off:], f32ToF16(float32(mag*(0.5+rng.Float64()))))
	}
	switch t {
	case quant.F32:
		for i := 0; i < len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(rng.NormFloat64())))
		}
	case quant.F16:
		for i := 0; i < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], f32ToF16(float32(rng.NormFloat64())))
		}
	case quant.BF16:
		for i := 0; i < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], f32ToBF16(float32(rng.NormFloat64())))
		}
	case quant.Q8_0:
		for o := 0; o < len(b); o += 34 {
			scale(o, 0.01)
		}
	case quant.Q4_0:
		for o := 0; o < len(b); o += 18 {
			scale(o, 0.1)
		}
	case quant.Q4_K:
		for o := 0; o < len(b); o += 144 {
			scale(o, 0.01)
			scale(o+2, 0.005)
		}
	case quant.Q6_K:
		for o := 0; o < len(b); o += 210 {
			scale(o+208, 0.001)
		}
	case quant.Q4_1, quant.Q5_1: // d, then the min
		for o := 0; o < len(b); o += t.BlockBytes() {
			scale(o, 0.01)
			scale(o+2, -0.1)
		}
	case quant.Q5_0, quant.IQ4_NL, quant.IQ4_XS:
		for o := 0; o < len(b); o += t.BlockBytes() {
			scale(o, 0.01)
		}
	case quant.Q5_K:
		for o := 0; o < len(b); o += 176 {
			scale(o, 0.01)
			scale(o+2, 0.005)
		}
	case quant.Q3_K:
		for o := 0; o < len(b); o += 110 {
			scale(o+108, 0.01)
		}
	case quant.Q2_K:
		for o := 0; o < len(b); o += 84 {
			scale(o+80, 0.01)
			scale(o+82, 0.005)
		}
	}
	return b
}

// useRef swaps every implementation for its reference for the duration of
// a test and returns the function that restores them.
func useRef() (restore func()) {
	saved := []any{dotImpl, dotF16Impl, dotBF16Impl, axpyImpl, axpyF16Impl, f16ToF32sImpl, qTileImpl, gemmF32Impl, kTileImpl, quantKImpl, quantQ8Impl, siluMulImpl, softmaxImpl}
	dotImpl, dotF16Impl, dotBF16Impl = dotRef, dotF16Ref, dotBF16Ref
	axpyImpl, axpyF16Impl, f16ToF32sImpl = axpyRef, axpyF16Ref, f16ToF32sRef
	qTileImpl, gemmF32Impl, kTileImpl, quantKImpl = qTileRef, gemmF32Ref, kTileRef, quantizeQ8KPacked
	quantQ8Impl = quantizeQ8_0Packed
	siluMulImpl, softmaxImpl = siluMulRef, softmaxRef
	return func() {
		dotImpl = saved[0].(func([]float32, []float32) float32)
		dotF16Impl = saved[1].(func([]float32, []uint16) float32)
		dotBF16Impl = saved[2].(func([]float32, []uint16) float32)
		axpyImpl = saved[3].(func([]float32, float32, []float32))
		axpyF16Impl = saved[4].(func([]float32, float32, []uint16))
		f16ToF32sImpl = saved[5].(func([]float32, []uint16))
		qTileImpl = saved[6].(qTileFn)
		gemmF32Impl = saved[7].(gemmF32Fn)
		kTileImpl = saved[8].(kTileFn)
		quantKImpl = saved[9].(quantKFn)
		quantQ8Impl = saved[10].(quantQ8Fn)
		siluMulImpl = saved[11].(func([]float32, []float32, []float32))
		softmaxImpl = saved[12].(func([]float32))
	}
}
