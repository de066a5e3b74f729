package cli

import (
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// TestAlsoTheOtherRole: a prefill process that also decodes
// (--also-decode) and a decode process that also prefills
// (--also-prefill), each one OS process with two nodes on one model, pair
// with each other and with a plain decode node through the same mutual
// TLS and handoff as separate processes: greedy answers equal serve's,
// under concurrent load as well, and every pool comes back to baseline.
func TestAlsoTheOtherRole(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	dir := t.TempDir()
	writeCerts(t, dir,
		link.Identity{Name: "gw", Role: transfer.RoleGateway},
		link.Identity{Name: "pA", Role: transfer.RolePrefill}, link.Identity{Name: "dA", Role: transfer.RoleDecode},
		link.Identity{Name: "pB", Role: transfer.RolePrefill}, link.Identity{Name: "dB", Role: transfer.RoleDecode},
		link.Identity{Name: "dC", Role: transfer.RoleDecode},
	)
	file := func(name string) string { return filepath.Join(dir, name) }
	common := []string{"--model", "builtin:tiny", "--threads", "1", "--kv-memory", "16MiB", "--tls-ca", file("ca.pem")}
	ident := func(name string) []string {
		return []string{"--name", name, "--tls-cert", file(name + ".pem"), "--tls-key", file(name + "-key.pem")}
	}
	node := func(role, name string, extra ...string) []string {
		args := append(append(append([]string{role}, common...), ident(name)...), "--link-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
		return append(args, extra...)
	}
	also := func(role, name string) []string {
		f := "--also-" + role
		return []string{f, f + "-name", name, f + "-tls-cert", file(name + ".pem"), f + "-tls-key", file(name + "-key.pem")}
	}
	linked := func(role, name string) string { return role + " " + name + ` linked on (127\.0\.0\.1:\d+)` }
	gateway := func(name, prefill, decode string) (url, key string) {
		gw := startProc(t, name, append(append(append([]string{"gateway"}, common...), ident("gw")...),
			"--listen", "127.0.0.1:0", "--metrics-listen", "", "--prefill", prefill, "--decode", decode)...)
		return "http://" + gw.await(t, `listening on http://(127\.0\.0\.1:\d+)`), gw.await(t, `API key \(shown once\): (\S+)`)
	}

	dC := startProc(t, "dC", node("decode", "dC")...)
	dCaddr := dC.await(t, linked("decode", "dC"))
	a := startProc(t, "A", node("prefill", "pA", append(also("decode", "dA"), "--decode", "dC="+dCaddr)...)...)
	url1, key1 := gateway("gw1", "pA="+a.await(t, linked("prefill", "pA")), "dA="+a.await(t, linked("decode", "dA"))+",dC="+dCaddr)
	b := startProc(t, "B", node("decode", "dB", also("prefill", "pB")...)...)
	url2, key2 := gateway("gw2", "pB="+b.await(t, linked("prefill", "pB")), "dB="+b.await(t, linked("decode", "dB")))

	prompts := []string{"Once upon a time", "The little dog", "She opened the door and", "In the morning the sun"}
	want := referenceAnswers(t, prompts, 24, "--colocated")
	client := &http.Client{Timeout: 60 * time.Second}
	for _, cl := range []struct{ name, url, key string }{{"A+dC", url1, key1}, {"B", url2, key2}} {
		var wg sync.WaitGroup
		for i := range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := prompts[i%len(prompts)]
				if c := complete(client, cl.url, cl.key, p, 24); c.status != 200 || c.text != want[p] {
					t.Errorf("%s, %q: %d %q, serve said %q (%s)", cl.name, p, c.status, c.text, want[p], c.body)
				}
			}()
		}
		wg.Wait()
	}
	// Each two-node process shows both nodes in its metrics, and its pools
	// (and dC's) come back to baseline with no violation.
	for _, n := range []struct {
		p     *proc
		nodes []string
	}{{a, []string{"pA", "dA"}}, {b, []string{"dB", "pB"}}, {dC, nil}} {
		addr := n.p.await(t, `metrics on http://(127\.0\.0\.1:\d+)/metrics`)
		waitPoolBack(t, n.p.name, addr, 10*time.Second)
		for _, name := range n.nodes {
			if v := metric(t, addr, `pagewarden_sched_steps_total{node="`+name+`"}`); v == "" || v == "0" {
				t.Errorf("%s: node %s took no step (%q)", n.p.name, name, v)
			}
		}
	}
}

// TestAlsoFlags: the other role's flags are refused without --also-ROLE,
// and --also-ROLE without a name and certificate of its own.
func TestAlsoFlags(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"prefill", "--also-decode-name", "d"}, "--also-decode-name needs --also-decode"},
		{[]string{"decode", "--also-prefill-tls-cert", "x.pem"}, "--also-prefill-tls-cert needs --also-prefill"},
		{[]string{"decode", "--decode", "d=127.0.0.1:1"}, "--decode on a decode node needs --also-prefill"},
		{[]string{"prefill", "--also-decode"}, "--also-decode needs --also-decode-name, --also-decode-tls-cert and --also-decode-tls-key"},
		{[]string{"prefill", "--name", "n", "--also-decode", "--also-decode-name", "n", "--also-decode-tls-cert", "c", "--also-decode-tls-key", "k"},
			`--also-decode-name "n" is this node's own --name`},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stderr strings.Builder
			code := Main(t.Context(), append(tc.args, "--model", "builtin:tiny"), &strings.Builder{}, &stderr)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), tc.want)
			}
		})
	}
}
