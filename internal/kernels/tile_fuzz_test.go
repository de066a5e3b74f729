package kernels

import (
	"math"
	"testing"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// sameBits reports whether two results are the same float, counting any
// two NaNs as equal (weight bytes from a file may hold NaN or Inf scales,
// and which NaN payload survives depends on operand order).
func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b
}

// FuzzTiles: the quantised tile kernels of every tier agree with the
// reference, bit for bit, on weights made of arbitrary bytes (any scales,
// NaN and Inf included, any quants) against activations built from
// arbitrary bytes, for every group width, with one or two weight groups
// per call; and write nothing outside their output.
func FuzzTiles(f *testing.F) {
	rng := newRand(60)
	for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K} {
		f.Add(uint8(typ), uint8(5), randWeights(rng, typ, 2*qRows, 256), []byte("activations: any bytes at all, scaled"))
	}
	f.Fuzz(func(t *testing.T, typByte, shape uint8, data, xs []byte) {
		typ := []quant.Type{quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K}[typByte%4]
		ng := 1 + int(shape%2)
		rows := ng * qRows
		bs := typ.BlockBytes()
		nbl := len(data) / (rows * bs) // blocks per row the bytes allow
		if nbl == 0 {
			return
		}
		nbl = min(nbl, 4)
		cols := nbl * typ.BlockSize()
		m, err := NewMatrix(typ, rows, cols, data[:rows*nbl*bs])
		if err != nil {
			t.Fatalf("NewMatrix refused well-sized %s bytes: %v", typ, err)
		}
		widths := []int{1, 4, 8}
		if m.kw != nil {
			widths = []int{1, 4}
		}
		width := widths[int(shape/2)%len(widths)]
		x := make([]float32, width*cols)
		for i := range x {
			b := byte(i * 7)
			if len(xs) > 0 {
				b = xs[i%len(xs)] ^ byte(i/len(xs))
			}
			x[i] = float32(int8(b)) * float32(1+int(shape/8)) / 16
		}
		want := make([]float32, ng*width*qRows)
		if m.kw != nil {
			xq, xd, xp := make([]int8, width*cols), make([]float32, width*nbl), make([]int32, width*nbl*8)
			for i := 0; i < width; i++ {
				quantizeQ8KPacked(typ, x[i*cols:(i+1)*cols], width, i, xq, xd, xp)
			}
			kTileRef(typ, width, ng, m.kw, xq, xd, xp, want)
			for _, v := range kTileVariants[1:] {
				got, check := guarded(t, len(want), int(shape%5))
				v.fn(typ, width, ng, m.kw, xq, xd, xp, got)
				check()
				compareTile(t, v.name, typ, width, want, got)
			}
			return
		}
		xq, xd, xc := make([]int8, width*cols), make([]float32, width*nbl), make([]int32, width*nbl)
		for i := 0; i < width; i++ {
			quantizeQ8_0Packed(x[i*cols:(i+1)*cols], width, i, qCorr(typ), xq, xd, xc)
		}
		qTileRef(typ, width, ng, m.qw, m.qd, xq, xd, xc, want)
		for _, v := range qTileVariants[1:] {
			got, check := guarded(t, len(want), int(shape%5))
			v.fn(typ, width, ng, m.qw, m.qd, xq, xd, xc, got)
			check()
			compareTile(t, v.name, typ, width, want, got)
		}
	})
}

func compareTile(t *testing.T, name string, typ quant.Type, width int, want, got []float32) {
	t.Helper()
	for i := range want {
		if !sameBits(want[i], got[i]) {
			t.Fatalf("%s %s width %d: out[%d] = %g (%#x), reference %g (%#x)", name, typ, width, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}
