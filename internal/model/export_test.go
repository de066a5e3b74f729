package model

import "github.com/pagewarden/pagewarden/internal/gguf"

// Loaders that keep every projection its own matrix: the reference the
// fused projections are tested against.

func BuiltinUnfused(name string) (*Model, error) { return builtin(name, false) }

func FromGGUFUnfused(f *gguf.File) (*Model, error) { return fromGGUF(f, false) }

func LoadLlama2CUnfused(path, tokPath string) (*Model, error) {
	return loadLlama2C(path, tokPath, false)
}
