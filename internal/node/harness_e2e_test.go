package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/engine"
	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/syncbuf"
)

// The end-to-end harness: a real node (engine, pool, scheduler) behind the
// real gateway on a loopback listener, driven over HTTP. The only thing
// between the gateway and the node is recorder, a pass-through that notes
// which requests were submitted and counts the tokens the node streamed, so
// that tests can compare what the client was told with what happened.

// e2eKey is the API key of end-to-end tenant id.
func e2eKey(id string) string { return "sk-e2e-tenant-" + id }

// API keys of the default end-to-end tenants "a" and "b".
var (
	e2eKeyA = e2eKey("a")
	e2eKeyB = e2eKey("b")
)

type e2eConfig struct {
	model   string // builtin model name; default "tiny"
	node    node.Options
	limits  map[string]tenants.Limits // by tenant id
	tenants []string                  // tenant ids; default "a", "b"
	now     func() time.Time          // the gateway's clock (quotas); default time.Now
	// direct serves the node itself, without the recorder between it
	// and the gateway (benchmarks); rec is then nil.
	direct bool
	// scrubAsGiven keeps node.Scrub (benchmarks: serve's zero fill);
	// otherwise released pages are poisoned with NaN.
	scrubAsGiven bool
	// submitted and abortAfter configure the recorder (see there).
	submitted  chan request.Owner
	abortAfter func(request.Params) int
	auditRate  float64 // gateway.Config.AuditRate
}

type e2eServer struct {
	t    testing.TB
	node *node.Node
	rec  *recorder
	srv  *gateway.Server
	ts   *httptest.Server
	url  string
	logs *syncbuf.Buffer
}

// startE2E serves cfg.model through the real node and gateway. Tenant
// limits reach the scheduler the way `pagewarden serve` wires them.
func startE2E(t testing.TB, cfg e2eConfig) *e2eServer {
	t.Helper()
	if cfg.model == "" {
		cfg.model = "tiny"
	}
	if len(cfg.tenants) == 0 {
		cfg.tenants = []string{"a", "b"}
	}
	tc := &tenants.Config{}
	for _, id := range cfg.tenants {
		tc.Tenants = append(tc.Tenants, tenants.Tenant{ID: id, APIKeySHA256: []string{tenants.HashKey(e2eKey(id))}, Limits: cfg.limits[id]})
	}
	o := cfg.node
	if o.Threads == 0 {
		o.Threads = 2
	}
	if !cfg.scrubAsGiven {
		// NaN in released pages: a read of a freed page would poison
		// the output and fail the greedy comparisons loudly.
		o.Scrub = kvcache.ScrubPoison
	}
	o.Policy = func(tn request.Tenant) sched.TenantPolicy {
		l := cfg.limits[string(tn)]
		return sched.TenantPolicy{MaxPages: l.MaxKVPages, MaxRunning: l.MaxConcurrent, Priority: l.Priority}
	}
	m, err := model.Load(model.BuiltinPrefix+cfg.model, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(m, o)
	if err != nil {
		m.Close()
		t.Fatal(err)
	}
	var rec *recorder
	var backend gateway.Backend = n
	if !cfg.direct {
		rec = &recorder{Node: n, streamed: map[request.Owner]*atomic.Int64{}, submitted: cfg.submitted, abortAfter: cfg.abortAfter}
		backend = rec
	}
	logs := &syncbuf.Buffer{}
	srv, err := gateway.New(gateway.Config{Backend: backend, Tenants: tc, Now: cfg.now, AuditRate: cfg.auditRate,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	if err != nil {
		n.Close()
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	s := &e2eServer{t: t, node: n, rec: rec, srv: srv, ts: ts, url: ts.URL, logs: logs}
	t.Cleanup(func() {
		ts.Close()
		if err := n.Close(); err != nil {
			t.Errorf("node close: %v", err)
		}
	})
	return s
}

// recorder passes every call through to the real node. It records the
// owner of every submitted request (sent on submitted when set) and counts
// the tokens the node delivered for it.
type recorder struct {
	*node.Node
	// submitted, when set, receives the owner of each submitted request
	// it has room for; it never blocks the gateway.
	submitted chan request.Owner
	// abortAfter, when set, returns k > 0 for requests the node is to
	// abort (through Node.Abort, as an operator would) once k tokens
	// were delivered: a failure after the first byte of a response. Such
	// a request is submitted with max_tokens raised to the whole window,
	// so that it cannot finish before the abort lands however loaded the
	// machine is.
	abortAfter func(request.Params) int

	mu       sync.Mutex
	owners   []request.Owner
	streamed map[request.Owner]*atomic.Int64
}

var (
	_ gateway.Backend     = (*recorder)(nil)
	_ gateway.StatsSource = (*recorder)(nil)
)

func (r *recorder) Submit(ctx context.Context, p request.Params) (gateway.Stream, error) {
	abortAt := 0
	if r.abortAfter != nil {
		if abortAt = r.abortAfter(p); abortAt > 0 {
			p.MaxTokens = r.Node.Limits().MaxContext - len(p.Prompt)
		}
	}
	st, err := r.Node.Submit(ctx, p)
	if err != nil {
		return nil, err
	}
	n := &atomic.Int64{}
	r.mu.Lock()
	r.owners = append(r.owners, p.Owner)
	r.streamed[p.Owner] = n
	r.mu.Unlock()
	if r.submitted != nil {
		select {
		case r.submitted <- p.Owner:
		default:
		}
	}
	cs := &countingStream{Stream: st, n: n, abortAt: abortAt}
	if abortAt > 0 {
		cs.abort = func() { _ = r.Node.Abort(p.Owner.Tenant, p.Owner.ID) }
	}
	return cs, nil
}

// streamedTokens is how many tokens the node delivered for the request
// with the given id string (X-Request-Id), and whether it was submitted.
func (r *recorder) streamedTokens(id string) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for o, n := range r.streamed {
		if o.ID.String() == id {
			return int(n.Load()), true
		}
	}
	return 0, false
}

func (r *recorder) submits() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.owners)
}

// countingStream forwards the node's tokens and counts them. The gateway
// always drains Tokens to its end, so the forwarding goroutine ends too.
type countingStream struct {
	gateway.Stream
	n       *atomic.Int64
	abortAt int    // abort after this many tokens, if > 0
	abort   func() // called once, asynchronously, at abortAt
	once    sync.Once
	out     chan request.Token
}

func (c *countingStream) Tokens() <-chan request.Token {
	c.once.Do(func() {
		in := c.Stream.Tokens()
		c.out = make(chan request.Token)
		go func() {
			defer close(c.out)
			for tok := range in {
				if c.n.Add(1) == int64(c.abortAt) {
					go c.abort()
				}
				c.out <- tok
			}
		}()
	})
	return c.out
}

// post sends a JSON body and returns the status, the headers and the body.
func (s *e2eServer) post(key, path string, body any) (int, http.Header, []byte) {
	s.t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		s.t.Fatal(err)
	}
	req, err := http.NewRequest("POST", s.url+path, bytes.NewReader(b))
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		s.t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, out
}

