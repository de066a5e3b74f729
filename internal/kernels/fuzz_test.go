package kernels

import (
	"testing"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// FuzzMatrix: weight bytes come from model files, so NewMatrix must reject
// every malformed shape with an error and every accepted matrix must
// survive Row and MatMul (arbitrary bits: NaN/Inf scales, -128 quants)
// without panicking or writing outside dst.
func FuzzMatrix(f *testing.F) {
	rng := newRand(50)
	for _, typ := range weightTypes {
		cols := max(typ.BlockSize(), 32)
		f.Add(uint32(typ), uint8(3), uint16(cols), randWeights(rng, typ, 3, cols))
	}
	f.Add(uint32(quant.Q8_0), uint8(1), uint16(33), make([]byte, 34))
	f.Fuzz(func(t *testing.T, typ uint32, rows uint8, cols uint16, data []byte) {
		m, err := NewMatrix(quant.Type(typ), int(rows), int(cols), data)
		if err != nil {
			return
		}
		row := make([]float32, m.Cols())
		for r := 0; r < m.Rows(); r++ {
			m.Row(r, row)
		}
		x := make([]float32, 2*m.Cols())
		for i := range x {
			x[i] = float32(i%7) - 3
		}
		dst := make([]float32, 2*m.Rows()+1)
		dst[len(dst)-1] = 42
		MatMul(nil, dst, m, x, 2)
		if dst[len(dst)-1] != 42 {
			t.Fatal("MatMul wrote past n*Rows")
		}
	})
}
