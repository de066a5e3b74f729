package model_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/llama2c"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/sample"
	"github.com/pagewarden/pagewarden/internal/testdata"
	"github.com/pagewarden/pagewarden/internal/tokenizer"
)

// patchTensorType overwrites the type field of tensor name's info record in
// a GGUF image (name, n_dims, dims, type), to make a type id that no writer
// would produce.
func patchTensorType(t *testing.T, img []byte, name string, typ uint32) []byte {
	t.Helper()
	var rec bytes.Buffer
	binary.Write(&rec, binary.LittleEndian, uint64(len(name)))
	rec.WriteString(name)
	i := bytes.Index(img, rec.Bytes())
	if i < 0 {
		t.Fatalf("tensor info %q not found", name)
	}
	out := bytes.Clone(img)
	p := i + rec.Len()
	nd := int(binary.LittleEndian.Uint32(out[p:]))
	binary.LittleEndian.PutUint32(out[p+4+8*nd:], typ)
	return out
}

// TestLoadCorrupt feeds Load model files broken in each way a download or
// a wrong file can be, and checks each is refused with an error that names
// the problem (and the sentinel callers branch on), never a panic.
func TestLoadCorrupt(t *testing.T) {
	const base = "tiny"
	img := builtinImage(t, base)
	f := parse(t, img)
	good := builtin(t, base)
	c := good.Config
	vocab, dim, kvdim := c.Vocab, c.Dim, c.KVDim()
	f32 := func(n int) []byte { return make([]byte, 4*n) }
	tokens, _ := f.Strings("tokenizer.ggml.tokens")
	scores, _ := f.Float32s("tokenizer.ggml.scores")
	types, _ := f.Int32s("tokenizer.ggml.token_type")
	grow := func(n int) ggufEdit {
		ts, ss, ty := append([]string(nil), tokens...), append([]float32(nil), scores...), append([]int32(nil), types...)
		for i := len(ts); i < n; i++ {
			ts, ss, ty = append(ts, fmt.Sprintf("<extra_%d>", i)), append(ss, 0), append(ty, 1)
		}
		return ggufEdit{setKV: map[string]any{"tokenizer.ggml.tokens": ts[:n], "tokenizer.ggml.scores": ss[:n], "tokenizer.ggml.token_type": ty[:n]}}
	}
	edit := func(e ggufEdit) []byte { return rewrite(t, f, e) }
	kv := func(k string, v any) []byte { return edit(ggufEdit{setKV: map[string]any{k: v}}) }
	vocabOnly, err := os.ReadFile(testdata.Path(t, "vocab", "ggml-vocab-llama-spm.gguf"))
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name string
		data []byte
		err  error    // sentinel, nil when the message is the contract
		msg  []string // substrings the error must contain
	}{
		// Transport damage.
		{"truncated in the magic", img[:3], nil, []string{"not a GGUF file"}},
		{"truncated after the magic", img[:6], nil, []string{"gguf", "file has 6"}},
		{"truncated in the header", img[:20], nil, []string{"gguf", "file has 20"}},
		{"truncated in the metadata", img[:200], nil, []string{"gguf", "cannot fit"}},
		{"truncated in the tensor data", img[:len(img)/2], nil, []string{"gguf", "past end of file"}},
		{"truncated by one byte", img[:len(img)-1], nil, []string{"gguf", "past end of file"}},
		{"unknown tensor type id", patchTensorType(t, img, "blk.0.attn_q.weight", 99), nil, []string{"blk.0.attn_q.weight", "unknown tensor type 99"}},

		// Files that parse but are not a model we can run.
		{"vocabulary-only GGUF", vocabOnly, model.ErrMissingTensor, []string{"no tensors"}},
		{"architecture gpt2", kv("general.architecture", "gpt2"), model.ErrUnsupportedArch, []string{`"gpt2"`, "llama"}},
		{"architecture bert", kv("general.architecture", "bert"), model.ErrUnsupportedArch, []string{`"bert"`}},
		{"no architecture", edit(ggufEdit{dropKV: []string{"general.architecture"}}), model.ErrUnsupportedArch, []string{"general.architecture is missing"}},
		{"tensor type we cannot compute with", edit(ggufEdit{setTensor: map[string]tensorSpec{
			"blk.0.attn_q.weight": {quant.MXFP4, []uint64{uint64(dim), uint64(dim)}, make([]byte, dim*dim/32*17)}}}),
			nil, []string{"blk.0.attn_q.weight", "has type MXFP4", "cannot compute with", "Q5_0, Q5_1", "IQ4_XS"}},

		// Tensors that disagree with the metadata.
		{"wrong shape", edit(ggufEdit{setTensor: map[string]tensorSpec{
			"blk.1.attn_k.weight": {quant.F32, []uint64{uint64(dim), uint64(dim)}, f32(dim * dim)}}}),
			model.ErrBadShape, []string{"blk.1.attn_k.weight", fmt.Sprintf("want [%d %d]", dim, kvdim)}},
		{"transposed matrix", edit(ggufEdit{setTensor: map[string]tensorSpec{
			"blk.0.ffn_down.weight": {quant.F32, []uint64{uint64(dim), uint64(c.FFN)}, f32(dim * c.FFN)}}}),
			model.ErrBadShape, []string{"blk.0.ffn_down.weight"}},
		{"norm of the wrong length", edit(ggufEdit{setTensor: map[string]tensorSpec{
			"blk.3.ffn_norm.weight": {quant.F32, []uint64{uint64(dim / 2)}, f32(dim / 2)}}}),
			model.ErrBadShape, []string{"blk.3.ffn_norm.weight", fmt.Sprintf("want %d", dim)}},
		{"embedding with three dims", edit(ggufEdit{setTensor: map[string]tensorSpec{
			"token_embd.weight": {quant.F32, []uint64{uint64(dim), uint64(vocab), 1}, f32(dim * vocab)}}}),
			model.ErrBadShape, []string{"token_embd.weight", "3 dims"}},
		{"missing layer tensor", edit(ggufEdit{dropTensor: []string{"blk.2.ffn_up.weight"}}), model.ErrMissingTensor, []string{"blk.2.ffn_up.weight"}},
		{"missing embedding", edit(ggufEdit{dropTensor: []string{"token_embd.weight"}}), model.ErrMissingTensor, []string{"token_embd.weight"}},
		{"missing output norm", edit(ggufEdit{dropTensor: []string{"output_norm.weight"}}), model.ErrMissingTensor, []string{"output_norm.weight"}},
		{"more layers than tensors", kv("llama.block_count", uint32(c.Layers+1)), model.ErrMissingTensor, []string{fmt.Sprintf("blk.%d.", c.Layers)}},
		{"embedding width disagrees", kv("llama.embedding_length", uint32(dim*2)), model.ErrBadShape, []string{"token_embd.weight"}},

		// A tokenizer that does not belong to the weights.
		{"tokenizer smaller than the embedding", grow(vocab - 1).apply(edit), nil, []string{"tokenizer", fmt.Sprint(vocab - 1), fmt.Sprint(vocab)}},
		{"tokenizer larger than the embedding", grow(vocab + 7).apply(edit), nil, []string{"tokenizer", fmt.Sprint(vocab + 7), fmt.Sprint(vocab)}},

		// Absurd or inconsistent hyper-parameters.
		{"head count 2^31", kv("llama.attention.head_count", uint32(1<<31)), model.ErrBadConfig, []string{"head_count", "absurd"}},
		{"head count 0", kv("llama.attention.head_count", uint32(0)), model.ErrBadConfig, []string{"heads 0"}},
		{"head count 2000", kv("llama.attention.head_count", uint32(2000)), model.ErrBadConfig, []string{"heads 2000"}},
		{"more heads than dims", kv("llama.attention.head_count", uint32(dim*2)), model.ErrBadConfig, []string{"head dim 0"}},
		{"kv head count 0", kv("llama.attention.head_count_kv", uint32(0)), model.ErrBadConfig, []string{"kv heads 0"}},
		{"kv heads do not divide heads", kv("llama.attention.head_count_kv", uint32(3)), model.ErrBadConfig, []string{"not a multiple of 3 kv heads"}},
		{"kv head count 2^63", kv("llama.attention.head_count_kv", uint64(1<<63)), model.ErrBadConfig, []string{"kv heads -9223372036854775808"}},
		{"kv head count 2^40", kv("llama.attention.head_count_kv", uint64(1<<40)), model.ErrBadConfig, []string{"1099511627776 kv heads"}},
		{"key length 2^40", kv("llama.attention.key_length", uint64(1<<40)), model.ErrBadConfig, []string{"head dim 1099511627776"}},
		{"block count 2^20", kv("llama.block_count", uint32(1<<20)), model.ErrBadConfig, []string{"layers 1048576"}},
		{"block count missing", edit(ggufEdit{dropKV: []string{"llama.block_count"}}), model.ErrBadConfig, []string{"llama.block_count"}},
		{"block count is a string", kv("llama.block_count", "four"), model.ErrBadConfig, []string{"llama.block_count"}},
		{"block count negative", kv("llama.block_count", int32(-4)), model.ErrBadConfig, []string{"llama.block_count"}},
		{"context length 0", kv("llama.context_length", uint32(0)), model.ErrBadConfig, []string{"context length 0"}},
		{"context length 2^30", kv("llama.context_length", uint32(1<<30)), model.ErrBadConfig, []string{"ctx 1073741824"}},
		{"odd rope dimensions", kv("llama.rope.dimension_count", uint32(31)), model.ErrBadConfig, []string{"rope dims 31"}},
		{"rope dimensions 2^63", kv("llama.rope.dimension_count", uint64(1<<63)), model.ErrBadConfig, []string{"rope dims"}},
		{"negative rms epsilon", kv("llama.attention.layer_norm_rms_epsilon", float32(-1)), model.ErrBadConfig, []string{"epsilon"}},
		{"NaN rms epsilon", kv("llama.attention.layer_norm_rms_epsilon", float32(math.NaN())), model.ErrBadConfig, []string{"epsilon"}},
		{"rope base 0", kv("llama.rope.freq_base", float32(0)), model.ErrBadConfig, []string{"rope base"}},
		{"unsupported rope scaling", kv("llama.rope.scaling.type", "yarn"), model.ErrBadConfig, []string{`"yarn"`}},
		{"linear rope scaling without a factor", kv("llama.rope.scaling.type", "linear"), model.ErrBadConfig, []string{"rope.scaling.factor"}},
		{"rope frequency factors of the wrong length", edit(ggufEdit{setTensor: map[string]tensorSpec{
			"rope_freqs.weight": {quant.F32, []uint64{3}, f32(3)}}}), model.ErrBadShape, []string{"rope_freqs.weight"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeTemp(t, "model.gguf", tc.data)
			m, err := loadNoPanic(path)
			if err == nil {
				m.Close()
				t.Fatalf("Load accepted the file")
			}
			if tc.err != nil && !errors.Is(err, tc.err) {
				t.Errorf("err = %v, want it to wrap %v", err, tc.err)
			}
			for _, s := range tc.msg {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			t.Logf("%v", err)
		})
	}
}

