package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// fakeLlamaBench writes a stand-in for llama-bench: it checks the
// arguments bench passes and prints one JSON record as llama-bench -o json
// does (prefill at 100 tokens/s, decode at 10), or fails as told.
func fakeLlamaBench(t *testing.T, fail bool) string {
	t.Helper()
	script := `#!/bin/sh
p= n= th= ctk= ctv= o= r= m=
while [ $# -gt 0 ]; do
  case "$1" in
    -p) p=$2; shift 2 ;; -n) n=$2; shift 2 ;; -t) th=$2; shift 2 ;;
    -ctk) ctk=$2; shift 2 ;; -ctv) ctv=$2; shift 2 ;; -o) o=$2; shift 2 ;;
    -r) r=$2; shift 2 ;; -m) m=$2; shift 2 ;; *) echo "unknown argument $1" >&2; exit 1 ;;
  esac
done
[ -s "$m" ] || { echo "no model file $m" >&2; exit 1; }
[ "$o" = json ] && [ "$r" = 1 ] && [ "$ctk" = "$ctv" ] || { echo "bad flags" >&2; exit 1; }
` + map[bool]string{true: "echo 'error: failed to load model' >&2; exit 1\n", false: ""}[fail] + `
ts=10; [ "$p" != 0 ] && ts=100
echo "[{\"build_commit\": \"fake123\", \"n_prompt\": $p, \"n_gen\": $n, \"n_threads\": $th, \"type_k\": \"$ctk\", \"avg_ts\": $ts}]"
`
	path := filepath.Join(t.TempDir(), "llama-bench")
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBenchLlamaBench: --llama-bench runs the given binary on a GGUF file
// of the same model (a builtin one written by the project's writer) for
// every test and thread count, once per repetition, and prints its rows and
// pagewarden's ratio to it; a failing binary or an f32 cache llama-bench
// cannot run are errors that say so.
func TestBenchLlamaBench(t *testing.T) {
	args := []string{"bench", "-m", "builtin:tiny", "-p", "16", "-n", "4", "-r", "2", "--threads-list", "1", "--bw-mib", "4"}
	r := pw(t, append(args, "--llama-bench", fakeLlamaBench(t, false))...)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	for _, re := range []string{
		`llama\.cpp +1 +pp16 +100\.0 +100\.0-100\.0`,
		`llama\.cpp +1 +tg4 +10\.0 +10\.0-10\.0`,
		`pagewarden / llama\.cpp \(best of 2 each; .*llama-bench, build fake123; K/V f16; builtin:tiny\)`,
		`(?m)^ +\S+ +1 +pp16 +[0-9]+\.[0-9]{2}$`,
		`(?m)^ +\S+ +1 +tg4 +[0-9]+\.[0-9]{2}$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("output lacks %s:\n%s", re, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "K/V type f16 on both sides") {
		t.Errorf("no note that the K/V type became f16: %q", r.stderr)
	}

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"failing binary", []string{"--llama-bench", fakeLlamaBench(t, true)}, 1, "failed to load model"},
		{"f32 cache", []string{"--llama-bench", fakeLlamaBench(t, false), "--kv-type", "f32"}, 2, "llama-bench has no f32 K/V cache"},
		{"missing binary", []string{"--llama-bench", filepath.Join(t.TempDir(), "nope")}, 2, "--llama-bench"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := pw(t, append(args, tc.args...)...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want %d and %q", r.code, r.stderr, tc.code, tc.want)
			}
		})
	}
}
