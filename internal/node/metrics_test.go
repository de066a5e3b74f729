package node_test

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/syncbuf"
)

// scrape GETs /metrics from h and returns every sample by its series
// (name and labels as exposed).
func scrape(t *testing.T, h http.Handler) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(rec.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

// stepGate is an executor that makes the first batch's outcome claim the
// wrong owner (an isolation violation the core counts) and holds the loop
// inside the second batch until released.
type stepGate struct {
	inner   sched.Executor
	batches int
	entered chan struct{} // closed when the second batch starts
	release chan struct{} // closed by the test to let it finish
}

func (g *stepGate) Execute(ctx context.Context, b *sched.Batch) ([]sched.Outcome, error) {
	g.batches++
	switch g.batches {
	case 1:
		outs, err := g.inner.Execute(ctx, b)
		if err == nil {
			outs[0].Owner = request.Owner{Tenant: "intruder", ID: request.NewID()}
		}
		return outs, err
	case 2:
		close(g.entered)
		<-g.release
	}
	return g.inner.Execute(ctx, b)
}

// TestScrapeDuringLongStep: while the scheduler loop is inside a long step
// and cannot answer, a scrape still shows the true counters (here one
// isolation violation) and pool gauges, never zeros, and the snapshot-age
// gauge grows so that an alert can see the loop is stuck.
//
// It runs in real time, not in a synctest bubble: a scrape's collectors run
// in parallel, and a scrape that queues behind a mutex (as one did) is not
// durably blocked, so a bubble would hang instead of failing. Each scrape
// waits the stats timeout (shortened here) for the stuck loop, which is
// what makes the age grow; nothing sleeps.
func TestScrapeDuringLongStep(t *testing.T) {
	prev := invariants.SetStrict(false) // the violation is provoked on purpose
	t.Cleanup(func() { invariants.SetStrict(prev) })
	const wait = 50 * time.Millisecond
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gate := &stepGate{entered: make(chan struct{}), release: make(chan struct{})}
	o := node.Options{Threads: 1, KVMemory: 16 << 20, Scrub: kvcache.ScrubPoison}
	node.WrapExecutor(&o, func(x sched.Executor) sched.Executor { gate.inner = x; return gate })
	node.SetStatsTimeout(&o, wait)
	n, err := node.Start(m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	srv, err := gateway.New(gateway.Config{Backend: n, Tenants: &tenants.Config{Tenants: []tenants.Tenant{
		{ID: "a", APIKeySHA256: []string{tenants.HashKey(keyA)}},
	}}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Metrics().Register(n.Collector()); err != nil {
		t.Fatal(err)
	}
	metrics := srv.MetricsHandler()
	prompt, _ := n.Tokenize("the loop is busy", true, false)
	submit := func(tenant request.Tenant) *sched.Stream {
		t.Helper()
		s, err := n.Submit(context.Background(), request.Params{Owner: request.Owner{Tenant: tenant}, Prompt: prompt, MaxTokens: 2})
		if err != nil {
			t.Fatal(err)
		}
		return s.(*sched.Stream)
	}

	if res := submit("a").Result(); res.Reason != request.FinishError {
		t.Fatalf("request with a crossed outcome: %+v", res)
	}
	before, err := n.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if before.Core.OwnerMismatches != 1 || before.Pool.QuarantinedPages == 0 {
		t.Fatalf("setup: %+v, %d quarantined", before.Core, before.Pool.QuarantinedPages)
	}

	b := submit("b")
	<-gate.entered // the loop is inside the second step and stays there
	released := false
	defer func() {
		if !released {
			close(gate.release)
		}
	}()
	check := func(got map[string]float64) {
		t.Helper()
		for series, want := range map[string]float64{
			"pagewarden_isolation_violations_total":   1,
			"pagewarden_sched_owner_mismatches_total": 1,
			"pagewarden_aborted_but_completed_total":  0,
			"pagewarden_kv_pages":                     float64(before.Pool.TotalPages),
			"pagewarden_kv_pages_quarantined":         float64(before.Pool.QuarantinedPages),
			"pagewarden_kv_page_quarantines_total":    float64(before.Pool.Quarantines),
			"pagewarden_kv_page_scrubs_total":         float64(before.Pool.Scrubs),
			"pagewarden_running_requests":             1,
		} {
			if v, ok := got[series]; !ok || v != want {
				t.Errorf("%s = %v (exported %v), want %v", series, v, ok, want)
			}
		}
		// The step's pages were allocated before it ran.
		if v := got["pagewarden_kv_page_allocations_total"]; v <= float64(before.Pool.Allocations) {
			t.Errorf("pagewarden_kv_page_allocations_total = %v, want more than %d", v, before.Pool.Allocations)
		}
		if v := got["pagewarden_sched_steps_total"]; v < float64(before.Core.Steps) {
			t.Errorf("pagewarden_sched_steps_total = %v, want at least %d", v, before.Core.Steps)
		}
	}
	const age = "pagewarden_scheduler_snapshot_age_seconds"
	first := scrape(t, metrics)
	check(first)
	second := scrape(t, metrics)
	check(second)
	if !(first[age] >= wait.Seconds() && second[age] > first[age]) {
		t.Errorf("%s: %v then %v while the loop is stuck, want at least %v and growing", age, first[age], second[age], wait.Seconds())
	}

	released = true
	close(gate.release)
	if res := b.Result(); res.Reason != request.FinishLength {
		t.Fatalf("request run after the long step: %+v", res)
	}
	// The loop is free again: a scrape's refresh gets a fresh snapshot
	// (it waits 50 ms for one, which a loaded machine can miss once).
	after := scrape(t, metrics)
	for deadline := time.Now().Add(5 * time.Second); after[age] >= first[age] && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		after = scrape(t, metrics)
	}
	if after[age] >= first[age] || after["pagewarden_isolation_violations_total"] != 1 || after["pagewarden_running_requests"] != 0 {
		t.Errorf("after the step: age %v, violations %v, running %v", after[age],
			after["pagewarden_isolation_violations_total"], after["pagewarden_running_requests"])
	}
}

// TestViolationIsAudited: a request ended by an isolation violation leaves
// one ERROR line naming the tenant, the request and what the check saw,
// without the prompt's text.
func TestViolationIsAudited(t *testing.T) {
	prev := invariants.SetStrict(false)
	t.Cleanup(func() { invariants.SetStrict(prev) })
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	o := node.Options{Threads: 1, KVMemory: 16 << 20, Logger: slog.New(slog.NewJSONHandler(logs, nil))}
	gate := &stepGate{entered: make(chan struct{}), release: make(chan struct{})}
	close(gate.release)
	node.WrapExecutor(&o, func(x sched.Executor) sched.Executor { gate.inner = x; return gate })
	n, err := node.Start(m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	prompt, _ := n.Tokenize("a secret prompt", true, false)
	st, err := n.Submit(context.Background(), request.Params{Owner: request.Owner{Tenant: "victim", ID: request.NewID()}, Prompt: prompt, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	if res := st.Result(); res.Reason.Success() {
		t.Fatalf("a violated request succeeded: %+v", res)
	}
	text := logs.String()
	if !strings.Contains(text, `"level":"ERROR"`) || !strings.Contains(text, "isolation violation") || !strings.Contains(text, `"tenant":"victim"`) || !strings.Contains(text, "intruder") {
		t.Errorf("audit line missing or incomplete:\n%s", text)
	}
	if strings.Contains(text, "secret") {
		t.Errorf("the audit trail holds prompt text:\n%s", text)
	}
}
