package cli

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/cluster/etcdtest"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// TestGatewayStaleLeaseRefuses: a gateway cut off from etcd stops taking
// requests once its lease has gone unconfirmed for 2/3 of its TTL —
// /readyz answers 503 and a completion gets a 503 "draining" — before it
// loses the registration and exits; until the cut it serves.
func TestGatewayStaleLeaseRefuses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes")
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	writeCerts(t, dir, link.Identity{Name: "gw", Role: transfer.RoleGateway}, link.Identity{Name: "p0", Role: transfer.RolePrefill},
		link.Identity{Name: "d0", Role: transfer.RoleDecode})
	common := []string{"--model", "builtin:tiny", "--threads", "1", "--kv-memory", "16MiB", "--tls-ca", filepath.Join(dir, "ca.pem"), "--etcd-prefix", "/stale"}
	args := func(role, name, endpoint, ttl string) []string {
		a := append(append([]string{role}, common...), "--name", name, "--tls-cert", filepath.Join(dir, name+".pem"),
			"--tls-key", filepath.Join(dir, name+"-key.pem"), "--etcd", endpoint, "--etcd-lease-ttl", ttl)
		if role != "gateway" {
			a = append(a, "--link-listen", "127.0.0.1:0", "--metrics-listen", "")
		}
		return a
	}
	linked := `linked on (127\.0\.0\.1:\d+)`
	startProc(t, "d0", args("decode", "d0", srv.Endpoint, "5s")...).await(t, linked)
	startProc(t, "p0", args("prefill", "p0", srv.Endpoint, "5s")...).await(t, linked)
	proxy := srv.NewProxy(t)
	gw := startProc(t, "gw", append(args("gateway", "gw", proxy.Endpoint, "9s"), "--listen", "127.0.0.1:0", "--metrics-listen", "")...)
	url := "http://" + gw.await(t, `listening on http://(127\.0\.0\.1:\d+)`)
	key := gw.await(t, `API key \(shown once\): (\S+)`)
	ready := func() int {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if c := complete(http.DefaultClient, url, key, "Once upon a time", 4); c.status == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the gateway never served before the cut")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ready() != 200 {
		t.Fatalf("readyz before the cut: %d", ready())
	}
	proxy.Cut()
	cut := time.Now()
	for ready() != http.StatusServiceUnavailable {
		if time.Since(cut) > 10*time.Second || gw.cmd.ProcessState != nil {
			t.Fatalf("readyz still %d %v after the cut", ready(), time.Since(cut))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if d := time.Since(cut); d >= 9*time.Second {
		t.Fatalf("refusing only %v after the cut: not before the 9s lease could expire", d)
	}
	t.Logf("refusing %v after the cut (lease TTL 9s)", time.Since(cut))
	c := complete(http.DefaultClient, url, key, "Once upon a time", 4)
	if c.status != http.StatusServiceUnavailable || !strings.Contains(c.body, `"draining"`) {
		t.Fatalf("a request while the lease is unconfirmed: %d %s", c.status, c.body)
	}
	gw.await(t, `(etcd has not confirmed this gateway's lease)`)
}
