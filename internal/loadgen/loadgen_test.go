package loadgen_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/loadgen"
	"github.com/pagewarden/pagewarden/internal/request"
)

const (
	keyFree    = "sk-loadgen-free"
	keyLimited = "sk-loadgen-limited"
)

// gatewayServer serves the fake backend through the real gateway: tenant
// "free" is unlimited, "limited" may send rpm requests a minute.
func gatewayServer(t *testing.T, fake *gatewaytest.Fake, rpm int) *httptest.Server {
	t.Helper()
	cfg := &tenants.Config{Tenants: []tenants.Tenant{
		{ID: "free", APIKeySHA256: []string{tenants.HashKey(keyFree)}},
		{ID: "limited", APIKeySHA256: []string{tenants.HashKey(keyLimited)}, Limits: tenants.Limits{RequestsPerMinute: rpm}},
	}}
	srv, err := gateway.New(gateway.Config{Backend: fake, Tenants: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return ts
}

// TestRunAgainstGateway drives the gateway (fake backend) from two
// tenants, one of which runs into its request quota, and checks every
// count in the report against what the server did.
func TestRunAgainstGateway(t *testing.T) {
	const delay = 2 * time.Millisecond
	fake := gatewaytest.NewFake()
	fake.Behave = func(request.Params) gatewaytest.Behavior { return gatewaytest.Behavior{Delay: delay} }
	ts := gatewayServer(t, fake, 5)
	for _, ep := range []loadgen.Endpoint{loadgen.Completions, loadgen.Chat} {
		t.Run(string(ep), func(t *testing.T) {
			before := fake.Submits()
			r, err := loadgen.Run(context.Background(), loadgen.Config{
				BaseURL: ts.URL + "/v1/", Keys: []string{keyFree, keyLimited}, Endpoint: ep,
				Concurrency: 4, Requests: 20, MaxTokens: 64, PromptTokens: 40,
			})
			if err != nil {
				t.Fatal(err)
			}
			// The limited tenant's bucket holds 5 requests and is shared
			// by both subtests, so the second gets none.
			wantLimitedOK := 5
			if ep == loadgen.Chat {
				wantLimitedOK = 0
			}
			reply := len(gatewaytest.DefaultReply) // one token a byte, then EOS
			got := struct {
				Requests, Succeeded, Submits int
				Errors                       map[string]int
				Free, Limited                int
			}{r.Requests, r.Succeeded, fake.Submits() - before, r.Errors, r.Tenants[0].Succeeded, r.Tenants[1].Succeeded}
			want := struct {
				Requests, Succeeded, Submits int
				Errors                       map[string]int
				Free, Limited                int
			}{20, 10 + wantLimitedOK, 10 + wantLimitedOK, map[string]int{"429": 10 - wantLimitedOK}, 10, wantLimitedOK}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("report (-want +got):\n%s", d)
			}
			if !r.PromptCalibrated {
				t.Error("prompt not calibrated through /tokenize")
			}
			if r.OutputTokens < r.Succeeded*reply || r.OutputTokens > r.Succeeded*(reply+1) {
				t.Errorf("%d output tokens for %d requests of a %d-token reply", r.OutputTokens, r.Succeeded, reply)
			}
			// Chat prompts carry the chat template's tokens as well.
			if ep == loadgen.Completions && (r.PromptTokens < r.Succeeded*30 || r.PromptTokens > r.Succeeded*60) {
				t.Errorf("%d prompt tokens for %d requests of about 40", r.PromptTokens, r.Succeeded)
			}
			// The fake waits delay before every token: no gap and no
			// first token can be faster.
			if r.TTFT.N != r.Succeeded || r.TTFT.P50 < delay || r.ITL.N == 0 || r.ITL.P50 < delay/2 {
				t.Errorf("ttft %+v, itl %+v; want every request measured, at least %v", r.TTFT, r.ITL, delay)
			}
			if r.Latency.N != r.Succeeded || r.Latency.P50 < r.TTFT.P50 || r.Latency.Max < r.TTFT.Max {
				t.Errorf("latency %+v shorter than ttft %+v", r.Latency, r.TTFT)
			}
			if r.RequestsPerSec <= 0 || r.OutputTokensPerSec <= 0 {
				t.Errorf("throughput %v req/s %v tok/s", r.RequestsPerSec, r.OutputTokensPerSec)
			}
			var sb strings.Builder
			if err := r.Write(&sb); err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{"20 sent", "ttft", "inter-token", "tenant 2"} {
				if !strings.Contains(sb.String(), want) {
					t.Errorf("report text lacks %q:\n%s", want, sb.String())
				}
			}
		})
	}
}

// TestRunClassifiesFailures checks each way a request can fail is counted
// under its own key.
func TestRunClassifiesFailures(t *testing.T) {
	okEvent := `data: {"choices":[{"text":"hi"}]}` + "\n\n"
	usage := `data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}` + "\n\n"
	cases := []struct {
		name    string
		handler http.HandlerFunc
		timeout time.Duration
		fail    string
		tokens  int
	}{
		{"done", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, okEvent+okEvent+usage+"data: [DONE]\n\n")
		}, 0, "", 7},
		{"done without usage counts events", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, ": comment\n\n"+okEvent+"event: x\r\n"+okEvent+okEvent+"data:[DONE]\n\n")
		}, 0, "", 3},
		{"status", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}, 0, "503", 0},
		{"error event", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, okEvent+`data: {"error":{"message":"boom","type":"server_error"}}`+"\n\n")
		}, 0, loadgen.FailStreamError, 1},
		{"truncated", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, okEvent+okEvent)
		}, 0, loadgen.FailTruncated, 2},
		{"malformed", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, okEvent+"data: {not json\n\n")
		}, 0, loadgen.FailMalformed, 1},
		{"line too long", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "data: "+strings.Repeat("x", 2<<20)+"\n\n")
		}, 0, loadgen.FailMalformed, 0},
		{"timeout", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, okEvent)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, 50 * time.Millisecond, loadgen.FailTimeout, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := httptest.NewServer(tc.handler)
			defer ts.Close()
			r, err := loadgen.Run(context.Background(), loadgen.Config{
				BaseURL: ts.URL, Keys: []string{"k"}, Requests: 1, Concurrency: 1, RequestTimeout: tc.timeout,
			})
			if err != nil {
				t.Fatal(err)
			}
			s := r.Samples[0]
			if s.Failure != tc.fail || s.OutputTokens != tc.tokens {
				t.Errorf("failure %q with %d tokens, want %q with %d", s.Failure, s.OutputTokens, tc.fail, tc.tokens)
			}
			if tc.fail != "" && r.Errors[tc.fail] != 1 {
				t.Errorf("errors %v", r.Errors)
			}
			if r.PromptCalibrated {
				t.Error("calibrated against a server without /tokenize")
			}
		})
	}
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		r, err := loadgen.Run(context.Background(), loadgen.Config{BaseURL: "http://" + addr, Keys: []string{"k"}, Requests: 3, Concurrency: 2})
		if err != nil {
			t.Fatal(err)
		}
		if r.Errors[loadgen.FailTransport] != 3 || r.Succeeded != 0 {
			t.Errorf("errors %v, succeeded %d", r.Errors, r.Succeeded)
		}
	})
}

