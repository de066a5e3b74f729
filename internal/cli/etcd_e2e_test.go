package cli

import (
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/cluster/etcdtest"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// exited waits for p to exit by itself and returns its exit code.
func (p *proc) exited(t *testing.T, within time.Duration) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case <-done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(within):
		t.Fatalf("%s still running after %v:\n%s", p.name, within, p.out.String())
	}
	return 0
}

// TestRolesThroughEtcd: decode, prefill and gateway processes that know
// nothing of each other but an etcd (embedded in the test) find each
// other through it and serve what serve serves. A decode node started
// with another window is refused registration, naming both layouts and
// the node it differs from; one with a safety margin the registered
// decode nodes cannot hold the window with is refused too. A decode node
// killed with SIGKILL leaves the set when its lease expires (the gateway,
// the prefill node and the other decode node see it go) and the survivor
// keeps serving. A decode node cut off from etcd stops taking work and
// exits with the lost membership as its error.
func TestRolesThroughEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six processes")
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	ids := []link.Identity{{Name: "gw", Role: transfer.RoleGateway}, {Name: "p0", Role: transfer.RolePrefill}}
	for _, n := range []transfer.Peer{"d0", "d1", "d2", "d3"} {
		ids = append(ids, link.Identity{Name: n, Role: transfer.RoleDecode})
	}
	writeCerts(t, dir, ids...)
	// Short enough to keep the test quick, long enough that a node starved
	// of CPU on a loaded machine does not miss its renewals (every TTL/3).
	const ttl = 3 * time.Second
	etcdArgs := func(endpoint string) []string {
		return []string{"--etcd", endpoint, "--etcd-prefix", "/e2e", "--etcd-lease-ttl", ttl.String()}
	}
	common := []string{"--model", "builtin:tiny", "--threads", "1", "--kv-memory", "16MiB", "--tls-ca", filepath.Join(dir, "ca.pem")}
	roleArgs := func(role, name, endpoint string) []string {
		args := append([]string{role}, common...)
		args = append(args, "--name", name, "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem"))
		if role != "gateway" {
			args = append(args, "--link-listen", "127.0.0.1:0", "--metrics-listen", "")
		}
		return append(args, etcdArgs(endpoint)...)
	}
	linked := `linked on (127\.0\.0\.1:\d+)`
	d0 := startProc(t, "d0", roleArgs("decode", "d0", srv.Endpoint)...)
	d1 := startProc(t, "d1", roleArgs("decode", "d1", srv.Endpoint)...)
	d0.await(t, linked)
	d1.await(t, linked)
	p0 := startProc(t, "p0", roleArgs("prefill", "p0", srv.Endpoint)...)
	p0.await(t, linked)
	gw := startProc(t, "gw", append(roleArgs("gateway", "gw", srv.Endpoint), "--listen", "127.0.0.1:0", "--metrics-listen", "")...)
	url := "http://" + gw.await(t, `listening on http://(127\.0\.0\.1:\d+)`)
	key := gw.await(t, `API key \(shown once\): (\S+)`)

	prompts := []string{"Once upon a time", "The little dog", "She opened the door and"}
	want := referenceAnswers(t, prompts, 16)
	// Concurrent requests, so that both decode nodes take some.
	check := func(when string) {
		t.Helper()
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				p := prompts[i%len(prompts)]
				if c := complete(http.DefaultClient, url, key, p, 16); c.status != 200 || c.text != want[p] {
					t.Errorf("%s, %q: %d %q, serve said %q (%s)", when, p, c.status, c.text, want[p], c.body)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
	}
	check("through etcd")
	d1.await(t, `("link up"[^\n]*"peer":"gateway/gw")`)

	// Another window: another layout hash. Refused, naming both.
	d2 := startProc(t, "d2", append(roleArgs("decode", "d2", srv.Endpoint), "--max-context", "128")...)
	if code := d2.exited(t, 30*time.Second); code == 0 {
		t.Fatalf("d2 with another window exited 0:\n%s", d2.out.String())
	}
	out := d2.out.String()
	if !regexp.MustCompile(`configuration differs from the cluster's: layout hash: this node \(decode/d2\) has [0-9a-f]{64}, registered node \S+/\S+ \(at .*\) has [0-9a-f]{64}`).MatchString(out) {
		t.Errorf("d2's refusal does not name both layouts and the other node:\n%s", out)
	}

	// The same window, but a safety margin the registered decode nodes'
	// pools (8192 tokens) cannot hold the window (2048) with: refused,
	// naming the node that is too small and the numbers.
	d2 = startProc(t, "d2-margin", append(roleArgs("decode", "d2", srv.Endpoint), "--kv-memory", "32MiB", "--kv-safety-margin", "6")...)
	if code := d2.exited(t, 30*time.Second); code == 0 {
		t.Fatalf("d2 with margin 6 exited 0:\n%s", d2.out.String())
	}
	if out := d2.out.String(); !regexp.MustCompile(`configuration differs from the cluster's: capacity: decode node decode/d[01] holds 8192 KV tokens \(512 pages of 16\), below the window 2048 × safety margin 6 \(that of decode/d2\) = 12288 tokens`).MatchString(out) {
		t.Errorf("d2's refusal does not name the small node and the numbers:\n%s", out)
	}

	// SIGKILL d1: no goodbye; its lease expires.
	killed := time.Now()
	if err := d1.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	gw.await(t, `("msg":"node left the cluster","node":"d1")`)
	t.Logf("d1 left the gateway's rotation %v after SIGKILL (lease TTL %v)", time.Since(killed), ttl)
	p0.await(t, `("msg":"cluster member left"[^\n]*"member":"decode/d1")`)
	// Decode nodes follow the members too (Decode.PeerLeft): one that
	// leaves takes its reservations on the others with it.
	d0.await(t, `("msg":"cluster member left"[^\n]*"member":"decode/d1"[^\n]*"reservations_aborted":0)`)
	check("after d1 left")

	// d3 reaches etcd only through a proxy, which is then cut: it stops.
	proxy := srv.NewProxy(t)
	d3 := startProc(t, "d3", roleArgs("decode", "d3", proxy.Endpoint)...)
	d3.await(t, linked)
	gw.await(t, `("msg":"cluster member joined"[^\n]*"member":"decode/d3")`)
	proxy.Cut()
	if code := d3.exited(t, 30*time.Second); code == 0 {
		t.Fatalf("d3 cut off from etcd exited 0:\n%s", d3.out.String())
	}
	if out := d3.out.String(); !strings.Contains(out, "membership session lost") || !strings.Contains(out, "stopped taking work") {
		t.Errorf("d3's exit does not say it lost its membership:\n%s", out)
	}
	gw.await(t, `("msg":"node left the cluster","node":"d3")`)
	check("after d3 left")

	// A graceful stop leaves the cluster at once.
	if err := d0.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	gw.await(t, `("msg":"node left the cluster","node":"d0")`)
	if c := complete(http.DefaultClient, url, key, prompts[0], 4); c.status != 503 && c.status != 429 {
		t.Errorf("with no decode node: %d %s, want overloaded", c.status, c.body)
	}
}

