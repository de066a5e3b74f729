package kvcache_test

import (
	"go/build"
	"strings"
	"testing"
)

// TestPureCore: the pool is a deterministic data structure, so its
// non-test code imports nothing that does IO, reads a clock, draws random
// numbers or coordinates goroutines (sync/atomic, for a counter bumped by
// Views, is the one exception).
func TestPureCore(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	forbidden := []string{"net", "os", "time", "syscall", "io/fs", "log", "math/rand", "crypto/rand", "sync"}
	for _, imp := range pkg.Imports {
		for _, f := range forbidden {
			if imp == f || strings.HasPrefix(imp, f+"/") && imp != "sync/atomic" {
				t.Errorf("kvcache imports %q", imp)
			}
		}
	}
	if len(pkg.Imports) == 0 {
		t.Fatal("no imports found: the check is not looking at the package")
	}
}
