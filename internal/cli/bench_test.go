package cli

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestBenchBatch: --batch measures aggregate decode for each sequence
// count (a row per count, named for the workload, with the bandwidth
// columns), and nonsense is a usage error naming the flag.
func TestBenchBatch(t *testing.T) {
	r := pw(t, "bench", "-m", "builtin:tiny", "--batch", "1,3", "--batch-prompt", "5", "-n", "2", "-r", "1", "--threads-list", "1", "--bw-mib", "4")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	for _, b := range []string{"1", "3"} {
		re := `(?m)^\s*builtin:tiny\s+F32\s+\S+\s+1\s+tg2 x` + b + ` \(pp5\)\s+[0-9.]+\s+[0-9.]+-[0-9.]+\s+[0-9.]+\s+[0-9]+%\s*$`
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("no row for %s sequences (%s):\n%s", b, re, r.stdout)
		}
	}
	if regexp.MustCompile(`\s(pp5|tg2)\s+[0-9]`).MatchString(r.stdout) {
		t.Errorf("batch mode ran the pp/tg tests too:\n%s", r.stdout)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"zero sequences", []string{"--batch", "0"}, "--batch"},
		{"not a list", []string{"--batch", "4,x"}, "--batch"},
		{"no prompt", []string{"--batch", "2", "--batch-prompt", "0"}, "--batch-prompt"},
		{"negative buffer", []string{"--bw-mib", "-1"}, "--bw-mib"},
		{"with llama-bench", []string{"--batch", "2", "--llama-bench", "/bin/true"}, "llama-batched-bench"},
		{"beyond the context", []string{"--batch", "2", "--batch-prompt", "100000"}, "context"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := pw(t, append([]string{"bench", "-m", "builtin:tiny", "-n", "2", "-r", "1", "--threads-list", "1", "--bw-mib", "0"}, tc.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", r.code, r.stderr, tc.want)
			}
		})
	}
}

// TestBenchCPUProfile: --cpuprofile writes a gzip-compressed pprof profile
// of the run (the format go tool pprof reads), and a path that cannot be
// created is a usage error naming the flag, before anything is measured.
func TestBenchCPUProfile(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		path string
		code int
		want string
	}{
		{"written", filepath.Join(dir, "cpu.prof"), 0, ""},
		{"no such directory", filepath.Join(dir, "missing", "cpu.prof"), 2, "--cpuprofile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := pw(t, "bench", "-m", "builtin:tiny", "-p", "4", "-n", "2", "-r", "1", "--threads-list", "1", "--bw-mib", "0", "--cpuprofile", tc.path)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
			if tc.code != 0 {
				if _, err := os.Stat(tc.path); err == nil {
					t.Errorf("a failed run left %s", tc.path)
				}
				return
			}
			f, err := os.Open(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			// A stopped profile is a complete gzip stream holding a
			// protobuf; a profile never stopped would end early.
			z, err := gzip.NewReader(f)
			if err != nil {
				t.Fatalf("profile is not gzip: %v", err)
			}
			b, err := io.ReadAll(z)
			if err != nil || len(b) == 0 {
				t.Fatalf("profile: %d bytes, %v", len(b), err)
			}
		})
	}
}
