package model

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"strings"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// BuiltinSpec describes a generated model: a Llama-shaped network with
// deterministic pseudo-random weights and a byte-level vocabulary (three
// control tokens, 256 byte tokens, "▁", the printable ASCII characters and
// the two ChatML markers, padded to Vocab). The text it writes is noise; its
// job is to let every command run on a fresh machine with no download, and
// to give benchmarks the exact shapes of real models.
type BuiltinSpec struct {
	Name                                  string
	Dim, Layers, Heads, KVHeads, FFN, Ctx int
	Vocab                                 int // 0: just the byte-level tokens
	Type                                  quant.Type
	Tied                                  bool
	Seed                                  uint64
	// Arch is general.architecture: "" for llama, or "phi3" or "gemma2"
	// (written by archGGUF, with the fields below).
	Arch string `json:",omitempty"`
	// HeadDim overrides Dim/Heads (gemma2's key_length); 0 keeps it.
	HeadDim int `json:",omitempty"`
	// Window is the attention window (phi3, gemma2); 0 for none.
	Window int `json:",omitempty"`
	// RopeOrigCtx, when set, gives a phi3 model "longrope" scaling: long
	// and short rope factors and this original context; the long ones
	// apply when Ctx exceeds it.
	RopeOrigCtx int `json:",omitempty"`
}

// Builtins lists the generated models by name. The larger ones copy the
// shapes of SmolLM2-135M and TinyLlama-1.1B for benchmarks.
var Builtins = map[string]BuiltinSpec{
	"tiny":       {Name: "tiny", Dim: 128, Layers: 4, Heads: 4, KVHeads: 2, FFN: 384, Ctx: 2048, Type: quant.F32, Seed: 1},
	"135m-f32":   {Name: "135m-f32", Dim: 576, Layers: 30, Heads: 9, KVHeads: 3, FFN: 1536, Ctx: 4096, Vocab: 32000, Type: quant.F32, Tied: true, Seed: 2},
	"135m-q8_0":  {Name: "135m-q8_0", Dim: 576, Layers: 30, Heads: 9, KVHeads: 3, FFN: 1536, Ctx: 4096, Vocab: 32000, Type: quant.Q8_0, Tied: true, Seed: 2},
	"1.1b-q8_0":  {Name: "1.1b-q8_0", Dim: 2048, Layers: 22, Heads: 32, KVHeads: 4, FFN: 5632, Ctx: 2048, Vocab: 32000, Type: quant.Q8_0, Seed: 3},
	"d256-q4_0":  {Name: "d256-q4_0", Dim: 256, Layers: 2, Heads: 4, KVHeads: 2, FFN: 768, Ctx: 2048, Type: quant.Q4_0, Seed: 4},
	"tiny-f16":   {Name: "tiny-f16", Dim: 128, Layers: 4, Heads: 4, KVHeads: 2, FFN: 384, Ctx: 2048, Type: quant.F16, Tied: true, Seed: 1},
	"tiny-q8_0":  {Name: "tiny-q8_0", Dim: 128, Layers: 4, Heads: 4, KVHeads: 2, FFN: 384, Ctx: 2048, Type: quant.Q8_0, Tied: true, Seed: 1},
	"tiny-bf16":  {Name: "tiny-bf16", Dim: 128, Layers: 4, Heads: 4, KVHeads: 2, FFN: 384, Ctx: 2048, Type: quant.BF16, Tied: true, Seed: 1},
	"135m-q4_0":  {Name: "135m-q4_0", Dim: 576, Layers: 30, Heads: 9, KVHeads: 3, FFN: 1536, Ctx: 4096, Vocab: 32000, Type: quant.Q4_0, Tied: true, Seed: 2},
	"tiny-long":  {Name: "tiny-long", Dim: 128, Layers: 4, Heads: 4, KVHeads: 2, FFN: 384, Ctx: 16384, Type: quant.F32, Tied: true, Seed: 1},
	"tiny-short": {Name: "tiny-short", Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 192, Ctx: 256, Type: quant.F32, Tied: true, Seed: 5},
	// The other architectures, small, with short windows so that a
	// prompt of a few dozen tokens already meets the mask. gemma2 has 26
	// layers because llama.cpp runs only the released depths (26 is the
	// 2B's).
	"tiny-phi3":   {Name: "tiny-phi3", Arch: "phi3", Dim: 128, Layers: 4, Heads: 4, KVHeads: 2, FFN: 256, Ctx: 4096, Window: 32, RopeOrigCtx: 4096, Type: quant.F32, Seed: 6},
	"tiny-gemma2": {Name: "tiny-gemma2", Arch: "gemma2", Dim: 64, Layers: 26, Heads: 4, KVHeads: 2, HeadDim: 32, FFN: 128, Ctx: 2048, Window: 16, Type: quant.F32, Tied: true, Seed: 7},
}

