package cli

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// The canary soak's handoff faults. Two kinds, because TLS stands in the
// way of one:
//
//   - frame faults (a page frame dropped, sent twice, or held back while
//     the manifest and commit overtake it) are injected above TLS, in the
//     prefill node's process: the processes the soak starts are this test
//     binary acting as pagewarden, and faultEnv makes it wrap the prefill
//     node's transport (wrapLink) with a faultyLink that follows the plan
//     the test writes into a file;
//   - link cuts are a TCP proxy in the test process that the
//     prefill→decode links go through (the prefill nodes' --decode
//     addresses are the proxy's), closing every connection it carries
//     mid-handoff; killing a prefill node is the test's SIGKILL.

// faultEnv names the plan file a child process's prefill node follows.
const faultEnv = "PAGEWARDEN_TEST_LINK_FAULTS"

func init() {
	path := os.Getenv(faultEnv)
	if os.Getenv(childEnv) != "1" || path == "" {
		return
	}
	wrapLink = func(role transfer.Role, name string, t link.Transport) link.Transport {
		if role != transfer.RolePrefill {
			return t // pages go one way: from prefill to decode
		}
		f := &faultyLink{Transport: t, name: name, out: os.Stderr, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid())))}
		go f.follow(path)
		return f
	}
}

// faultPlan is how often each frame fault hits a page frame (each a
// probability; their sum at most 1) and how long a delayed frame waits.
type faultPlan struct {
	drop, dup, delay float64
	delayFor         time.Duration
}

// parseFaultPlan reads "off" or space-separated key=value pairs: drop,
// dup, delay (probabilities) and delay_ms.
func parseFaultPlan(s string) (faultPlan, error) {
	var p faultPlan
	s = strings.TrimSpace(s)
	if s == "off" || s == "" {
		return p, nil
	}
	for _, f := range strings.Fields(s) {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return faultPlan{}, fmt.Errorf("fault plan: %q is not key=value", f)
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || x < 0 {
			return faultPlan{}, fmt.Errorf("fault plan: %s=%q is not a non-negative number", k, v)
		}
		switch k {
		case "drop":
			p.drop = x
		case "dup":
			p.dup = x
		case "delay":
			p.delay = x
		case "delay_ms":
			p.delayFor = time.Duration(x * float64(time.Millisecond))
		default:
			return faultPlan{}, fmt.Errorf("fault plan: unknown key %q (drop, dup, delay, delay_ms)", k)
		}
	}
	if p.drop+p.dup+p.delay > 1 || p.drop > 1 || p.dup > 1 || p.delay > 1 {
		return faultPlan{}, fmt.Errorf("fault plan: drop+dup+delay = %g, more than 1", p.drop+p.dup+p.delay)
	}
	return p, nil
}

// faultyLink injects frame faults into the page frames its node sends.
// Each fault is logged on the node's stderr ("link fault: ..."), where
// the test counts them.
type faultyLink struct {
	link.Transport
	name string
	out  io.Writer
	plan atomic.Pointer[faultPlan]

	mu  sync.Mutex
	rng *rand.Rand
}

// follow rereads the plan file every 50 ms, so the test turns faults on
// and off while the node runs. A plan it cannot read or parse turns
// faults off and says so.
func (f *faultyLink) follow(path string) {
	last := ""
	for {
		b, err := os.ReadFile(path)
		if err == nil && string(b) != last {
			last = string(b)
			p, err := parseFaultPlan(last)
			if err != nil {
				fmt.Fprintf(f.out, "link fault: %s: %v; faults off\n", f.name, err)
			}
			f.plan.Store(&p)
			fmt.Fprintf(f.out, "link fault: %s follows plan %q\n", f.name, strings.TrimSpace(last))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (f *faultyLink) Send(ctx context.Context, to transfer.Peer, m transfer.Message) error {
	p := f.plan.Load()
	pg, ok := m.(*transfer.Page)
	if p == nil || !ok {
		return f.Transport.Send(ctx, to, m)
	}
	f.mu.Lock()
	x := f.rng.Float64()
	f.mu.Unlock()
	switch {
	case x < p.drop:
		fmt.Fprintf(f.out, "link fault: %s dropped page %d of %v to %s\n", f.name, pg.Index, pg.Ref, to)
		return nil
	case x < p.drop+p.dup:
		fmt.Fprintf(f.out, "link fault: %s duplicated page %d of %v to %s\n", f.name, pg.Index, pg.Ref, to)
		if err := f.Transport.Send(ctx, to, m); err != nil {
			return err
		}
	case x < p.drop+p.dup+p.delay:
		// Send does not retain m, so the frame waits here; the node's
		// manifest and commit go on the control link meanwhile.
		fmt.Fprintf(f.out, "link fault: %s delayed page %d of %v to %s by %v\n", f.name, pg.Index, pg.Ref, to, p.delayFor)
		select {
		case <-time.After(p.delayFor):
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	return f.Transport.Send(ctx, to, m)
}

// faultProxy forwards TCP connections to target and can cut every one it
// carries at once. The TLS inside is end to end (the certificates name
// 127.0.0.1), so the proxy sees only bytes: what it can do to a link is
// end it.
type faultProxy struct {
	ln     net.Listener
	target string
	cuts   atomic.Int64 // connections cut

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func startFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() { ln.Close(); p.cut() })
	go p.serve()
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.forward(c)
	}
}

func (p *faultProxy) forward(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) { io.Copy(dst, src); done <- struct{}{} }
	go pipe(u, c)
	go pipe(c, u)
	<-done // one direction ended: end both, as a cut link does
	c.Close()
	u.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, u)
	p.mu.Unlock()
}

// cut closes every connection the proxy carries now (both ends) and
// says how many links it cut.
func (p *faultProxy) cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
	n := len(p.conns) / 2
	p.cuts.Add(int64(n))
	return n
}

