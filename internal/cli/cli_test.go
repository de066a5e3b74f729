package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/testdata"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// result is what one run of Main produced.
type result struct {
	code           int
	stdout, stderr string
}

func pw(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(context.Background(), args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// summary is run's one-line report on stderr.
var summary = regexp.MustCompile(`(?m)^prompt (\d+) tokens, generated (\d+) tokens, prefill [0-9.]+ tok/s, decode [0-9.]+ tok/s \(1 threads, [A-Za-z0-9_(),]+\)$`)

func TestRunBuiltin(t *testing.T) {
	args := []string{"run", "--model", "builtin:tiny", "--temperature", "0", "-n", "5", "-t", "1", "--prompt", "Hello"}
	r := pw(t, args...)
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if strings.TrimSuffix(r.stdout, "\n") == "" {
		t.Errorf("no generated text on stdout: %q", r.stdout)
	}
	m := summary.FindStringSubmatch(r.stderr)
	if m == nil {
		t.Fatalf("no summary line on stderr:\n%s", r.stderr)
	}
	if m[1] != "6" || m[2] != "5" { // BOS + 5 bytes of "Hello"
		t.Errorf("summary counts prompt %s, generated %s; want 6 and 5", m[1], m[2])
	}
	// Greedy is deterministic: the same command prints the same text.
	if again := pw(t, args...); again.stdout != r.stdout {
		t.Errorf("greedy output changed between runs: %q then %q", r.stdout, again.stdout)
	}
	// --echo prints the prompt first.
	echo := pw(t, append(args, "--echo")...)
	if echo.code != 0 || echo.stdout != "Hello"+r.stdout {
		t.Errorf("--echo: exit %d, stdout %q, want %q", echo.code, echo.stdout, "Hello"+r.stdout)
	}
}

// TestRunStories260K is the reference check of issue 2 through the
// command line: llama2.c's run.c output, byte for byte.
func TestRunStories260K(t *testing.T) {
	want, err := os.ReadFile(testdata.Path(t, "models", "stories260K.t0.n200.expected.txt"))
	if err != nil {
		t.Fatal(err)
	}
	r := pw(t, "run", "--model", testdata.Path(t, "models", "stories260K.bin"), "--tokenizer", testdata.Path(t, "models", "tok512.bin"),
		"--temperature", "0", "-n", "200", "-t", "1")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if r.stdout != string(want) {
		t.Errorf("stdout differs from run.c's (-want +got):\n%s", cmp.Diff(string(want), r.stdout))
	}
}

// TestConvertThenRun converts stories260K to GGUF and runs the GGUF: the
// output must still be run.c's.
func TestConvertThenRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "stories260K.gguf")
	r := pw(t, "convert", "--checkpoint", testdata.Path(t, "models", "stories260K.bin"), "--tokenizer", testdata.Path(t, "models", "tok512.bin"), "--out", out)
	if r.code != 0 {
		t.Fatalf("convert: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "wrote "+out) {
		t.Errorf("convert stdout %q does not say what it wrote", r.stdout)
	}
	want, err := os.ReadFile(testdata.Path(t, "models", "stories260K.t0.n200.expected.txt"))
	if err != nil {
		t.Fatal(err)
	}
	r = pw(t, "run", "--model", out, "--temperature", "0", "-n", "200", "-t", "1")
	if r.code != 0 {
		t.Fatalf("run: exit %d, stderr:\n%s", r.code, r.stderr)
	}
	if r.stdout != string(want) {
		t.Errorf("GGUF output differs from run.c's (-want +got):\n%s", cmp.Diff(string(want), r.stdout))
	}

	// A builtin converts too, and the file loads.
	b := filepath.Join(t.TempDir(), "tiny-short.gguf")
	if r := pw(t, "convert", "--builtin", "tiny-short", "--out", b); r.code != 0 {
		t.Fatalf("convert --builtin: exit %d: %s", r.code, r.stderr)
	}
	if r := pw(t, "run", "--model", b, "--temperature", "0", "-n", "3", "-t", "1"); r.code != 0 || !summary.MatchString(r.stderr) {
		t.Errorf("run of the converted builtin: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestUsageErrors checks that every malformed command line exits 2 with a
// message naming what to fix, before any model is loaded.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"run", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"run", "stray"}, `unknown command "stray"`},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"run", "-n", "many"}, `invalid argument "many"`},
		{[]string{"run", "-n", "-1"}, "-n -1"},
		{[]string{"run", "--threads", "0"}, "--threads 0"},
		{[]string{"run", "--page-size", "0"}, "--page-size 0"},
		{[]string{"run", "--kv-type", "f8"}, `--kv-type "f8"`},
		{[]string{"run", "--temperature", "-1"}, "--temperature"},
		{[]string{"run", "--top-p", "1.5"}, "--top-p"},
		{[]string{"run", "--min-p", "-0.1"}, "--min-p"},
		{[]string{"run", "--top-k", "-3"}, "--top-k"},
		{[]string{"bench", "--threads-list", "1,x"}, "--threads-list"},
		{[]string{"bench", "-p", "0"}, "-p"},
		{[]string{"bench", "-n", "0"}, "-n and -r"},
		{[]string{"bench", "-r", "0"}, "-n and -r"},
		{[]string{"bench", "--kernels-list", "ref,sse9"}, "--kernels-list: unknown kernel tier \"sse9\""},
		{[]string{"bench", "--model", "builtin:tiny-short", "-p", "250", "-n", "10", "--threads-list", "1"}, "exceed the model's context of 256"},
		{[]string{"convert", "--builtin", "tiny"}, "--out"},
		{[]string{"convert", "--out", "x.gguf"}, "--checkpoint"},
		{[]string{"convert", "--builtin", "tiny", "--checkpoint", "a.bin", "--out", "x.gguf"}, "not both"},
		{[]string{"convert", "--checkpoint", "a.bin", "--out", "x.gguf"}, "--tokenizer"},
		{[]string{"convert", "--builtin", "nope", "--out", "x.gguf"}, `--builtin "nope"`},
		{[]string{"capacity", "--kv-memory", "12 parsecs"}, "--kv-memory"},
		{[]string{"capacity", "--max-context", "-5"}, "--max-context -5"},
		{[]string{"capacity", "--kv-safety-margin", "0.5"}, "--kv-safety-margin"},
		{[]string{"capacity", "--scrub", "bleach"}, "--scrub"},
		{[]string{"capacity", "--scrub", "none"}, "--allow-no-scrub"},
		{[]string{"capacity", "--max-batch-tokens", "0"}, "--max-batch-tokens"},
		{[]string{"serve", "--quarantine-reap-after", "-1s"}, "--quarantine-reap-after -1s"},
		{[]string{"serve", "--quarantine-reap-after", "soon"}, `invalid argument "soon"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := pw(t, tc.args...)
			if r.code != 2 {
				t.Errorf("exit %d, want 2 (stderr %q)", r.code, r.stderr)
			}
			if !strings.HasPrefix(r.stderr, "pagewarden: ") || !strings.Contains(r.stderr, tc.msg) {
				t.Errorf("stderr %q does not name %q", r.stderr, tc.msg)
			}
			if r.stdout != "" {
				t.Errorf("stdout %q on a usage error", r.stdout)
			}
		})
	}
}

// TestRunFailures checks the failures that are not the command line's
// fault: exit 1 and a message that says what went wrong.
func TestRunFailures(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.gguf")
	if err := os.WriteFile(garbage, []byte("GGUF\x03\x00\x00\x00 not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("a", 300) // byte-level vocabulary: 300 tokens + BOS
	for _, tc := range []struct {
		name string
		args []string
		msg  []string
	}{
		{"missing model file", []string{"run", "--model", filepath.Join(dir, "missing.gguf")}, []string{"missing.gguf", "no such file"}},
		{"missing tokenizer", []string{"run", "--model", testdata.Path(t, "models", "stories260K.bin"), "--tokenizer", filepath.Join(dir, "tok.bin")}, []string{"tok.bin", "no such file"}},
		{"checkpoint without tokenizer", []string{"run", "--model", testdata.Path(t, "models", "stories260K.bin")}, []string{"--tokenizer"}},
		{"corrupt GGUF", []string{"run", "--model", garbage}, []string{"garbage.gguf", "gguf"}},
		{"unknown builtin", []string{"run", "--model", "builtin:huge"}, []string{`"huge"`, "tiny"}},
		{"prompt longer than the context", []string{"run", "--model", "builtin:tiny-short", "-t", "1", "--prompt", long}, []string{"301 tokens", "context window is 256", "shorten"}},
		{"convert of a missing checkpoint", []string{"convert", "--checkpoint", filepath.Join(dir, "nope.bin"), "--tokenizer", "x", "--out", filepath.Join(dir, "o.gguf")}, []string{"nope.bin"}},
		{"capacity of a missing model", []string{"capacity", "--model", filepath.Join(dir, "missing.gguf")}, []string{"missing.gguf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := pw(t, tc.args...)
			if r.code != 1 {
				t.Errorf("exit %d, want 1 (stderr %q)", r.code, r.stderr)
			}
			for _, s := range tc.msg {
				if !strings.Contains(r.stderr, s) {
					t.Errorf("stderr %q does not mention %q", r.stderr, s)
				}
			}
		})
	}
	// A prompt that fits but leaves less room than -n asks for is not an
	// error: -n is lowered, with a note.
	r := pw(t, "run", "--model", "builtin:tiny-short", "-t", "1", "--temperature", "0", "--prompt", strings.Repeat("b", 250), "-n", "20")
	if r.code != 0 || !strings.Contains(r.stderr, "-n lowered to 5") {
		t.Errorf("near-full prompt: exit %d, stderr %q", r.code, r.stderr)
	}
	if m := summary.FindStringSubmatch(r.stderr); m == nil || m[1] != "251" || m[2] != "5" {
		t.Errorf("near-full prompt: summary %q, want 251 prompt and 5 generated tokens", m)
	}
}

func TestCapacity(t *testing.T) {
	// builtin:tiny: 4 layers x 2 kv heads x 32, F32, pages of 16 tokens:
	// 32 KiB per page.
	r := pw(t, "capacity", "--model", "builtin:tiny", "--kv-memory", "8MiB")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	for _, s := range []string{"builtin:tiny", "kv memory        8388608 bytes (8.0 MiB; --kv-memory)", "pages            256", "max context (W):   2048", "usable KV tokens:  4096"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("capacity output does not contain %q:\n%s", s, r.stdout)
		}
	}
	// F16 halves the page, doubling the pages.
	if r := pw(t, "capacity", "--model", "builtin:tiny", "--kv-memory", "8MiB", "--kv-type", "f16"); !strings.Contains(r.stdout, "pages            512") {
		t.Errorf("f16 capacity:\n%s", r.stdout)
	}

	// 1 MiB holds 32 pages = 512 tokens: far from 2 x 2048.
	r = pw(t, "capacity", "--model", "builtin:tiny", "--kv-memory", "1MiB", "--max-context", "2048")
	if r.code != 1 {
		t.Errorf("exit %d, want 1", r.code)
	}
	for _, s := range []string{"--max-context 2048", "--kv-memory", "--kv-safety-margin", "lower --max-context to at most 256"} {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("refusal %q does not name %q", r.stderr, s)
		}
	}
	// The same budget with a window that fits is accepted.
	if r := pw(t, "capacity", "--model", "builtin:tiny", "--kv-memory", "1MiB", "--max-context", "256"); r.code != 0 {
		t.Errorf("--max-context 256 in 1MiB: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestBench(t *testing.T) {
	r := pw(t, "bench", "--model", "builtin:tiny", "-p", "8", "-n", "4", "-r", "1", "--threads-list", "1", "--bw-mib", "4")
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 7 {
		t.Fatalf("want a header, two rows and the bandwidth table, got:\n%s", r.stdout)
	}
	// pp rows have no bandwidth columns; tg rows give GB/s and the share
	// of the bound measured with the same threads.
	row := regexp.MustCompile(`^\s*builtin:tiny\s+F32\s+` + regexp.QuoteMeta(kernels.Implementation()) + `\s+1\s+(pp8\s+[0-9.]+\s+[0-9.]+-[0-9.]+\s+-\s+-|tg4\s+[0-9.]+\s+[0-9.]+-[0-9.]+\s+[0-9.]+\s+[0-9]+%)\s*$`)
	for i, want := range []string{"pp8", "tg4"} {
		m := row.FindStringSubmatch(lines[i+1])
		if m == nil || !strings.HasPrefix(m[1], want) {
			t.Errorf("row %d %q, want a %s measurement", i+1, lines[i+1], want)
		}
	}
	if !strings.Contains(lines[0], "tokens/s") || !strings.Contains(lines[0], "of bound") {
		t.Errorf("header %q", lines[0])
	}
	if !strings.HasPrefix(lines[4], "streaming read bandwidth (4 MiB") || !regexp.MustCompile(`^\s*1\s+[0-9]+\.[0-9]$`).MatchString(lines[6]) {
		t.Errorf("bandwidth table:\n%s", strings.Join(lines[4:], "\n"))
	}
}

// TestBenchKernelsList: --kernels-list measures each tier, a row per tier
// and test in the order given, and leaves the installed tier in place.
func TestBenchKernelsList(t *testing.T) {
	before := kernels.Implementation()
	tiers := kernels.Tiers()
	r := pw(t, "bench", "--model", "builtin:tiny", "-p", "8", "-n", "2", "-r", "2", "--threads-list", "1", "--bw-mib", "0", "--kernels-list", strings.Join(tiers, ","))
	if r.code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", r.code, r.stderr)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 1+2*len(tiers) {
		t.Fatalf("want a header and %d rows, got:\n%s", 2*len(tiers), r.stdout)
	}
	for i, line := range lines[1:] {
		f := strings.Fields(line)
		if want := tiers[i%len(tiers)]; len(f) != 9 || f[2] != want {
			t.Errorf("row %d %q: want tier %s", i+1, line, want)
		}
	}
	if after := kernels.Implementation(); after != before {
		t.Errorf("bench left tier %s installed, was %s", after, before)
	}
}

func TestVersion(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"version"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	for _, want := range []string{"pagewarden ", "commit ", "go ", "kernels ", fmt.Sprintf("handoff    protocol %d\n", transfer.ProtocolVersion)} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("version output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestVersionFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"--version"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "handoff    protocol") {
		t.Fatalf("exit %d: %q %q", code, out.String(), errOut.String())
	}
}

// TestQueueFlags: the queue limits reach the node's options, with a finite
// default wait, and nonsense is a usage error.
func TestQueueFlags(t *testing.T) {
	var nf nodeFlags
	c := &cobra.Command{Use: "x"}
	nf.register(c)
	if err := c.ParseFlags([]string{"--max-queued", "10", "--max-queued-per-tenant", "3", "--max-queue-wait", "5s"}); err != nil {
		t.Fatal(err)
	}
	o, err := nf.options()
	if err != nil {
		t.Fatal(err)
	}
	if o.MaxQueued != 10 || o.MaxQueuedPerTenant != 3 || o.MaxQueueWait != 5*time.Second {
		t.Fatalf("options %+v", o)
	}
	var def nodeFlags
	d := &cobra.Command{Use: "y"}
	def.register(d)
	if o, err := def.options(); err != nil || o.MaxQueueWait != time.Minute {
		t.Fatalf("default queue wait %v (%v)", o.MaxQueueWait, err)
	}
	for _, args := range [][]string{{"--max-queued", "0"}, {"--max-queued-per-tenant", "-1"}, {"--max-queue-wait", "-1s"}} {
		var bad nodeFlags
		b := &cobra.Command{Use: "z"}
		bad.register(b)
		if err := b.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		var ue usageError
		if _, err := bad.options(); !errors.As(err, &ue) {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
}

// TestRunStopFlags: run takes --stop-token-ids and --ignore-eos as the
// API does (their effect is TestGenerateParamsStops'), and refuses an id
// that is not a token of the model.
func TestRunStopFlags(t *testing.T) {
	base := []string{"run", "--model", "builtin:tiny", "--temperature", "0", "-n", "8", "-t", "1", "--prompt", "Hello"}
	if r := pw(t, append(base, "--ignore-eos", "--stop-token-ids", "3,7")...); r.code != 0 || summary.FindStringSubmatch(r.stderr) == nil {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	r := pw(t, append(base, "--stop-token-ids", "-1")...)
	if r.code != 2 || !strings.Contains(r.stderr, "--stop-token-ids -1: not a token of this model") {
		t.Fatalf("exit %d, stderr %q; want a usage error naming the id", r.code, r.stderr)
	}
}
