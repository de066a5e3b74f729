package cli

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/cluster/etcdtest"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// TestLostSessionDrains: a decode node cut off from etcd (its proxy cut)
// loses its registration within its lease TTL and drains: it refuses the
// new work a gateway still sends it at once, lets the request it was
// decoding finish, and then exits with the loss. The gateway reaches etcd
// through a proxy cut at the same moment and has a long lease, so it
// still routes to the node after the node's session is gone: the
// stale-view case the fence exists for. Every answer is either a 200 with
// the text the cluster gave before the cut, or an error with an OpenAI
// body; the requests sent after the loss are all refused; and the node
// stopped taking work before etcd expired its lease (fencing).
func TestLostSessionDrains(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes")
	}
	srv := etcdtest.Start(t, etcdtest.Options{})
	dir := t.TempDir()
	writeCerts(t, dir, link.Identity{Name: "gw", Role: transfer.RoleGateway}, link.Identity{Name: "p0", Role: transfer.RolePrefill},
		link.Identity{Name: "d0", Role: transfer.RoleDecode})
	// tiny-long: a 16k window, so that one request decodes for seconds.
	common := []string{"--model", "builtin:tiny-long", "--threads", "1", "--kv-memory", "96MiB", "--tls-ca", filepath.Join(dir, "ca.pem"),
		"--etcd-prefix", "/drain", "--log-format", "json"}
	args := func(role, name, endpoint, ttl string) []string {
		a := append([]string{role}, common...)
		a = append(a, "--name", name, "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem"),
			"--etcd", endpoint, "--etcd-lease-ttl", ttl)
		if role != "gateway" {
			a = append(a, "--link-listen", "127.0.0.1:0", "--metrics-listen", "")
		}
		return a
	}
	linked := `linked on (127\.0\.0\.1:\d+)`
	dProxy, gwProxy := srv.NewProxy(t), srv.NewProxy(t)
	d0 := startProc(t, "d0", append(args("decode", "d0", dProxy.Endpoint, "2s"), "--etcd-drain-timeout", "60s", "--metrics-listen", "127.0.0.1:0")...)
	d0.await(t, linked)
	d0Metrics := d0.await(t, `metrics on http://(127\.0\.0\.1:\d+)/metrics`)
	p0 := startProc(t, "p0", args("prefill", "p0", srv.Endpoint, "2s")...)
	p0.await(t, linked)
	// No replay audit: a replay of the reference request would be work d0
	// holds too, and the test counts exactly the one request in flight.
	gw := startProc(t, "gw", append(args("gateway", "gw", gwProxy.Endpoint, "60s"), "--listen", "127.0.0.1:0", "--metrics-listen", "", "--audit-rate", "0")...)
	url := "http://" + gw.await(t, `listening on http://(127\.0\.0\.1:\d+)`)
	key := gw.await(t, `API key \(shown once\): (\S+)`)

	// The request in flight must outlast the node's loss of its session
	// (the 2 s TTL plus keep-alive detection, a few seconds after the
	// cut): size it from the speed of a 1000-token request, four times as
	// many tokens as that makes in a second (a longer context decodes
	// slower, so it runs 6-8 s), so that neither a quiet machine (5000
	// tokens once finished in 3.2 s, before the loss) nor a loaded one
	// (minutes) breaks the test.
	const prompt = "Once upon a time"
	start := time.Now()
	if c := complete(http.DefaultClient, url, key, prompt, 1000); c.status != 200 {
		t.Fatalf("calibration: %d %s", c.status, c.body)
	}
	long := min(10000, max(2000, int(4*1000/time.Since(start).Seconds())))
	start = time.Now()
	ref := complete(http.DefaultClient, url, key, prompt, long)
	if ref.status != 200 || ref.text == "" {
		t.Fatalf("before the cut: %d %s", ref.status, ref.body)
	}
	t.Logf("a %d-token request takes %v", long, time.Since(start))

	// The same request again, cut off from etcd while it decodes.
	inflight := make(chan completion, 1)
	go func() { inflight <- complete(http.DefaultClient, url, key, prompt, long) }()
	// Cut once d0 holds the request's pages (a fixed wait was not always
	// enough under load: d0 then held nothing when its session ended).
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, ok := holdsPages(d0Metrics); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("d0 never held the request's pages")
		}
	}
	dProxy.Cut()
	gwProxy.Cut()
	cut := time.Now()
	d0.await(t, `("msg":"etcd registration lost: refusing new work[^\n]*"holding":1)`)
	t.Logf("d0 lost its registration %v after the cut and fenced itself", time.Since(cut))

	// New work while it drains: refused by the fence, never a 200.
	for i := range 3 {
		c := complete(http.DefaultClient, url, key, "The little dog", 8)
		var body struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if c.status == 200 || json.Unmarshal([]byte(c.body), &body) != nil || body.Error.Message == "" {
			t.Errorf("request %d after the loss: %d %s; want an error with an OpenAI body", i, c.status, c.body)
		}
	}
	select {
	case c := <-inflight:
		// The drain let it finish: the text the cluster gave before.
		if c.status != 200 || c.text != ref.text {
			t.Errorf("the request in flight at the cut: %d (%d bytes of text, %d before), want 200 with the same text: %.300s", c.status, len(c.text), len(ref.text), c.body)
		}
	case <-time.After(120 * time.Second):
		t.Fatal("the request in flight never ended")
	}
	if code := d0.exited(t, 30*time.Second); code == 0 {
		t.Fatalf("d0 exited 0 after losing its registration:\n%s", d0.out.String())
	}
	out := d0.out.String()
	if !strings.Contains(out, "stopped taking work and drained what it held") {
		t.Errorf("d0's exit does not say it drained:\n%s", out)
	}
	m := regexp.MustCompile(`"msg":"drain ended"[^\n]*"still_holding":0,"took_ms":(\d+),"refused":(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no drain report in d0's log:\n%s", out)
	}
	// The router may skip a node whose load answer shows no room (the
	// fence's), but with no other decode node it tries d0 all the same:
	// at least one of the three reached d0 and was refused there.
	if refused, _ := strconv.Atoi(m[2]); refused < 1 {
		t.Errorf("d0 refused %d requests while draining, want the ones sent after the loss", refused)
	}
	t.Logf("d0 drained in %s ms, refusing %s new requests", m[1], m[2])

	// Fencing: d0 refused new work (stale: etcd had not confirmed its
	// lease for two thirds of the TTL) before etcd expired the lease,
	// which p0, watching, saw as d0 leaving.
	logTime := func(p *proc, re string) time.Time {
		t.Helper()
		m := regexp.MustCompile(`"time":"([^"]+)"[^\n]*` + re).FindStringSubmatch(p.out.String())
		if m == nil {
			t.Fatalf("%s never logged %s:\n%s", p.name, re, p.out.String())
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			t.Fatal(err)
		}
		return at
	}
	fenced := logTime(d0, `"msg":"etcd has not confirmed this node's registration`)
	left := logTime(p0, `"msg":"cluster member left"[^\n]*"member":"decode/d0"`)
	if !fenced.Before(left) {
		t.Errorf("d0 refused new work at %v, after etcd expired its lease (p0 saw it leave at %v)", fenced, left)
	}
	t.Logf("d0 fenced itself %v before etcd expired its lease", left.Sub(fenced))
}
