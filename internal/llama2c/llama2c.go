// Package llama2c reads checkpoints in llama2.c's legacy (version-0) binary
// layout and turns them into GGUF, so that the engine has one loading path.
//
// The layout is seven little-endian int32 (dim, hidden_dim, n_layers,
// n_heads, n_kv_heads, vocab_size, seq_len; a negative vocab_size means the
// classifier is stored separately) followed by float32 tensors in a fixed
// order. Every size is checked against the file length before anything is
// sliced.
package llama2c

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// ErrFormat reports a checkpoint that is not a valid version-0 llama2.c file.
var ErrFormat = errors.New("llama2c: not a valid llama2.c checkpoint")

// Config is the checkpoint header.
type Config struct {
	Dim, Hidden, Layers, Heads, KVHeads, Vocab, SeqLen int
	SharedClassifier                                   bool
}

// Checkpoint is a parsed checkpoint. Tensors are float32, row-major with
// each row one output (the same as GGUF's order).
type Checkpoint struct {
	Config
	Embed                 []float32 // vocab × dim
	AttnNorm              [][]float32
	Wq, Wk, Wv, Wo        [][]float32
	FFNNorm               [][]float32
	W1, W2, W3            [][]float32
	FinalNorm, Classifier []float32
}

const headerBytes = 7 * 4

// Parse decodes a checkpoint from bytes.
func Parse(data []byte) (*Checkpoint, error) {
	if len(data) < headerBytes {
		return nil, fmt.Errorf("%w: %d bytes is shorter than the 28-byte header", ErrFormat, len(data))
	}
	var h [7]int32
	for i := range h {
		h[i] = int32(binary.LittleEndian.Uint32(data[4*i:]))
	}
	c := Config{Dim: int(h[0]), Hidden: int(h[1]), Layers: int(h[2]), Heads: int(h[3]), KVHeads: int(h[4]), SeqLen: int(h[6])}
	c.SharedClassifier = h[5] > 0
	c.Vocab = int(h[5])
	if c.Vocab < 0 {
		c.Vocab = -c.Vocab
	}
	switch {
	case c.Dim <= 0 || c.Hidden <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.Vocab <= 0 || c.SeqLen <= 0:
		return nil, fmt.Errorf("%w: header has a non-positive size (dim %d, hidden %d, layers %d, heads %d, kv heads %d, vocab %d, seq_len %d)",
			ErrFormat, c.Dim, c.Hidden, c.Layers, c.Heads, c.KVHeads, c.Vocab, c.SeqLen)
	case c.Dim > 1<<16 || c.Hidden > 1<<18 || c.Layers > 1024 || c.Vocab > 1<<22 || c.SeqLen > 1<<24:
		return nil, fmt.Errorf("%w: header sizes are absurd (dim %d, hidden %d, layers %d, vocab %d, seq_len %d)", ErrFormat, c.Dim, c.Hidden, c.Layers, c.Vocab, c.SeqLen)
	case c.Dim%c.Heads != 0 || c.Heads%c.KVHeads != 0 || (c.Dim/c.Heads)%2 != 0:
		return nil, fmt.Errorf("%w: dim %d, %d heads and %d kv heads do not divide evenly", ErrFormat, c.Dim, c.Heads, c.KVHeads)
	}
	hs := c.Dim / c.Heads
	kvDim := c.KVHeads * hs
	per := int64(c.Dim)*2 + int64(c.Dim)*int64(c.Dim)*2 + int64(c.Dim)*int64(kvDim)*2 + int64(c.Dim)*int64(c.Hidden)*3
	floats := int64(c.Vocab)*int64(c.Dim) + int64(c.Layers)*per + int64(c.Dim) + int64(c.SeqLen)*int64(hs)
	if !c.SharedClassifier {
		floats += int64(c.Vocab) * int64(c.Dim)
	}
	want := headerBytes + floats*4
	if int64(len(data)) != want {
		return nil, fmt.Errorf("%w: header describes %d bytes of weights but the file has %d", ErrFormat, want, len(data))
	}
	r := reader{b: data[headerBytes:]}
	ck := &Checkpoint{Config: c}
	ck.Embed = r.take(c.Vocab * c.Dim)
	ck.AttnNorm = r.layers(c.Layers, c.Dim)
	ck.Wq = r.layers(c.Layers, c.Dim*c.Dim)
	ck.Wk = r.layers(c.Layers, c.Dim*kvDim)
	ck.Wv = r.layers(c.Layers, c.Dim*kvDim)
	ck.Wo = r.layers(c.Layers, c.Dim*c.Dim)
	ck.FFNNorm = r.layers(c.Layers, c.Dim)
	ck.W1 = r.layers(c.Layers, c.Dim*c.Hidden)
	ck.W2 = r.layers(c.Layers, c.Dim*c.Hidden)
	ck.W3 = r.layers(c.Layers, c.Dim*c.Hidden)
	ck.FinalNorm = r.take(c.Dim)
	r.take(c.SeqLen * hs) // freq_cis_real and freq_cis_imag: RoPE is recomputed
	if c.SharedClassifier {
		ck.Classifier = ck.Embed
	} else {
		ck.Classifier = r.take(c.Vocab * c.Dim)
	}
	return ck, nil
}

// Read parses the checkpoint at path.
func Read(path string) (*Checkpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("llama2c: %w", err)
	}
	ck, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ck, nil
}

type reader struct{ b []byte }

// take converts the next n float32s; Parse has already checked the length.
func (r *reader) take(n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(r.b[4*i:]))
	}
	r.b = r.b[4*n:]
	return out
}

func (r *reader) layers(layers, n int) [][]float32 {
	out := make([][]float32, layers)
	for i := range out {
		out[i] = r.take(n)
	}
	return out
}

