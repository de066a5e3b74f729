package model_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// TestFusedProjectionsExact checks that fusing the Q/K/V and gate/up
// projections into one matrix each changes no bit of any output: every
// model the tests know, loaded fused and unfused, runs the same steps
// (prefill chunks, a mixed batch, decodes; F32 and F16 caches; one and two
// threads) and must give identical logits. It also checks that the fusion
// really happened, or the comparison would prove nothing.
func TestFusedProjectionsExact(t *testing.T) {
	type source struct {
		name string
		load func(t *testing.T, fuse bool) *model.Model
		// matrices per fused projection (QKV, GateUp) of each layer; one
		// entry stands for every layer
		want [][2]int
	}
	all := [][2]int{{1, 1}}
	var sources []source
	for _, name := range []string{"tiny", "tiny-f16", "tiny-bf16", "tiny-q8_0", "d256-q4_0", "tiny-short"} {
		sources = append(sources, source{name: "builtin:" + name, want: all,
			load: func(t *testing.T, fuse bool) *model.Model {
				if fuse {
					return builtin(t, name)
				}
				m, err := model.BuiltinUnfused(name)
				if err != nil {
					t.Fatal(err)
				}
				return m
			}})
	}
	for _, f := range []struct {
		file string
		want [][2]int
	}{
		{"tiny-llama-f32.gguf", all},
		{"tiny-llama-f16.gguf", all},
		{"tiny-llama-q8_0.gguf", all},
		{"tiny-llama-d128-mha-tied.gguf", all},
		// Layer 1 of this Q4_K_M file has attn_v in Q6_K: Q and K fuse,
		// V stays apart (and so does the unfused path's copy-out).
		{"tiny-llama-d256-q4_k_m.gguf", [][2]int{{1, 1}, {2, 1}}},
		{"tiny-llama-d256-q4_0.gguf", all},
	} {
		sources = append(sources, source{name: f.file, want: f.want,
			load: func(t *testing.T, fuse bool) *model.Model {
				g, err := gguf.Open(testdata.Path(t, "models", f.file))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { g.Close() })
				load := model.FromGGUF
				if !fuse {
					load = model.FromGGUFUnfused
				}
				m, err := load(g)
				if err != nil {
					t.Fatal(err)
				}
				return m
			}})
	}
	// The llama2.c converter writes w1, w2, w3 (gate, down, up): the F32
	// gate and up are not adjacent, so only Q, K and V fuse.
	sources = append(sources, source{name: "stories260K", want: [][2]int{{1, 2}},
		load: func(t *testing.T, fuse bool) *model.Model {
			bin, tok := testdata.Path(t, "models", "stories260K.bin"), testdata.Path(t, "models", "tok512.bin")
			load := model.LoadLlama2C
			if !fuse {
				load = model.LoadLlama2CUnfused
			}
			m, err := load(bin, tok)
			if err != nil {
				t.Fatal(err)
			}
			return m
		}})

	threadCounts := []int{1, 2}
	if testing.Short() || raceEnabled {
		// The reference kernels (purego) and the race detector make the
		// 32000-token output products slow; two threads cover more.
		threadCounts = threadCounts[1:]
	}
	for _, src := range sources {
		t.Run(src.name, func(t *testing.T) {
			fused, plain := src.load(t, true), src.load(t, false)
			for l := range fused.W.Layers {
				L, P := &fused.W.Layers[l], &plain.W.Layers[l]
				got := [4]int{len(L.QKV.Matrices()), len(L.GateUp.Matrices()), len(P.QKV.Matrices()), len(P.GateUp.Matrices())}
				w := src.want[min(l, len(src.want)-1)]
				if want := [4]int{w[0], w[1], 3, 2}; got != want {
					t.Fatalf("layer %d: matrices per projection (fused QKV, GateUp, unfused QKV, GateUp) = %v, want %v", l, got, want)
				}
				if L.QKV.Rows() != P.QKV.Rows() || L.GateUp.Rows() != P.GateUp.Rows() {
					t.Fatalf("layer %d: fused widths %d, %d; unfused %d, %d", l, L.QKV.Rows(), L.GateUp.Rows(), P.QKV.Rows(), P.GateUp.Rows())
				}
			}
			for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
				for _, threads := range threadCounts {
					want := scriptedLogits(t, plain, dt, threads)
					gotL := scriptedLogits(t, fused, dt, threads)
					if err := sameBits(want, gotL); err != nil {
						t.Errorf("kv %v, %d threads: %v", dt, threads, err)
					}
				}
			}
		})
	}
}

// scriptedLogits runs a fixed script of steps on m and returns every
// logit it produced: two prefills (one wanting all positions), a step that
// mixes a decode with a 5-token chunk, single decodes and batched decodes.
func scriptedLogits(t *testing.T, m *model.Model, dt kvcache.DType, threads int) [][]float32 {
	r := newRunner(t, m, dt, 64)
	r.compute = computePool(t, threads)
	v := m.Config.Vocab
	a, b := r.seq("a"), r.seq("b")
	var out [][]float32
	out = append(out, r.step(part{a, tokens(1, 21, v), model.LogitsAll})...)
	out = append(out, r.step(part{b, tokens(2, 7, v), model.LogitsLast})...)
	out = append(out, r.step(part{a, tokens(3, 1, v), model.LogitsLast}, part{b, tokens(4, 5, v), model.LogitsAll})...)
	for i := range 3 {
		out = append(out, r.step(part{a, tokens(uint32(10+i), 1, v), model.LogitsLast})...)
	}
	for i := range 2 {
		out = append(out, r.step(part{a, tokens(uint32(20+i), 1, v), model.LogitsLast}, part{b, tokens(uint32(30+i), 1, v), model.LogitsLast})...)
	}
	return out
}

// sameBits reports the first difference between two lists of rows, bit
// for bit (so -0 differs from 0 and NaNs are compared by payload).
func sameBits(want, got [][]float32) error {
	if len(want) != len(got) {
		return fmt.Errorf("%d rows, want %d", len(got), len(want))
	}
	for i := range want {
		if len(want[i]) != len(got[i]) {
			return fmt.Errorf("row %d has %d values, want %d", i, len(got[i]), len(want[i]))
		}
		for j := range want[i] {
			if math.Float32bits(want[i][j]) != math.Float32bits(got[i][j]) {
				return fmt.Errorf("row %d value %d is %v, want %v", i, j, got[i][j], want[i][j])
			}
		}
	}
	return nil
}
