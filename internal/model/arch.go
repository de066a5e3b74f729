package model

import (
	"fmt"

	"github.com/pagewarden/pagewarden/internal/gguf"
)

// archHook is what an architecture beyond llama and qwen2 does differently
// while loading: its hyper-parameters, read after the common ones, and the
// tensors of a layer that it names or adds.
type archHook struct {
	// config completes c from the file's metadata and tensors; it runs
	// before Validate.
	config func(f *gguf.File, c *Config) error
	// layer loads what layer p ("blk.N.") has beyond or instead of
	// llama's tensors. A projection it leaves with no rows (L.QKV,
	// L.GateUp) is loaded as llama's.
	layer func(ld archLoader, p string, c *Config, L *Layer) error
}

// archLoader hands a hook the loader's checked readers: proj for
// projections of one input (names with their row counts), vec for 1-D
// tensors.
type archLoader struct {
	proj func(cols int, names []string, rows []int) (Proj, error)
	vec  func(name string, n int) ([]float32, error)
}

// archHooks are the architectures loaded through hooks, by
// general.architecture.
var archHooks = map[string]*archHook{
	"phi3":   {config: phi3Config, layer: phi3Layer},
	"gemma2": {config: gemma2Config, layer: gemma2Layer},
}

// optUint reads an optional integer key: ok is false when the key is
// absent; a key present with another type is an error naming it.
func optUint(f *gguf.File, key string) (v uint64, ok bool, err error) {
	if _, present := f.Lookup(key); !present {
		return 0, false, nil
	}
	v, ok = f.Uint(key)
	if !ok || v > 1<<30 {
		return 0, false, fmt.Errorf("%w: %s must be a non-negative integer below 2^30", ErrBadConfig, key)
	}
	return v, true, nil
}

// optFloat reads an optional positive number; def when the key is absent.
func optFloat(f *gguf.File, key string, def float32) (float32, error) {
	if _, present := f.Lookup(key); !present {
		return def, nil
	}
	v, ok := f.Float(key)
	if !ok || !(v > 0) || v > 1e30 {
		return 0, fmt.Errorf("%w: %s must be a positive number", ErrBadConfig, key)
	}
	return float32(v), nil
}
