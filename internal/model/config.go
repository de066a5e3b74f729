package model

import (
	"errors"
	"fmt"
	"math"
)

// Errors returned by loaders; each is wrapped with the detail.
var (
	ErrUnsupportedArch = errors.New("model: unsupported architecture")
	ErrBadShape        = errors.New("model: tensor shape does not match the model's metadata")
	ErrMissingTensor   = errors.New("model: required tensor missing")
	ErrBadConfig       = errors.New("model: invalid hyper-parameters")
)

// RopeStyle says which pairs of a head's dimensions RoPE rotates together.
type RopeStyle uint8

const (
	// RopeNormal rotates adjacent pairs (2i, 2i+1): GGUF "llama" (whose Q/K
	// rows the converter permuted for it) and llama2.c.
	RopeNormal RopeStyle = iota
	// RopeNeox rotates (i, i+d/2): qwen2 and other NeoX-style models.
	RopeNeox
)

// Config is the shape and the hyper-parameters of a model.
type Config struct {
	Arch          string // "llama", "qwen2", "phi3", "gemma2"
	Dim           int    // embedding width
	Layers        int
	Heads         int
	KVHeads       int
	HeadDim       int
	FFN           int // feed-forward hidden width
	Vocab         int
	ContextLength int // trained context window
	NormEps       float32

	RopeStyle RopeStyle
	RopeBase  float32 // theta base, 10000 unless the file says otherwise
	RopeDims  int     // rotated dimensions per head (usually HeadDim)
	// RopeFreqScale multiplies positions (linear rope scaling: 1/factor).
	RopeFreqScale float32
	// RopeFreqFactors divides each pair's frequency (Llama 3.1's
	// rope_freqs.weight); nil when absent.
	RopeFreqFactors []float32
	// RopeRunC computes angles the way llama2.c's run.c does (one powf per
	// pair) instead of ggml's running product; both are RoPE, but the last
	// bits differ and the reference outputs we match were made by each.
	RopeRunC bool

	TiedOutput bool // the output matrix is the token embedding

	// SlidingWindow, when positive, limits what a token attends to: the
	// key at position k is seen from position q only if q-k <
	// SlidingWindow (llama.cpp's n_swa; mistral, phi3, gemma2). 0 means
	// every earlier position.
	SlidingWindow int
	// WindowedLayers says which layers the window applies to; nil means
	// all of them (gemma2 alternates windowed and global layers).
	WindowedLayers []bool
	// AttnScale multiplies the query-key products; 0 means 1/sqrt(HeadDim)
	// (Gemma 2 27B: 1/sqrt(Dim/Heads), its query_pre_attn_scalar).
	AttnScale float32
	// AttnSoftcap, when positive, caps attention scores as
	// AttnSoftcap*tanh(score/AttnSoftcap) before the softmax (gemma2).
	AttnSoftcap float32

	// EmbedScale, when non-zero, multiplies the token embeddings (gemma2:
	// sqrt(Dim)).
	EmbedScale float32
	// FFNAct is the activation of the feed-forward gate: SiLU (SwiGLU)
	// or GELU (GeGLU, gemma2).
	FFNAct Activation
	// FinalSoftcap, when positive, caps the logits as
	// FinalSoftcap*tanh(logit/FinalSoftcap) (gemma2).
	FinalSoftcap float32
	// RopeAttnFactor, when non-zero, multiplies the cosine and sine of
	// every rotation (ggml's mscale; phi3's rope.scaling.attn_factor), so
	// that query-key products grow by its square.
	RopeAttnFactor float32
}

// Activation is the nonlinearity of a gated feed-forward block.
type Activation uint8

const (
	ActSiLU Activation = iota // silu(gate)*up: llama, qwen2, phi3
	ActGELU                   // gelu(gate)*up, tanh approximation: gemma2
)

// Window is the attention window of layer l: the number of positions a
// token sees, its own included, or 0 for all of them.
func (c *Config) Window(l int) int {
	if c.SlidingWindow <= 0 || (c.WindowedLayers != nil && !c.WindowedLayers[l]) {
		return 0
	}
	return c.SlidingWindow
}

