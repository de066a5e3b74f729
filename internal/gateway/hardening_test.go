package gateway_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// A max_tokens near the integer limit must be a definite 400 that names
// max_tokens and must not touch the tenant's quota: prompt+max_tokens used
// to wrap negative and refill the tokens-per-minute bucket.
func TestMaxTokensOverflowKeepsQuota(t *testing.T) {
	h := newHarness(t, nil, func(c *gateway.Config) {
		c.Tenants = testTenants(tenants.Limits{}, tenants.Limits{TokensPerMinute: 100})
	})
	body := func(mt any) map[string]any { return map[string]any{"prompt": "x", "max_tokens": mt} }
	if r := h.post("/v1/completions", keyBeta, body(90)); r.status != 200 {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	if r := h.post("/v1/completions", keyBeta, body(90)); r.status != 429 {
		t.Fatalf("second: %d %s", r.status, r.body)
	}
	for _, huge := range []any{uint64(1<<63 - 1), uint64(1<<63 - 2), 1 << 62, 1 << 40, 1 << 31} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			b := body(huge)
			if path == "/v1/chat/completions" {
				b = chatBody(map[string]any{"max_tokens": huge})
			}
			r := h.post(path, keyBeta, b)
			if r.status != 400 {
				t.Fatalf("%s max_tokens=%v: %d %s", path, huge, r.status, r.body)
			}
			if got := errorParam(t, r.body); got != "max_tokens" {
				t.Errorf("%s max_tokens=%v: param %q, want max_tokens (%s)", path, huge, got, r.body)
			}
		}
	}
	if r := h.post("/v1/completions", keyBeta, body(90)); r.status != 429 {
		t.Fatalf("after the huge max_tokens the bucket was refilled: %d %s", r.status, r.body)
	}
}

// Unseeded requests each draw a fresh seed, reported in X-Seed; a seeded
// one uses its own and reports it unchanged.
func TestUnseededRequestsDrawFreshSeeds(t *testing.T) {
	h := newHarness(t, nil)
	seeds := map[uint64]bool{}
	for i, key := range []string{keyAlpha, keyBeta, keyAlpha, keyBeta} {
		r := h.post("/v1/completions", key, map[string]any{"prompt": "x", "max_tokens": 3, "temperature": 1})
		if r.status != 200 {
			t.Fatalf("%d: %s", r.status, r.body)
		}
		got := h.fake.LastParams().Sampling.Seed
		if seeds[got] {
			t.Fatalf("request %d reused seed %d", i, got)
		}
		seeds[got] = true
		if hdr := r.header.Get("X-Seed"); hdr != strconv.FormatUint(got, 10) {
			t.Errorf("X-Seed %q, submitted seed %d", hdr, got)
		}
	}
	r := h.post("/v1/chat/completions", keyAlpha, chatBody(map[string]any{"seed": -7, "temperature": 1}))
	if r.status != 200 || h.fake.LastParams().Sampling.Seed != uint64(1<<64-7) || r.header.Get("X-Seed") != "-7" {
		t.Fatalf("seeded: %d seed %d X-Seed %q", r.status, h.fake.LastParams().Sampling.Seed, r.header.Get("X-Seed"))
	}
}

// A token whose index is not the next one expected (lost, reordered or
// duplicated in the backend) fails the request: its text is never
// written, and no 200 or [DONE] is sent.
func TestTokenIndexChecked(t *testing.T) {
	for _, tc := range []struct {
		name   string
		fault  gatewaytest.Fault
		at     int
		stream bool
	}{
		{"gap non-stream", gatewaytest.FaultTokenIndex, 3, false},
		{"gap first token stream", gatewaytest.FaultTokenIndex, 0, true},
		{"gap later stream", gatewaytest.FaultTokenIndex, 3, true},
		{"repeat non-stream", gatewaytest.FaultRepeatIndex, 3, false},
		{"repeat stream", gatewaytest.FaultRepeatIndex, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := gatewaytest.NewFake()
			fake.Behave = func(request.Params) gatewaytest.Behavior {
				return gatewaytest.Behavior{Reply: "abcdefgh", Fault: tc.fault, At: tc.at}
			}
			h := newHarness(t, fake)
			r := h.post("/v1/completions", keyAlpha, map[string]any{"prompt": "p", "stream": tc.stream})
			if tc.stream && r.status == 200 {
				s := summarize(t, r.body)
				if s.done || s.errObj == nil || s.errObj["type"] != "server_error" {
					t.Errorf("stream %+v", s)
				}
				if s.text != "abcdefgh"[:tc.at] {
					t.Errorf("streamed %q, want only the %d tokens before the bad one", s.text, tc.at)
				}
			} else if r.status != 500 {
				t.Errorf("status %d: %s", r.status, r.body)
			}
			eventually(t, "pages returned", func() bool { return h.fake.PagesUsed() == 0 })
		})
	}
}

