package model_test

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// drop marks a metadata key or tensor that editArch leaves out.
type drop struct{}

// editArch writes spec's builtin GGUF, with the metadata in kv set (or
// left out, for drop{}) and the tensors in tensors replaced by the given
// F32 values (or left out, for nil), and parses it back.
func editArch(t *testing.T, spec model.BuiltinSpec, kv map[string]any, tensors map[string][]float32) *gguf.File {
	t.Helper()
	src := archFile(t, spec)
	w := gguf.NewWriter()
	for _, e := range src.KV {
		var v any = e.Value
		if nv, ok := kv[e.Key]; ok {
			if _, gone := nv.(drop); gone {
				continue
			}
			v = nv
		}
		if err := w.SetKV(e.Key, v); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range kv {
		if _, ok := src.Lookup(k); !ok {
			if err := w.SetKV(k, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range src.Tensors {
		ti := &src.Tensors[i]
		typ, data := ti.Type, ti.Data
		if vals, ok := tensors[ti.Name]; ok {
			if vals == nil {
				continue
			}
			typ, data = quant.F32, must(quant.Quantize(quant.F32, vals))
		}
		if err := w.AddTensor(ti.Name, typ, ti.Dims, data); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func archFile(t *testing.T, spec model.BuiltinSpec) *gguf.File {
	t.Helper()
	w, err := model.BuiltinGGUF(spec)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func tensorValues(t *testing.T, f *gguf.File, name string) []float32 {
	t.Helper()
	ti, ok := f.Tensor(name)
	if !ok {
		t.Fatalf("no tensor %s", name)
	}
	out := make([]float32, ti.Dims[0])
	if err := quant.Dequantize(ti.Type, ti.Data, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestArchLoadErrors: a phi3 or gemma2 file missing what its architecture
// needs, or carrying a value that cannot be right, is refused with an
// error naming the tensor or key.
func TestArchLoadErrors(t *testing.T) {
	phi3, gemma2 := model.Builtins["tiny-phi3"], model.Builtins["tiny-gemma2"]
	for _, tc := range []struct {
		name    string
		spec    model.BuiltinSpec
		kv      map[string]any
		tensors map[string][]float32
		err     error
		says    string
	}{
		{"phi3 without fused qkv", phi3, nil, map[string][]float32{"blk.1.attn_qkv.weight": nil}, model.ErrMissingTensor, "blk.1.attn_qkv.weight"},
		{"phi3 without fused gate/up", phi3, nil, map[string][]float32{"blk.0.ffn_up.weight": nil}, model.ErrMissingTensor, "blk.0.ffn_up.weight"},
		{"phi3 without output", phi3, nil, map[string][]float32{"output.weight": nil}, model.ErrMissingTensor, "output.weight"},
		{"phi3 with one rope factor list", phi3, nil, map[string][]float32{"rope_factors_short.weight": nil}, model.ErrMissingTensor, "rope_factors_short.weight"},
		{"phi3 with a zero rope factor", phi3, nil, map[string][]float32{"rope_factors_short.weight": make([]float32, 16)}, model.ErrBadConfig, "rope_factors_short.weight[0]"},
		{"phi3 without window, unknown shape", phi3, map[string]any{"phi3.attention.sliding_window": drop{}}, nil, model.ErrBadConfig, "phi3.attention.sliding_window"},
		{"phi3 window of another type", phi3, map[string]any{"phi3.attention.sliding_window": "wide"}, nil, model.ErrBadConfig, "phi3.attention.sliding_window"},
		{"phi3 negative attention factor", phi3, map[string]any{"phi3.rope.scaling.attn_factor": float32(-1)}, nil, model.ErrBadConfig, "phi3.rope.scaling.attn_factor"},
		{"gemma2 without post-attention norm", gemma2, nil, map[string][]float32{"blk.0.post_attention_norm.weight": nil}, model.ErrMissingTensor, "blk.0.post_attention_norm.weight"},
		{"gemma2 without post-ffn norm", gemma2, nil, map[string][]float32{"blk.3.post_ffw_norm.weight": nil}, model.ErrMissingTensor, "blk.3.post_ffw_norm.weight"},
		{"gemma2 zero attention soft-cap", gemma2, map[string]any{"gemma2.attn_logit_softcapping": float32(0)}, nil, model.ErrBadConfig, "gemma2.attn_logit_softcapping"},
		{"gemma2 NaN logit soft-cap", gemma2, map[string]any{"gemma2.final_logit_softcapping": float32(math.NaN())}, nil, model.ErrBadConfig, "gemma2.final_logit_softcapping"},
		{"gemma2 window of another type", gemma2, map[string]any{"gemma2.attention.sliding_window": float32(16)}, nil, model.ErrBadConfig, "gemma2.attention.sliding_window"},
		{"another architecture", gemma2, map[string]any{"general.architecture": "falcon"}, nil, model.ErrUnsupportedArch, "supported: llama, qwen2, phi3, gemma2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := model.FromGGUF(editArch(t, tc.spec, tc.kv, tc.tensors))
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %v, want %v naming %q", err, tc.err, tc.says)
			}
		})
	}
}

// TestArchConfig checks the hyper-parameters phi3 and gemma2 files load
// into, llama.cpp b4748's defaults included, where a golden of the other
// branch would need a model llama.cpp refuses or one too big for a test.
func TestArchConfig(t *testing.T) {
	phi3, gemma2 := model.Builtins["tiny-phi3"], model.Builtins["tiny-gemma2"]
	long := phi3
	long.Ctx, long.RopeOrigCtx = 2048, 512
	// Shapes of the released Phi-3 models (their layer counts, contexts
	// and, for the 128k mini, 32 kv heads) and of Gemma 2 27B (46
	// layers), made narrow.
	phi3mini4k := model.BuiltinSpec{Name: "phi3-32", Arch: "phi3", Dim: 32, Layers: 32, Heads: 2, KVHeads: 2, FFN: 32, Ctx: 4096, Type: quant.F32, Seed: 1}
	phi3mini128k := phi3mini4k
	phi3mini128k.Dim, phi3mini128k.Heads, phi3mini128k.KVHeads, phi3mini128k.Ctx = 64, 32, 32, 131072
	gemma27b := model.BuiltinSpec{Name: "gemma2-46", Arch: "gemma2", Dim: 48, Layers: 46, Heads: 4, KVHeads: 2, HeadDim: 8, FFN: 32, Ctx: 8192, Window: 4096, Type: quant.F32, Tied: true, Seed: 1}
	noWindow := map[string]any{"phi3.attention.sliding_window": drop{}}
	for _, tc := range []struct {
		name  string
		spec  model.BuiltinSpec
		kv    map[string]any
		check func(t *testing.T, f *gguf.File, c model.Config)
	}{
		{"phi3", phi3, nil, func(t *testing.T, f *gguf.File, c model.Config) {
			if c.RopeStyle != model.RopeNeox || c.SlidingWindow != 32 || c.WindowedLayers != nil || c.TiedOutput || c.FFNAct != model.ActSiLU {
				t.Errorf("style %d, window %d over %v, tied %v, activation %d", c.RopeStyle, c.SlidingWindow, c.WindowedLayers, c.TiedOutput, c.FFNAct)
			}
			// Context 4096, original 4096: the short factors; the
			// file's attention factor is 1.
			if want := tensorValues(t, f, "rope_factors_short.weight"); !slices.Equal(c.RopeFreqFactors, want) || c.RopeAttnFactor != 0 {
				t.Errorf("rope factors %v (attention factor %g), want the short ones %v", c.RopeFreqFactors, c.RopeAttnFactor, want)
			}
		}},
		{"phi3 long context", long, nil, func(t *testing.T, f *gguf.File, c model.Config) {
			if want := tensorValues(t, f, "rope_factors_long.weight"); !slices.Equal(c.RopeFreqFactors, want) {
				t.Errorf("rope factors %v, want the long ones %v", c.RopeFreqFactors, want)
			}
			if want := float32(math.Sqrt(1 + math.Log(4)/math.Log(512))); c.RopeAttnFactor != want {
				t.Errorf("attention factor %g, want %g", c.RopeAttnFactor, want)
			}
		}},
		{"phi3 window 0 (Phi-4)", phi3, map[string]any{"phi3.attention.sliding_window": uint32(0)}, func(t *testing.T, f *gguf.File, c model.Config) {
			if c.SlidingWindow != 0 {
				t.Errorf("window %d, want none", c.SlidingWindow)
			}
		}},
		{"phi3 window beyond the context", phi3, map[string]any{"phi3.attention.sliding_window": uint32(5000)}, func(t *testing.T, f *gguf.File, c model.Config) {
			if c.SlidingWindow != 0 {
				t.Errorf("window %d over a context of %d, want none", c.SlidingWindow, c.ContextLength)
			}
		}},
		{"phi3 without rope factors", phi3, nil, nil},
		{"phi3-mini-4k shape without window", phi3mini4k, noWindow, func(t *testing.T, f *gguf.File, c model.Config) {
			if c.SlidingWindow != 2047 {
				t.Errorf("window %d, want llama.cpp's 2047", c.SlidingWindow)
			}
		}},
		{"phi3-mini-128k shape without window", phi3mini128k, noWindow, func(t *testing.T, f *gguf.File, c model.Config) {
			if c.SlidingWindow != 0 { // 262144 holds the whole context
				t.Errorf("window %d, want none", c.SlidingWindow)
			}
		}},
		{"gemma2", gemma2, nil, func(t *testing.T, f *gguf.File, c model.Config) {
			if c.RopeStyle != model.RopeNeox || !c.TiedOutput || c.FFNAct != model.ActGELU || c.HeadDim != 32 || c.QDim() != 128 {
				t.Errorf("style %d, tied %v, activation %d, head dim %d, q dim %d", c.RopeStyle, c.TiedOutput, c.FFNAct, c.HeadDim, c.QDim())
			}
			if c.EmbedScale != 8 || c.AttnSoftcap != 2 || c.FinalSoftcap != 5 || c.AttnScale != 0 || c.Scale() != float32(1/math.Sqrt(32)) {
				t.Errorf("embedding scale %g, soft-caps %g and %g, attention scale %g", c.EmbedScale, c.AttnSoftcap, c.FinalSoftcap, c.Scale())
			}
			// llama.cpp: il % 2 == 0 layers use the window.
			for l := range c.Layers {
				if want := map[bool]int{true: 16, false: 0}[l%2 == 0]; c.Window(l) != want {
					t.Errorf("layer %d: window %d, want %d", l, c.Window(l), want)
				}
			}
		}},
		{"gemma2 defaults", gemma2, map[string]any{"gemma2.attn_logit_softcapping": drop{}, "gemma2.final_logit_softcapping": drop{}, "gemma2.attention.sliding_window": drop{}}, func(t *testing.T, f *gguf.File, c model.Config) {
			// 50 and 30, and a window of 4096 that a 2048 context never reaches.
			if c.AttnSoftcap != 50 || c.FinalSoftcap != 30 || c.SlidingWindow != 0 || c.Window(0) != 0 {
				t.Errorf("soft-caps %g and %g, window %d", c.AttnSoftcap, c.FinalSoftcap, c.SlidingWindow)
			}
		}},
		{"gemma2 27B shape", gemma27b, nil, func(t *testing.T, f *gguf.File, c model.Config) {
			// llama.cpp scales the 27B's queries by 1/sqrt(dim/heads), not head dim.
			if want := float32(1 / math.Sqrt(12)); c.Scale() != want || c.Window(0) != 4096 || c.Window(45) != 0 {
				t.Errorf("attention scale %g, want %g; windows %d, %d", c.Scale(), want, c.Window(0), c.Window(45))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tensors := map[string][]float32{}
			if tc.check == nil { // no rope factors at all: plain NeoX RoPE
				tensors = map[string][]float32{"rope_factors_long.weight": nil, "rope_factors_short.weight": nil}
			}
			f := editArch(t, tc.spec, tc.kv, tensors)
			m, err := model.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			if tc.check == nil {
				if m.Config.RopeFreqFactors != nil || m.Config.RopeAttnFactor != 0 {
					t.Errorf("rope factors %v, attention factor %g, want none", m.Config.RopeFreqFactors, m.Config.RopeAttnFactor)
				}
				return
			}
			tc.check(t, f, m.Config)
		})
	}
}

// FuzzArchGGUF runs mutated phi3 and gemma2 files through the loader:
// metadata such as windows, soft-caps, rope factors and head sizes, which
// the architectures read beyond llama's, must load into a model whose
// every per-layer and per-pair list fits what a step indexes, or be
// refused, never panic. (A version that also ran a step of each loaded
// model made 320 000 executions in 45 s without coverage guidance and
// found nothing; under coverage instrumentation a step is too slow to
// fuzz.)
func FuzzArchGGUF(f *testing.F) {
	for _, spec := range []model.BuiltinSpec{
		{Name: "fuzz-phi3", Arch: "phi3", Dim: 16, Layers: 1, Heads: 2, KVHeads: 1, FFN: 32, Ctx: 64, Window: 2, RopeOrigCtx: 32, Type: quant.F32, Seed: 9},
		{Name: "fuzz-gemma2", Arch: "gemma2", Dim: 32, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 16, FFN: 32, Ctx: 64, Window: 2, Type: quant.Q8_0, Tied: true, Seed: 9},
	} {
		w, err := model.BuiltinGGUF(spec)
		if err != nil {
			f.Fatal(err)
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		gf, err := gguf.Parse(data)
		if err != nil {
			return
		}
		m, err := model.FromGGUF(gf)
		if err != nil {
			return
		}
		if err := m.Config.Validate(); err != nil {
			t.Fatalf("loaded a model whose config does not validate: %v", err)
		}
		c := m.Config
		// What a step would index by: a window list per layer, a factor
		// per rotated pair, a post norm per layer or none.
		if (c.WindowedLayers != nil && len(c.WindowedLayers) != c.Layers) || (c.RopeFreqFactors != nil && len(c.RopeFreqFactors) != c.RopeDims/2) {
			t.Fatalf("windows %v over %d layers, %d rope factors for %d dims", c.WindowedLayers, c.Layers, len(c.RopeFreqFactors), c.RopeDims)
		}
		for l, L := range m.W.Layers {
			if (L.PostAttnNorm != nil && len(L.PostAttnNorm) != c.Dim) || (L.PostFFNNorm != nil && len(L.PostFFNNorm) != c.Dim) || L.QKV.Rows() != c.QDim()+2*c.KVDim() || L.GateUp.Rows() != 2*c.FFN {
				t.Fatalf("layer %d: post norms %d and %d for dim %d, qkv %d rows, gate/up %d", l, len(L.PostAttnNorm), len(L.PostFFNNorm), c.Dim, L.QKV.Rows(), L.GateUp.Rows())
			}
		}
	})
}

// TestArchFusedExact: gemma2's Q, K, V and gate, up projections fuse like
// llama's, and phi3's come fused from the file; either way a model loaded
// with every projection apart gives the same logits bit for bit, over
// batched prefill and decode steps, F32 and F16 caches and one or two
// threads.
func TestArchFusedExact(t *testing.T) {
	for _, tc := range []struct {
		name      string
		qkv, gu   int // matrices of the fused model's projections
		pqkv, pgu int // and of the unfused one's
	}{
		{"tiny-gemma2", 1, 1, 3, 2},
		{"tiny-phi3", 1, 1, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fused := builtin(t, tc.name)
			plain, err := model.BuiltinUnfused(tc.name)
			if err != nil {
				t.Fatal(err)
			}
			L, P := &fused.W.Layers[0], &plain.W.Layers[0]
			if got, want := [4]int{len(L.QKV.Matrices()), len(L.GateUp.Matrices()), len(P.QKV.Matrices()), len(P.GateUp.Matrices())}, [4]int{tc.qkv, tc.gu, tc.pqkv, tc.pgu}; got != want {
				t.Fatalf("matrices per projection (fused QKV, GateUp, unfused QKV, GateUp) = %v, want %v", got, want)
			}
			for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
				for _, threads := range []int{1, 2} {
					if err := sameBits(scriptedLogits(t, plain, dt, threads), scriptedLogits(t, fused, dt, threads)); err != nil {
						t.Errorf("kv %v, %d threads: %v", dt, threads, err)
					}
				}
			}
		})
	}
}
