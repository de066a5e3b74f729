package llama2c_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/llama2c"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// header is the seven int32 of a version-0 checkpoint.
type header struct{ dim, hidden, layers, heads, kvHeads, vocab, seqLen int32 }

func (h header) bytes() []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, []int32{h.dim, h.hidden, h.layers, h.heads, h.kvHeads, h.vocab, h.seqLen})
	return b.Bytes()
}

// floats is the number of float32 weights h describes, as llama2.c lays
// them out (freq_cis included, the classifier only when vocab < 0).
func (h header) floats() int {
	d, hid, l, v := int(h.dim), int(h.hidden), int(h.layers), int(h.vocab)
	hs := d / int(h.heads)
	kv := int(h.kvHeads) * hs
	n := abs(v)*d + l*(2*d+2*d*d+2*d*kv+3*d*hid) + d + int(h.seqLen)*hs
	if v < 0 {
		n += -v * d
	}
	return n
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

// small is a valid, tiny checkpoint shape with GQA.
var small = header{dim: 8, hidden: 12, layers: 2, heads: 2, kvHeads: 1, vocab: 10, seqLen: 4}

// checkpoint builds a checkpoint whose i-th weight is i/1000, so that a
// tensor read from the wrong offset shows.
func checkpoint(h header) []byte {
	b := h.bytes()
	for i := range h.floats() {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(i)/1000))
	}
	return b
}

func TestParseLayout(t *testing.T) {
	for _, shared := range []bool{true, false} {
		h := small
		if !shared {
			h.vocab = -h.vocab
		}
		ck, err := llama2c.Parse(checkpoint(h))
		if err != nil {
			t.Fatal(err)
		}
		want := llama2c.Config{Dim: 8, Hidden: 12, Layers: 2, Heads: 2, KVHeads: 1, Vocab: 10, SeqLen: 4, SharedClassifier: shared}
		if diff := cmp.Diff(want, ck.Config); diff != "" {
			t.Fatalf("shared=%v: config -want +got:\n%s", shared, diff)
		}
		// Offsets in floats, from llama2.c's memory_map_weights.
		const d, hid, kv, v = 8, 12, 4, 10
		at := func(off int) float32 { return float32(off) / 1000 }
		off := v * d
		type probe struct {
			name string
			got  float32
			want float32
		}
		var probes []probe
		probes = append(probes, probe{"embed[0]", ck.Embed[0], at(0)})
		probes = append(probes, probe{"attn_norm[1][0]", ck.AttnNorm[1][0], at(off + d)})
		off += 2 * d
		probes = append(probes, probe{"wq[1][0]", ck.Wq[1][0], at(off + d*d)})
		off += 2 * d * d
		probes = append(probes, probe{"wk[0][0]", ck.Wk[0][0], at(off)})
		off += 2 * d * kv
		probes = append(probes, probe{"wv[1][last]", ck.Wv[1][d*kv-1], at(off + 2*d*kv - 1)})
		off += 2 * d * kv
		probes = append(probes, probe{"wo[0][0]", ck.Wo[0][0], at(off)})
		off += 2 * d * d
		probes = append(probes, probe{"ffn_norm[0][0]", ck.FFNNorm[0][0], at(off)})
		off += 2 * d
		probes = append(probes, probe{"w1[1][0]", ck.W1[1][0], at(off + d*hid)})
		off += 2 * d * hid
		probes = append(probes, probe{"w2[0][0]", ck.W2[0][0], at(off)})
		off += 2 * d * hid
		probes = append(probes, probe{"w3[1][last]", ck.W3[1][d*hid-1], at(off + 2*d*hid - 1)})
		off += 2 * d * hid
		probes = append(probes, probe{"final_norm[0]", ck.FinalNorm[0], at(off)})
		off += d + 4*(d/2) // freq_cis_real and _imag: seq_len * head_size/2 each
		if shared {
			if &ck.Classifier[0] != &ck.Embed[0] {
				t.Error("shared classifier is not the embedding")
			}
		} else {
			probes = append(probes, probe{"classifier[0]", ck.Classifier[0], at(off)})
		}
		for _, p := range probes {
			if p.got != p.want {
				t.Errorf("shared=%v: %s = %v, want %v", shared, p.name, p.got, p.want)
			}
		}
		for name, n := range map[string]int{"embed": len(ck.Embed), "classifier": len(ck.Classifier), "final norm": len(ck.FinalNorm)} {
			want := map[string]int{"embed": v * d, "classifier": v * d, "final norm": d}[name]
			if n != want {
				t.Errorf("len(%s) = %d, want %d", name, n, want)
			}
		}
	}
}

