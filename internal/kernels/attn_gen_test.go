//go:build amd64 && !purego

package kernels

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestAttnAssemblyUpToDate: attn_amd64.s and attn_stubs_amd64.go are
// exactly what attngen.go writes.
func TestAttnAssemblyUpToDate(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the generator with the go command")
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to run attngen.go")
	}
	dir := t.TempDir()
	src, err := os.ReadFile("attngen.go")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "attngen.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goCmd, "run", "attngen.go")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GO111MODULE=off", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run attngen.go: %v\n%s", err, out)
	}
	for _, f := range []string{"attn_amd64.s", "attn_stubs_amd64.go"} {
		want, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what attngen.go writes: run go generate in internal/kernels", f)
		}
	}
}