// TestRunSizesPromptsAndSpreadsTenants checks the request bodies: prompts
// sized from the /tokenize answer, all different, keys used round-robin,
// and the requested parameters sent.
func TestRunSizesPromptsAndSpreadsTenants(t *testing.T) {
	var mu sync.Mutex
	prompts := map[string]string{}
	perKey := map[string]int{}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		if r.URL.Path == "/tokenize" {
			// Two characters a token.
			fmt.Fprintf(w, `{"count":%d}`, len(body["prompt"].(string))/2)
			return
		}
		if r.URL.Path != "/v1/completions" || body["max_tokens"] != 16.0 || body["stream"] != true || body["model"] != "m" {
			http.Error(w, "unexpected request", 400)
			return
		}
		mu.Lock()
		p := body["prompt"].(string)
		prompts[p] = r.Header.Get("Authorization")
		perKey[r.Header.Get("Authorization")]++
		mu.Unlock()
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer ts.Close()
	r, err := loadgen.Run(context.Background(), loadgen.Config{
		BaseURL: ts.URL, Keys: []string{"k1", "k2", "k3"}, Requests: 30, Concurrency: 5,
		MaxTokens: 16, PromptTokens: 100, Model: "m",
	})
	if err != nil {
		t.Fatal(err)
	}
	if r.Succeeded != 30 || !r.PromptCalibrated {
		t.Fatalf("succeeded %d, calibrated %v, errors %v", r.Succeeded, r.PromptCalibrated, r.Errors)
	}
	if len(prompts) != 30 {
		t.Errorf("%d distinct prompts for 30 requests", len(prompts))
	}
	for p := range prompts {
		if len(p) != 200 {
			t.Errorf("prompt of %d characters, want 200 (100 tokens at 2 characters each)", len(p))
			break
		}
	}
	if d := cmp.Diff(map[string]int{"Bearer k1": 10, "Bearer k2": 10, "Bearer k3": 10}, perKey); d != "" {
		t.Errorf("requests per key (-want +got):\n%s", d)
	}
}

