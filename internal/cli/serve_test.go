package cli

import (
	"context"
	"io"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitFor polls buf until it contains want.
func waitFor(t *testing.T, buf *syncBuffer, want string) {
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
	stderr := &syncBuffer{}
	code := make(chan int, 1)
	go func() {
		code <- Main(ctx, []string{"serve", "--model", "builtin:tiny", "--threads", "1", "--listen", "127.0.0.1:0", "--kv-memory", "64MiB", "--quarantine-reap-after", "1m"}, io.Discard, stderr)
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

// TestServeKeyNotPrintedBeforeFailedStart: without --config, serve makes a
// tenant and a key, but announces the key only when it is about to
// listen; a model that fails to load must not leave a key on the console.
func TestServeKeyNotPrintedBeforeFailedStart(t *testing.T) {
	var stderr syncBuffer
	code := Main(context.Background(), []string{"serve", "--model", "builtin:no-such-model", "--listen", "127.0.0.1:0"}, io.Discard, &stderr)
	if code == 0 {
		t.Fatal("serve of a missing model exited 0")
	}
	if strings.Contains(stderr.String(), "API key") || strings.Contains(stderr.String(), "pw-") {
		t.Errorf("a key was printed before the start failed:\n%s", stderr.String())
	}
}