// postOK is post that requires 200 and decodes the body into v.
func (s *e2eServer) postOK(key, path string, body, v any) http.Header {
	s.t.Helper()
	code, h, out := s.post(key, path, body)
	if code != http.StatusOK {
		s.t.Fatalf("POST %s: status %d: %s", path, code, out)
	}
	if err := json.Unmarshal(out, v); err != nil {
		s.t.Fatalf("POST %s: %v in %s", path, err, out)
	}
	return h
}

// sseStream is a parsed server-sent event stream.
type sseStream struct {
	status int
	header http.Header
	events []json.RawMessage // data payloads before [DONE], in order
	done   bool              // ended with data: [DONE]
	errEv  *apiErr           // an error event (then done is false)
}

type apiErr struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// stream posts a streaming request and reads the whole event stream.
func (s *e2eServer) stream(key, path string, body map[string]any) sseStream {
	s.t.Helper()
	body["stream"] = true
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", s.url+path, bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	out := sseStream{status: resp.StatusCode, header: resp.Header}
	if resp.StatusCode != http.StatusOK {
		return out
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			out.done = true
			continue
		}
		if out.done {
			s.t.Errorf("event after [DONE]: %s", data)
		}
		var e apiErr
		if json.Unmarshal([]byte(data), &e) == nil && e.Error.Message != "" {
			out.errEv = &e
			continue
		}
		out.events = append(out.events, json.RawMessage(data))
	}
	if err := sc.Err(); err != nil {
		s.t.Fatalf("reading stream: %v", err)
	}
	return out
}

// stats is one snapshot of the node.
func (s *e2eServer) stats() sched.NodeStats {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := s.node.Stats(ctx)
	if err != nil {
		s.t.Fatal(err)
	}
	return st
}

