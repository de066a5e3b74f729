package kernels

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// The kernels keep private copies of the half conversions and block
// decoders (they sit in inner loops); these tests pin them to package
// quant, the project's definition of the formats.

func TestHalfMatchesQuant(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		a, b := f16ToF32(h), quant.F16ToF32(h)
		if math.IsNaN(float64(a)) && math.IsNaN(float64(b)) {
			continue
		}
		if math.Float32bits(a) != math.Float32bits(b) {
			t.Fatalf("F16 %#04x: kernels %v, quant %v", h, a, b)
		}
	}
	rng := newRand(40)
	for i := 0; i < 100000; i++ {
		f := math.Float32frombits(rng.Uint32())
		if math.IsNaN(float64(f)) {
			continue
		}
		if a, b := f32ToF16(f), quant.F32ToF16(f); a != b {
			t.Fatalf("F32ToF16(%v): kernels %#04x, quant %#04x", f, a, b)
		}
	}
}

// TestRowMatchesQuantDequantize: Matrix.Row gives the same bits as
// quant.Dequantize of the GGML row, for every supported type, on weights
// that quant.Quantize produced (real block statistics, not random bytes).
func TestRowMatchesQuantDequantize(t *testing.T) {
	rng := newRand(41)
	for _, typ := range weightTypes {
		rows, cols := 5, 512
		src := randF32(rng, rows*cols)
		data, err := quant.Quantize(typ, src)
		if err != nil {
			t.Fatalf("%s: Quantize: %v", typ, err)
		}
		m, err := NewMatrix(typ, rows, cols, data)
		if err != nil {
			t.Fatal(err)
		}
		rb, _ := quant.RowBytes(typ, cols)
		got, want := make([]float32, cols), make([]float32, cols)
		for r := 0; r < rows; r++ {
			m.Row(r, got)
			if err := quant.Dequantize(typ, data[r*rb:(r+1)*rb], want); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("%s row %d: Row vs quant.Dequantize (-quant +kernels):\n%s", typ, r, diff)
			}
		}
		// And the product on these weights tracks the dequantised product
		// with float activations to quantisation accuracy (a sanity check
		// that the activation quantisation is in the right units).
		x := randF32(rng, cols)
		out := make([]float32, rows)
		MatMul(nil, out, m, x, 1)
		for r := 0; r < rows; r++ {
			m.Row(r, got)
			var exact, mag float64
			for j := range got {
				exact += float64(got[j]) * float64(x[j])
				mag += math.Abs(float64(got[j]) * float64(x[j]))
			}
			if math.Abs(float64(out[r])-exact) > 0.02*mag {
				t.Errorf("%s row %d: product %g vs float product %g (mag %g)", typ, r, out[r], exact, mag)
			}
		}
	}
}
