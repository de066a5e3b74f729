package cli

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/syncbuf"
)

// waitFor polls buf until it contains want.
func waitFor(t *testing.T, buf *syncbuf.Buffer, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(buf.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q after 30s; stderr:\n%s", want, buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServeScrubsQuarantineOnSIGUSR1: serve takes --quarantine-reap-after,
// and SIGUSR1 makes it scrub the KV quarantine through the scheduler loop
// and log the count (0 here: nothing violated), without stopping.
func TestServeScrubsQuarantineOnSIGUSR1(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &syncbuf.Buffer{}
	code := make(chan int, 1)
	go func() {
		code <- Main(ctx, []string{"serve", "--model", "builtin:tiny", "--threads", "1", "--listen", "127.0.0.1:0", "--kv-memory", "64MiB", "--metrics-listen", "127.0.0.1:0", "--quarantine-reap-after", "1m"}, io.Discard, stderr)
	}()
	// serve catches SIGUSR1 before it announces its address: signalling
	// any earlier would kill the test binary.
	waitFor(t, stderr, "listening on http://")
	if !regexp.MustCompile(`API key \(shown once\): pw-\S+\n(.*\n)*listening on`).MatchString(stderr.String()) {
		t.Errorf("no generated key announced before the address:\n%s", stderr.String())
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, stderr, `"msg":"SIGUSR1: quarantined KV pages scrubbed and freed","pages":0`)
	cancel()
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("serve exited %d; stderr:\n%s", c, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// watchBuffer is a syncbuf.Buffer that signals every write.
type watchBuffer struct {
	syncbuf.Buffer
	wrote chan struct{}
}

func (w *watchBuffer) Write(p []byte) (int, error) {
	n, err := w.Buffer.Write(p)
	select {
	case w.wrote <- struct{}{}:
	default:
	}
	return n, err
}

// serve runs `pagewarden serve` on builtin:tiny with args until the test
// ends, and returns the API's base URL and what it wrote on stderr until
// it announced that URL.
func serve(t *testing.T, args ...string) (api, stderr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errb := &watchBuffer{wrote: make(chan struct{}, 1)}
	code := make(chan int, 1)
	args = append([]string{"serve", "--model", "builtin:tiny", "--threads", "1", "--listen", "127.0.0.1:0", "--kv-memory", "64MiB", "--metrics-listen", "127.0.0.1:0"}, args...)
	go func() { code <- Main(ctx, args, io.Discard, errb) }()
	exited := false
	t.Cleanup(func() {
		cancel()
		if !exited {
			if c := <-code; c != 0 {
				t.Errorf("serve exited %d; stderr:\n%s", c, errb.String())
			}
		}
	})
	addr := regexp.MustCompile(`listening on (http://\S+)`)
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		if m := addr.FindStringSubmatch(errb.String()); m != nil {
			return m[1], errb.String()
		}
		select {
		case <-errb.wrote:
		case c := <-code:
			exited = true
			t.Fatalf("serve exited %d before listening; stderr:\n%s", c, errb.String())
		case <-timeout.C:
			t.Fatalf("serve not listening after 30s; stderr:\n%s", errb.String())
		}
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func TestServeMetricsFlagDefaults(t *testing.T) {
	f := serveCmd().Flags()
	for name, want := range map[string]string{"metrics-listen": "127.0.0.1:9464", "metrics-on-api": "false"} {
		if fl := f.Lookup(name); fl == nil || fl.DefValue != want {
			t.Errorf("--%s: %+v, want the default %q", name, fl, want)
		}
	}
}

// TestServeMetricsOffTheAPI: /metrics names every tenant and its traffic
// and is not authenticated, so the API listener serves it only with
// --metrics-on-api, whatever --metrics-listen says (--metrics-listen's
// default, a fixed loopback port, is replaced here by a free port or by
// none, so that the test never depends on that port being free).
func TestServeMetricsOffTheAPI(t *testing.T) {
	const victimKey = "sk-victim-corp-key"
	config := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(config, []byte("tenants:\n  - id: victim-corp\n    api_key_sha256: [\""+tenants.HashKey(victimKey)+"\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	traffic := func(t *testing.T, api string) {
		t.Helper()
		req, _ := http.NewRequest("POST", api+"/v1/completions", strings.NewReader(`{"prompt":"hello","max_tokens":2}`))
		req.Header.Set("Authorization", "Bearer "+victimKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion: %d", resp.StatusCode)
		}
	}
	for _, tc := range []struct {
		name      string
		args      []string
		onAPI     bool
		privately bool // a metrics listener is announced
	}{
		{"private listener", []string{"--metrics-listen", "127.0.0.1:0"}, false, true},
		{"no metrics listener", []string{"--metrics-listen="}, false, false},
		{"metrics on api", []string{"--metrics-listen=", "--metrics-on-api"}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, stderr := serve(t, append([]string{"--config", config}, tc.args...)...)
			traffic(t, api)
			code, body := get(t, api+"/metrics")
			if leaked := strings.Contains(body, "victim-corp"); tc.onAPI != (code == http.StatusOK && leaked) || !tc.onAPI && (code != http.StatusNotFound || leaked) {
				t.Errorf("GET /metrics on the API listener: %d, names the tenant: %v", code, leaked)
			}
			m := regexp.MustCompile(`metrics on (http://\S+)`).FindStringSubmatch(stderr)
			if (m != nil) != tc.privately {
				t.Fatalf("metrics listener announced: %v; stderr:\n%s", m != nil, stderr)
			}
			if m != nil {
				if code, body := get(t, m[1]); code != http.StatusOK || !strings.Contains(body, `pagewarden_prompt_tokens_total{tenant="victim-corp"}`) {
					t.Errorf("GET %s: %d %.300s", m[1], code, body)
				}
			}
		})
	}
}

// TestServeKeyNotPrintedBeforeFailedStart: without --config, serve makes a
// tenant and a key, but announces the key only when it is about to
// listen; a model that fails to load must not leave a key on the console.
func TestServeKeyNotPrintedBeforeFailedStart(t *testing.T) {
	var stderr syncbuf.Buffer
	code := Main(context.Background(), []string{"serve", "--model", "builtin:no-such-model", "--listen", "127.0.0.1:0", "--metrics-listen="}, io.Discard, &stderr)
	if code == 0 {
		t.Fatal("serve of a missing model exited 0")
	}
	if strings.Contains(stderr.String(), "API key") || strings.Contains(stderr.String(), "pw-") {
		t.Errorf("a key was printed before the start failed:\n%s", stderr.String())
	}
}
