package model

import (
	"math"
	"sync"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// gemma2 is Gemma 2 as llama.cpp b4748 runs it (build_gemma2): embeddings
// scaled by sqrt(dim); RMS norms whose weights the converter already
// stored as 1+w, so they are plain RMS norms here; a norm after attention
// and after the feed-forward block, before each joins the residual; GeGLU;
// attention scores and final logits soft-capped; a sliding window on the
// even layers (il % 2 == 0), the odd ones global; NeoX RoPE; the output
// tied to the embedding.

func gemma2Config(f *gguf.File, c *Config) error {
	c.RopeStyle = RopeNeox
	// llama.cpp multiplies by token_embd even when a file carries an
	// output.weight (it is not one of gemma2's tensors).
	c.TiedOutput = true
	c.FFNAct = ActGELU
	c.EmbedScale = float32(math.Sqrt(float64(float32(c.Dim))))

	w, ok, err := optUint(f, "gemma2.attention.sliding_window")
	if err != nil {
		return err
	}
	if !ok {
		w = 4096 // llama.cpp's default for gemma2
	}
	c.SlidingWindow, c.WindowedLayers = 0, nil
	if int(w) < c.ContextLength && w > 0 {
		c.SlidingWindow = int(w)
		c.WindowedLayers = make([]bool, c.Layers)
		for l := range c.WindowedLayers {
			c.WindowedLayers[l] = l%2 == 0
		}
	}
	// llama.cpp soft-caps gemma2's attention always (attn_soft_cap), at
	// 50 unless the file says otherwise, and its logits at 30.
	if c.AttnSoftcap, err = optFloat(f, "gemma2.attn_logit_softcapping", 50); err != nil {
		return err
	}
	if c.FinalSoftcap, err = optFloat(f, "gemma2.final_logit_softcapping", 30); err != nil {
		return err
	}
	// The query scale: Gemma 2 scales by query_pre_attn_scalar^-1/2,
	// which GGUF files do not carry; llama.cpp b4748 uses
	// 1/sqrt(head_dim) for the 2B and 9B (26 and 42 layers, where the
	// scalar is head_dim) and 1/sqrt(dim/heads) for the 27B (46 layers,
	// scalar 144 with head_dim 128). It refuses other layer counts; here
	// they get head_dim, the 2B and 9B rule.
	if c.Layers == 46 && c.Heads > 0 {
		c.AttnScale = 1 / float32(math.Sqrt(float64(float32(c.Dim/c.Heads))))
	}
	return nil
}

// gemma2Layer loads the post-attention and post-feed-forward norms.
func gemma2Layer(ld archLoader, p string, c *Config, L *Layer) error {
	var err error
	if L.PostAttnNorm, err = ld.vec(p+"post_attention_norm.weight", c.Dim); err != nil {
		return err
	}
	L.PostFFNNorm, err = ld.vec(p+"post_ffw_norm.weight", c.Dim)
	return err
}

// postNorm RMS-normalises, in place, each of the n rows (dim wide) of x
// by w; nothing when w is nil (every architecture but gemma2).
func postNorm(x, w []float32, dim, n int, eps float32) {
	if w == nil {
		return
	}
	for r := 0; r < n; r++ {
		kernels.RMSNorm(x[r*dim:(r+1)*dim], x[r*dim:(r+1)*dim], w, eps)
	}
}

// scale multiplies x by a, as ggml_scale does.
func scale(x []float32, a float32) {
	for i := range x {
		x[i] *= a
	}
}

// softcap sets x = c*tanh(x/c) as llama.cpp's graph does for gemma2's
// logits: scale by the float32 reciprocal, tanh, scale back.
func softcap(x []float32, c float32) {
	inv := 1 / c
	for i, v := range x {
		x[i] = float32(math.Tanh(float64(v*inv))) * c
	}
}

// geluMul sets dst = gelu(gate) * up elementwise; dst may alias either.
//
// ggml's CPU backend (GGML_GELU_FP16, defined in every b4748 build)
// computes gelu from a table: the input rounded to F16 indexes the F16
// result of the tanh approximation, except beyond ±10 where gelu is 0 or
// the identity. Computing it in float32 instead would move each output by
// up to half an F16 step (about 5e-4 relative), which over a model's
// layers is far more than the rest of the arithmetic differs by.
func geluMul(dst, gate, up []float32) {
	tab := geluTable()
	up = up[:len(gate)]
	dst = dst[:len(gate)]
	for i, x := range gate {
		var g float32
		switch {
		case x <= -10:
			g = 0
		case x >= 10:
			g = x
		default:
			g = quant.F16ToF32(tab[quant.F32ToF16(x)])
		}
		dst[i] = g * up[i]
	}
}

// geluTable is ggml's table_gelu_f16: for every F16 bit pattern, the F16
// of ggml_gelu_f32 of its value.
var geluTable = sync.OnceValue(func() *[1 << 16]uint16 {
	var t [1 << 16]uint16
	for i := range t {
		t[i] = quant.F32ToF16(geluF32(quant.F16ToF32(uint16(i))))
	}
	return &t
})

// geluF32 is ggml_gelu_f32, the tanh approximation, in float32 steps.
func geluF32(x float32) float32 {
	const (
		coefA       = float32(0.044715)
		sqrt2OverPi = float32(0.79788456080286535587989211986876)
	)
	// gcc (-O3 -march=native, GNU C's default contraction) fuses
	// 1+a*x*x into one multiply-add and rounds every other product; the
	// conversions keep Go from fusing anything else. So made, the table
	// equals ggml's for every F16 input (TestGELUMatchesGGML); rounding
	// 1+a*x*x separately moves one entry (x = -1.999) by an F16 step.
	inner := float32(sqrt2OverPi*x) * float32(math.FMA(float64(float32(coefA*x)), float64(x), 1))
	return float32(0.5*x) * (1 + float32(math.Tanh(float64(inner))))
}