// TestParseCorrupt checks that every malformed header or size is refused
// with ErrFormat, never a panic or a huge allocation.
func TestParseCorrupt(t *testing.T) {
	good := checkpoint(small)
	with := func(f func(h *header)) []byte {
		h := small
		f(&h)
		// Keep the body as long as the broken header implies when that
		// is computable and small, so that only the header is wrong.
		return append(h.bytes(), good[28:]...)
	}
	cases := []struct {
		name string
		data []byte
		msg  string
	}{
		{"empty", nil, "shorter than the 28-byte header"},
		{"27 bytes", good[:27], "shorter than the 28-byte header"},
		{"header only", good[:28], "file has 28"},
		{"one float short", good[:len(good)-4], "but the file has"},
		{"one byte short", good[:len(good)-1], "but the file has"},
		{"one float extra", append(bytes.Clone(good), 0, 0, 0, 0), "but the file has"},
		{"dim 0", with(func(h *header) { h.dim = 0 }), "non-positive"},
		{"dim negative", with(func(h *header) { h.dim = -8 }), "non-positive"},
		{"hidden 0", with(func(h *header) { h.hidden = 0 }), "non-positive"},
		{"layers 0", with(func(h *header) { h.layers = 0 }), "non-positive"},
		{"heads 0", with(func(h *header) { h.heads = 0 }), "non-positive"},
		{"kv heads 0", with(func(h *header) { h.kvHeads = 0 }), "non-positive"},
		{"vocab 0", with(func(h *header) { h.vocab = 0 }), "non-positive"},
		{"seq_len 0", with(func(h *header) { h.seqLen = 0 }), "non-positive"},
		{"seq_len negative", with(func(h *header) { h.seqLen = -1 }), "non-positive"},
		{"vocab MinInt32", with(func(h *header) { h.vocab = math.MinInt32 }), "absurd"},
		{"dim MaxInt32", with(func(h *header) { h.dim = math.MaxInt32 }), "absurd"},
		{"hidden MaxInt32", with(func(h *header) { h.hidden = math.MaxInt32 }), "absurd"},
		{"layers MaxInt32", with(func(h *header) { h.layers = math.MaxInt32 }), "absurd"},
		{"vocab MaxInt32", with(func(h *header) { h.vocab = math.MaxInt32 }), "absurd"},
		{"seq_len MaxInt32", with(func(h *header) { h.seqLen = math.MaxInt32 }), "absurd"},
		{"everything MaxInt32", header{math.MaxInt32, math.MaxInt32, math.MaxInt32, math.MaxInt32, math.MaxInt32, math.MaxInt32, math.MaxInt32}.bytes(), "absurd"},
		// Largest sizes the header allows: the byte count must be computed
		// without overflow and simply not match.
		{"largest legal sizes", header{1 << 16, 1 << 18, 1024, 1, 1, 1 << 22, 1 << 24}.bytes(), "but the file has"},
		{"heads do not divide dim", with(func(h *header) { h.heads = 3 }), "do not divide"},
		{"kv heads do not divide heads", with(func(h *header) { h.kvHeads = 3 }), "do not divide"},
		{"more kv heads than heads", with(func(h *header) { h.kvHeads = 4 }), "do not divide"},
		{"odd head size", with(func(h *header) { h.dim, h.heads, h.kvHeads = 6, 2, 1 }), "do not divide"},
		{"a GGUF file", append([]byte("GGUF\x03\x00\x00\x00"), make([]byte, 40)...), "non-positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ck, err := llama2c.Parse(tc.data)
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", ck.Config)
			}
			if !errors.Is(err, llama2c.ErrFormat) {
				t.Errorf("err = %v, want ErrFormat", err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
		})
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	if _, err := llama2c.Read(filepath.Join(dir, "missing.bin")); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Errorf("missing file: err = %v", err)
	}
	bad := filepath.Join(dir, "bad.bin")
	if err := os.WriteFile(bad, checkpoint(small)[:100], 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := llama2c.Read(bad)
	if !errors.Is(err, llama2c.ErrFormat) || !strings.Contains(err.Error(), bad) {
		t.Errorf("truncated file: err = %v, want ErrFormat naming the path", err)
	}
	ck, err := llama2c.Read(testdata.Path(t, "models", "stories260K.bin"))
	if err != nil {
		t.Fatal(err)
	}
	want := llama2c.Config{Dim: 64, Hidden: 172, Layers: 5, Heads: 8, KVHeads: 4, Vocab: 512, SeqLen: 512, SharedClassifier: true}
	if diff := cmp.Diff(want, ck.Config); diff != "" {
		t.Errorf("stories260K config (see testdata/models/README) -want +got:\n%s", diff)
	}
}

// vocabFile builds a tokenizer.bin: max_token_length, then score, length
// and bytes per token.
func vocabFile(pieces ...string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 7)
	for i, p := range pieces {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(-i)))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(p)))
		b = append(b, p...)
	}
	return b
}