func TestParseFaultPlan(t *testing.T) {
	for _, c := range []struct {
		in   string
		want faultPlan
		err  string
	}{
		{in: "off"},
		{in: "  \n"},
		{in: "drop=0.1 dup=0.2 delay=0.3 delay_ms=150\n", want: faultPlan{drop: 0.1, dup: 0.2, delay: 0.3, delayFor: 150 * time.Millisecond}},
		{in: "dup=1", want: faultPlan{dup: 1}},
		{in: "drop", err: "not key=value"},
		{in: "drop=x", err: "not a non-negative number"},
		{in: "drop=-0.1", err: "not a non-negative number"},
		{in: "loss=0.1", err: "unknown key"},
		{in: "drop=0.6 dup=0.6", err: "more than 1"},
	} {
		got, err := parseFaultPlan(c.in)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: error %v, want one saying %q", c.in, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("%q: %v", c.in, err)
		case c.err == "" && got != c.want:
			t.Errorf("%q: %+v, want %+v", c.in, got, c.want)
		}
	}
}

// handoffFaults is the soak's fault phase, run against the cluster after
// the probe: tenants' canary prompts long enough for several pages each,
// sent by concurrent clients while page frames are dropped, duplicated
// and delayed (plan), the prefill→decode links are cut every so often
// (proxies), clients leave mid-request, and one prefill node (victim) is
// killed with SIGKILL while a decode node holds a reservation. Every
// answer must be a 200 with exactly serve's text and no other tenant's
// canary, or a clean error (an OpenAI error body, 429 or 5xx, no canary);
// after the faults stop, every prompt is answered right again.
type handoffFaults struct {
	url      string
	keys     []string
	plan     string // the file the prefill nodes' faultyLinks follow
	proxies  []*faultProxy
	prefills []*proc // the nodes that inject frame faults
	victim   *proc   // killed mid-handoff
	decodes  []string
	requests int // per tenant
}