// A known path with the wrong method is 405 with Allow, not 404.
func TestWrongMethod(t *testing.T) {
	h := newHarness(t, nil)
	for _, tc := range []struct{ method, path, allow string }{
		{"GET", "/v1/chat/completions", "POST"},
		{"PUT", "/v1/completions", "POST"},
		{"POST", "/v1/models", "GET"},
		{"GET", "/tokenize", "POST"},
	} {
		r := h.do(context.Background(), tc.method, tc.path, keyAlpha, nil)
		if r.status != 405 || r.header.Get("Allow") != tc.allow || errorCode(t, r.body) != "method_not_allowed" {
			t.Errorf("%s %s: %d Allow=%q %s", tc.method, tc.path, r.status, r.header.Get("Allow"), r.body)
		}
	}
	if r := h.do(context.Background(), "GET", "/v1/nothing", keyAlpha, nil); r.status != 404 {
		t.Errorf("unknown path: %d", r.status)
	}
}

// context_length_exceeded names the field the prompt came from.
func TestContextLengthParam(t *testing.T) {
	h := newHarness(t, nil)
	w := h.fake.Window
	for _, tc := range []struct {
		path  string
		body  any
		param string
	}{
		{"/v1/completions", map[string]any{"prompt": idsPrompt(w)}, "prompt"},
		{"/v1/completions", map[string]any{"prompt": idsPrompt(w / 2), "max_tokens": w/2 + 1}, "prompt"},
		{"/v1/completions", map[string]any{"prompt": idsPrompt(2), "max_tokens": w + 1}, "max_tokens"},
		{"/v1/chat/completions", chatBody(map[string]any{"max_tokens": w - 1}), "messages"},
		{"/v1/chat/completions", chatBody(map[string]any{"max_completion_tokens": w + 5}), "max_completion_tokens"},
	} {
		r := h.post(tc.path, keyAlpha, tc.body)
		if r.status != 400 || errorCode(t, r.body) != "context_length_exceeded" || errorParam(t, r.body) != tc.param {
			t.Errorf("%s %v: %d %s, want param %s", tc.path, tc.body, r.status, r.body, tc.param)
		}
	}
}

// requestsWithStatus sums pagewarden_requests_total over the labels given.
func requestsWithStatus(t *testing.T, h *harness, endpoint, status string) float64 {
	t.Helper()
	mfs, err := h.srv.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "pagewarden_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["endpoint"] == endpoint && labels["status"] == status {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}

// A client that hangs up in the middle of its body is logged and counted
// as 499 (client closed), not as a 400 of ours.
func TestDisconnectMidBodyIs499(t *testing.T) {
	h := newHarness(t, nil)
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.ts.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\": \"abc", keyAlpha)
	conn.Close()
	eventually(t, "the request counted as 499", func() bool { return requestsWithStatus(t, h, "completions", "499") == 1 })
	if n := requestsWithStatus(t, h, "completions", "400"); n != 0 {
		t.Errorf("%v requests counted as 400", n)
	}
}

// Shedding load is a warning, not an error: an operator alerts on the 503
// rate, and an ERROR line per refused request would drown real failures.
func TestOverloadLoggedAsWarning(t *testing.T) {
	fake := gatewaytest.NewFake()
	fake.Behave = func(request.Params) gatewaytest.Behavior {
		return gatewaytest.Behavior{SubmitErr: request.ErrOverloaded}
	}
	h := newHarness(t, fake)
	r := h.post("/v1/completions", keyAlpha, map[string]any{"prompt": "x"})
	if r.status != 503 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	logs := h.logs.String()
	if !strings.Contains(logs, `"level":"WARN"`) || strings.Contains(logs, `"level":"ERROR"`) {
		t.Errorf("overload log: %s", logs)
	}
}

