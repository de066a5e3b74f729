package transfer

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestCoreIsPure enforces the pure-core rule of STYLE.md on every non-test
// file of the package: only the imports listed below (no net, os, io,
// time, sync, context, randomness, logging, unsafe), no goroutines, no
// channels, no select. The drivers and transports live elsewhere.
func TestCoreIsPure(t *testing.T) {
	allowed := []string{
		"container/heap", "crypto/sha256", "encoding/binary", "encoding/hex", "errors", "fmt",
		"hash/crc32", "math", "slices", "strconv",
		// A job's output constraint is compiled on decode: deterministic,
		// no IO, clock or goroutines.
		"github.com/pagewarden/pagewarden/internal/grammar",
		"github.com/pagewarden/pagewarden/internal/invariants",
		"github.com/pagewarden/pagewarden/internal/kvcache",
		"github.com/pagewarden/pagewarden/internal/request",
	}
	forbidden := []string{"net", "os", "io", "time", "sync", "context", "syscall", "log", "math/rand", "crypto/rand", "unsafe", "runtime", "reflect"}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		checked++
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			for _, bad := range forbidden {
				if path == bad || strings.HasPrefix(path, bad+"/") {
					t.Errorf("%s imports %s", file, path)
				}
			}
			if !slices.Contains(allowed, path) {
				t.Errorf("%s imports %s, which is not on the pure core's list", file, path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: goroutine at %v", file, fset.Position(n.Pos()))
			case *ast.ChanType, *ast.SelectStmt, *ast.SendStmt:
				t.Errorf("%s: channel operation at %v", file, fset.Position(n.Pos()))
			}
			return true
		})
	}
	if checked < 5 {
		t.Fatalf("checked %d files: the test is not looking at the package", checked)
	}
}
