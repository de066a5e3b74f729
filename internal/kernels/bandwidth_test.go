package kernels

import (
	"testing"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// TestReadBandwidth checks that the measurement reads what it says: a
// buffer too small for one chunk gives 0, and a real one gives a rate
// between what any machine manages (0.1 GB/s) and far above any memory
// bus (10 TB/s). A pass that skipped its reads would give an absurd rate.
func TestReadBandwidth(t *testing.T) {
	if got := ReadBandwidth(nil, make([]float32, bwChunk-1), 3); got != 0 {
		t.Errorf("buffer under one chunk: %g B/s, want 0", got)
	}
	buf := make([]float32, 16*bwChunk) // 8 MiB: cache speed, still a rate
	for i := range buf {
		buf[i] = float32(i % 7)
	}
	for _, threads := range []int{1, 2} {
		p := NewPool(threads)
		bw := ReadBandwidth(p, buf, 3)
		p.Close()
		if bw < 1e8 || bw > 1e13 {
			t.Errorf("%d threads: %.3g B/s is not a memory bandwidth", threads, bw)
		}
	}
}

// TestStreamBytes checks the byte accounting of the bandwidth share: float
// matrices read their GGML size, Q8_0 and Q4_K within 3% above it (the
// repacking keeps them), Q6_K about 30% above (its values unpacked to
// bytes), as the package comment promises.
func TestStreamBytes(t *testing.T) {
	const rows, cols = 32, 512
	tests := []struct {
		typ      quant.Type
		min, max float64 // StreamBytes / Bytes
	}{
		{quant.F32, 1, 1},
		{quant.F16, 1, 1},
		{quant.Q8_0, 1, 1.03},
		{quant.Q4_0, 1, 1.03},
		{quant.Q4_K, 1, 1.03},
		{quant.Q6_K, 1.25, 1.35},
	}
	for _, tc := range tests {
		rb, err := quant.RowBytes(tc.typ, cols)
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, rows*rb)
		m, err := NewMatrix(tc.typ, rows, cols, data)
		if err != nil {
			t.Fatal(err)
		}
		r := float64(m.StreamBytes()) / float64(m.Bytes())
		if r < tc.min || r > tc.max {
			t.Errorf("%s: StreamBytes %d / Bytes %d = %.3f, want %.2f..%.2f", tc.typ, m.StreamBytes(), m.Bytes(), r, tc.min, tc.max)
		}
	}
}