// /tokenize and /detokenize count against the tenant's quota: requests
// per minute, and tokens per minute charged by body size, refunded to the
// tokens produced.
func TestTokenizeUnderQuota(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	h := newHarness(t, nil, func(c *gateway.Config) {
		c.Tenants = testTenants(tenants.Limits{RequestsPerMinute: 2}, tenants.Limits{TokensPerMinute: 1000})
		c.Now = clock.Now
	})
	for i := range 2 {
		if r := h.post("/tokenize", keyAlpha, map[string]any{"prompt": "abc"}); r.status != 200 {
			t.Fatalf("tokenize %d: %d %s", i, r.status, r.body)
		}
	}
	if r := h.post("/detokenize", keyAlpha, map[string]any{"tokens": []int{5}}); r.status != 429 {
		t.Fatalf("detokenize over requests_per_minute: %d %s", r.status, r.body)
	}
	// A small body is charged its bytes, then refunded down to its tokens:
	// many fit in the budget.
	for i := range 20 {
		if r := h.post("/tokenize", keyBeta, map[string]any{"prompt": strings.Repeat("a", 30)}); r.status != 200 {
			t.Fatalf("small tokenize %d: %d %s", i, r.status, r.body)
		}
	}
	// A body larger than the whole budget is let through alone (as a
	// generation request is) and drains the bucket.
	big := map[string]any{"prompt": strings.Repeat("a", 1500)}
	clock.Advance(2 * time.Minute)
	if r := h.post("/tokenize", keyBeta, big); r.status != 200 {
		t.Fatalf("big tokenize: %d", r.status)
	}
	if r := h.post("/tokenize", keyBeta, big); r.status != 429 {
		t.Fatalf("tokenize over tokens_per_minute: %d", r.status)
	}
	clock.Advance(2 * time.Minute)
	if r := h.post("/tokenize", keyBeta, big); r.status != 200 {
		t.Fatalf("after the bucket refilled: %d", r.status)
	}
}

// A registry shared with the scheduler is the one the gateway admits
// under and reloads: one Reload, one generation, both sides.
func TestSharedRegistry(t *testing.T) {
	cfg := testTenants(tenants.Limits{}, tenants.Limits{})
	reg, err := tenants.NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gateway.New(gateway.Config{Backend: gatewaytest.NewFake(), Tenants: cfg, Registry: reg}); err == nil {
		t.Fatal("New took both Tenants and Registry")
	}
	h := newHarness(t, nil, func(c *gateway.Config) { c.Tenants, c.Registry = nil, reg })
	gen := reg.Generation()
	if r := h.post("/v1/completions", keyBeta, map[string]any{"prompt": "x", "max_tokens": 3}); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if err := h.srv.Reload(testTenants(tenants.Limits{}, tenants.Limits{MaxKVPages: 1})); err != nil {
		t.Fatal(err)
	}
	if reg.Generation() == gen {
		t.Fatal("the gateway's reload did not reach the shared registry")
	}
	if tn, _ := reg.Tenant("beta"); tn.Limits.MaxKVPages != 1 {
		t.Fatalf("shared registry has %+v", tn.Limits)
	}
}

// TestRefusalsLoggedWithTheirCode: a 4xx line says why, with the code the
// client was sent.
func TestRefusalsLoggedWithTheirCode(t *testing.T) {
	h := newHarness(t, nil)
	if r := h.post("/v1/completions", keyAlpha, map[string]any{"prompt": idsPrompt(h.fake.Window)}); r.status != 400 {
		t.Fatalf("%d", r.status)
	}
	if r := h.post("/v1/completions", "sk-wrong", map[string]any{"prompt": "x"}); r.status != 401 {
		t.Fatalf("%d", r.status)
	}
	logs := h.logs.String()
	for _, want := range []string{`"status":400`, `"code":"context_length_exceeded"`, `"status":401`, `"code":"invalid_api_key"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
}
