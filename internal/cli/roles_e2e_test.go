package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/syncbuf"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// childEnv makes the test binary act as the pagewarden binary: the
// multi-process test starts each role as a real OS process of its own.
const childEnv = "PAGEWARDEN_CLI_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// proc is one role running as a child process.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
}

func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, nil, args...)
}

// startProcEnv is startProc with env (KEY=value) added to the child's
// environment.
func startProcEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	p := &proc{name: name, cmd: cmd, out: &syncbuf.Buffer{}}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				cmd.Process.Kill()
				<-done
			}
		}
		if t.Failed() {
			t.Logf("--- %s output:\n%s", name, p.out.String())
		}
	})
	return p
}

// await returns the first submatch of re in the process's output.
func (p *proc) await(t *testing.T, re string) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if m := rx.FindStringSubmatch(p.out.String()); m != nil {
			return m[1]
		}
		if p.cmd.ProcessState != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: no %q in:\n%s", p.name, re, p.out.String())
	return ""
}

// writeCerts makes a development CA and a certificate for each node.
func writeCerts(t *testing.T, dir string, ids ...link.Identity) {
	t.Helper()
	now := time.Now()
	ca, err := link.NewCA("test CA", now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("ca.pem", ca.CertPEM)
	for _, id := range ids {
		c, err := ca.Issue(id, []string{"127.0.0.1", "localhost"}, now, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		write(string(id.Name)+".pem", c.CertPEM)
		write(string(id.Name)+"-key.pem", c.KeyPEM)
	}
}

type completion struct {
	status int
	text   string
	body   string
}

func complete(client *http.Client, url, key, prompt string, maxTokens int) completion {
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "temperature": 0})
	req, _ := http.NewRequest("POST", url+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return completion{status: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	_ = json.Unmarshal(b, &out)
	c := completion{status: resp.StatusCode, body: string(b)}
	if len(out.Choices) == 1 {
		c.text = out.Choices[0].Text
	}
	return c
}

// metric reads one unlabelled sample from a node's /metrics.
func metric(t *testing.T, addr, name string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v
		}
	}
	return ""
}

// referenceAnswers is what `serve` (in this process, extra its flags)
// answers greedily to each prompt with maxTokens: the text a cluster's
// answers must equal.
func referenceAnswers(t *testing.T, prompts []string, maxTokens int, extra ...string) map[string]string {
	t.Helper()
	ref := startServe(t, extra...)
	want := map[string]string{}
	for _, p := range prompts {
		c := complete(http.DefaultClient, ref.url, ref.key, p, maxTokens)
		if c.status != 200 {
			t.Fatalf("serve: %d %s", c.status, c.body)
		}
		want[p] = c.text
	}
	return want
}

// waitPoolBack waits up to within for the node whose metrics are at addr
// to hold no KV page (none used, none quarantined), and requires that it
// counted no isolation violation.
func waitPoolBack(t *testing.T, name, addr string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		used, q := metric(t, addr, "pagewarden_kv_pages_used"), metric(t, addr, "pagewarden_kv_pages_quarantined")
		if used == "0" && q == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s pages used, %s quarantined", name, used, q)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if v := metric(t, addr, "pagewarden_isolation_violations_total"); v != "0" {
		t.Fatalf("%s: %s isolation violations", name, v)
	}
}

