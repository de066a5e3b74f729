package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// writeGGUF writes w to a file in dir and returns its path.
func writeGGUF(t *testing.T, dir, name string, w *gguf.Writer) string {
	t.Helper()
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunTensorTypes: run takes a file mixing the types llama-quantize
// falls back to (Q4_1, Q5_0, Q5_1 beside Q8_0, rows of 64), and run, serve
// and capacity refuse a file with a type the engine cannot compute with by
// naming the tensor, its type and what is supported.
func TestRunTensorTypes(t *testing.T) {
	dir := t.TempDir()
	spec := model.Builtins["tiny-short"]
	mix := []quant.Type{quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.Q8_0}
	i := 0
	w, err := model.BuiltinGGUFTyped(spec, func(string) quant.Type { i++; return mix[i%len(mix)] })
	if err != nil {
		t.Fatal(err)
	}
	mixed := writeGGUF(t, dir, "mixed.gguf", w)
	r := pw(t, "run", "--model", mixed, "-t", "1", "--temperature", "0", "-n", "3", "--prompt", "Hi")
	if r.code != 0 || !strings.Contains(r.stderr, "mixed(Q4_1,Q5_0,Q5_1,Q8_0)") {
		t.Errorf("mixed Q4_1/Q5_0/Q5_1/Q8_0 file: exit %d, stderr %q", r.code, r.stderr)
	}

	// The same model with one matrix in MXFP4, which nothing here computes.
	f, err := gguf.Parse(mustRead(t, mixed))
	if err != nil {
		t.Fatal(err)
	}
	bad := gguf.NewWriter()
	for _, kv := range f.KV {
		if err := bad.SetKV(kv.Key, kv.Value.Any()); err != nil {
			t.Fatalf("%s: %v", kv.Key, err)
		}
	}
	for _, ti := range f.Tensors {
		typ, data := ti.Type, ti.Data
		if ti.Name == "blk.1.ffn_up.weight" {
			typ = quant.MXFP4
			n, _ := quant.RowBytes(typ, int(ti.Elements()))
			data = make([]byte, n)
		}
		if err := bad.AddTensor(ti.Name, typ, ti.Dims, data); err != nil {
			t.Fatal(err)
		}
	}
	path := writeGGUF(t, dir, "mxfp4.gguf", bad)
	// run, serve and capacity load the model the same way; each must
	// refuse the file before doing anything else, with the same message.
	for _, args := range [][]string{
		{"run", "--model", path, "-t", "1", "-n", "1"},
		{"serve", "--model", path, "--listen", "127.0.0.1:0"},
		{"capacity", "--model", path},
	} {
		r = pw(t, args...)
		if r.code != 1 {
			t.Errorf("%s of the MXFP4 file: exit %d, want 1 (stderr %q)", args[0], r.code, r.stderr)
		}
		for _, s := range []string{"blk.1.ffn_up.weight", "has type MXFP4", "cannot compute with", "Q4_1, Q5_0, Q5_1", "Q5_K", "IQ4_XS"} {
			if !strings.Contains(r.stderr, s) {
				t.Errorf("%s of the MXFP4 file: stderr %q does not mention %q", args[0], r.stderr, s)
			}
		}
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