// BuiltinNames returns the builtin model names, sorted.
func BuiltinNames() []string {
	var names []string
	for n := range Builtins {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Builtin generates the named builtin model.
func Builtin(name string) (*Model, error) { return builtin(name, true) }

func builtin(name string, fuse bool) (*Model, error) {
	spec, ok := Builtins[name]
	if !ok {
		return nil, fmt.Errorf("model: no builtin model %q (have: %s)", name, strings.Join(BuiltinNames(), ", "))
	}
	w, err := BuiltinGGUF(spec)
	if err != nil {
		return nil, err
	}
	m, err := fromWriter(w, fuse)
	if err != nil {
		return nil, fmt.Errorf("model: builtin %s: %w", name, err)
	}
	m.Name = BuiltinPrefix + name
	return m, nil
}

// Token types, as llama.cpp's llama_token_type.
const (
	ttNormal  = 1
	ttUnknown = 2
	ttControl = 3
	ttUnused  = 5
	ttByte    = 6
)

// byteVocab returns the builtin vocabulary padded to n tokens (n ≤ its
// natural size means no padding).
func byteVocab(n int) (tokens []string, types []int32, scores []float32) {
	add := func(s string, t int32) {
		tokens = append(tokens, s)
		types = append(types, t)
		scores = append(scores, 0)
	}
	add("<unk>", ttUnknown)
	add("<s>", ttControl)
	add("</s>", ttControl)
	for b := 0; b < 256; b++ {
		add(fmt.Sprintf("<0x%02X>", b), ttByte)
	}
	add("\u2581", ttNormal)
	for c := byte('!'); c <= '~'; c++ {
		add(string(c), ttNormal)
	}
	add("<|im_start|>", ttControl)
	add("<|im_end|>", ttControl)
	for i := len(tokens); i < n; i++ {
		add(fmt.Sprintf("<pad_%d>", i), ttUnused)
	}
	return tokens, types, scores
}

// builtinKV is a metadata key and value of a generated file.
type builtinKV struct {
	k string
	v any
}

// vocabKVs is the tokenizer metadata of the builtin vocabulary: a
// SentencePiece-style ("llama") byte-fallback vocabulary that llama.cpp
// reads too, BOS added, the ChatML template.
func vocabKVs(tokens []string, types []int32, scores []float32) []builtinKV {
	imEnd := uint32(len(tokens))
	for i, t := range tokens {
		if t == "<|im_end|>" {
			imEnd = uint32(i)
		}
	}
	return []builtinKV{
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.pre", "default"},
		{"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.scores", scores},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.unknown_token_id", uint32(0)},
		{"tokenizer.ggml.bos_token_id", uint32(1)},
		{"tokenizer.ggml.eos_token_id", uint32(2)},
		{"tokenizer.ggml.eot_token_id", imEnd},
		{"tokenizer.ggml.add_bos_token", true},
		{"tokenizer.ggml.add_eos_token", false},
		{"tokenizer.ggml.add_space_prefix", false},
		{"tokenizer.chat_template", chatMLTemplate},
	}
}

const chatMLTemplate = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// BuiltinGGUF writes spec as a GGUF image.
func BuiltinGGUF(spec BuiltinSpec) (*gguf.Writer, error) {
	return BuiltinGGUFTyped(spec, nil)
}

// BuiltinGGUFTyped writes spec as a GGUF image with each matrix in the type
// typeOf gives for its name (spec.Type where typeOf is nil), from the same
// float32 weights; norms stay F32. Tests use it to rebuild, with the
// project's ggml-exact quantisers, a mixed-type file such as the one
// llama-quantize makes of the F32 model.
func BuiltinGGUFTyped(spec BuiltinSpec, typeOf func(name string) quant.Type) (*gguf.Writer, error) {
	if spec.Arch != "" && spec.Arch != "llama" {
		return archGGUF(spec, typeOf)
	}
	tokens, types, scores := byteVocab(spec.Vocab)
	vocab := len(tokens)
	hd := spec.Dim / spec.Heads
	w := gguf.NewWriter()
	kvs := []builtinKV{
		{"general.architecture", "llama"},
		{"general.name", BuiltinPrefix + spec.Name},
		{"general.file_type", fileType(spec.Type)},
		{"llama.context_length", uint32(spec.Ctx)},
		{"llama.embedding_length", uint32(spec.Dim)},
		{"llama.block_count", uint32(spec.Layers)},
		{"llama.feed_forward_length", uint32(spec.FFN)},
		{"llama.attention.head_count", uint32(spec.Heads)},
		{"llama.attention.head_count_kv", uint32(spec.KVHeads)},
		{"llama.rope.dimension_count", uint32(hd)},
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.rope.freq_base", float32(10000)},
	}
	for _, kv := range append(kvs, vocabKVs(tokens, types, scores)...) {
		if err := w.SetKV(kv.k, kv.v); err != nil {
			return nil, fmt.Errorf("model: builtin: %w", err)
		}
	}
	d, kvd, ffn := uint64(spec.Dim), uint64(spec.KVHeads*hd), uint64(spec.FFN)
	type tensor struct {
		name string
		rows uint64
		cols uint64
		norm bool
	}
	ts := []tensor{{"token_embd.weight", uint64(vocab), d, false}, {"output_norm.weight", 1, d, true}}
	if !spec.Tied {
		ts = append(ts, tensor{"output.weight", uint64(vocab), d, false})
	}
	for l := 0; l < spec.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		ts = append(ts,
			tensor{p + "attn_norm.weight", 1, d, true},
			tensor{p + "attn_q.weight", d, d, false},
			tensor{p + "attn_k.weight", kvd, d, false},
			tensor{p + "attn_v.weight", kvd, d, false},
			tensor{p + "attn_output.weight", d, d, false},
			tensor{p + "ffn_norm.weight", 1, d, true},
			tensor{p + "ffn_gate.weight", ffn, d, false},
			tensor{p + "ffn_up.weight", ffn, d, false},
			tensor{p + "ffn_down.weight", d, ffn, false},
		)
	}
	for _, t := range ts {
		vals := make([]float32, t.rows*t.cols)
		typ := spec.Type
		if typeOf != nil {
			typ = typeOf(t.name)
		}
		if t.norm {
			for i := range vals {
				vals[i] = 1
			}
			typ = quant.F32
		} else {
			fillUniform(vals, spec.Seed, t.name, float32(1/math.Sqrt(float64(t.cols))))
		}
		if t.name == "output.weight" {
			dampNonText(vals, t.cols, types)
		}
		b, err := quant.Quantize(typ, vals)
		if err != nil {
			return nil, fmt.Errorf("model: builtin %s: %w", t.name, err)
		}
		dims := []uint64{t.cols, t.rows}
		if t.norm {
			dims = []uint64{t.cols}
		}
		if err := w.AddTensor(t.name, typ, dims, b); err != nil {
			return nil, fmt.Errorf("model: builtin %s: %w", t.name, err)
		}
	}
	return w, nil
}

// dampNonText scales down the output rows (cols wide) of byte, control and
// padding tokens so that a random network writes printable ASCII rather
// than invalid UTF-8.
func dampNonText(vals []float32, cols uint64, types []int32) {
	for id, typ := range types {
		if typ != ttNormal {
			row := vals[uint64(id)*cols : uint64(id+1)*cols]
			for i := range row {
				row[i] *= 0.05
			}
		}
	}
}

// fillUniform writes values uniform in [-a, a) from a splitmix64 stream
// seeded by the model seed and the tensor name, so each tensor is
// reproducible on its own.
func fillUniform(dst []float32, seed uint64, name string, a float32) {
	h := fnv.New64a()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], seed)
	h.Write(b[:])
	h.Write([]byte(name))
	s := h.Sum64()
	for i := range dst {
		s += 0x9e3779b97f4a7c15
		z := s
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		z ^= z >> 31
		u := float32(z>>40) / float32(1<<24) // [0,1)
		dst[i] = (2*u - 1) * a
	}
}

// fileType is llama.cpp's general.file_type (llama_ftype) for a file whose
// weights are all of type t.
func fileType(t quant.Type) uint32 {
	switch t {
	case quant.F16:
		return 1
	case quant.Q4_0:
		return 2
	case quant.Q8_0:
		return 7
	case quant.BF16:
		return 32
	}
	return 0 // all F32
}
