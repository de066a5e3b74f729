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

// FuzzGemmF32: the F32 products of every tier agree with one reference dot
// per output (to the differential test's tolerance) on weights and
// activations made of arbitrary bytes (finite float32 patterns; others are
// mapped to small values), for shapes the bytes choose: tails of every
// length, one to seven activation rows, row ranges that leave rows outside
// the groups of four; nothing outside the range is written.
func FuzzGemmF32(f *testing.F) {
	f.Add(uint16(37), uint8(3), uint8(1), []byte("weights and activations from any bytes: 0123456789abcdef"))
	f.Add(uint16(8), uint8(1), uint8(0), make([]byte, 64))
	f.Fuzz(func(t *testing.T, cols16 uint16, nb, r0b uint8, data []byte) {
		cols := 1 + int(cols16%1100)
		n := 1 + int(nb%7)
		if len(data) == 0 {
			return
		}
		val := func(k int) float32 {
			var b [4]byte
			for j := range b {
				b[j] = data[(4*k+j)%len(data)]
			}
			v := math.Float32frombits(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) || math.Abs(float64(v)) > 1e15 || math.Abs(float64(v)) < 1e-15 {
				return float32(int8(b[0]^byte(k))) / 16
			}
			return v
		}
		rows := 1 + len(data)%13
		r0 := int(r0b) % rows
		w := make([]float32, rows*cols)
		for k := range w {
			w[k] = val(k)
		}
		x := make([]float32, n*cols)
		for k := range x {
			x[k] = val(len(w) + 3*k)
		}
		ds := rows + 1
		for _, v := range gemmF32Variants[1:] {
			got, check := guarded(t, n*ds, int(nb)%3)
			for i := range got {
				got[i] = sentinel
			}
			v.fn(got, ds, w, cols, r0, rows, x, n)
			check()
			for i := 0; i < n; i++ {
				for r := 0; r < ds; r++ {
					g := got[i*ds+r]
					if r < r0 || r >= rows {
						if math.Float32bits(g) != math.Float32bits(sentinel) {
							t.Fatalf("%s: wrote dst[%d][%d] outside rows [%d, %d)", v.name, i, r, r0, rows)
						}
						continue
					}
					wr, xi := w[r*cols:(r+1)*cols], x[i*cols:(i+1)*cols]
					want := dotRef(xi, wr)
					if math.Abs(float64(g-want)) > tolDot(wr, func(j int) float32 { return xi[j] }) {
						t.Fatalf("%s cols %d n %d: dst[%d][%d] = %g, reference %g", v.name, cols, n, i, r, g, want)
					}
				}
			}
		}
	})
}