// waitAllFree polls until no request is queued or running and every page
// is free or an unreferenced prefix-cache page, and checks the
// must-be-zero counters.
func (s *e2eServer) waitAllFree() sched.NodeStats {
	s.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		st := s.stats()
		p := st.Pool
		if st.Core.Running == 0 && st.Core.Queued == 0 && p.FreePages+p.CachedPages == p.TotalPages && p.Sequences == 0 {
			if p.Violations != 0 || p.QuarantinedPages != 0 || st.Core.AbortedButCompleted != 0 {
				s.t.Errorf("must-be-zero counters: violations %d, quarantined %d, aborted-but-completed %d",
					p.Violations, p.QuarantinedPages, st.Core.AbortedButCompleted)
			}
			return st
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("pages not returned after 15s: running %d queued %d sequences %d; %d free + %d cached of %d",
				st.Core.Running, st.Core.Queued, p.Sequences, p.FreePages, p.CachedPages, p.TotalPages)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// requestCounts reads pagewarden_requests_total as status -> count for one
// tenant and endpoint.
func (s *e2eServer) requestCounts(tenant, endpoint string) map[string]int {
	s.t.Helper()
	mfs, err := s.srv.Metrics().Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	out := map[string]int{}
	for _, mf := range mfs {
		if mf.GetName() != "pagewarden_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["tenant"] == tenant && l["endpoint"] == endpoint {
				out[l["status"]] += int(m.GetCounter().GetValue())
			}
		}
	}
	return out
}

// metricValue sums a counter or gauge over all its label sets.
func (s *e2eServer) metricValue(name string) float64 {
	s.t.Helper()
	mfs, err := s.srv.Metrics().Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				v += m.Counter.GetValue()
			case m.Gauge != nil:
				v += m.Gauge.GetValue()
			}
		}
	}
	return v
}

// checkMustBeZero fails the test if a must-be-zero metric moved.
func (s *e2eServer) checkMustBeZero() {
	s.t.Helper()
	for _, name := range []string{
		"pagewarden_response_owner_mismatch_total",
		"pagewarden_gateway_inconsistent_results_total",
		"pagewarden_gateway_stream_contract_violations_total",
		"pagewarden_isolation_violations_total",
		"pagewarden_aborted_but_completed_total",
		"pagewarden_audit_mismatches_total",
	} {
		if v := s.metricValue(name); v != 0 {
			s.t.Errorf("%s = %v, want 0", name, v)
		}
	}
}

// greedy generates with a private engine on the same builtin model: the
// reference for what the served node must produce.
func greedy(t *testing.T, name string, prompt []int, n int) []int {
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
	var out []int
	_, _, err = e.Generate(context.Background(), request.Owner{Tenant: "reference", ID: request.NewID()}, prompt, n, request.Sampling{},
		func(tok int) error {
			out = append(out, tok)
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// Response shapes.

type usageBody struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u usageBody) cached() int {
	if u.PromptTokensDetails == nil {
		return -1
	}
	return u.PromptTokensDetails.CachedTokens
}

type completionBody struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageBody `json:"usage"`
}

type chatBody struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usageBody `json:"usage"`
}

// completionStream folds a /v1/completions event stream into its text,
// finish reason, usage and number of text-carrying chunks.
func completionStream(t *testing.T, st sseStream) (text, finish string, usage *usageBody, chunks int) {
	t.Helper()
	for _, ev := range st.events {
		var c completionBody
		if err := json.Unmarshal(ev, &c); err != nil {
			t.Fatalf("chunk %s: %v", ev, err)
		}
		if c.Object != "text_completion" {
			t.Errorf("chunk object %q", c.Object)
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		for _, ch := range c.Choices {
			if ch.Text != "" {
				chunks++
				text += ch.Text
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return text, finish, usage, chunks
}

// chatStream folds a chat event stream the same way; role is the role of
// the first chunk.
func chatStream(t *testing.T, st sseStream) (role, text, finish string, usage *usageBody, chunks int) {
	t.Helper()
	for i, ev := range st.events {
		var c chatBody
		if err := json.Unmarshal(ev, &c); err != nil {
			t.Fatalf("chunk %s: %v", ev, err)
		}
		if c.Object != "chat.completion.chunk" {
			t.Errorf("chunk object %q", c.Object)
		}
		if c.Usage != nil {
			usage = c.Usage
		}
		for _, ch := range c.Choices {
			if i == 0 {
				role = ch.Delta.Role
			}
			if ch.Delta.Content != nil && *ch.Delta.Content != "" {
				chunks++
				text += *ch.Delta.Content
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
	}
	return role, text, finish, usage, chunks
}
