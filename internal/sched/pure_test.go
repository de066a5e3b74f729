package sched

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"testing"
)

// TestCoreIsPure enforces the pure-core rule of STYLE.md on the files
// that make up Core: no goroutines, no clock, no IO, no locks, no
// randomness. The driver (node.go) is the only place for those.
func TestCoreIsPure(t *testing.T) {
	forbiddenImports := map[string]bool{"net": true, "os": true, "io": true, "sync": true, "math/rand": true, "math/rand/v2": true, "crypto/rand": true, "context": false}
	forbiddenTime := map[string]bool{"Now": true, "Since": true, "Until": true, "Sleep": true, "After": true, "AfterFunc": true, "NewTimer": true, "NewTicker": true, "Tick": true}
	for _, file := range []string{"core.go", "state.go", "limits.go", "admission.go", "mutant.go", "nomutant.go", "reaper.go", "policy.go"} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if forbiddenImports[path] {
				t.Errorf("%s imports %s", file, path)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.GoStmt:
				t.Errorf("%s: goroutine at %v", file, fset.Position(n.Pos()))
			case *ast.SelectorExpr:
				if id, ok := n.X.(*ast.Ident); ok && id.Name == "time" && forbiddenTime[n.Sel.Name] {
					t.Errorf("%s: time.%s at %v (time is an input: Tick)", file, n.Sel.Name, fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
}
