package model

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/hugemem"
	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/tokenizer"
)

// Model is a loaded network with its tokenizer. It is immutable after
// loading and safe for concurrent Forward calls with distinct scratch
// buffers and views.
type Model struct {
	Config    Config
	W         Weights
	Tokenizer *tokenizer.Tokenizer
	// Digest identifies the weights and vocabulary; prefix-cache keys and
	// the transfer handshake use it so that KV made by one model is never
	// read as another's.
	Digest [32]byte
	// Name is what the model calls itself (general.name) or its source.
	Name string
	// ChatTemplate is tokenizer.chat_template from the file, "" if none.
	ChatTemplate string
	// WeightType summarises the tensor types ("Q8_0", "F32", "mixed").
	WeightType string

	closer io.Closer
}

// Close releases the model's memory mapping, if any. The model must not be
// used afterwards.
func (m *Model) Close() error {
	if m.closer == nil {
		return nil
	}
	err := m.closer.Close()
	m.closer = nil
	return err
}

// FromGGUF builds a model from a GGUF file read by gguf.Parse or gguf.Open.
// The model keeps references into f's memory; f is closed by Model.Close.
func FromGGUF(f *gguf.File) (*Model, error) { return fromGGUF(f, true) }

// fromGGUF is FromGGUF; fuse=false keeps every projection its own matrix,
// the reference the fused model is tested against.
func fromGGUF(f *gguf.File, fuse bool) (*Model, error) {
	arch, _ := f.String("general.architecture")
	if h := archHint(arch); h != "" {
		return nil, fmt.Errorf("%w %q: %s", ErrUnsupportedArch, arch, h)
	}
	ah := archHooks[arch] // nil for llama and qwen2
	switch {
	case arch == "llama" || arch == "qwen2" || ah != nil:
	case arch == "":
		return nil, fmt.Errorf("%w: general.architecture is missing (is this a model file?)", ErrUnsupportedArch)
	default:
		return nil, fmt.Errorf("%w %q (supported: llama, qwen2, phi3, gemma2)", ErrUnsupportedArch, arch)
	}
	if len(f.Tensors) == 0 {
		return nil, fmt.Errorf("%w: the file has no tensors (a vocabulary-only GGUF?)", ErrMissingTensor)
	}
	key := func(k string) string { return arch + "." + k }
	req := func(k string) (int, error) {
		v, ok := f.Uint(key(k))
		if !ok {
			return 0, fmt.Errorf("%w: metadata key %s missing or not a non-negative integer", ErrBadConfig, key(k))
		}
		if v > 1<<30 {
			return 0, fmt.Errorf("%w: %s = %d is absurd", ErrBadConfig, key(k), v)
		}
		return int(v), nil
	}
	c := Config{Arch: arch, RopeBase: 10000, RopeFreqScale: 1, NormEps: 1e-5}
	var err error
	for _, p := range []struct {
		k string
		v *int
	}{
		{"embedding_length", &c.Dim}, {"block_count", &c.Layers}, {"feed_forward_length", &c.FFN},
		{"attention.head_count", &c.Heads}, {"context_length", &c.ContextLength},
	} {
		if *p.v, err = req(p.k); err != nil {
			return nil, err
		}
	}
	c.KVHeads = c.Heads
	if v, ok := f.Uint(key("attention.head_count_kv")); ok {
		c.KVHeads = int(v)
	}
	if c.Heads > 0 {
		c.HeadDim = c.Dim / c.Heads
	}
	if v, ok := f.Uint(key("attention.key_length")); ok {
		c.HeadDim = int(v)
	}
	c.RopeDims = c.HeadDim
	if v, ok := f.Uint(key("rope.dimension_count")); ok {
		c.RopeDims = int(v)
	}
	if v, ok := f.Float(key("attention.layer_norm_rms_epsilon")); ok {
		c.NormEps = float32(v)
	}
	if v, ok := f.Float(key("rope.freq_base")); ok {
		c.RopeBase = float32(v)
	}
	if typ, ok := f.String(key("rope.scaling.type")); ok && typ != "none" {
		switch typ {
		case "linear":
			factor, ok := f.Float(key("rope.scaling.factor"))
			if !ok || !(factor > 0) {
				return nil, fmt.Errorf("%w: rope.scaling.type linear needs a positive rope.scaling.factor", ErrBadConfig)
			}
			c.RopeFreqScale = float32(1 / factor)
		case "llama3":
			// Llama 3.1 files carry the per-frequency factors as the
			// rope_freqs.weight tensor, read below.
		default:
			return nil, fmt.Errorf("%w: rope scaling %q is not supported (linear, llama3)", ErrBadConfig, typ)
		}
	} else if factor, ok := f.Float(key("rope.scale_linear")); ok && factor > 0 {
		c.RopeFreqScale = float32(1 / factor)
	}
	if c.SlidingWindow, err = slidingWindow(f, arch); err != nil {
		return nil, err
	}
	if err := unsupportedFeatures(f, arch); err != nil {
		return nil, err
	}
	if arch == "qwen2" {
		c.RopeStyle = RopeNeox
	}
	emb, ok := f.Tensor("token_embd.weight")
	if !ok {
		return nil, fmt.Errorf("%w: token_embd.weight", ErrMissingTensor)
	}
	if len(emb.Dims) != 2 {
		return nil, fmt.Errorf("%w: token_embd.weight has %d dims", ErrBadShape, len(emb.Dims))
	}
	c.Vocab = int(emb.Dims[1])
	if ff, ok := f.Tensor("rope_freqs.weight"); ok {
		v, err := vector(ff, c.RopeDims/2)
		if err != nil {
			return nil, err
		}
		c.RopeFreqFactors = v
	}
	_, hasOut := f.Tensor("output.weight")
	c.TiedOutput = !hasOut
	if ah != nil {
		if err := ah.config(f, &c); err != nil {
			return nil, err
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}

	m := &Model{Config: c}
	m.Name, _ = f.String("general.name")
	m.ChatTemplate, _ = f.String("tokenizer.chat_template")
	types := map[quant.Type]bool{}
	// One arena for all the matrices: the weights lie on huge pages end
	// to end, and each layer's, made in the order a forward pass reads
	// them, form one stream.
	arena := &hugemem.Arena{}
	// weight finds a matrix tensor and checks its shape and type.
	weight := func(name string, rows, cols int) (*gguf.TensorInfo, error) {
		t, ok := f.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("%w: %s", ErrMissingTensor, name)
		}
		if len(t.Dims) != 2 || t.Dims[0] != uint64(cols) || t.Dims[1] != uint64(rows) {
			return nil, fmt.Errorf("%w: %s has dims %v, want [%d %d]", ErrBadShape, name, t.Dims, cols, rows)
		}
		if !kernels.Supports(t.Type) {
			return nil, fmt.Errorf("model: tensor %s has type %s, which this engine cannot compute with (supported: %s)", name, t.Type, supportedList())
		}
		types[t.Type] = true
		return t, nil
	}
	mat := func(name string, rows, cols int) (*kernels.Matrix, error) {
		t, err := weight(name, rows, cols)
		if err != nil {
			return nil, err
		}
		mx, err := kernels.NewMatrixIn(arena, t.Type, rows, cols, t.Data)
		if err != nil {
			return nil, fmt.Errorf("model: tensor %s: %w", name, err)
		}
		return mx, nil
	}
	// proj prepares projections of one input (same column count) as a Proj.
	proj := func(cols int, names []string, rows []int) (Proj, error) {
		ts := make([]*gguf.TensorInfo, len(names))
		for i, name := range names {
			t, err := weight(name, rows[i], cols)
			if err != nil {
				return Proj{}, err
			}
			ts[i] = t
		}
		return newProj(arena, fuse, cols, ts)
	}
	vec := func(name string, n int) ([]float32, error) {
		t, ok := f.Tensor(name)
		if !ok {
			return nil, fmt.Errorf("%w: %s", ErrMissingTensor, name)
		}
		return vector(t, n)
	}
	if m.W.Embed, err = mat("token_embd.weight", c.Vocab, c.Dim); err != nil {
		return nil, err
	}
	if m.W.OutNorm, err = vec("output_norm.weight", c.Dim); err != nil {
		return nil, err
	}
	if c.TiedOutput {
		m.W.Output = m.W.Embed
	} else if m.W.Output, err = mat("output.weight", c.Vocab, c.Dim); err != nil {
		return nil, err
	}
	m.W.Layers = make([]Layer, c.Layers)
	qdim, kvdim := c.QDim(), c.KVDim()
	for i := range m.W.Layers {
		L := &m.W.Layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		if ah != nil && ah.layer != nil {
			// What the architecture names or adds differently; the
			// projections it leaves unset load as llama's below.
			if err := ah.layer(archLoader{proj, vec}, p, &c, L); err != nil {
				return nil, err
			}
		}
		if L.QKV.Rows() == 0 {
			if L.QKV, err = proj(c.Dim, []string{p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"}, []int{qdim, kvdim, kvdim}); err != nil {
				return nil, err
			}
		}
		if L.O, err = mat(p+"attn_output.weight", c.Dim, qdim); err != nil {
			return nil, err
		}
		if L.GateUp.Rows() == 0 {
			if L.GateUp, err = proj(c.Dim, []string{p + "ffn_gate.weight", p + "ffn_up.weight"}, []int{c.FFN, c.FFN}); err != nil {
				return nil, err
			}
		}
		if L.Down, err = mat(p+"ffn_down.weight", c.Dim, c.FFN); err != nil {
			return nil, err
		}
		if L.AttnNorm, err = vec(p+"attn_norm.weight", c.Dim); err != nil {
			return nil, err
		}
		if L.FFNNorm, err = vec(p+"ffn_norm.weight", c.Dim); err != nil {
			return nil, err
		}
		if _, ok := f.Tensor(p + "attn_q.bias"); ok || arch == "qwen2" {
			if L.QBias, err = vec(p+"attn_q.bias", qdim); err != nil {
				return nil, err
			}
			if L.KBias, err = vec(p+"attn_k.bias", kvdim); err != nil {
				return nil, err
			}
			if L.VBias, err = vec(p+"attn_v.bias", kvdim); err != nil {
				return nil, err
			}
		}
	}
	m.WeightType = summarizeTypes(types)

	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, fmt.Errorf("model: tokenizer: %w", err)
	}
	if err := checkTokenizer(tok, c.Vocab); err != nil {
		return nil, err
	}
	m.Tokenizer = tok
	m.Digest = digestGGUF(f)
	return m, nil
}

