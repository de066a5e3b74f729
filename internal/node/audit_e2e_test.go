package node_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
)

// auditWorkload sends a mix of answers through s from both tenants at
// once: completions and chat, greedy and sampled (seeded and not), a stop
// sequence, ending at length and at a stop, streamed and not. It returns
// how many came back 200.
func auditWorkload(t *testing.T, s *e2eServer) int {
	t.Helper()
	bodies := []struct {
		path string
		body map[string]any
	}{
		{"/v1/completions", map[string]any{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}},
		{"/v1/completions", map[string]any{"prompt": "The dog", "max_tokens": 16, "temperature": 1, "seed": 7}},
		{"/v1/completions", map[string]any{"prompt": "The cat sat", "max_tokens": 16, "temperature": 0.8, "top_p": 0.9}}, // unseeded: a fresh seed
		{"/v1/completions", map[string]any{"prompt": "A B C", "max_tokens": 24, "temperature": 1, "seed": 3, "stop": []string{"e"}}},
		{"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "Hello there"}}, "max_tokens": 10, "temperature": 0}},
		{"/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "Tell me"}}, "max_tokens": 10, "temperature": 1.2, "seed": 11,
			"presence_penalty": 0.5}},
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for _, key := range []string{e2eKeyA, e2eKeyB} {
		for i, b := range bodies {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := map[string]any{}
				for k, v := range b.body {
					body[k] = v
				}
				var code int
				if i%2 == 0 {
					st := s.stream(key, b.path, body)
					if st.status == 200 && st.done && st.errEv == nil {
						code = 200
					}
				} else {
					code, _, _ = s.post(key, b.path, body)
				}
				mu.Lock()
				defer mu.Unlock()
				if code == 200 {
					ok++
				} else {
					t.Errorf("%s %v: status %d", b.path, b.body, code)
				}
			}()
		}
	}
	wg.Wait()
	return ok
}

// waitReplays waits until n replays have ended, whatever their result.
func (s *e2eServer) waitReplays(n int) {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for s.metricValue("pagewarden_audit_replays_total") < float64(n) {
		if time.Now().After(deadline) {
			s.t.Fatalf("%v of %d replays ended", s.metricValue("pagewarden_audit_replays_total"), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// replays returns the replay counter of one result.
func (s *e2eServer) replays(result string) float64 {
	s.t.Helper()
	mfs, err := s.srv.Metrics().Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pagewarden_audit_replays_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestReplayAudit: at rate 1 every answer that went out with a 200 is
// generated again on fresh pages, as the reserved audit tenant at the
// lowest priority, and matches token for token — greedy or sampled,
// seeded or not (the fresh seed is kept), cut by a stop sequence or not,
// streamed or not, while the other tenant's requests share the batches.
// No replay is charged to a tenant, and the pages come back.
func TestReplayAudit(t *testing.T) {
	s := startE2E(t, e2eConfig{auditRate: 1})
	ok := auditWorkload(t, s)
	s.waitReplays(ok)
	if m, mm, f, d := s.replays("match"), s.replays("mismatch"), s.replays("failed"), s.replays("dropped"); m != float64(ok) || mm+f+d != 0 {
		t.Fatalf("replays: %v match, %v mismatch, %v failed, %v dropped; want %d matches", m, mm, f, d, ok)
	}
	s.checkMustBeZero()
	s.waitAllFree()
	// The replays reached the node as the audit tenant, one per answer,
	// and the tenants' own submissions are their requests only.
	byTenant := map[request.Tenant]int{}
	s.rec.mu.Lock()
	for _, o := range s.rec.owners {
		byTenant[o.Tenant]++
	}
	s.rec.mu.Unlock()
	if byTenant[gateway.AuditTenant] != ok || byTenant["a"]+byTenant["b"] != ok {
		t.Errorf("submissions by tenant %v; want %d of %s and %d of a and b together", byTenant, ok, gateway.AuditTenant, ok)
	}
}

// crossing is the positive control's fault: an executor that gives
// tenant victim's sequences the neighbouring token instead of the one
// they sampled — an answer built from something other than its own
// request, as the incident's were. The audit's replays (another tenant)
// are left alone, so they produce what the victim should have got.
type crossing struct {
	inner  sched.Executor
	victim request.Tenant
}

func (x *crossing) Execute(ctx context.Context, b *sched.Batch) ([]sched.Outcome, error) {
	outs, err := x.inner.Execute(ctx, b)
	for i := range outs {
		if outs[i].Owner.Tenant == x.victim && outs[i].Token > 0 {
			outs[i].Token--
		}
	}
	return outs, err
}

// TestReplayAuditCatchesContamination is the audit's positive control:
// with tenant b's answers altered inside the executor, every one of b's
// answers is a mismatch (counted, and logged at ERROR with tenant, request
// id and position, never text), and none of a's is.
func TestReplayAuditCatchesContamination(t *testing.T) {
	var o node.Options
	node.WrapExecutor(&o, func(e sched.Executor) sched.Executor { return &crossing{inner: e, victim: "b"} })
	s := startE2E(t, e2eConfig{auditRate: 1, node: o})
	ok := auditWorkload(t, s)
	s.waitReplays(ok)
	if mm, m := s.replays("mismatch"), s.replays("match"); mm != float64(ok/2) || m != float64(ok/2) {
		t.Fatalf("replays: %v mismatch, %v match; want %d of each (tenant b's answers are altered)", mm, m, ok/2)
	}
	if v := s.metricValue("pagewarden_audit_mismatches_total"); v != float64(ok/2) {
		t.Fatalf("pagewarden_audit_mismatches_total = %v, want %d", v, ok/2)
	}
	logs := s.logs.String()
	lines := 0
	for _, l := range strings.Split(logs, "\n") {
		if !strings.Contains(l, "replay audit mismatch") {
			continue
		}
		lines++
		// The pages and epochs the answer's sequence held, from the
		// pool's record of ended sequences.
		for _, want := range []string{`"level":"ERROR"`, `"tenant":"b"`, `"request_id":"`, `"first_difference_at":`, `"positions":[`, `"pages":["`, `"pages_quarantined":`} {
			if !strings.Contains(l, want) {
				t.Errorf("audit line lacks %s: %s", want, l)
			}
		}
		for _, text := range []string{"Once upon", "Hello there", "The dog"} {
			if strings.Contains(l, text) {
				t.Errorf("audit line carries prompt text %q: %s", text, l)
			}
		}
	}
	if lines != ok/2 {
		t.Errorf("%d audit ERROR lines, want %d:\n%s", lines, ok/2, logs)
	}
}
