package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pagewarden/pagewarden/internal/engine"
	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
)

const (
	keyA = "sk-tenant-a"
	keyB = "sk-tenant-b"
)

type server struct {
	t    *testing.T
	node *node.Node
	ts   *httptest.Server
}

// start serves builtin model name through the real node and gateway.
func start(t *testing.T, name string, o node.Options) *server {
	t.Helper()
	m, err := model.Load(model.BuiltinPrefix+name, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if o.Threads == 0 {
		o.Threads = 2
	}
	o.Scrub = kvcache.ScrubPoison
	n, err := node.Start(m, o)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tenants.Config{Tenants: []tenants.Tenant{
		{ID: "a", APIKeySHA256: []string{tenants.HashKey(keyA)}},
		{ID: "b", APIKeySHA256: []string{tenants.HashKey(keyB)}},
	}}
	srv, err := gateway.New(gateway.Config{Backend: n, Tenants: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(func() {
		ts.Close()
		if err := n.Close(); err != nil {
			t.Errorf("node close: %v", err)
		}
	})
	return &server{t: t, node: n, ts: ts}
}

func (s *server) post(key, path string, body any) (int, []byte) {
	s.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", s.ts.URL+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (s *server) stats() (allocs uint64, free, total, running int) {
	s.t.Helper()
	st, err := s.node.Stats(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	return st.Pool.Allocations, st.Pool.FreePages + st.Pool.CachedPages, st.Pool.TotalPages, st.Core.Running + st.Core.Queued
}

// waitIdle waits until no request runs and every page is free or cached.
func (s *server) waitIdle() {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, free, total, running := s.stats()
		if running == 0 && free == total {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("not idle after 10s: %d requests, %d of %d pages free", running, free, total)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type completion struct {
	Choices []struct {
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// solo generates greedily with a private engine, as `pagewarden run` does.
func solo(t *testing.T, name, prompt string, n int) string {
	t.Helper()
	m, err := model.Load(model.BuiltinPrefix+name, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e, err := engine.New(m, engine.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ids := m.Tokenizer.Encode(prompt, true, false)
	var out []int
	_, _, err = e.Generate(context.Background(), request.Owner{Tenant: "solo", ID: request.NewID()}, ids, n, request.Sampling{}, func(tok int) error {
		out = append(out, tok)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return m.Tokenizer.Decode(out)
}

func TestGreedyThroughAPIEqualsRun(t *testing.T) {
	s := start(t, "tiny", node.Options{})
	prompts := []string{"Hello", "The quick brown fox", "a", strings.Repeat("pagewarden ", 30)}
	var wg sync.WaitGroup
	for i, p := range prompts {
		want := solo(t, "tiny", p, 24)
		key := keyA
		if i%2 == 1 {
			key = keyB
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, body := s.post(key, "/v1/completions", map[string]any{"prompt": p, "max_tokens": 24, "temperature": 0})
			if code != 200 {
				t.Errorf("prompt %q: status %d: %s", p, code, body)
				return
			}
			var c completion
			if err := json.Unmarshal(body, &c); err != nil {
				t.Error(err)
				return
			}
			if got := c.Choices[0].Text; got != want {
				t.Errorf("prompt %q: API %q, run %q", p, got, want)
			}
		}()
	}
	wg.Wait()
	s.waitIdle()
}

func TestBoundaryTableLeavesPoolUntouched(t *testing.T) {
	s := start(t, "tiny-short", node.Options{MaxContext: 256, KVMemory: 4 << 20})
	w := s.node.Limits().MaxContext
	prompt := strings.Repeat("x", 99) // 100 tokens with BOS in the byte-level vocabulary
	for _, tc := range []struct {
		total int
		ok    bool
	}{{w - 1, true}, {w, true}, {w + 1, false}, {2 * w, false}, {10 * w, false}} {
		allocs, _, _, _ := s.stats()
		code, body := s.post(keyA, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": tc.total - 100, "temperature": 0})
		if tc.ok != (code == 200) {
			t.Errorf("prompt 100 + max_tokens %d (W=%d): status %d: %s", tc.total-100, w, code, body)
		}
		if !tc.ok {
			if !strings.Contains(string(body), "context_length_exceeded") {
				t.Errorf("total %d: body lacks context_length_exceeded: %s", tc.total, body)
			}
			if after, _, _, _ := s.stats(); after != allocs {
				t.Errorf("total %d: a rejected request allocated %d pages", tc.total, after-allocs)
			}
		}
	}
	s.waitIdle()
}

func TestDisconnectFreesPages(t *testing.T) {
	s := start(t, "tiny", node.Options{})
	for i := 0; i < 5; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		b, _ := json.Marshal(map[string]any{"prompt": fmt.Sprintf("stream %d", i), "max_tokens": 1500, "stream": true})
		req, _ := http.NewRequestWithContext(ctx, "POST", s.ts.URL+"/v1/completions", bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+keyA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		r := bufio.NewReader(resp.Body)
		for lines := 0; lines < 2*(i+1); {
			line, err := r.ReadString('\n')
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(line, "data: ") {
				lines++
			}
		}
		cancel()
		resp.Body.Close()
	}
	s.waitIdle()
}

func TestCollectorExportsPoolCounters(t *testing.T) {
	s := start(t, "tiny", node.Options{})
	if code, body := s.post(keyA, "/v1/completions", map[string]any{"prompt": "count me", "max_tokens": 4}); code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	reg := prometheus.NewRegistry()
	if err := reg.Register(s.node.Collector()); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.Counter != nil {
				got[mf.GetName()] = m.Counter.GetValue()
			}
		}
	}
	if got["pagewarden_kv_page_allocations_total"] < 1 || got["pagewarden_sched_steps_total"] < 1 {
		t.Errorf("counters after one request: %v", got)
	}
	for _, name := range []string{"pagewarden_kv_quarantine_reaped_total", "pagewarden_kv_quarantine_scrubbed_total"} {
		if v, ok := got[name]; !ok || v != 0 {
			t.Errorf("%s = %v (exported %v), want an exported 0", name, v, ok)
		}
	}
	// promtool's checks over what a node process exports.
	for _, c := range append(gateway.PoolCollectors(s.node), gateway.ProcessCollectors()...) {
		if err := reg.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestQuarantineControls: the reap delay reaches the scheduler's
// configuration (a negative one is refused there), and the operator's
// scrub runs through the scheduler loop; with no violation it frees
// nothing.
func TestQuarantineControls(t *testing.T) {
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := node.Start(m, node.Options{QuarantineReapAfter: -time.Second}); !errors.Is(err, sched.ErrConfig) {
		if err == nil {
			n.Close()
		}
		t.Fatalf("negative reap delay: %v, want sched.ErrConfig", err)
	}
	m.Close()
	s := start(t, "tiny", node.Options{QuarantineReapAfter: time.Minute})
	if code, body := s.post(keyA, "/v1/completions", map[string]any{"prompt": "scrub me", "max_tokens": 4}); code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	k, err := s.node.ScrubQuarantined(context.Background())
	if err != nil || k != 0 {
		t.Fatalf("scrub with nothing quarantined: %d, %v", k, err)
	}
	st, err := s.node.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Core.Scrubbed != 0 || st.Core.Reaped != 0 || st.Pool.QuarantinedPages != 0 {
		t.Errorf("stats: %+v", st.Core)
	}
}
