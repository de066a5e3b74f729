// Package goldentest holds what the tests that compare the engine with
// llama.cpp's recorded outputs compute the same way on both sides: the
// exact log-softmax the recording driver used and the digest that names a
// GGUF file's tensors. Tests only; the binary never uses it.
package goldentest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"sort"

	"github.com/pagewarden/pagewarden/internal/gguf"
)

// LogSoftmax is the log-softmax of logits in float64, as the goldens'
// driver computes it (max-shifted, one sum over the whole vocabulary).
func LogSoftmax(logits []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = max(mx, float64(v))
	}
	var s float64
	for _, v := range logits {
		s += math.Exp(float64(v) - mx)
	}
	lse := mx + math.Log(s)
	out := make([]float64, len(logits))
	for i, v := range logits {
		out[i] = float64(v) - lse
	}
	return out
}

// TensorSHA256 is a golden's tensor_sha256 of f: sha256 over name, NUL,
// type name, NUL and data of every tensor, in name order, so that a test
// knows the file it rebuilt is the one llama.cpp evaluated.
func TensorSHA256(f *gguf.File) string {
	names := make([]string, len(f.Tensors))
	for i := range f.Tensors {
		names[i] = f.Tensors[i].Name
	}
	sort.Strings(names)
	h := sha256.New()
	for _, n := range names {
		ti, _ := f.Tensor(n)
		fmt.Fprintf(h, "%s\x00%s\x00", n, ti.Type)
		h.Write(ti.Data)
	}
	return hex.EncodeToString(h.Sum(nil))
}
