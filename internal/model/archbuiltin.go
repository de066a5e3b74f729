package model

import (
	"fmt"
	"math"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// archGGUF writes a builtin phi3 or gemma2 model: the builtin vocabulary,
// the architecture's tensors laid out as llama.cpp's converter writes
// them, and deterministic pseudo-random weights. Unlike the llama
// builtins, norm weights are random around 1, so that a norm applied in
// the wrong place (gemma2 has four per layer) changes the outputs.
func archGGUF(spec BuiltinSpec, typeOf func(name string) quant.Type) (*gguf.Writer, error) {
	tokens, types, scores := byteVocab(spec.Vocab)
	if spec.Arch == "phi3" {
		// llama.cpp sets attributes of Phi-3's <|endoftext|> in any
		// model whose name says phi3, and fails to load one without it.
		tokens, types, scores = append(tokens, "<|endoftext|>"), append(types, ttControl), append(scores, 0)
	}
	vocab := uint64(len(tokens))
	hd := spec.Dim / spec.Heads
	if spec.HeadDim != 0 {
		hd = spec.HeadDim
	}
	a := spec.Arch
	d, qd, kvd, ffn := uint64(spec.Dim), uint64(spec.Heads*hd), uint64(spec.KVHeads*hd), uint64(spec.FFN)
	kvs := []builtinKV{
		{"general.architecture", a},
		{"general.name", BuiltinPrefix + spec.Name},
		{"general.file_type", fileType(spec.Type)},
		{a + ".context_length", uint32(spec.Ctx)},
		{a + ".embedding_length", uint32(spec.Dim)},
		{a + ".block_count", uint32(spec.Layers)},
		{a + ".feed_forward_length", uint32(spec.FFN)},
		{a + ".attention.head_count", uint32(spec.Heads)},
		{a + ".attention.head_count_kv", uint32(spec.KVHeads)},
		{a + ".attention.sliding_window", uint32(spec.Window)},
	}
	// tensor is one weight: rows x cols, values uniform in [-amp, amp)
	// plus offset; a vector (rows 0: norms, rope factors) stays F32.
	type tensor struct {
		name        string
		rows, cols  uint64
		amp, offset float32
	}
	mat := func(name string, rows, cols uint64, gain float32) tensor {
		return tensor{name, rows, cols, gain / float32(math.Sqrt(float64(cols))), 0}
	}
	norm := func(name string) tensor { return tensor{name, 0, d, 0.25, 1} }
	var ts []tensor
	switch a {
	case "phi3":
		kvs = append(kvs,
			builtinKV{"phi3.rope.dimension_count", uint32(hd)},
			builtinKV{"phi3.attention.layer_norm_rms_epsilon", float32(1e-5)},
			builtinKV{"phi3.rope.freq_base", float32(10000)},
		)
		ts = append(ts, mat("token_embd.weight", vocab, d, 1), norm("output_norm.weight"), mat("output.weight", vocab, d, 1))
		if spec.RopeOrigCtx > 0 {
			// What convert_hf_to_gguf.py writes for "longrope": the
			// original context, the attention factor of the context
			// ratio, and both factor lists (here uniform in [1, 3)).
			s := float64(spec.Ctx) / float64(spec.RopeOrigCtx)
			af := 1.0
			if s > 1 {
				af = math.Sqrt(1 + math.Log(s)/math.Log(float64(spec.RopeOrigCtx)))
			}
			kvs = append(kvs,
				builtinKV{"phi3.rope.scaling.original_context_length", uint32(spec.RopeOrigCtx)},
				builtinKV{"phi3.rope.scaling.attn_factor", float32(af)},
			)
			ts = append(ts,
				tensor{"rope_factors_long.weight", 0, uint64(hd / 2), 1, 2},
				tensor{"rope_factors_short.weight", 0, uint64(hd / 2), 1, 2},
			)
		}
		for l := 0; l < spec.Layers; l++ {
			p := fmt.Sprintf("blk.%d.", l)
			ts = append(ts,
				norm(p+"attn_norm.weight"),
				mat(p+"attn_qkv.weight", qd+2*kvd, d, 1),
				mat(p+"attn_output.weight", d, qd, 1),
				norm(p+"ffn_norm.weight"),
				mat(p+"ffn_up.weight", 2*ffn, d, 1),
				mat(p+"ffn_down.weight", d, ffn, 1),
			)
		}
	case "gemma2":
		// Soft-caps well below Gemma 2's 50 and 30, and queries and keys
		// and embeddings larger than the other builtins', so that both
		// caps bend the scores and logits of this small model instead
		// of passing them through nearly unchanged.
		kvs = append(kvs,
			builtinKV{"gemma2.attention.key_length", uint32(hd)},
			builtinKV{"gemma2.attention.value_length", uint32(hd)},
			builtinKV{"gemma2.attention.layer_norm_rms_epsilon", float32(1e-6)},
			builtinKV{"gemma2.attn_logit_softcapping", float32(2)},
			builtinKV{"gemma2.final_logit_softcapping", float32(5)},
		)
		ts = append(ts, mat("token_embd.weight", vocab, d, 4), norm("output_norm.weight"))
		for l := 0; l < spec.Layers; l++ {
			p := fmt.Sprintf("blk.%d.", l)
			ts = append(ts,
				norm(p+"attn_norm.weight"),
				mat(p+"attn_q.weight", qd, d, 2),
				mat(p+"attn_k.weight", kvd, d, 2),
				mat(p+"attn_v.weight", kvd, d, 1),
				mat(p+"attn_output.weight", d, qd, 1),
				norm(p+"post_attention_norm.weight"),
				norm(p+"ffn_norm.weight"),
				mat(p+"ffn_gate.weight", ffn, d, 1),
				mat(p+"ffn_up.weight", ffn, d, 1),
				mat(p+"ffn_down.weight", d, ffn, 1),
				norm(p+"post_ffw_norm.weight"),
			)
		}
	default:
		return nil, fmt.Errorf("model: builtin %s: no generator for architecture %q", spec.Name, a)
	}

	w := gguf.NewWriter()
	for _, kv := range append(kvs, vocabKVs(tokens, types, scores)...) {
		if err := w.SetKV(kv.k, kv.v); err != nil {
			return nil, fmt.Errorf("model: builtin: %w", err)
		}
	}
	for _, t := range ts {
		n := t.cols
		if t.rows > 0 {
			n *= t.rows
		}
		vals := make([]float32, n)
		fillUniform(vals, spec.Seed, t.name, t.amp)
		for i := range vals {
			vals[i] += t.offset
		}
		if t.name == "output.weight" || (t.name == "token_embd.weight" && a == "gemma2") {
			// gemma2's output is the embedding: damping its rows
			// damps those tokens' inputs too, which is harmless.
			dampNonText(vals, t.cols, types)
		}
		typ := spec.Type
		if t.rows == 0 {
			typ = quant.F32
		} else if typeOf != nil {
			typ = typeOf(t.name)
		}
		b, err := quant.Quantize(typ, vals)
		if err != nil {
			return nil, fmt.Errorf("model: builtin %s: %w", t.name, err)
		}
		dims := []uint64{t.cols, t.rows}
		if t.rows == 0 {
			dims = dims[:1]
		}
		if err := w.AddTensor(t.name, typ, dims, b); err != nil {
			return nil, fmt.Errorf("model: builtin %s: %w", t.name, err)
		}
	}
	return w, nil
}
