package quant_test

import (
	"bytes"
	"math"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

func openModel(t testing.TB, name string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(testdata.Path(t, "models", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// maxCheck caps the elements decoded per tensor (whole rows, from the
// start) so the test stays fast under -race; 2^18 values is 1024 K-quant
// blocks, plenty to expose a layout mistake.
const maxCheck = 1 << 18

func dequantTensor(t testing.TB, ti *gguf.TensorInfo) []float32 {
	t.Helper()
	n := ti.Elements()
	if n > maxCheck {
		n = maxCheck / ti.Dims[0] * ti.Dims[0]
	}
	out := make([]float32, n)
	if err := quant.Dequantize(ti.Type, ti.Data, out); err != nil {
		t.Fatalf("%s: %v", ti.Name, err)
	}
	return out
}

type stats struct{ mean, std, maxAbs float64 }

func describe(x []float32) (s stats, finite bool) {
	var sum, sum2 float64
	for _, v := range x {
		f := float64(v)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return s, false
		}
		sum += f
		sum2 += f * f
		s.maxAbs = max(s.maxAbs, math.Abs(f))
	}
	n := float64(len(x))
	s.mean = sum / n
	s.std = math.Sqrt(sum2/n - s.mean*s.mean)
	return s, true
}

// TestRealFilesCrossCheck uses the two d256 files, which llama-quantize made
// from one F32 model: each weight matrix appears as Q4_K or Q6_K in one and
// Q4_0 or Q6_K in the other. Dequantized, the two encodings of a tensor must
// agree to within the formats' error, which catches any layout mistake in
// either dequantizer (a misplaced nibble or scale decorrelates them).
func TestRealFilesCrossCheck(t *testing.T) {
	km := openModel(t, "tiny-llama-d256-q4_k_m.gguf")
	q0 := openModel(t, "tiny-llama-d256-q4_0.gguf")
	seen := map[quant.Type]bool{}
	for i := range km.Tensors {
		a := &km.Tensors[i]
		b, ok := q0.Tensor(a.Name)
		if !ok {
			t.Fatalf("%s missing from the Q4_0 file", a.Name)
		}
		x, y := dequantTensor(t, a), dequantTensor(t, b)
		sx, okx := describe(x)
		sy, oky := describe(y)
		if !okx || !oky {
			t.Fatalf("%s: non-finite values (%s finite=%v, %s finite=%v)", a.Name, a.Type, okx, b.Type, oky)
		}
		if a.Type == quant.F32 {
			continue // norms: all 1.0 in both
		}
		seen[a.Type], seen[b.Type] = true, true
		if sx.std == 0 || sx.maxAbs > 100*sx.std {
			t.Errorf("%s (%s): implausible distribution %+v", a.Name, a.Type, sx)
		}
		if a.Type == b.Type && !bytes.Equal(a.Data, b.Data) {
			t.Errorf("%s: both files hold %s but the bytes differ", a.Name, a.Type)
		}
		var se, ss float64
		for k := range x {
			d := float64(x[k] - y[k])
			se += d * d
			ss += float64(x[k]) * float64(x[k])
		}
		rel := math.Sqrt(se / ss)
		// Q4_0 vs Q4_K each carry ~8% RMS error; independent errors add.
		if rel > 0.15 {
			t.Errorf("%s: %s vs %s relative RMS difference %.3f (stats %+v vs %+v)", a.Name, a.Type, b.Type, rel, sx, sy)
		}
	}
	for _, typ := range []quant.Type{quant.Q4_K, quant.Q6_K, quant.Q4_0} {
		if !seen[typ] {
			t.Errorf("no %s tensor was cross-checked", typ)
		}
	}
}

// TestRequantizeRealBlocks re-quantizes llama.cpp's own blocks after
// dequantizing them. The reference quantizers are not idempotent in
// general, but on llama.cpp's output they should reproduce nearly every
// block; a systematic mismatch would mean our quantizer does not follow
// ggml's reference.
func TestRequantizeRealBlocks(t *testing.T) {
	for _, tc := range []struct {
		file, tensor string
		min          float64 // fraction of blocks reproduced exactly
	}{
		{"tiny-llama-d256-q4_0.gguf", "blk.0.attn_q.weight", 0.99},
		{"tiny-llama-d256-q4_0.gguf", "output.weight", 0.7},
		{"tiny-llama-d256-q4_k_m.gguf", "blk.0.attn_q.weight", 0.95},
		{"tiny-llama-q8_0.gguf", "blk.0.attn_q.weight", 0.99},
	} {
		f := openModel(t, tc.file)
		ti, ok := f.Tensor(tc.tensor)
		if !ok {
			t.Fatalf("%s: no %s", tc.file, tc.tensor)
		}
		x := dequantTensor(t, ti)
		b, err := quant.Quantize(ti.Type, x)
		if err != nil {
			t.Fatal(err)
		}
		bs := ti.Type.BlockBytes()
		same := 0
		for k := 0; k < len(b); k += bs {
			if bytes.Equal(b[k:k+bs], ti.Data[k:k+bs]) {
				same++
			}
		}
		frac := float64(same) / float64(len(b)/bs)
		t.Logf("%s %s (%s): %.3f of blocks reproduced", tc.file, tc.tensor, ti.Type, frac)
		if frac < tc.min {
			t.Errorf("%s %s (%s): only %.3f of blocks reproduced, want >= %.2f", tc.file, tc.tensor, ti.Type, frac, tc.min)
		}
	}
}
