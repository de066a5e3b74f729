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
// declarations are exactly what asmgen.go writes, so nobody edits the
// generated files by hand or changes the generator without regenerating.
func TestGeneratedAssemblyUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the generator with the go command")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to run asmgen.go")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("asmgen.go")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "asmgen.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goCmd, "run", "asmgen.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GO111MODULE=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run asmgen.go: %v\n%s", err, out)
	}
	for _, f := range []string{"gemm_amd64.s", "gemm_stubs_amd64.go", "vec_avx2_amd64.s"} {
		want, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what asmgen.go writes: run go generate in internal/kernels", f)
		}
	}
}