func (e ggufEdit) apply(edit func(ggufEdit) []byte) []byte { return edit(e) }

func loadNoPanic(path string) (m *model.Model, err error) {
	defer func() {
		if p := recover(); p != nil {
			m, err = nil, fmt.Errorf("Load panicked: %v", p)
		}
	}()
	return model.Load(path, model.Options{})
}

// TestLoadOptions checks the loader's refusals of a wrong combination of
// inputs.
func TestLoadOptions(t *testing.T) {
	gg := testdata.Path(t, "models", "tiny-llama-f32.gguf")
	for _, tc := range []struct {
		name, model, tok, msg string
	}{
		{"no model", "", "", "no model"},
		{"missing file", "/nonexistent/model.gguf", "", "no such file"},
		{"unknown builtin", "builtin:nope", "", `no builtin model "nope"`},
		{"builtin with a tokenizer", "builtin:tiny", gg, "drop --tokenizer"},
		{"GGUF with a tokenizer", gg, testdata.Path(t, "models", "tok512.bin"), "--tokenizer is only for llama2.c"},
		{"checkpoint without a tokenizer", testdata.Path(t, "models", "stories260K.bin"), "", "needs --tokenizer"},
		{"checkpoint with a missing tokenizer", testdata.Path(t, "models", "stories260K.bin"), "/nonexistent/tok.bin", "no such file"},
		{"checkpoint with another model's tokenizer", testdata.Path(t, "models", "stories260K.bin"), testdata.Path(t, "vocab", "ggml-vocab-llama-spm.gguf"), "ggml-vocab-llama-spm.gguf: llama2c: token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := model.Load(tc.model, model.Options{Tokenizer: tc.tok})
			if err == nil {
				m.Close()
				t.Fatal("Load succeeded")
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
		})
	}
}

