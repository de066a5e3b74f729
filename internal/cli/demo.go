package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/disagg"
	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

func init() { extraCommands = append(extraCommands, demoCmd) }

func demoCmd() *cobra.Command {
	var mf modelFlags
	var perTenant int
	c := &cobra.Command{
		Use:   "demo",
		Short: "Run a gateway, two prefill and two decode nodes over mutual TLS on loopback through a multi-tenant workload with the incident's faults",
		Long: `Start, in this process, a gateway and two prefill and two decode nodes
linked by gRPC over mutual TLS on loopback (a development CA is made on the
fly), then run a short multi-tenant workload through the OpenAI API that
includes the incident's shape: an over-long prompt, clients that leave during
prefill and in the middle of a stream, and one handoff that sends fewer KV
pages than the decode node reserved. Print what happened to every request, why
each handoff was accepted or refused, and the state of every node's pages.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := mf.validate(); err != nil {
				return err
			}
			if perTenant < 1 || perTenant > 100 {
				return usagef("--requests-per-tenant %d: want 1..100", perTenant)
			}
			return runDemo(cmd.Context(), cmd.OutOrStdout(), &mf, perTenant)
		},
	}
	mf.register(c)
	c.Flags().IntVar(&perTenant, "requests-per-tenant", 4, "ordinary requests each tenant sends")
	return c
}

// demoFault is the injected bad handoff: the first request of the victim
// tenant with a prompt of several pages reaches decode with only its
// first page, and a manifest that says the prompt was one page long (the
// incident: 8 pages reserved, 1 sent).
type demoFault struct {
	link.Transport
	*demoFaultState
}

// demoFaultState is shared by both prefill nodes' wrappers: one handoff in
// the whole run is cut short, whichever node serves it.
type demoFaultState struct {
	victim request.Tenant
	mu     sync.Mutex
	target request.Owner
	done   bool
}

func (f *demoFault) Send(ctx context.Context, to transfer.Peer, m transfer.Message) error {
	f.mu.Lock()
	switch m := m.(type) {
	case *transfer.Page:
		if !f.done && f.target.Tenant == "" && m.Owner.Tenant == f.victim && m.Index > 0 {
			f.target = m.Owner
		}
		if m.Owner == f.target && m.Index > 0 {
			f.mu.Unlock()
			return nil
		}
	case *transfer.Manifest:
		if m.Owner == f.target && !f.done {
			f.done = true
			q := *m
			q.PageCount, q.Filled, q.PageDigests, q.TotalTokens = 1, m.Filled[:1], m.PageDigests[:1], m.Filled[0]
			f.mu.Unlock()
			return f.Transport.Send(ctx, to, &q)
		}
	}
	f.mu.Unlock()
	return f.Transport.Send(ctx, to, m)
}

// demoCluster starts the nodes on gRPC with mutual TLS over loopback.
func demoCluster(mf *modelFlags, logger *slog.Logger) (*disagg.Local, error) {
	names := []transfer.Peer{"prefill-0", "prefill-1", "decode-0", "decode-1", "gateway"}
	now := time.Now()
	ca, err := link.NewCA("pagewarden demo CA", now, time.Hour)
	if err != nil {
		return nil, err
	}
	listeners := map[transfer.Peer]net.Listener{}
	addrs := map[transfer.Peer]string{}
	closeAll := func() {
		for _, ln := range listeners {
			ln.Close()
		}
	}
	for _, n := range names[:4] {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			closeAll()
			return nil, err
		}
		listeners[n], addrs[n] = ln, ln.Addr().String()
	}
	m, err := mf.load()
	if err != nil {
		closeAll()
		return nil, err
	}
	kvType, _ := mf.kvDType()
	fault := &demoFaultState{victim: "umbrella"}
	l, err := disagg.StartLocal(m, disagg.LocalConfig{
		Prefill: 2, Decode: 2, Logger: logger,
		Node: node.Options{Threads: mf.threads, PageSize: mf.pageSize, KVType: kvType, KVMemory: 32 << 20},
		Transport: func(h transfer.Hello) (link.Transport, error) {
			cert, err := ca.Issue(link.Identity{Name: h.Node, Role: h.Role}, []string{"127.0.0.1"}, now, time.Hour)
			if err != nil {
				return nil, err
			}
			tl, err := link.NewTLS(ca.CertPEM, cert.CertPEM, cert.KeyPEM)
			if err != nil {
				return nil, err
			}
			return link.NewGRPC(link.GRPCConfig{Options: link.Options{Logger: logger}, TLS: tl, Hello: h, Peers: addrs}, listeners[h.Node])
		},
		Wrap: func(name transfer.Peer, t link.Transport) link.Transport {
			if name == "prefill-0" || name == "prefill-1" {
				return &demoFault{Transport: t, demoFaultState: fault}
			}
			return t
		},
	})
	if err != nil {
		closeAll()
		return nil, err
	}
	return l, nil
}

// demoTally is what happened to one tenant's requests.
type demoTally struct {
	sent   int
	ok     int
	errors map[string]int // "status code"
}

func runDemo(ctx context.Context, out io.Writer, mf *modelFlags, perTenant int) error {
	invariants.SetStrict(false)
	logger := slog.New(slog.DiscardHandler)
	l, err := demoCluster(mf, logger)
	if err != nil {
		return err
	}
	defer l.Close()
	tenantIDs := []string{"acme", "globex", "initech", "umbrella"}
	keys := map[string]string{}
	var cfg tenants.Config
	for _, id := range tenantIDs {
		keys[id] = "sk-demo-" + id + "-" + request.NewID().String()
		cfg.Tenants = append(cfg.Tenants, tenants.Tenant{ID: id, APIKeySHA256: []string{tenants.HashKey(keys[id])}})
	}
	srv, err := gateway.New(gateway.Config{Backend: l, Tenants: &cfg, Logger: logger})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv.Start(ln)
	defer srv.Shutdown(context.Background())
	base := "http://" + ln.Addr().String()
	fmt.Fprintf(out, "pagewarden demo: gateway %s; prefill-0, prefill-1, decode-0, decode-1 linked by gRPC over mutual TLS on loopback\n", base)
	fmt.Fprintf(out, "model %s, window %d tokens, KV pages of %d tokens\n\n", l.ModelID(), l.Limits().MaxContext, l.Limits().PageSize)

	var mu sync.Mutex
	tally := map[string]*demoTally{}
	record := func(tenant string, status int, code string) {
		mu.Lock()
		defer mu.Unlock()
		t := tally[tenant]
		if t == nil {
			t = &demoTally{errors: map[string]int{}}
			tally[tenant] = t
		}
		t.sent++
		if status == 200 {
			t.ok++
		} else {
			t.errors[fmt.Sprintf("%d %s", status, code)]++
		}
	}
	post := func(ctx context.Context, tenant string, body map[string]any) (int, string, *http.Response) {
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+keys[tenant])
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 499, "client_closed", nil
		}
		return resp.StatusCode, "", resp
	}
	errCode := func(resp *http.Response) string {
		defer resp.Body.Close()
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(b, &e)
		return e.Error.Code
	}
	prompts := []string{
		"Once upon a time, in a small village by the sea, there lived a girl who loved to",
		"The little dog ran to the park and saw",
		"Tim and his sister found a box under the bed. Inside the box they found",
		"It was a sunny day. The birds were singing and the children wanted to play outside, so they asked their mother if",
	}
	var wg sync.WaitGroup
	for _, tenant := range tenantIDs {
		for i := range perTenant {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status, _, resp := post(ctx, tenant, map[string]any{"prompt": prompts[i%len(prompts)] + strings.Repeat(" and then", i), "max_tokens": 24, "temperature": 0})
				code := ""
				if resp != nil {
					if status == 200 {
						resp.Body.Close()
					} else {
						code = errCode(resp)
					}
				}
				record(tenant, status, code)
			}()
		}
	}
	// The incident's request: a prompt longer than the window.
	wg.Add(1)
	go func() {
		defer wg.Done()
		long := strings.Repeat("the sea is wide and the sky is blue ", l.Limits().MaxContext/4)
		status, _, resp := post(ctx, "initech", map[string]any{"prompt": long, "max_tokens": 16})
		code := ""
		if resp != nil {
			code = errCode(resp)
		}
		record("initech", status, code)
	}()
	// A client that leaves while its prompt is being prefilled.
	wg.Add(1)
	go func() {
		defer wg.Done()
		cctx, cancel := context.WithTimeout(ctx, 2*time.Millisecond)
		defer cancel()
		status, code, resp := post(cctx, "globex", map[string]any{"prompt": strings.Repeat("a long story about a cat ", 60), "max_tokens": 32})
		if resp != nil {
			resp.Body.Close()
		}
		record("globex", status, code)
	}()
	// A client that leaves in the middle of a stream.
	wg.Add(1)
	go func() {
		defer wg.Done()
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		status, code, resp := post(cctx, "globex", map[string]any{"prompt": prompts[0], "max_tokens": 200, "stream": true})
		if resp != nil {
			sc := bufio.NewScanner(resp.Body)
			for n := 0; n < 3 && sc.Scan(); {
				if strings.HasPrefix(sc.Text(), "data: ") {
					n++
				}
			}
			cancel()
			resp.Body.Close()
			status, code = 499, "client_closed"
		}
		record("globex", status, code)
	}()
	wg.Wait()

	fmt.Fprintln(out, "requests per tenant")
	ids := slices.Sorted(func(yield func(string) bool) {
		for k := range tally {
			if !yield(k) {
				return
			}
		}
	})
	for _, id := range ids {
		t := tally[id]
		var errs []string
		for k, v := range t.errors {
			errs = append(errs, fmt.Sprintf("%d × %s", v, k))
		}
		sort.Strings(errs)
		fmt.Fprintf(out, "  %-9s sent %2d   200 %2d   refused/failed: %s\n", id, t.sent, t.ok, orNone(strings.Join(errs, ", ")))
	}

	// Let aborts and leases settle before reading the nodes.
	settle := time.Now().Add(15 * time.Second)
	for time.Now().Before(settle) && l.PoolStats().PagesUsed > 0 {
		time.Sleep(20 * time.Millisecond)
	}
	var committed, failed uint64
	reasons := map[string]uint64{}
	for _, d := range l.DecodeDrivers {
		s := d.Stats()
		committed += s.Committed
		failed += s.Failed
	}
	for k, v := range l.Router.Stats().HandoffFailures {
		reasons[k] += v
	}
	fmt.Fprintf(out, "\nhandoffs: %d validated and committed, %d refused or aborted\n", committed, failed)
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range reasons {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(out, "  %-24s %d\n", k, reasons[k])
	}
	fmt.Fprintln(out, "\npages per node (after the workload)")
	ps := l.PoolStats()
	all := append(append([]*node.Node(nil), l.Prefills...), l.Decodes...)
	labels := []string{"prefill-0", "prefill-1", "decode-0", "decode-1"}
	for i, n := range all {
		p := n.PoolStats()
		fmt.Fprintf(out, "  %-9s total %5d   free %5d   used %d   quarantined %d   violations %d\n", labels[i], p.PagesTotal, p.PagesFree, p.PagesUsed, p.PagesQuarantined, n.IsolationViolations())
	}
	viol := l.IsolationViolations()
	verdict := "PASS"
	if ps.PagesUsed != 0 || ps.PagesQuarantined != 0 || viol != 0 || tally["umbrella"] == nil || tally["umbrella"].ok == tally["umbrella"].sent {
		verdict = "FAIL"
	}
	fmt.Fprintf(out, "\npages back to baseline: %v; isolation violations: %d; the short handoff was refused: %v\n%s\n",
		ps.PagesUsed == 0 && ps.PagesQuarantined == 0, viol, reasons["page_count_mismatch"]+reasons["total_tokens_mismatch"]+reasons["filled_mismatch"] > 0, verdict)
	if verdict != "PASS" {
		return fmt.Errorf("demo: the checks above did not hold")
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
