package model

import (
	"fmt"

	"github.com/pagewarden/pagewarden/internal/gguf"
)

// Mistral, and where a file's attention window comes from.
//
// Mistral 7B is a llama-shaped network whose every layer attends to the
// last 4096 positions (v0.1; v0.2 and later attend to everything). No
// llama.cpp writes an architecture of its own for it: b4748's
// convert_hf_to_gguf.py registers MistralForCausalLM (and Mixtral) as
// "llama" and writes no window, and its llama graph ignores one, so every
// Mistral GGUF people download says general.architecture = "llama".
// Later llama.cpp versions name other models "mistral3" (Ministral 3,
// Devstral Small 2: YaRN RoPE scaling and a position-dependent attention
// temperature), which this engine does not compute and refuses by name.
//
// So there is no "mistral" architecture here: a "llama" file that carries
// llama.attention.sliding_window (llama.cpp's LLM_KV_ATTENTION_SLIDING_WINDOW,
// the key phi3 and gemma2 files carry under their own prefix) runs with
// that window on every layer, with llama.cpp's n_swa meaning: the key at
// position k is seen from position q iff q-k < window. A file without the
// key runs with full attention, exactly as llama.cpp b4748 runs it, so a
// Mistral 7B v0.1 GGUF gives llama.cpp's answers (which differ from the
// original model's beyond 4096 positions).

// maxWindow bounds a window read from a file; anything larger is longer
// than any context this engine supports (Validate's 1<<24) anyway.
const maxWindow = 1 << 30

// slidingWindow reads <arch>.attention.sliding_window: 0 when the key is
// absent (or 0, as phi-4 files say "no window"), an error naming the key
// when it is there but not a usable count, so that a window is never
// silently dropped (the model would then answer with full attention).
func slidingWindow(f *gguf.File, arch string) (int, error) {
	key := arch + ".attention.sliding_window"
	v, ok := f.Lookup(key)
	if !ok {
		return 0, nil
	}
	n, ok := v.Uint()
	if !ok {
		return 0, fmt.Errorf("%w: metadata key %s is %v, not a non-negative integer", ErrBadConfig, key, v)
	}
	if n > maxWindow {
		return 0, fmt.Errorf("%w: %s = %d is absurd", ErrBadConfig, key, n)
	}
	return int(n), nil
}

// unsupportedFeatures names what a file of a supported architecture asks
// for that this engine does not compute, before a missing tensor would
// report it less clearly: a llama file with experts (Mixtral, and
// llama.cpp's conversions of other MoE models) has blk.N.ffn_gate_exps
// instead of blk.N.ffn_gate.
func unsupportedFeatures(f *gguf.File, arch string) error {
	if n, ok := f.Uint(arch + ".expert_count"); ok && n > 0 {
		return fmt.Errorf("%w: %s.expert_count = %d: mixture-of-experts models (such as Mixtral) are not supported", ErrUnsupportedArch, arch, n)
	}
	return nil
}

// archHint says what an architecture this engine refuses would need, for
// the ones people are likely to try; "" for the others.
func archHint(arch string) string {
	switch arch {
	case "mistral3":
		return "Ministral 3 / Devstral Small 2: YaRN RoPE scaling and llama4-style attention temperature are not implemented"
	case "gemma3":
		return "gemma3: per-layer RoPE bases for its local and global layers and query/key norms are not implemented"
	}
	return ""
}

// EveryLayerWindow is the attention window when every layer has the same
// one (mistral, phi3), else 0 (no window, or gemma2's alternate global
// layers, which read every position). It is how many positions a sequence
// must keep: pages wholly before the last EveryLayerWindow positions are
// never read again (kvcache.Pool.DropBefore, sched.Config.Window).
func (c *Config) EveryLayerWindow() int {
	if c.SlidingWindow <= 0 {
		return 0
	}
	for l := range c.Layers {
		if c.Window(l) != c.SlidingWindow {
			return 0
		}
	}
	return c.SlidingWindow
}
