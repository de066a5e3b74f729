package model

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"testing"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// ggmlGELUSHA256 is the sha256 of ggml_gelu's output for every F16 value
// (input i is the F16 with bits i, i = 0..65535; 65536 little-endian
// float32 outputs, NaNs written as 0x7fc00000). It was made with llama.cpp
// c392e5094 (b4748) outside the repository: a small C program on ggml
// built as for the golden files (gcc -O3 -march=native, AVX-512 EPYC)
// that computes ggml_gelu of a 65536-element F32 tensor holding those
// values on the CPU backend, one thread.
const ggmlGELUSHA256 = "9a4f809d993f7215521aedc597b63cde4ce5cb531644434cb3958fcda228de23"

// TestGELUMatchesGGML: geluMul with up = 1 gives ggml_gelu's outputs, bit
// for bit, at every F16 input; gemma2's feed-forward runs on it.
func TestGELUMatchesGGML(t *testing.T) {
	x := make([]float32, 1<<16)
	one := make([]float32, 1<<16)
	for i := range x {
		x[i] = quant.F16ToF32(uint16(i))
		one[i] = 1
	}
	y := make([]float32, 1<<16)
	geluMul(y, x, one)
	h := sha256.New()
	var b [4]byte
	for _, v := range y {
		u := math.Float32bits(v)
		if v != v {
			u = 0x7fc00000
		}
		binary.LittleEndian.PutUint32(b[:], u)
		h.Write(b[:])
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != ggmlGELUSHA256 {
		t.Errorf("GELU over every F16 input: sha256 %s, ggml's %s", got, ggmlGELUSHA256)
	}
}

// TestGELUMul checks the shape of geluMul around its table: values of the
// tanh approximation rounded to F16, the cut-offs at ±10, the product by
// up, and dst aliasing gate.
func TestGELUMul(t *testing.T) {
	for _, tc := range []struct {
		x, up, want float32
		tol         float64 // relative
	}{
		{0, 1, 0, 0},
		{1, 1, 0.841192, 1e-3},   // 0.5(1+tanh(sqrt(2/pi)(1+0.044715)))
		{-1, 1, -0.158808, 2e-3}, // gelu(-1) = -1 + gelu(1)
		{2, 3, 3 * 1.954598, 1e-3},
		{-9.99, 1, 0, 1e-3}, // from the table: below F16's smallest step
		{-10, 1, 0, 0},      // cut-off: 0
		{-1e30, 1, 0, 0},
		{10, 2, 20, 0}, // cut-off: the identity
		{1e30, 1, 1e30, 0},
	} {
		gate := []float32{tc.x}
		geluMul(gate, gate, []float32{tc.up})
		got := gate[0]
		if d := math.Abs(float64(got - tc.want)); d > tc.tol*math.Max(1, math.Abs(float64(tc.want))) {
			t.Errorf("gelu(%g)*%g = %g, want %g", tc.x, tc.up, got, tc.want)
		}
	}
}
