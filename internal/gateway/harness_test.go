package gateway_test

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
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/syncbuf"
)

// Keys of the test tenants.
const (
	keyAlpha = "sk-alpha-test-key"
	keyBeta  = "sk-beta-test-key"
)

func testTenants(alpha, beta tenants.Limits) *tenants.Config {
	return &tenants.Config{Tenants: []tenants.Tenant{
		{ID: "alpha", APIKeySHA256: []string{tenants.HashKey(keyAlpha)}, Limits: alpha},
		{ID: "beta", APIKeySHA256: []string{tenants.HashKey(keyBeta)}, Limits: beta},
	}}
}

// fakeClock is a settable clock for quota tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type harness struct {
	t    *testing.T
	fake *gatewaytest.Fake
	srv  *gateway.Server
	ts   *httptest.Server
	logs *syncbuf.Buffer
}

type harnessOpt func(*gateway.Config)

// newHarness starts a Server with the fake backend on a real loopback
// listener.
func newHarness(t *testing.T, fake *gatewaytest.Fake, opts ...harnessOpt) *harness {
	t.Helper()
	if fake == nil {
		fake = gatewaytest.NewFake()
	}
	logs := &syncbuf.Buffer{}
	cfg := gateway.Config{
		Backend: fake,
		Tenants: testTenants(tenants.Limits{}, tenants.Limits{}),
		Logger:  slog.New(slog.NewJSONHandler(logs, nil)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := gateway.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return &harness{t: t, fake: fake, srv: srv, ts: ts, logs: logs}
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (h *harness) do(ctx context.Context, method, path, key string, body any) response {
	h.t.Helper()
	r, err := h.try(ctx, method, path, key, body)
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

// try is do for use off the test goroutine: it returns errors.
func (h *harness) try(ctx context.Context, method, path, key string, body any) (response, error) {
	resp, err := h.open(ctx, method, path, key, body)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: data}, err
}

// open sends a request and returns the response unread, for a test that
// reads a stream as it comes.
func (h *harness) open(ctx context.Context, method, path, key string, body any) (*http.Response, error) {
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, h.ts.URL+path, r)
	if err != nil {
		return nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	return h.ts.Client().Do(req)
}

func (h *harness) post(path, key string, body any) response {
	h.t.Helper()
	return h.do(context.Background(), http.MethodPost, path, key, body)
}

// sseEvents splits an SSE body into its data payloads.
func sseEvents(t *testing.T, body []byte) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, rest)
		} else if line != "" {
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	return out
}

// streamText concatenates the text of chat or completion chunks and
// returns the last finish_reason and usage seen, and whether [DONE] ended
// the stream.
type streamSummary struct {
	text   string
	finish string
	usage  map[string]any
	done   bool
	errObj map[string]any
}

func summarize(t *testing.T, body []byte) streamSummary {
	t.Helper()
	var s streamSummary
	events := sseEvents(t, body)
	for i, e := range events {
		if e == "[DONE]" {
			if i != len(events)-1 {
				t.Fatalf("[DONE] is not the last event: %q", events)
			}
			s.done = true
			continue
		}
		var ch struct {
			Choices []struct {
				Text  *string `json:"text"`
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage map[string]any `json:"usage"`
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal([]byte(e), &ch); err != nil {
			t.Fatalf("event %q: %v", e, err)
		}
		if ch.Error != nil {
			s.errObj = ch.Error
			if i != len(events)-1 {
				t.Fatalf("error event is not the last event: %q", events)
			}
		}
		for _, c := range ch.Choices {
			if c.Text != nil {
				s.text += *c.Text
			}
			if c.Delta.Content != nil {
				s.text += *c.Delta.Content
			}
			if c.FinishReason != nil {
				s.finish = *c.FinishReason
			}
		}
		if ch.Usage != nil {
			s.usage = ch.Usage
		}
	}
	return s
}

func decodeBody(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return m
}

// errorCode returns error.code of an OpenAI error body ("" for null).
func errorCode(t *testing.T, b []byte) string {
	t.Helper()
	m := decodeBody(t, b)
	e, ok := m["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error object in %q", b)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e[k]; !ok {
			t.Fatalf("error body %q lacks %q", b, k)
		}
	}
	c, _ := e["code"].(string)
	return c
}

// eventually polls cond until it holds or a generous bound passes; the
// bound is a failure detector, not a timing assertion.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func chatBody(extra map[string]any) map[string]any {
	b := map[string]any{
		"model":    "fake-model",
		"messages": []any{map[string]any{"role": "user", "content": "Hi"}},
	}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// idsPrompt is a completions prompt of n token ids (byte 'a').
func idsPrompt(n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = 3 + 'a'
	}
	return ids
}

// errorParam returns the param of an OpenAI error body ("" for null).
func errorParam(t *testing.T, b []byte) string {
	t.Helper()
	errorCode(t, b)
	p, _ := decodeBody(t, b)["error"].(map[string]any)["param"].(string)
	return p
}