// TestRolesAsProcesses: a gateway, two prefill and two decode nodes as
// separate OS processes over gRPC with mutual TLS, on the builtin model.
// Greedy answers through the cluster equal `serve`'s; a decode node killed
// with SIGKILL in the middle of a load takes only its own requests with it
// (errors, never a 200 with other text), the survivors keep serving, and
// their pages come back to baseline.
func TestRolesAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six processes")
	}
	dir := t.TempDir()
	ids := []link.Identity{
		{Name: "gw", Role: transfer.RoleGateway},
		{Name: "p0", Role: transfer.RolePrefill}, {Name: "p1", Role: transfer.RolePrefill},
		{Name: "d0", Role: transfer.RoleDecode}, {Name: "d1", Role: transfer.RoleDecode},
	}
	writeCerts(t, dir, ids...)
	common := []string{"--model", "builtin:tiny", "--threads", "1", "--kv-memory", "16MiB", "--tls-ca", filepath.Join(dir, "ca.pem")}
	tlsArgs := func(name string) []string {
		return append(append([]string(nil), common...), "--name", name, "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem"))
	}
	nodeArgs := func(role, name string) []string {
		return append(append([]string{role}, tlsArgs(name)...), "--link-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
	}
	linked := `linked on (127\.0\.0\.1:\d+)`
	metricsAt := `metrics on http://(127\.0\.0\.1:\d+)/metrics`
	d0 := startProc(t, "d0", nodeArgs("decode", "d0")...)
	d1 := startProc(t, "d1", nodeArgs("decode", "d1")...)
	d0addr, d1addr := d0.await(t, linked), d1.await(t, linked)
	decodes := "d0=" + d0addr + ",d1=" + d1addr
	p0 := startProc(t, "p0", append(nodeArgs("prefill", "p0"), "--decode", decodes)...)
	p1 := startProc(t, "p1", append(nodeArgs("prefill", "p1"), "--decode", decodes)...)
	prefills := "p0=" + p0.await(t, linked) + ",p1=" + p1.await(t, linked)
	gw := startProc(t, "gw", append(append([]string{"gateway"}, tlsArgs("gw")...), "--listen", "127.0.0.1:0", "--metrics-listen", "",
		"--prefill", prefills, "--decode", decodes)...)
	url := "http://" + gw.await(t, `listening on http://(127\.0\.0\.1:\d+)`)
	key := gw.await(t, `API key \(shown once\): (\S+)`)

	// The reference: the same prompts through serve in this process.
	prompts := []string{"Once upon a time", "The little dog", "She opened the door and", "In the morning the sun"}
	want := referenceAnswers(t, prompts, 24)
	for _, p := range prompts {
		c := complete(http.DefaultClient, url, key, p, 24)
		if c.status != 200 || c.text != want[p] {
			t.Fatalf("cluster %q: %d %q, serve said %q (%s)", p, c.status, c.text, want[p], c.body)
		}
	}

	// Load, and SIGKILL d1 in the middle of it.
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	client := &http.Client{Timeout: 60 * time.Second}
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := prompts[i%len(prompts)]
			c := complete(client, url, key, p, 48)
			mu.Lock()
			defer mu.Unlock()
			statuses[c.status]++
			if c.status == 200 && !strings.HasPrefix(c.text, want[p]) {
				t.Errorf("200 with other text for %q: %q, serve said %q…", p, c.text, want[p])
			}
			if c.status != 200 && !strings.Contains(c.body, `"error"`) {
				t.Errorf("failure without an error body: %d %s", c.status, c.body)
			}
		}()
		if i == 8 {
			if err := d1.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
		}
	}
	wg.Wait()
	t.Logf("statuses under the kill: %v", statuses)
	// The survivors keep serving.
	for _, p := range prompts {
		c := complete(http.DefaultClient, url, key, p, 24)
		if c.status != 200 || c.text != want[p] {
			t.Fatalf("after the kill, %q: %d %q, want %q (%s)", p, c.status, c.text, want[p], c.body)
		}
	}
	// Every surviving node's pages come back.
	for _, n := range []*proc{d0, p0, p1} {
		waitPoolBack(t, n.name, n.await(t, metricsAt), 10*time.Second)
	}
}

type refServer struct{ url, key string }