func TestParseVocab(t *testing.T) {
	good := vocabFile("<unk>", "\n<s>\n", "\n</s>\n", "<0x41>", " the", "")
	v, err := llama2c.ParseVocab(good, 6)
	if err != nil {
		t.Fatal(err)
	}
	got := []string{}
	for _, p := range v.Pieces {
		got = append(got, string(p))
	}
	if diff := cmp.Diff([]string{"<unk>", "\n<s>\n", "\n</s>\n", "<0x41>", " the", ""}, got); diff != "" {
		t.Errorf("pieces -want +got:\n%s", diff)
	}
	if diff := cmp.Diff([]float32{0, -1, -2, -3, -4, -5}, v.Scores); diff != "" {
		t.Errorf("scores -want +got:\n%s", diff)
	}
	if v.MaxTokenLength != 7 {
		t.Errorf("MaxTokenLength = %d", v.MaxTokenLength)
	}

	negLen := bytes.Clone(good)
	binary.LittleEndian.PutUint32(negLen[4+4:], uint32(0xFFFFFFFF)) // token 0's length: -1
	hugeLen := bytes.Clone(good)
	binary.LittleEndian.PutUint32(hugeLen[4+4:], 1<<30)
	for _, tc := range []struct {
		name string
		data []byte
		n    int
		msg  string
	}{
		{"empty", nil, 6, "truncated"},
		{"three bytes", good[:3], 6, "truncated"},
		{"fewer tokens than the model", good, 7, "ends at token 6 of 7"},
		{"more tokens than the model", good, 5, "more tokens than the model's 5"},
		{"cut inside a record", good[:10], 6, "ends at token 0"},
		{"cut inside a piece", good[:4+8+3], 6, "length 5 with 3 bytes left"},
		{"negative length", negLen, 6, "length -1"},
		{"length beyond the file", hugeLen, 6, "length 1073741824"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := llama2c.ParseVocab(tc.data, tc.n)
			if err == nil {
				t.Fatal("ParseVocab accepted it")
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
		})
	}
}