// TestEtcdFlags: --etcd excludes static peer lists, the etcd TLS flags
// need it, and its settings are checked before anything starts.
func TestEtcdFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"gateway", "--etcd", "127.0.0.1:2379", "--decode", "d0=127.0.0.1:7000"}, "--etcd and --prefill/--decode cannot be used together"},
		{[]string{"prefill", "--etcd", "127.0.0.1:2379", "--decode", "d0=127.0.0.1:7000"}, "--etcd and --prefill/--decode cannot be used together"},
		{[]string{"decode", "--etcd-ca", "ca.pem"}, "need --etcd"},
		{[]string{"gateway", "--etcd-cert", "c.pem", "--prefill", "p=h:1", "--decode", "d=h:2"}, "need --etcd"},
		{[]string{"prefill", "--advertise-addr", "10.0.0.1:7000"}, "need --etcd"},
		{[]string{"prefill"}, "--decode (or --etcd) is required"},
		{[]string{"gateway"}, "(or --etcd, to find them there)"},
		{[]string{"decode", "--etcd", "127.0.0.1:2379", "--etcd-lease-ttl", "1500ms"}, "whole seconds"},
		{[]string{"decode", "--etcd", "127.0.0.1:2379", "--etcd-cert", "c.pem"}, "needs its key"},
		{[]string{"prefill", "--etcd", "127.0.0.1:2379", "--etcd-drain-timeout", "-1s"}, "--etcd-drain-timeout -1s"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r := pw(t, tc.args...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.msg) {
				t.Errorf("exit %d, stderr %q; want 2 naming %q", r.code, r.stderr, tc.msg)
			}
		})
	}
}