// TestLoadRealModels loads every GGUF in the shared test data (the same
// files llama.cpp ran for the goldens) and checks their shapes against the
// folder's README.
func TestLoadRealModels(t *testing.T) {
	for _, tc := range []struct {
		file                             string
		dim, layers, heads, kvHeads, ffn int
		ctx                              int
		ropeBase                         float32
		tied                             bool
		weightType                       string
	}{
		{"tiny-llama-f32.gguf", 64, 2, 4, 2, 192, 2048, 10000, false, "F32"},
		{"tiny-llama-f16.gguf", 64, 2, 4, 2, 192, 2048, 10000, false, "F16"},
		{"tiny-llama-q8_0.gguf", 64, 2, 4, 2, 192, 2048, 10000, false, "Q8_0"},
		{"tiny-llama-d128-mha-tied.gguf", 128, 3, 8, 8, 320, 4096, 500000, true, "mixed(F32,Q8_0)"},
		{"tiny-llama-d256-q4_k_m.gguf", 256, 2, 4, 2, 768, 2048, 10000, false, "mixed(Q4_K,Q6_K)"},
		{"tiny-llama-d256-q4_0.gguf", 256, 2, 4, 2, 768, 2048, 10000, false, "mixed(Q4_0,Q6_K)"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			m, err := model.Load(testdata.Path(t, "models", tc.file), model.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			c := m.Config
			got := []any{c.Arch, c.Dim, c.Layers, c.Heads, c.KVHeads, c.FFN, c.ContextLength, c.RopeBase, c.TiedOutput, c.Vocab, m.WeightType, m.Tokenizer.VocabSize()}
			want := []any{"llama", tc.dim, tc.layers, tc.heads, tc.kvHeads, tc.ffn, tc.ctx, tc.ropeBase, tc.tied, 32000, tc.weightType, 32000}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("config (arch dim layers heads kv ffn ctx rope tied vocab type tokvocab) -want +got:\n%s", diff)
			}
			if m.Digest == ([32]byte{}) {
				t.Error("no digest")
			}
			// One short greedy run on a poisoned pool: finite logits.
			r := newRunner(t, m, kvcache.F32, 4)
			s := r.seq("t")
			l := r.step(part{s, m.Tokenizer.Encode("Hello world", true, false), model.LogitsLast})[0]
			r.step(part{s, []int{sample.Argmax(l)}, model.LogitsLast})
		})
	}
}

