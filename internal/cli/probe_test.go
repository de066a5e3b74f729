package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/probe"
	"github.com/pagewarden/pagewarden/internal/syncbuf"
)

// startServeTenants runs serve on builtin:tiny with one tenant per key,
// each allowed max_concurrent requests at once, and returns its URL.
func startServeTenants(t *testing.T, maxConcurrent int, keys ...string) string {
	t.Helper()
	var cfg strings.Builder
	cfg.WriteString("tenants:\n")
	for i, k := range keys {
		fmt.Fprintf(&cfg, "  - id: t%d\n    api_key_sha256: [\"%s\"]\n    limits: {max_concurrent: %d}\n", i, tenants.HashKey(k), maxConcurrent)
	}
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &syncbuf.Buffer{}
	done := make(chan int, 1)
	args := []string{"serve", "--model", "builtin:tiny", "--threads", "1", "--listen", "127.0.0.1:0", "--kv-memory", "16MiB",
		"--metrics-listen", "", "--metrics-on-api", "--max-context", "256", "--config", path}
	go func() { done <- Main(ctx, args, io.Discard, stderr) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, stderr, "listening on http://")
	m := regexp.MustCompile(`listening on (http://\S+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("serve output: %s", stderr.String())
	}
	return m[1]
}

// TestProbePagewarden: pagewarden probe --quick against serve (a prefill
// and a decode node behind the gateway, two tenants with a concurrency
// cap) passes every check; none is skipped, so each was really judged:
// the cache is seen to hit, streams are left mid-way, the burst is
// refused. The report holds neither key.
func TestProbePagewarden(t *testing.T) {
	keys := []string{"probe-key-alpha", "probe-key-beta"}
	url := startServeTenants(t, 6, keys...)
	report := filepath.Join(t.TempDir(), "probe.json")
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), []string{"probe", "--url", url, "--key", keys[0], "--key", keys[1], "--quick", "--json", report}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("probe exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var r probe.Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	want := []string{"canaries", "boundary", "prefix-cache", "abort-storm", "determinism", "errors", "overload", "server-counters"}
	if len(r.Checks) != len(want) {
		t.Fatalf("%d checks, want %v:\n%s", len(r.Checks), want, stdout.String())
	}
	for _, name := range want {
		if c := r.Check(name); c == nil || c.Verdict != probe.Pass {
			t.Errorf("%s: %+v\n%s", name, c, stdout.String())
		}
	}
	if r.Window != 256 || !r.Tokenize || r.Leak.Leaks != 0 || r.Leak.Trials < 20 {
		t.Errorf("window %d tokenize %v leak %+v", r.Window, r.Tokenize, r.Leak)
	}
	for _, k := range keys {
		if bytes.Contains(b, []byte(k)) || strings.Contains(stdout.String()+stderr.String(), k) {
			t.Errorf("the report or the output holds key %q", k)
		}
	}
	if !strings.Contains(stderr.String(), "canaries:") || !strings.Contains(stdout.String(), "verdict: PASS") {
		t.Errorf("progress or summary missing:\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	}
}

// TestProbeUsage: bad command lines are usage errors (exit 2) before any
// request is sent, and a probe of nothing listening fails (exit 1).
func TestProbeUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"probe", "--key", "a"}, 2, "at least two --key"},
		{[]string{"probe", "--key", "a,a"}, 2, "given twice"},
		{[]string{"probe", "--key", "a", "--key", "b", "--url", "ftp://x"}, 2, "--url"},
		{[]string{"probe", "--key", "a", "--key", "b", "--window", "-5"}, 2, "--window"},
		{[]string{"probe", "--key", "a", "--key", "b", "--max-duration", "0s"}, 2, "--max-duration"},
		{[]string{"probe", "--key", "a", "--key", "b", "--zero-metric", "bad name"}, 2, "--zero-metric"},
		{[]string{"probe", "--key", "a", "--key", "b", "--metrics-url", "localhost:9"}, 2, "--metrics-url"},
		{[]string{"probe", "--key", "a", "--key", "b", "--url", "http://127.0.0.1:1"}, 1, "/v1/models"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}
