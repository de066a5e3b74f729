package cli

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// TestKillPrefillMidHandoff: a prefill node killed with SIGKILL while it
// streams KV pages to the decode nodes. Requests are long prompts with a
// few output tokens, so that most of each request's time is its prefill
// and handoff, and the kill lands while pages are in flight (the decode
// nodes hold reservations: their used pages are checked to be above zero
// at the moment of the kill). Every answer is a 200 with the text serve
// gives, or an error with an OpenAI body; the decode nodes abort the dead
// sender's handoffs and every page comes back (none quarantined, no
// isolation violation); the other prefill node takes the load after.
func TestKillPrefillMidHandoff(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes")
	}
	dir := t.TempDir()
	writeCerts(t, dir, link.Identity{Name: "gw", Role: transfer.RoleGateway},
		link.Identity{Name: "p0", Role: transfer.RolePrefill}, link.Identity{Name: "p1", Role: transfer.RolePrefill},
		link.Identity{Name: "d0", Role: transfer.RoleDecode}, link.Identity{Name: "d1", Role: transfer.RoleDecode})
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
	decodes := "d0=" + d0.await(t, linked) + ",d1=" + d1.await(t, linked)
	p0 := startProc(t, "p0", append(nodeArgs("prefill", "p0"), "--decode", decodes)...)
	p1 := startProc(t, "p1", append(nodeArgs("prefill", "p1"), "--decode", decodes)...)
	prefills := "p0=" + p0.await(t, linked) + ",p1=" + p1.await(t, linked)
	gw := startProc(t, "gw", append(append([]string{"gateway"}, tlsArgs("gw")...), "--listen", "127.0.0.1:0", "--metrics-listen", "",
		"--prefill", prefills, "--decode", decodes)...)
	url := "http://" + gw.await(t, `listening on http://(127\.0\.0\.1:\d+)`)
	key := gw.await(t, `API key \(shown once\): (\S+)`)
	dm := []string{d0.await(t, metricsAt), d1.await(t, metricsAt)}

	// Long prompts (the byte-level model: ~1 token a byte), a few tokens out.
	var prompts []string
	for i := range 4 {
		prompts = append(prompts, fmt.Sprintf("Story %d. ", i)+strings.Repeat(fmt.Sprintf("The %d little dogs ran to the park and back. ", i), 28))
	}
	const maxTokens = 4
	want := referenceAnswers(t, prompts, maxTokens)

	var mu sync.Mutex
	statuses := map[int]int{}
	check := func(when, p string, c completion) {
		mu.Lock()
		statuses[c.status]++
		mu.Unlock()
		switch {
		case c.status == 200 && c.text != want[p]:
			t.Errorf("%s: a 200 with text serve did not give: %q, want %q", when, c.text, want[p])
		case c.status != 200 && !strings.Contains(c.body, `"error"`):
			t.Errorf("%s: failure without an error body: %d %s", when, c.status, c.body)
		}
	}
	client := &http.Client{Timeout: 60 * time.Second}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for k := w; ; k += 6 {
				select {
				case <-stop:
					return
				default:
				}
				p := prompts[k%len(prompts)]
				check("under the kill", p, complete(client, url, key, p, maxTokens))
			}
		})
	}
	// Kill p0 while a decode node holds a reservation (a handoff in flight).
	deadline := time.Now().Add(30 * time.Second)
	for metric(t, dm[0], "pagewarden_kv_pages_used") == "0" && metric(t, dm[1], "pagewarden_kv_pages_used") == "0" {
		if time.Now().After(deadline) {
			t.Fatal("no decode node ever held pages under the load")
		}
		time.Sleep(time.Millisecond)
	}
	if err := p0.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the load goes on against p1 alone
	close(stop)
	wg.Wait()
	t.Logf("statuses around the kill: %v", statuses)

	// p1 serves every prompt; the decode nodes and p1 come back to baseline.
	for _, p := range prompts {
		c := complete(client, url, key, p, maxTokens)
		if c.status != 200 {
			t.Errorf("after the kill: %d %s", c.status, c.body)
		}
		check("after the kill", p, c)
	}
	for _, n := range []*proc{d0, d1, p1} {
		waitPoolBack(t, n.name, n.await(t, metricsAt), 15*time.Second)
	}
}
