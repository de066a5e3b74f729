package model

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"pgregory.net/rapid"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/hugemem"
	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// TestProjFusedMatchesParts is the property fusion rests on: a Proj built
// from 1-3 tensors of any supported type, with row counts that are
// multiples of 16 or not (then only what follows them stays apart), and any
// number of activation rows gives, bit for bit, each tensor's own product,
// whether the tensors were fused into one matrix or not.
func TestProjFusedMatchesParts(t *testing.T) {
	pool := kernels.NewPool(2)
	defer pool.Close()
	types := []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K}
	rapid.Check(t, func(t *rapid.T) {
		typ := rapid.SampledFrom(types).Draw(t, "type")
		block := 32
		if typ == quant.Q4_K || typ == quant.Q6_K {
			block = 256
		}
		cols := block * rapid.IntRange(1, 3).Draw(t, "blocks")
		parts := rapid.IntRange(1, 3).Draw(t, "parts")
		rows := make([]int, parts)
		for i := range rows {
			if rapid.Bool().Draw(t, fmt.Sprintf("aligned%d", i)) {
				rows[i] = 16 * rapid.IntRange(1, 3).Draw(t, fmt.Sprintf("groups%d", i))
			} else {
				rows[i] = rapid.IntRange(1, 40).Draw(t, fmt.Sprintf("rows%d", i))
			}
		}
		wantMats := 1
		for _, r := range rows[:parts-1] {
			if r%16 != 0 {
				wantMats++
			}
		}
		n := rapid.IntRange(1, 19).Draw(t, "n")
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "seed"), 1))

		// One buffer holds the tensors back to back, as a file mapping
		// does, so float tensors fuse too.
		var buf []byte
		var offs []int
		for _, r := range rows {
			vals := make([]float32, r*cols)
			for i := range vals {
				vals[i] = float32(rng.NormFloat64())
			}
			b, err := quant.Quantize(typ, vals)
			if err != nil {
				t.Fatal(err)
			}
			offs = append(offs, len(buf))
			buf = append(buf, b...)
		}
		offs = append(offs, len(buf))
		ts := make([]*gguf.TensorInfo, parts)
		for i, r := range rows {
			ts[i] = &gguf.TensorInfo{Name: fmt.Sprintf("t%d", i), Type: typ,
				Dims: []uint64{uint64(cols), uint64(r)}, Data: buf[offs[i]:offs[i+1]:offs[i+1]]}
		}
		x := make([]float32, n*cols)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}

		fused, err := newProj(nil, true, cols, ts)
		if err != nil {
			t.Fatal(err)
		}
		if len(fused.Matrices()) != wantMats {
			t.Fatalf("tensors of %v rows, one type, adjacent, made %d matrices, want %d", rows, len(fused.Matrices()), wantMats)
		}
		plain, err := newProj(&hugemem.Arena{}, false, cols, ts)
		if err != nil {
			t.Fatal(err)
		}
		var tmp []float32
		got := make([]float32, n*fused.Rows())
		fused.mul(pool, got, x, n, &tmp)
		viaParts := make([]float32, n*plain.Rows())
		plain.mul(pool, viaParts, x, n, &tmp)

		// The reference: each tensor alone, its own MatMul.
		off := 0
		for i, r := range rows {
			m, err := kernels.NewMatrix(typ, r, cols, ts[i].Data)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]float32, n*r)
			kernels.MatMul(pool, want, m, x, n)
			for a := 0; a < n; a++ {
				for o := 0; o < r; o++ {
					w := want[a*r+o]
					for name, out := range map[string][]float32{"fused": got, "unfused": viaParts} {
						if g := out[a*fused.Rows()+off+o]; math.Float32bits(g) != math.Float32bits(w) {
							t.Fatalf("%s: activation row %d, tensor %d row %d: %v, want %v", name, a, i, o, g, w)
						}
					}
				}
			}
			off += r
		}
	})
}

// TestJoinableNeedsAdjacentFloats checks that float tensors, which the
// kernels use in place, fuse only when their bytes are contiguous, and
// quantised ones (copied anyway) whenever the types match.
func TestJoinableNeedsAdjacentFloats(t *testing.T) {
	buf := make([]byte, 64)
	ti := func(typ quant.Type, lo, hi int) *gguf.TensorInfo {
		return &gguf.TensorInfo{Type: typ, Dims: []uint64{1, 32}, Data: buf[lo:hi:hi]}
	}
	for _, tc := range []struct {
		name string
		a, b *gguf.TensorInfo
		want bool
	}{
		{"adjacent F32", ti(quant.F32, 0, 16), ti(quant.F32, 16, 32), true},
		{"gap F32", ti(quant.F32, 0, 16), ti(quant.F32, 20, 36), false},
		{"reversed F16", ti(quant.F16, 16, 32), ti(quant.F16, 0, 16), false},
		{"apart Q8_0", ti(quant.Q8_0, 0, 16), ti(quant.Q8_0, 32, 48), true},
		{"types differ", ti(quant.Q4_K, 0, 16), ti(quant.Q6_K, 16, 32), false},
		{"empty", ti(quant.F32, 0, 0), ti(quant.F32, 0, 16), false},
		{"rows not a multiple of 16", &gguf.TensorInfo{Type: quant.Q8_0, Dims: []uint64{32, 24}, Data: buf[:8]}, ti(quant.Q8_0, 8, 16), false},
	} {
		if got := joinable(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: joinable = %v, want %v", tc.name, got, tc.want)
		}
	}
}