// startServe runs `serve` in this process for reference answers.
func startServe(t *testing.T, extra ...string) refServer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stderr := &syncbuf.Buffer{}
	done := make(chan int, 1)
	args := append([]string{"serve", "--model", "builtin:tiny", "--threads", "1", "--listen", "127.0.0.1:0", "--kv-memory", "16MiB", "--metrics-listen", ""}, extra...)
	go func() {
		done <- Main(ctx, args, io.Discard, stderr)
	}()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, stderr, "listening on http://")
	m := regexp.MustCompile(`API key \(shown once\): (\S+)\n(?:.*\n)*listening on http://(\S+)`).FindStringSubmatch(stderr.String())
	if m == nil {
		t.Fatalf("serve output: %s", stderr.String())
	}
	return refServer{url: "http://" + m[2], key: m[1]}
}

// TestServeDisaggregated: serve (a prefill and a decode node in one
// process, through the handoff protocol) answers exactly as serve
// --colocated (one node, no handoff) does, and its metrics show both nodes
// with no violation.
func TestServeDisaggregated(t *testing.T) {
	one := startServe(t, "--colocated")
	two := startServe(t, "--metrics-on-api")
	for _, p := range []string{"Once upon a time", "The little dog ran to the park and", "A"} {
		for _, n := range []int{1, 7, 40} {
			a, b := complete(http.DefaultClient, one.url, one.key, p, n), complete(http.DefaultClient, two.url, two.key, p, n)
			if a.status != 200 || b.status != 200 || a.text != b.text {
				t.Fatalf("%q max %d: colocated %d %q, disaggregated %d %q (%s)", p, n, a.status, a.text, b.status, b.text, b.body)
			}
		}
	}
	req, _ := http.NewRequest("GET", two.url+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, want := range []string{`pagewarden_sched_steps_total{node="prefill-0"}`, `pagewarden_sched_steps_total{node="decode-0"}`,
		"pagewarden_isolation_violations_total 0", "pagewarden_kv_pages_quarantined 0"} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

// TestGatewayReloadsOnSIGHUP: the gateway role reloads --config on SIGHUP
// like serve: a key added to the file is accepted afterwards (its request
// gets past authentication), and a broken file keeps the old config.
func TestGatewayReloadsOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	writeCerts(t, dir, link.Identity{Name: "gw", Role: transfer.RoleGateway})
	cfgPath := filepath.Join(dir, "tenants.yaml")
	writeCfg := func(keys ...string) {
		var b strings.Builder
		b.WriteString("tenants:\n")
		for i, k := range keys {
			fmt.Fprintf(&b, "  - id: t%d\n    api_key_sha256: [\"%s\"]\n", i, tenants.HashKey(k))
		}
		if err := os.WriteFile(cfgPath, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeCfg("sk-first")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &syncbuf.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- Main(ctx, []string{"gateway", "--model", "builtin:tiny", "--threads", "1", "--kv-memory", "16MiB",
			"--name", "gw", "--tls-ca", filepath.Join(dir, "ca.pem"), "--tls-cert", filepath.Join(dir, "gw.pem"), "--tls-key", filepath.Join(dir, "gw-key.pem"),
			"--prefill", "p0=127.0.0.1:1", "--decode", "d0=127.0.0.1:1", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--config", cfgPath}, io.Discard, stderr)
	}()
	defer func() { cancel(); <-done }()
	waitFor(t, stderr, "listening on http://")
	url := "http://" + regexp.MustCompile(`listening on http://(\S+)`).FindStringSubmatch(stderr.String())[1]
	status := func(key string) int { return complete(http.DefaultClient, url, key, "hi", 2).status }
	if s := status("sk-second"); s != 401 {
		t.Fatalf("an unknown key: %d", s)
	}
	writeCfg("sk-first", "sk-second")
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, stderr, "tenant config reloaded")
	if s := status("sk-second"); s == 401 {
		t.Fatalf("the reloaded key is still refused")
	}
	if err := os.WriteFile(cfgPath, []byte("tenants: [}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, stderr, "tenant config reload failed; keeping the old one")
	if s := status("sk-second"); s == 401 {
		t.Fatalf("a broken file replaced the config in force")
	}
}