// TestToGGUF checks the converter's layout: GGML dims, tensor bytes equal
// to the checkpoint's floats, token types and the SentencePiece space.
func TestToGGUF(t *testing.T) {
	h := small
	h.vocab = -h.vocab // separate classifier: output.weight is written
	ck, err := llama2c.Parse(checkpoint(h))
	if err != nil {
		t.Fatal(err)
	}
	pieces := []string{"<unk>", "\n<s>\n", "\n</s>\n", "<0x00>", "<0x41>", " the", "a", "b c", "x", "y"}
	v, err := llama2c.ParseVocab(vocabFile(pieces...), 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := llama2c.ToGGUF(ck, &llama2c.Vocab{Pieces: v.Pieces[:9], Scores: v.Scores[:9]}, "x"); err == nil || !strings.Contains(err.Error(), "tokenizer has 9 tokens, model 10") {
		t.Errorf("vocab size mismatch: err = %v", err)
	}
	w, err := llama2c.ToGGUF(ck, v, "small")
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
	f32bytes := func(xs []float32) []byte {
		b, _ := quant.Quantize(quant.F32, xs)
		return b
	}
	for _, tc := range []struct {
		name string
		dims []uint64
		data []float32
	}{
		{"token_embd.weight", []uint64{8, 10}, ck.Embed},
		{"output.weight", []uint64{8, 10}, ck.Classifier},
		{"output_norm.weight", []uint64{8}, ck.FinalNorm},
		{"blk.1.attn_q.weight", []uint64{8, 8}, ck.Wq[1]},
		{"blk.0.attn_k.weight", []uint64{8, 4}, ck.Wk[0]},
		{"blk.1.attn_v.weight", []uint64{8, 4}, ck.Wv[1]},
		{"blk.0.ffn_gate.weight", []uint64{8, 12}, ck.W1[0]},
		{"blk.1.ffn_down.weight", []uint64{12, 8}, ck.W2[1]},
		{"blk.1.ffn_up.weight", []uint64{8, 12}, ck.W3[1]},
	} {
		ti, ok := f.Tensor(tc.name)
		if !ok {
			t.Errorf("%s missing", tc.name)
			continue
		}
		if !cmp.Equal(ti.Dims, tc.dims) || ti.Type != quant.F32 || !bytes.Equal(ti.Data, f32bytes(tc.data)) {
			t.Errorf("%s: %s %v, want F32 %v with the checkpoint's values", tc.name, ti.Type, ti.Dims, tc.dims)
		}
	}
	toks, _ := f.Strings("tokenizer.ggml.tokens")
	types, _ := f.Int32s("tokenizer.ggml.token_type")
	wantToks := []string{"<unk>", "<s>", "</s>", "<0x00>", "<0x41>", "\u2581the", "a", "b\u2581c", "x", "y"}
	wantTypes := []int32{2, 3, 3, 6, 6, 1, 1, 1, 1, 1}
	if diff := cmp.Diff(wantToks, toks); diff != "" {
		t.Errorf("tokens -want +got:\n%s", diff)
	}
	if diff := cmp.Diff(wantTypes, types); diff != "" {
		t.Errorf("token types -want +got:\n%s", diff)
	}
	for k, want := range map[string]uint64{"llama.context_length": 4, "llama.block_count": 2, "llama.attention.head_count_kv": 1, "llama.rope.dimension_count": 4} {
		if got, _ := f.Uint(k); got != want {
			t.Errorf("%s = %d, want %d", k, got, want)
		}
	}
}

// FuzzParse checks that Parse never panics and that whatever it accepts is
// internally consistent.
func FuzzParse(f *testing.F) {
	f.Add(checkpoint(small))
	h := small
	h.vocab = -h.vocab
	f.Add(checkpoint(h))
	f.Add(small.bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		ck, err := llama2c.Parse(data)
		if err != nil {
			if !errors.Is(err, llama2c.ErrFormat) {
				t.Fatalf("error without ErrFormat: %v", err)
			}
			return
		}
		c := ck.Config
		hs := c.Dim / c.Heads
		checks := []struct {
			name      string
			got, want int
		}{
			{"embed", len(ck.Embed), c.Vocab * c.Dim},
			{"classifier", len(ck.Classifier), c.Vocab * c.Dim},
			{"final norm", len(ck.FinalNorm), c.Dim},
			{"wq layers", len(ck.Wq), c.Layers},
			{"wk", len(ck.Wk[c.Layers-1]), c.Dim * c.KVHeads * hs},
			{"w2", len(ck.W2[0]), c.Dim * c.Hidden},
		}
		for _, ch := range checks {
			if ch.got != ch.want {
				t.Fatalf("%s: %d values, want %d (config %+v)", ch.name, ch.got, ch.want, c)
			}
		}
	})
}

func FuzzParseVocab(f *testing.F) {
	f.Add(vocabFile("<unk>", "a", "bc"), 3)
	f.Fuzz(func(t *testing.T, data []byte, n int) {
		if n > 1<<16 {
			n %= 1 << 16
		}
		v, err := llama2c.ParseVocab(data, n)
		if err != nil {
			return
		}
		if len(v.Pieces) != max(n, 0) || len(v.Scores) != len(v.Pieces) {
			t.Fatalf("%d pieces and %d scores for %d tokens", len(v.Pieces), len(v.Scores), n)
		}
	})
}