// Vocab is a llama2.c tokenizer.bin in its raw form.
type Vocab struct {
	MaxTokenLength int
	Pieces         [][]byte
	Scores         []float32
}

// ParseVocab decodes tokenizer.bin for a model with n tokens.
func ParseVocab(data []byte, n int) (*Vocab, error) {
	if len(data) < 4 {
		return nil, fmt.Errorf("llama2c: tokenizer file of %d bytes is truncated", len(data))
	}
	v := &Vocab{MaxTokenLength: int(int32(binary.LittleEndian.Uint32(data)))}
	data = data[4:]
	for i := 0; i < n; i++ {
		if len(data) < 8 {
			return nil, fmt.Errorf("llama2c: tokenizer file ends at token %d of %d (does it belong to this model?)", i, n)
		}
		score := math.Float32frombits(binary.LittleEndian.Uint32(data))
		l := int32(binary.LittleEndian.Uint32(data[4:]))
		data = data[8:]
		if l < 0 || int(l) > len(data) {
			return nil, fmt.Errorf("llama2c: token %d has length %d with %d bytes left", i, l, len(data))
		}
		v.Pieces = append(v.Pieces, data[:l])
		v.Scores = append(v.Scores, score)
		data = data[l:]
	}
	if len(data) != 0 {
		return nil, fmt.Errorf("llama2c: tokenizer file has %d bytes after token %d: it holds more tokens than the model's %d", len(data), n, n)
	}
	return v, nil
}

// GGUF token types, as llama.cpp's llama_token_type.
const (
	tokNormal  = 1
	tokUnknown = 2
	tokControl = 3
	tokByte    = 6
)

// ToGGUF writes ck and its vocabulary as a GGUF "llama" model with F32
// weights and a SentencePiece ("llama") tokenizer. name goes into
// general.name.
func ToGGUF(ck *Checkpoint, v *Vocab, name string) (*gguf.Writer, error) {
	if len(v.Pieces) != ck.Vocab {
		return nil, fmt.Errorf("llama2c: tokenizer has %d tokens, model %d", len(v.Pieces), ck.Vocab)
	}
	w := gguf.NewWriter()
	c := ck.Config
	hs := c.Dim / c.Heads
	kvDim := c.KVHeads * hs
	tokens := make([]string, c.Vocab)
	types := make([]int32, c.Vocab)
	for i, p := range v.Pieces {
		s := string(p)
		switch {
		case i == 0:
			s, types[i] = "<unk>", tokUnknown
		case i == 1:
			s, types[i] = "<s>", tokControl
		case i == 2:
			s, types[i] = "</s>", tokControl
		case len(s) == 6 && strings.HasPrefix(s, "<0x") && s[5] == '>':
			types[i] = tokByte
		default:
			s, types[i] = strings.ReplaceAll(s, " ", "\u2581"), tokNormal
		}
		tokens[i] = s
	}
	kvs := []struct {
		k string
		v any
	}{
		{"general.architecture", "llama"},
		{"general.name", name},
		{"general.file_type", uint32(0)}, // llama.cpp's LLAMA_FTYPE_ALL_F32
		{"llama.context_length", uint32(c.SeqLen)},
		{"llama.embedding_length", uint32(c.Dim)},
		{"llama.block_count", uint32(c.Layers)},
		{"llama.feed_forward_length", uint32(c.Hidden)},
		{"llama.attention.head_count", uint32(c.Heads)},
		{"llama.attention.head_count_kv", uint32(c.KVHeads)},
		{"llama.rope.dimension_count", uint32(hs)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.rope.freq_base", float32(10000)},
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.pre", "default"},
		{"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.scores", v.Scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.unknown_token_id", uint32(0)},
		{"tokenizer.ggml.bos_token_id", uint32(1)},
		{"tokenizer.ggml.eos_token_id", uint32(2)},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.ggml.add_eos_token", false},
	}
	for _, kv := range kvs {
		if err := w.SetKV(kv.k, kv.v); err != nil {
			return nil, fmt.Errorf("llama2c: %w", err)
		}
	}
	add := func(name string, data []float32, dims ...uint64) error {
		b, err := quant.Quantize(quant.F32, data)
		if err != nil {
			return err
		}
		return w.AddTensor(name, quant.F32, dims, b)
	}
	d, hid, kv := uint64(c.Dim), uint64(c.Hidden), uint64(kvDim)
	if err := add("token_embd.weight", ck.Embed, d, uint64(c.Vocab)); err != nil {
		return nil, err
	}
	if err := add("output_norm.weight", ck.FinalNorm, d); err != nil {
		return nil, err
	}
	if !ck.SharedClassifier {
		if err := add("output.weight", ck.Classifier, d, uint64(c.Vocab)); err != nil {
			return nil, err
		}
	}
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		for _, t := range []struct {
			name string
			data []float32
			dims []uint64
		}{
			{"attn_norm.weight", ck.AttnNorm[l], []uint64{d}},
			{"attn_q.weight", ck.Wq[l], []uint64{d, d}},
			{"attn_k.weight", ck.Wk[l], []uint64{d, kv}},
			{"attn_v.weight", ck.Wv[l], []uint64{d, kv}},
			{"attn_output.weight", ck.Wo[l], []uint64{d, d}},
			{"ffn_norm.weight", ck.FFNNorm[l], []uint64{d}},
			{"ffn_gate.weight", ck.W1[l], []uint64{d, hid}},
			{"ffn_down.weight", ck.W2[l], []uint64{hid, d}},
			{"ffn_up.weight", ck.W3[l], []uint64{d, hid}},
		} {
			if err := add(p+t.name, t.data, t.dims...); err != nil {
				return nil, err
			}
		}
	}
	return w, nil
}
