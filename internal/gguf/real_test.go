package gguf

import (
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// TestOpenModels opens every model in shared/testdata and checks facts the
// README states about each.
func TestOpenModels(t *testing.T) {
	type want struct {
		embd, blocks, heads, headsKV uint64
		embdType, outType            quant.Type
		hasOutput                    bool
	}
	tests := map[string]want{
		"tiny-llama-f32.gguf":           {64, 2, 4, 2, quant.F32, quant.F32, true},
		"tiny-llama-f16.gguf":           {64, 2, 4, 2, quant.F16, quant.F16, true},
		"tiny-llama-q8_0.gguf":          {64, 2, 4, 2, quant.Q8_0, quant.Q8_0, true},
		"tiny-llama-d128-mha-tied.gguf": {128, 3, 8, 8, quant.Q8_0, 0, false},
		"tiny-llama-d256-q4_k_m.gguf":   {256, 2, 4, 2, quant.Q4_K, quant.Q6_K, true},
		"tiny-llama-d256-q4_0.gguf":     {256, 2, 4, 2, quant.Q4_0, quant.Q6_K, true},
	}
	for name, w := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := Open(testdata.Path(t, "models", name))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.Version != 3 || f.Alignment != 32 {
				t.Errorf("version %d alignment %d, want 3 and 32", f.Version, f.Alignment)
			}
			arch, _ := f.String("general.architecture")
			if arch != "llama" {
				t.Errorf("general.architecture = %q", arch)
			}
			got := want{}
			got.embd, _ = f.Uint("llama.embedding_length")
			got.blocks, _ = f.Uint("llama.block_count")
			got.heads, _ = f.Uint("llama.attention.head_count")
			got.headsKV, _ = f.Uint("llama.attention.head_count_kv")
			te, ok := f.Tensor("token_embd.weight")
			if !ok {
				t.Fatal("no token_embd.weight")
			}
			got.embdType = te.Type
			if out, ok := f.Tensor("output.weight"); ok {
				got.hasOutput, got.outType = true, out.Type
			}
			if diff := cmp.Diff(w, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]uint64{w.embd, 32000}, te.Dims); diff != "" {
				t.Errorf("token_embd dims (-want +got):\n%s", diff)
			}
			toks, _ := f.Strings("tokenizer.ggml.tokens")
			scores, _ := f.Float32s("tokenizer.ggml.scores")
			types, _ := f.Int32s("tokenizer.ggml.token_type")
			if len(toks) != 32000 || len(scores) != 32000 || len(types) != 32000 {
				t.Errorf("vocab arrays: %d tokens, %d scores, %d types; want 32000 each", len(toks), len(scores), len(types))
			}
			if len(toks) > 2 && (toks[1] != "<s>" || toks[2] != "</s>") {
				t.Errorf("tokens[1:3] = %q", toks[1:3])
			}
			// Every tensor's data must dequantize when its type is supported.
			for i := range f.Tensors {
				ti := &f.Tensors[i]
				n, _ := quant.RowBytes(ti.Type, int(ti.Dims[0]))
				if uint64(len(ti.Data)) != uint64(n)*ti.Rows() {
					t.Errorf("%s: %d bytes, want %d", ti.Name, len(ti.Data), uint64(n)*ti.Rows())
				}
			}
		})
	}
}

// TestOpenVocabs opens every vocabulary file and checks the token arrays
// agree in length.
func TestOpenVocabs(t *testing.T) {
	files, err := filepath.Glob(testdata.Path(t, "vocab", "*.gguf"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no vocab files (%v)", err)
	}
	for _, p := range files {
		t.Run(filepath.Base(p), func(t *testing.T) {
			f, err := Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			model, ok := f.String("tokenizer.ggml.model")
			if !ok || model == "" {
				t.Errorf("tokenizer.ggml.model missing")
			}
			toks, ok := f.Strings("tokenizer.ggml.tokens")
			if !ok || len(toks) < 1000 {
				t.Errorf("tokenizer.ggml.tokens: %d entries", len(toks))
			}
			if v, ok := f.Lookup("tokenizer.ggml.token_type"); ok && v.Len() != len(toks) {
				t.Errorf("token_type has %d entries, tokens %d", v.Len(), len(toks))
			}
		})
	}
}
