package cli

import (
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
