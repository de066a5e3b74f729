//go:build amd64 && !purego

package kernels

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestGeneratedAssemblyUpToDate: the committed assembly and its Go
// declarations are exactly what the generators write, so nobody edits the
// generated files by hand or changes a generator without regenerating.
func TestGeneratedAssemblyUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the generators with the go command")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to run the generators")
	}
	for _, gen := range []struct {
		src   string
		files []string
	}{
		{"asmgen.go", []string{"gemm_amd64.s", "gemm_stubs_amd64.go", "vec_avx2_amd64.s"}},
		{"attngen.go", []string{"attn_amd64.s", "attn_stubs_amd64.go"}},
	} {
		t.Run(gen.src, func(t *testing.T) {
			dir := t.TempDir()
			src, err := os.ReadFile(gen.src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, gen.src), src, 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(goCmd, "run", gen.src)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "GO111MODULE=off", "GOFLAGS=")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("go run %s: %v\n%s", gen.src, err, out)
			}
			for _, f := range gen.files {
				want, err := os.ReadFile(filepath.Join(dir, f))
				if err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s differs from what %s writes: run go generate in internal/kernels", f, gen.src)
				}
			}
		})
	}
}