// checkTokenizer refuses a tokenizer whose ids do not fit the model.
func checkTokenizer(tok *tokenizer.Tokenizer, vocab int) error {
	if tok.VocabSize() != vocab {
		return fmt.Errorf("model: the tokenizer has %d tokens but the model's embedding has %d rows: they do not belong together", tok.VocabSize(), vocab)
	}
	return nil
}

// vector reads a 1-D tensor of n values as float32.
func vector(t *gguf.TensorInfo, n int) ([]float32, error) {
	count := uint64(1)
	for _, d := range t.Dims {
		count *= d
	}
	if count != uint64(n) {
		return nil, fmt.Errorf("%w: %s has %d values, want %d", ErrBadShape, t.Name, count, n)
	}
	out := make([]float32, n)
	if err := quant.Dequantize(t.Type, t.Data, out); err != nil {
		return nil, fmt.Errorf("model: tensor %s: %w", t.Name, err)
	}
	return out, nil
}

func summarizeTypes(types map[quant.Type]bool) string {
	var names []string
	for t := range types {
		names = append(names, t.String())
	}
	if len(names) == 1 {
		return names[0]
	}
	slices.Sort(names)
	return "mixed(" + strings.Join(names, ",") + ")"
}

// digestGGUF hashes the metadata and the tensor table, and every tensor's
// bytes, so that two different weight sets never share a digest.
func digestGGUF(f *gguf.File) [32]byte {
	h := sha256.New()
	fmt.Fprintf(h, "gguf v%d\n", f.Version)
	for _, kv := range f.KV {
		fmt.Fprintf(h, "%q=%v\n", kv.Key, kv.Value)
	}
	for i := range f.Tensors {
		t := &f.Tensors[i]
		fmt.Fprintf(h, "%q %v %s %d\n", t.Name, t.Dims, t.Type, len(t.Data))
		h.Write(t.Data)
	}
	var d [32]byte
	h.Sum(d[:0])
	return d
}

var errNoModel = errors.New("model: no model given")

// supportedList names the weight types the kernels compute with, for the
// error that refuses a file using another ("F32, F16, ..., IQ4_XS").
func supportedList() string {
	var b strings.Builder
	for i, t := range kernels.WeightTypes() {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(t.String())
	}
	return b.String()
}
