package model

import (
	"fmt"

	"github.com/pagewarden/pagewarden/internal/gguf"
)

// phi3 is Phi-3 (and Phi-4, which shares its GGUF architecture) as
// llama.cpp b4748 runs it: llama's block with the Q, K and V projections
// fused in one attn_qkv tensor and the gate and up projections in one
// ffn_up tensor (gate rows first: llm_build_ffn's SWIGLU splits the
// product in halves and applies silu to the first), NeoX RoPE, a sliding
// window on every layer, and the "su"/"longrope" scaling: per-frequency
// factors, long or short, and an attention factor multiplying the
// rotations.

func phi3Config(f *gguf.File, c *Config) error {
	c.RopeStyle = RopeNeox
	if c.TiedOutput {
		return fmt.Errorf("%w: output.weight (phi3 does not tie its output to the embedding)", ErrMissingTensor)
	}

	// The window: the file's, where 0 means none (Phi-4); older files
	// have no key, and llama.cpp fills in the released models' values
	// (PR 8931) and refuses any other shape.
	w, ok, err := optUint(f, "phi3.attention.sliding_window")
	if err != nil {
		return err
	}
	if !ok {
		switch {
		case (c.Layers == 32 || c.Layers == 40) && c.ContextLength == 4096:
			w = 2047 // Phi-3-mini-4k, Phi-3-medium-4k
		case c.Layers == 32 && c.KVHeads == 32 && c.ContextLength == 131072:
			w = 262144 // Phi-3-mini-128k
		case c.Layers == 40 && c.ContextLength == 131072:
			w = 131072 // Phi-3-medium-128k
		default:
			return fmt.Errorf("%w: phi3.attention.sliding_window is missing (0 means no window)", ErrBadConfig)
		}
	}
	// A window that holds the whole context never masks anything; 0
	// says so without making the KV cache keep track of it.
	c.SlidingWindow = int(w)
	if c.SlidingWindow >= c.ContextLength {
		c.SlidingWindow = 0
	}

	// "su"/"longrope" scaling. llama.cpp picks the long factors when the
	// context it runs with exceeds the original one (build_rope_factors);
	// this engine runs a model with its whole trained context, as
	// llama.cpp does by default (n_ctx 0), so the long factors apply
	// exactly when the trained context is longer than the original.
	long, hasLong := f.Tensor("rope_factors_long.weight")
	short, hasShort := f.Tensor("rope_factors_short.weight")
	switch {
	case hasLong && !hasShort:
		return fmt.Errorf("%w: rope_factors_short.weight (the file has rope_factors_long.weight)", ErrMissingTensor)
	case hasShort && !hasLong:
		return fmt.Errorf("%w: rope_factors_long.weight (the file has rope_factors_short.weight)", ErrMissingTensor)
	case hasLong:
		orig := uint64(c.ContextLength)
		if v, ok, err := optUint(f, "phi3.rope.scaling.original_context_length"); err != nil {
			return err
		} else if ok && v > 0 {
			orig = v
		}
		t := short
		if uint64(c.ContextLength) > orig {
			t = long
		}
		if c.RopeFreqFactors, err = vector(t, c.RopeDims/2); err != nil {
			return err
		}
		for i, v := range c.RopeFreqFactors {
			if !(v > 0) || v > 1e30 {
				return fmt.Errorf("%w: %s[%d] = %g is not a positive factor", ErrBadConfig, t.Name, i, v)
			}
		}
	}
	// llama.cpp multiplies every rotation by rope.scaling.attn_factor
	// whichever factors apply (cparams.yarn_attn_factor).
	af, err := optFloat(f, "phi3.rope.scaling.attn_factor", 0)
	if err != nil {
		return err
	}
	if af != 1 {
		c.RopeAttnFactor = af
	}
	return nil
}

// phi3Layer loads the fused projections: attn_qkv (Q, K, V rows in that
// order, as Proj wants them) and ffn_up (gate then up).
func phi3Layer(ld archLoader, p string, c *Config, L *Layer) error {
	var err error
	if L.QKV, err = ld.proj(c.Dim, []string{p + "attn_qkv.weight"}, []int{c.QDim() + 2*c.KVDim()}); err != nil {
		return err
	}
	L.GateUp, err = ld.proj(c.Dim, []string{p + "ffn_up.weight"}, []int{2 * c.FFN})
	return err
}