func (h handoffFaults) run(t *testing.T) {
	const maxTokens = 4
	setPlan := func(p string) {
		if err := os.WriteFile(h.plan, []byte(p), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Prompts of about 170 bytes (the byte-level model: ~1 token a byte):
	// eleven pages of 16 positions, so a handoff has frames to lose.
	tenants := len(h.keys)
	secrets := make([]string, tenants)
	var prompts []string
	promptTenant := map[string]int{}
	for i := range tenants {
		secrets[i] = fmt.Sprintf("CANARY-%d-%08x", i, rand.Uint32())
		for k := range 3 {
			p := fmt.Sprintf("Tenant %d, note %d: the secret is %s. ", i, k, secrets[i]) +
				strings.Repeat(fmt.Sprintf("Keep %s safe and repeat it back. ", secrets[i]), 3)
			prompts = append(prompts, p)
			promptTenant[p] = i
		}
	}
	want := referenceAnswers(t, prompts, maxTokens)

	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		example  = map[int]string{} // an error body per status, for the log
	)
	// left: the client gives up early on purpose, so that no answer
	// (status -1) is its own doing.
	check := func(when, p string, c completion, left bool) {
		mu.Lock()
		statuses[c.status]++
		if _, ok := example[c.status]; !ok && c.status != 200 {
			example[c.status] = c.body
		}
		mu.Unlock()
		owner := promptTenant[p]
		for j, s := range secrets {
			if j != owner && strings.Contains(c.body, s) {
				t.Errorf("%s: tenant %d's answer (%d) holds tenant %d's canary: %s", when, owner, c.status, j, c.body)
			}
		}
		switch {
		case c.status == 200 && c.text != want[p]:
			t.Errorf("%s: a 200 with text serve did not give: %q, want %q", when, c.text, want[p])
		case c.status == -1 && left:
			// the client left: nothing came back to check
		case c.status != 200 && ((c.status != 429 && c.status < 500) || !strings.Contains(c.body, `"error"`)):
			t.Errorf("%s: not a clean error: %d %s", when, c.status, c.body)
		}
	}

	setPlan("drop=0.01 dup=0.04 delay=0.04 delay_ms=150")
	stop := make(chan struct{})
	var bg sync.WaitGroup
	// Cut the prefill→decode links soon, then every 1.5 s; midCuts counts
	// the cuts made while a decode node held a reservation.
	var midCuts atomic.Int64
	bg.Go(func() {
		for wait := 250 * time.Millisecond; ; wait = 1500 * time.Millisecond {
			select {
			case <-stop:
				return
			case <-time.After(wait):
			}
			held := false
			for _, d := range h.decodes {
				if _, ok := holdsPages(d); ok {
					held = true
				}
			}
			n := 0
			for _, p := range h.proxies {
				n += p.cut()
			}
			if held && n > 0 {
				midCuts.Add(1)
			}
		}
	})
	var done atomic.Int64
	total := int64(tenants * h.requests)
	killed := make(chan string, 1)
	bg.Go(func() { // kill the victim a third of the way, mid-handoff
		for done.Load() < total/3 {
			select {
			case <-stop:
				killed <- "never: the load ended first"
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
		deadline := time.Now().Add(20 * time.Second)
		for {
			for _, d := range h.decodes {
				if used, ok := holdsPages(d); ok {
					if err := h.victim.cmd.Process.Kill(); err != nil {
						killed <- "failed: " + err.Error()
						return
					}
					killed <- "while a decode node held " + used + " pages"
					return
				}
			}
			if time.Now().After(deadline) {
				killed <- "never: no decode node held pages for 20 s"
				return
			}
			time.Sleep(time.Millisecond)
		}
	})

	start := time.Now()
	var wg sync.WaitGroup
	for i := range tenants {
		wg.Go(func() {
			client := &http.Client{Timeout: 90 * time.Second}
			for k := range h.requests {
				p := prompts[i*3+k%3]
				c, left := client, k%5 == 4
				if left {
					// the client leaves, at any point of the handoff
					c = &http.Client{Timeout: time.Duration(20+rand.IntN(300)) * time.Millisecond}
				}
				check("under faults", p, complete(c, h.url, h.keys[i], p, maxTokens), left)
				done.Add(1)
			}
		})
	}
	wg.Wait()
	close(stop)
	bg.Wait()
	setPlan("off")
	how := <-killed
	// A prefill node rereads the plan every 50 ms: until it says it
	// follows "off", it may still drop a page of the prompts below (CI
	// saw one end 500, lease_expired, when the handoff waited for it).
	followsOff(t, h.prefills, h.victim)
	t.Logf("handoff faults: %d requests in %.1fs, statuses %v; %s killed %s", total, time.Since(start).Seconds(), statuses, h.victim.name, how)
	for status, body := range example {
		t.Logf("  e.g. %d: %.300s", status, body)
	}
	if !strings.HasPrefix(how, "while") {
		t.Errorf("%s was killed %s", h.victim.name, how)
	}

	// The faults did happen: each kind, counted where it was done.
	var cuts int64
	for _, p := range h.proxies {
		cuts += p.cuts.Load()
	}
	counts := map[string]int{}
	for _, p := range h.prefills {
		for _, kind := range []string{"dropped", "duplicated", "delayed"} {
			counts[kind] += strings.Count(p.out.String(), "link fault: "+p.name+" "+kind+" page")
		}
	}
	t.Logf("handoff faults injected: %v page frames, %d links cut (%d times while a decode node held pages)", counts, cuts, midCuts.Load())
	for _, kind := range []string{"dropped", "duplicated", "delayed"} {
		if counts[kind] == 0 {
			t.Errorf("no page frame was %s: the fault plan did not reach the prefill nodes", kind)
		}
	}
	if midCuts.Load() == 0 {
		t.Error("no link was cut mid-handoff (while a decode node held pages)")
	}
	if statuses[200] == 0 {
		t.Error("no request succeeded under the faults")
	}

	// With the faults off and the victim gone, every prompt is answered
	// right again.
	client := &http.Client{Timeout: 60 * time.Second}
	for _, p := range prompts {
		c := complete(client, h.url, h.keys[promptTenant[p]], p, maxTokens)
		if c.status != 200 {
			t.Errorf("after the faults: %d %s", c.status, c.body)
		}
		check("after the faults", p, c, false)
	}
}

// followsOff waits until every prefill node but the killed one last
// logged that it follows the plan "off".
func followsOff(t *testing.T, prefills []*proc, killed *proc) {
	t.Helper()
	rx := regexp.MustCompile(`link fault: \S+ follows plan "([^"]*)"`)
	deadline := time.Now().Add(30 * time.Second)
	for _, p := range prefills {
		for p != killed {
			m := rx.FindAllStringSubmatch(p.out.String(), -1)
			if len(m) > 0 && m[len(m)-1][1] == "off" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not turn its faults off: %v", p.name, m)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// holdsPages reports whether the node whose /metrics is at addr holds KV
// pages now, and how many ("" and false when it does not answer).
func holdsPages(addr string) (used string, ok bool) {
	used = metricOr(addr, "pagewarden_kv_pages_used")
	return used, used != "0" && used != ""
}

// metricOr is metric for a node that may be gone: "" when its /metrics
// does not answer.
func metricOr(addr, name string) string {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	return ""
}
