package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/cluster/etcdtest"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/syncbuf"
)

// The multi-host test runs every role on a host of its own: a Linux
// network namespace with its own address, joined to the others by a veth
// pair on a bridge in the test's namespace (which the test reaches the
// gateway and the nodes' metrics through). No traffic between roles goes
// over loopback. It needs root with CAP_NET_ADMIN and the ip command
// (iproute2); where either is missing it is skipped, saying why.

// netnsEtcdEnv makes the test binary, run as TestNetnsEtcdServer in the
// etcd namespace, serve etcd on the address it holds, over mutual TLS with
// the certificates of `pagewarden certs --etcd` in netnsEtcdTLSEnv's
// directory.
const (
	netnsEtcdEnv    = "PAGEWARDEN_NETNS_ETCD"
	netnsEtcdTLSEnv = "PAGEWARDEN_NETNS_ETCD_TLS"
)

// TestNetnsEtcdServer is the etcd host of TestMultiHostNetns: the test
// binary started in the etcd namespace. Run directly, it does nothing.
func TestNetnsEtcdServer(t *testing.T) {
	host := os.Getenv(netnsEtcdEnv)
	if host == "" {
		t.Skip("the etcd host of TestMultiHostNetns; runs only as its child")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	dir := os.Getenv(netnsEtcdTLSEnv)
	srv := etcdtest.Start(t, etcdtest.Options{Host: host, TLS: &etcdtest.TLS{
		Cert: filepath.Join(dir, "etcd.pem"), Key: filepath.Join(dir, "etcd-key.pem"), ClientCA: filepath.Join(dir, "ca.pem")}})
	fmt.Printf("etcd serving on %s\n", srv.Endpoint)
	<-ctx.Done()
}

// netns is the test's virtual network: a bridge and one namespace per
// host.
type netns struct {
	t      *testing.T
	prefix string // unique per run: names of namespaces and links
	subnet string // 10.X.Y.
	bridge string
}

func (n *netns) ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (n *netns) must(args ...string) {
	n.t.Helper()
	if err := n.ip(args...); err != nil {
		n.t.Fatal(err)
	}
}

// newNetns makes the bridge, or skips t where namespaces cannot be made.
func newNetns(t *testing.T) *netns {
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("SKIPPED: the multi-host test needs the ip command (iproute2) to make network namespaces; it is not installed")
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: the multi-host test needs root (with CAP_NET_ADMIN) to make network namespaces")
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	n := &netns{t: t, prefix: "pw" + hex.EncodeToString(b[:2]), subnet: fmt.Sprintf("10.%d.%d.", 200+int(b[0])%50, b[2])}
	probe := n.prefix + "-probe"
	if err := n.ip("netns", "add", probe); err != nil {
		t.Skipf("SKIPPED: cannot make a network namespace here (no CAP_NET_ADMIN?): %v", err)
	}
	_ = n.ip("netns", "del", probe)
	n.bridge = n.prefix + "-br"
	t.Cleanup(func() { _ = n.ip("link", "del", n.bridge) })
	n.must("link", "add", n.bridge, "type", "bridge")
	n.must("addr", "add", n.subnet+"254/24", "dev", n.bridge)
	n.must("link", "set", n.bridge, "up")
	return n
}

// host makes a namespace for name at address subnet+octet, linked to the
// bridge; it returns the namespace and the address.
func (n *netns) host(name string, octet int) (ns, addr string) {
	n.t.Helper()
	ns, addr = n.prefix+"-"+name, fmt.Sprintf("%s%d", n.subnet, octet)
	outer, inner := n.veth(name), "eth0"
	n.must("netns", "add", ns)
	n.t.Cleanup(func() { _ = n.ip("netns", "del", ns) })
	n.must("link", "add", outer, "type", "veth", "peer", "name", n.prefix+"x"+name)
	// Deleting our end deletes the pair: the namespace's end would
	// otherwise live on until the kernel gets round to the namespace.
	n.t.Cleanup(func() { _ = n.ip("link", "del", outer) })
	n.must("link", "set", n.prefix+"x"+name, "netns", ns)
	n.must("-n", ns, "link", "set", n.prefix+"x"+name, "name", inner)
	n.must("link", "set", outer, "master", n.bridge, "up")
	n.must("-n", ns, "addr", "add", addr+"/24", "dev", inner)
	n.must("-n", ns, "link", "set", inner, "up")
	n.must("-n", ns, "link", "set", "lo", "up")
	return ns, addr
}

// veth is the bridge's end of name's link: setting it down cuts the host
// off the network, as a pulled cable would (no RST, no FIN).
func (n *netns) veth(name string) string { return n.prefix + "h" + name }

// startIn starts the test binary in namespace ns: as a pagewarden role
// (args) or, with env, as whatever env makes it.
func startIn(t *testing.T, ns, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, os.Args[0]}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{name: name, cmd: cmd, out: &syncbuf.Buffer{}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		}
		if t.Failed() {
			t.Logf("--- %s output:\n%s", name, p.out.String())
		}
	})
	return p
}

