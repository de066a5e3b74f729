// Package testdata locates the project's shared test data (../shared/testdata
// beside the repository) for tests. The binary never uses it.
package testdata

import (
	"os"
	"path/filepath"
	"testing"
)

// Dir returns the absolute path of shared/testdata, searching upwards from
// the working directory for a sibling "shared/testdata". PAGEWARDEN_TESTDATA
// overrides the search. It fails the test when the data is absent: tests
// that need reference data must not pass silently without it.
func Dir(tb testing.TB) string {
	tb.Helper()
	if d := os.Getenv("PAGEWARDEN_TESTDATA"); d != "" {
		return d
	}
	wd, err := os.Getwd()
	if err != nil {
		tb.Fatalf("testdata: %v", err)
	}
	for dir := wd; ; dir = filepath.Dir(dir) {
		cand := filepath.Join(dir, "shared", "testdata")
		if st, err := os.Stat(cand); err == nil && st.IsDir() {
			return cand
		}
		if filepath.Dir(dir) == dir {
			break
		}
	}
	tb.Fatalf("testdata: shared/testdata not found above %s (set PAGEWARDEN_TESTDATA)", wd)
	return ""
}

// Path joins elem onto Dir.
func Path(tb testing.TB, elem ...string) string {
	tb.Helper()
	return filepath.Join(append([]string{Dir(tb)}, elem...)...)
}