// Scale is the factor applied to query-key products.
func (c *Config) Scale() float32 {
	if c.AttnScale != 0 {
		return c.AttnScale
	}
	return float32(1 / math.Sqrt(float64(c.HeadDim)))
}

// QDim is the width of the query projection.
func (c *Config) QDim() int { return c.Heads * c.HeadDim }

// KVDim is the width of the key and value projections.
func (c *Config) KVDim() int { return c.KVHeads * c.HeadDim }

// Validate checks the hyper-parameters are usable together.
func (c *Config) Validate() error {
	switch {
	case c.Dim <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.KVHeads <= 0 || c.HeadDim <= 0 || c.FFN <= 0 || c.Vocab <= 0:
		return fmt.Errorf("%w: every size must be positive (dim %d, layers %d, heads %d, kv heads %d, head dim %d, ffn %d, vocab %d)",
			ErrBadConfig, c.Dim, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.FFN, c.Vocab)
	case c.Heads%c.KVHeads != 0:
		return fmt.Errorf("%w: %d heads is not a multiple of %d kv heads", ErrBadConfig, c.Heads, c.KVHeads)
	case c.HeadDim%2 != 0 || c.RopeDims%2 != 0 || c.RopeDims > c.HeadDim || c.RopeDims <= 0:
		return fmt.Errorf("%w: head dim %d / rope dims %d must be even and rope dims ≤ head dim", ErrBadConfig, c.HeadDim, c.RopeDims)
	case c.ContextLength <= 0:
		return fmt.Errorf("%w: context length %d", ErrBadConfig, c.ContextLength)
	case !(c.NormEps > 0):
		return fmt.Errorf("%w: rms norm epsilon %g", ErrBadConfig, c.NormEps)
	case !(c.RopeBase > 0) || !(c.RopeFreqScale > 0):
		return fmt.Errorf("%w: rope base %g, freq scale %g", ErrBadConfig, c.RopeBase, c.RopeFreqScale)
	case c.RopeFreqFactors != nil && len(c.RopeFreqFactors) != c.RopeDims/2:
		return fmt.Errorf("%w: %d rope frequency factors for %d rotated dims", ErrBadConfig, len(c.RopeFreqFactors), c.RopeDims)
	case c.SlidingWindow < 0 || (c.WindowedLayers != nil && len(c.WindowedLayers) != c.Layers):
		return fmt.Errorf("%w: sliding window %d over %d of %d layers", ErrBadConfig, c.SlidingWindow, len(c.WindowedLayers), c.Layers)
	case c.AttnScale < 0 || c.AttnSoftcap < 0 || math.IsNaN(float64(c.AttnScale)) || math.IsNaN(float64(c.AttnSoftcap)):
		return fmt.Errorf("%w: attention scale %g, soft-cap %g", ErrBadConfig, c.AttnScale, c.AttnSoftcap)
	case !(c.EmbedScale >= 0) || !(c.FinalSoftcap >= 0) || !(c.RopeAttnFactor >= 0) || c.FFNAct > ActGELU:
		return fmt.Errorf("%w: embedding scale %g, logit soft-cap %g, rope attention factor %g, activation %d",
			ErrBadConfig, c.EmbedScale, c.FinalSoftcap, c.RopeAttnFactor, c.FFNAct)
	case c.Layers > 1024 || c.Dim > 1<<16 || c.HeadDim > 1024 || c.Heads > 1024 || c.FFN > 1<<18 || c.Vocab > 1<<22 || c.ContextLength > 1<<24:
		return fmt.Errorf("%w: sizes beyond what this engine supports (layers %d, dim %d, heads %d, head dim %d, ffn %d, vocab %d, ctx %d)",
			ErrBadConfig, c.Layers, c.Dim, c.Heads, c.HeadDim, c.FFN, c.Vocab, c.ContextLength)
	}
	return nil
}