// TestMultiHostNetns: etcd, a gateway, two prefill and two decode nodes,
// each on a host (network namespace) of its own with its own address,
// over mutual TLS, finding each other through etcd (mutual TLS too, with
// the certificates `pagewarden certs --etcd` makes). Three tenants send a
// workload whose prompts carry per-tenant canaries; in the middle of it
// one decode node's link is cut (ip link set down: it vanishes without a
// word, and loses etcd too) and one prefill node is killed (SIGKILL).
// Every answer is a 200 with the text serve gives for that prompt, or an
// error with an OpenAI body; no answer carries another tenant's canary;
// the survivors keep serving and their pages come back to baseline with
// no isolation violation; the cut node fences itself and exits.
func TestMultiHostNetns(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six processes in six network namespaces")
	}
	n := newNetns(t)
	dir := t.TempDir()

	// Tenants, each with a key and a secret its prompts carry.
	const nTenants = 3
	keys, canaries := make([]string, nTenants), make([]string, nTenants)
	var cfg strings.Builder
	cfg.WriteString("tenants:\n")
	for i := range nTenants {
		keys[i] = fmt.Sprintf("sk-netns-%d-%s", i, n.prefix)
		canaries[i] = fmt.Sprintf("CANARY%d%sX", i, strings.ToUpper(hex.EncodeToString([]byte(n.prefix + keys[i]))[:16]))
		fmt.Fprintf(&cfg, "  - id: t%d\n    api_key_sha256: [\"%s\"]\n", i, tenants.HashKey(keys[i]))
	}
	cfgPath := filepath.Join(dir, "tenants.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}

	// Hosts.
	etcdNS, etcdAddr := n.host("etcd", 1)
	gwNS, gwAddr := n.host("gw", 2)
	nodeHosts := map[string][2]string{}
	for i, name := range []string{"p0", "p1", "d0", "d1"} {
		ns, addr := n.host(name, 3+i)
		nodeHosts[name] = [2]string{ns, addr}
	}

	// The certificates as an operator makes them: one CA for the links and
	// etcd; etcd's own for its address; each node's is also its etcd
	// client certificate.
	if r := pw(t, "certs", "--out", dir, "--etcd", etcdAddr, "--node", "gw:gateway", "--node", "p0:prefill", "--node", "p1:prefill",
		"--node", "d0:decode", "--node", "d1:decode"); r.code != 0 {
		t.Fatalf("certs: %d %s", r.code, r.stderr)
	}
	etcd := startIn(t, etcdNS, "etcd", []string{netnsEtcdEnv + "=" + etcdAddr, netnsEtcdTLSEnv + "=" + dir}, "-test.run=^TestNetnsEtcdServer$", "-test.v")
	endpoint := etcd.await(t, `etcd serving on (https://\S+)`)
	common := []string{"--model", "builtin:tiny", "--threads", "1", "--kv-memory", "16MiB", "--tls-ca", filepath.Join(dir, "ca.pem"),
		"--etcd", endpoint, "--etcd-prefix", "/netns", "--etcd-lease-ttl", "5s", "--etcd-ca", filepath.Join(dir, "ca.pem")}
	roleArgs := func(role, name string) []string {
		cert, key := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		return append(append([]string{role}, common...), "--name", name, "--tls-cert", cert, "--tls-key", key, "--etcd-cert", cert, "--etcd-key", key)
	}
	procs := map[string]*proc{}
	for _, name := range []string{"d0", "d1", "p0", "p1"} {
		role := map[byte]string{'p': "prefill", 'd': "decode"}[name[0]]
		h := nodeHosts[name]
		procs[name] = startIn(t, h[0], name, []string{childEnv + "=1"}, append(roleArgs(role, name),
			"--link-listen", h[1]+":7001", "--metrics-listen", h[1]+":9464", "--etcd-drain-timeout", "5s")...)
	}
	for _, name := range []string{"d0", "d1", "p0", "p1"} {
		procs[name].await(t, `linked on (\S+)`)
	}
	gw := startIn(t, gwNS, "gw", []string{childEnv + "=1"}, append(roleArgs("gateway", "gw"),
		"--listen", gwAddr+":8080", "--metrics-listen", "", "--config", cfgPath)...)
	url := "http://" + gw.await(t, `listening on http://(\S+)`)

	// The prompts and what serve (one node, in this process) answers.
	prompts := make([][]string, nTenants)
	for i := range nTenants {
		for j := range 4 {
			prompts[i] = append(prompts[i], fmt.Sprintf("Tenant %d, note %d. The secret is %s. Keep it safe and", i, j, canaries[i]))
		}
	}
	const maxTokens = 32
	want := referenceAnswers(t, slices.Concat(prompts...), maxTokens)
	var mu sync.Mutex
	statuses := map[int]int{}
	check := func(when string, tenant int, p string, c completion) {
		mu.Lock()
		statuses[c.status]++
		mu.Unlock()
		for j, other := range canaries {
			if j != tenant && strings.Contains(c.body, other) {
				t.Errorf("%s: tenant t%d's answer carries t%d's canary: %d %s", when, tenant, j, c.status, c.body)
			}
		}
		switch {
		case c.status == 200 && c.text != want[p]:
			t.Errorf("%s: a 200 for t%d with text serve did not give: %q, want %q", when, tenant, c.text, want[p])
		case c.status != 200 && !strings.Contains(c.body, `"error"`):
			t.Errorf("%s: t%d failed without an error body: %d %s", when, tenant, c.status, c.body)
		}
	}
	client := &http.Client{Timeout: 60 * time.Second}
	for i := range nTenants {
		for _, p := range prompts[i] {
			c := complete(client, url, keys[i], p, maxTokens)
			if c.status != 200 {
				t.Fatalf("before the faults, t%d: %d %s", i, c.status, c.body)
			}
			check("before the faults", i, p, c)
		}
	}

	// The workload, with the faults a third of the way in.
	mu.Lock()
	clear(statuses)
	mu.Unlock()
	const total = 48
	var done atomic.Int32
	faults := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for k := w; k < total; k += 6 {
				i := k % nTenants
				p := prompts[i][(k/nTenants)%len(prompts[i])]
				check("under the faults", i, p, complete(client, url, keys[i], p, maxTokens))
				if done.Add(1) == total/3 {
					close(faults)
				}
			}
		})
	}
	<-faults
	n.must("link", "set", n.veth("d1"), "down")
	if err := procs["p0"].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	faulted := time.Now()
	wg.Wait()
	t.Logf("statuses under the faults: %v", statuses)

	// The cluster sees both go (the cut node's lease expires; the killed
	// one's too), and the survivors serve every tenant.
	gw.await(t, `("msg":"node left the cluster","node":"d1")`)
	gw.await(t, `("msg":"node left the cluster","node":"p0")`)
	t.Logf("both faulty nodes out of rotation %v after the faults", time.Since(faulted))
	for i := range nTenants {
		for _, p := range prompts[i] {
			c := complete(client, url, keys[i], p, maxTokens)
			if c.status != 200 {
				t.Errorf("after the faults, t%d: %d %s", i, c.status, c.body)
			}
			check("after the faults", i, p, c)
		}
	}
	// The survivors' pages come back; nothing was ever seen by the wrong
	// tenant.
	for _, name := range []string{"d0", "p1"} {
		waitPoolBack(t, name, nodeHosts[name][1]+":9464", 15*time.Second)
	}
	// The cut node lost etcd, fenced itself, drained and exited.
	if code := procs["d1"].exited(t, 30*time.Second); code == 0 {
		t.Errorf("d1, cut off, exited 0:\n%s", procs["d1"].out.String())
	}
	if out := procs["d1"].out.String(); !strings.Contains(out, "refusing new work") || !strings.Contains(out, "membership session lost") {
		t.Errorf("d1 did not fence itself and report the loss:\n%s", out)
	}
}