// TestBuiltinsLoadAndGenerate generates every builtin model and runs a
// short greedy decode through it. The larger ones take seconds to
// generate, so -short keeps to the small ones.
func TestBuiltinsLoadAndGenerate(t *testing.T) {
	digests := map[[32]byte]string{}
	for _, name := range model.BuiltinNames() {
		spec := model.Builtins[name]
		if spec.Dim > 256 && (testing.Short() || raceEnabled) {
			continue
		}
		if spec.Dim > 576 {
			continue // 1.1b: ~1 GiB of weights to generate; benchmarks only
		}
		t.Run(name, func(t *testing.T) {
			m, err := model.Load(model.BuiltinPrefix+name, model.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			c := m.Config
			if c.Dim != spec.Dim || c.Layers != spec.Layers || c.Heads != spec.Heads || c.KVHeads != spec.KVHeads || c.ContextLength != spec.Ctx || c.TiedOutput != spec.Tied {
				t.Errorf("config %+v does not match spec %+v", c, spec)
			}
			if m.Name != model.BuiltinPrefix+name {
				t.Errorf("Name = %q", m.Name)
			}
			if other, dup := digests[m.Digest]; dup {
				t.Errorf("same digest as %s", other)
			}
			digests[m.Digest] = name
			r := newRunner(t, m, kvcache.F16, 4)
			s := r.seq("t")
			ids := m.Tokenizer.Encode("Hello", true, false)
			if len(ids) == 0 || ids[0] != m.Tokenizer.BOS() {
				t.Fatalf("Encode = %v, want BOS first", ids)
			}
			l := r.step(part{s, ids, model.LogitsLast})[0]
			var gen []int
			for range 8 {
				next := sample.Argmax(l)
				gen = append(gen, next)
				l = r.step(part{s, []int{next}, model.LogitsLast})[0]
			}
			t.Logf("%s: %q", name, m.Tokenizer.Decode(gen))
		})
	}
}

// TestBuiltinDeterministic checks that generating a builtin model twice
// gives the same weights: benchmarks and tests rely on it.
func TestBuiltinDeterministic(t *testing.T) {
	a, err := model.Builtin("tiny-short")
	if err != nil {
		t.Fatal(err)
	}
	b, err := model.Builtin("tiny-short")
	if err != nil {
		t.Fatal(err)
	}
	if a.Digest != b.Digest {
		t.Fatal("two generations of tiny-short differ")
	}
}

// TestStories260KViaGGUF converts the llama2.c checkpoint to GGUF (what
// `pagewarden convert` writes) and checks that the GGUF path generates what
// the direct .bin path does: greedy, 200 positions, no prompt. The two
// paths compute RoPE angles by different formulas (run.c's powf per pair,
// ggml's running product) that agree to the last bits only, so this test
// reports how far the outputs agree if they ever part.
func TestStories260KViaGGUF(t *testing.T) {
	binPath, tokPath := testdata.Path(t, "models", "stories260K.bin"), testdata.Path(t, "models", "tok512.bin")
	direct, err := model.Load(binPath, model.Options{Tokenizer: tokPath})
	if err != nil {
		t.Fatal(err)
	}
	ck, err := llama2c.Read(binPath)
	if err != nil {
		t.Fatal(err)
	}
	tokData, err := os.ReadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	v, err := llama2c.ParseVocab(tokData, ck.Vocab)
	if err != nil {
		t.Fatal(err)
	}
	w, err := llama2c.ToGGUF(ck, v, "stories260K")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	conv, err := model.Load(writeTemp(t, "stories260K.gguf", buf.Bytes()), model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer conv.Close()
	if conv.Config.RopeRunC {
		t.Fatal("the GGUF path must use ggml's RoPE formula")
	}
	if conv.Tokenizer.VocabSize() != 512 || conv.Config.Vocab != 512 {
		t.Fatalf("converted vocab %d/%d, want 512", conv.Tokenizer.VocabSize(), conv.Config.Vocab)
	}
	want, err := os.ReadFile(testdata.Path(t, "models", "stories260K.t0.n200.expected.txt"))
	if err != nil {
		t.Fatal(err)
	}
	gen := func(m *model.Model) ([]int, string) {
		r := newRunner(t, m, kvcache.F32, 16)
		s := r.seq("t")
		bos := m.Tokenizer.BOS()
		l := r.step(part{s, []int{bos}, model.LogitsLast})[0]
		dec := tokenizer.NewStreamDecoder(m.Tokenizer, bos)
		var out []int
		var text strings.Builder
		// run.c's -n 200 counts positions: BOS is position 0 and the
		// logits after position 199 give the last token.
		for len(out) < 200 {
			next := sample.Argmax(l)
			if m.Tokenizer.IsEOG(next) {
				break
			}
			out = append(out, next)
			text.WriteString(dec.Add(next))
			l = r.step(part{s, []int{next}, model.LogitsLast})[0]
		}
		text.WriteString(dec.Flush())
		return out, text.String()
	}
	dIDs, dText := gen(direct)
	cIDs, cText := gen(conv)
	if dText+"\n" != string(want) {
		t.Fatalf("direct .bin path no longer matches run.c:\n%s", cmp.Diff(string(want), dText+"\n"))
	}
	same := 0
	for same < min(len(dIDs), len(cIDs)) && dIDs[same] == cIDs[same] {
		same++
	}
	if same != len(dIDs) || len(cIDs) != len(dIDs) {
		t.Errorf("GGUF path agrees with the .bin path on the first %d of %d tokens (GGUF path made %d)", same, len(dIDs), len(cIDs))
	}
	if cText != dText {
		t.Errorf("GGUF path text differs:\n%s", cmp.Diff(dText, cText))
	}
}

// FuzzFromGGUF runs arbitrary bytes through the GGUF parser and the model
// loader: a file that parses must load or fail with an error, never panic
// or allocate beyond what its tensors hold.
func FuzzFromGGUF(f *testing.F) {
	// A very small model keeps each execution fast.
	w, err := model.BuiltinGGUF(model.BuiltinSpec{Name: "fuzz", Dim: 32, Layers: 1, Heads: 2, KVHeads: 1, FFN: 64, Ctx: 64, Type: quant.Q8_0, Seed: 9})
	if err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		f.Fatal(err)
	}
	img := buf.Bytes()
	f.Add(img)
	f.Add(img[:len(img)/3])
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
		if m.Tokenizer.VocabSize() != m.Config.Vocab {
			t.Fatalf("loaded a model whose tokenizer has %d tokens for %d embedding rows", m.Tokenizer.VocabSize(), m.Config.Vocab)
		}
	})
}