// TestRunStopsWhenCancelled checks that a cancelled run stops sending and
// reports what it measured with the context's error.
func TestRunStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	n := 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		if n == 3 {
			cancel()
		}
		mu.Unlock()
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer ts.Close()
	r, err := loadgen.Run(ctx, loadgen.Config{BaseURL: ts.URL, Keys: []string{"k"}, Requests: 1000, Concurrency: 1})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v, want context.Canceled", err)
	}
	if r == nil || r.Requests >= 1000 || r.Requests < 2 {
		t.Fatalf("report %+v after cancelling at the third request", r)
	}
}

func TestValidate(t *testing.T) {
	good := loadgen.Config{BaseURL: "http://127.0.0.1:8080", Keys: []string{"k"}}
	if err := good.Validate(); err != nil {
		t.Fatalf("good config: %v", err)
	}
	cases := []struct {
		name string
		edit func(*loadgen.Config)
	}{
		{"no scheme", func(c *loadgen.Config) { c.BaseURL = "127.0.0.1:8080" }},
		{"ftp", func(c *loadgen.Config) { c.BaseURL = "ftp://127.0.0.1" }},
		{"credentials", func(c *loadgen.Config) { c.BaseURL = "http://u:p@127.0.0.1" }},
		{"query", func(c *loadgen.Config) { c.BaseURL = "http://127.0.0.1/?x=1" }},
		{"no key", func(c *loadgen.Config) { c.Keys = nil }},
		{"empty key", func(c *loadgen.Config) { c.Keys = []string{"k", ""} }},
		{"key with newline", func(c *loadgen.Config) { c.Keys = []string{"k\r\nX-Evil: 1"} }},
		{"negative concurrency", func(c *loadgen.Config) { c.Concurrency = -1 }},
		{"too many requests", func(c *loadgen.Config) { c.Requests = loadgen.MaxRequests + 1 }},
		{"too much concurrency", func(c *loadgen.Config) { c.Concurrency = loadgen.MaxConcurrency + 1 }},
		{"huge prompt", func(c *loadgen.Config) { c.PromptTokens = loadgen.MaxPromptTokens + 1 }},
		{"negative max tokens", func(c *loadgen.Config) { c.MaxTokens = -5 }},
		{"endpoint", func(c *loadgen.Config) { c.Endpoint = "embeddings" }},
		{"temperature", func(c *loadgen.Config) { c.Temperature = 3 }},
		{"negative timeout", func(c *loadgen.Config) { c.RequestTimeout = -time.Second }},
	}
	for _, tc := range cases {
		c := good
		c.Keys = append([]string(nil), good.Keys...)
		tc.edit(&c)
		if err := c.Validate(); !errors.Is(err, loadgen.ErrConfig) {
			t.Errorf("%s: Validate = %v, want ErrConfig", tc.name, err)
		}
		if _, err := loadgen.Run(context.Background(), c); !errors.Is(err, loadgen.ErrConfig) {
			t.Errorf("%s: Run = %v, want ErrConfig", tc.name, err)
		}
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var d []time.Duration
		for _, x := range v {
			d = append(d, time.Duration(x)*time.Millisecond)
		}
		return d
	}
	ten := ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10)
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	cases := []struct {
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{nil, 50, 0},
		{ms(7), 1, 7 * time.Millisecond},
		{ms(7), 100, 7 * time.Millisecond},
		{ten, 50, 5 * time.Millisecond},
		{ten, 51, 6 * time.Millisecond},
		{ten, 90, 9 * time.Millisecond},
		{ten, 99, 10 * time.Millisecond},
		{ten, 100, 10 * time.Millisecond},
		{hundred, 99, 99 * time.Millisecond},
		{hundred, 50, 50 * time.Millisecond},
		{hundred, 0.5, 1 * time.Millisecond},
	}
	for _, tc := range cases {
		if got := loadgen.Percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("Percentile(%d values, %v) = %v, want %v", len(tc.sorted), tc.p, got, tc.want)
		}
	}
	s := loadgen.Summarize(ms(10, 1, 4, 3, 2))
	want := loadgen.Summary{N: 5, Mean: 4 * time.Millisecond, P50: 3 * time.Millisecond, P90: 10 * time.Millisecond,
		P99: 10 * time.Millisecond, Max: 10 * time.Millisecond}
	if d := cmp.Diff(want, s); d != "" {
		t.Errorf("Summarize (-want +got):\n%s", d)
	}
}
