package gateway_test

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// TestNChildFailures: when one choice of n fails, in any way a backend can
// fail, the response fails (an error status, or an SSE error event and no
// [DONE]) and no choice is left running; never a 200 with a choice missing.
func TestNChildFailures(t *testing.T) {
	const seed = 1000
	for _, tc := range []struct {
		name string
		bad  gatewaytest.Behavior // for choice 2 (seed + 2)
	}{
		{"error", gatewaytest.Behavior{Fault: gatewaytest.FaultError, At: 3}},
		{"abort", gatewaytest.Behavior{Fault: gatewaytest.FaultAbort, At: 3}},
		{"wrong owner", gatewaytest.Behavior{Fault: gatewaytest.FaultWrongOwner, At: 2}},
		{"result owner", gatewaytest.Behavior{Fault: gatewaytest.FaultResultOwner}},
		{"bad usage", gatewaytest.Behavior{Fault: gatewaytest.FaultBadUsage}},
		{"token gap", gatewaytest.Behavior{Fault: gatewaytest.FaultTokenIndex, At: 2}},
		{"submit refused", gatewaytest.Behavior{SubmitErr: fmt.Errorf("full: %w", request.ErrOverloaded)}},
	} {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%v", tc.name, stream), func(t *testing.T) {
				fake := gatewaytest.NewFake()
				fake.Behave = func(p request.Params) gatewaytest.Behavior {
					if p.Sampling.Seed == seed+2 {
						b := tc.bad
						b.Delay = time.Millisecond
						return b
					}
					return gatewaytest.Behavior{Delay: time.Millisecond}
				}
				h := newHarness(t, fake)
				body := map[string]any{"model": "fake-model", "prompt": "Hi", "n": 4, "seed": seed, "stream": stream}
				r := h.post("/v1/completions", keyAlpha, body)
				switch {
				case !stream && r.status < 500:
					t.Errorf("status %d %s; want a 5xx", r.status, r.body)
				case stream && r.status == 200:
					if s := summarize(t, r.body); s.done || s.errObj == nil {
						t.Errorf("stream ended done %v error %v; want an error event and no [DONE]", s.done, s.errObj)
					}
				case stream && r.status < 500:
					t.Errorf("status %d %s", r.status, r.body)
				}
				deadline := time.Now().Add(5 * time.Second)
				for fake.Live() != 0 {
					if time.Now().After(deadline) {
						t.Fatalf("%d choices still running", fake.Live())
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
	}
}

// TestNSeedsAndTenant: choice i is submitted with seed + i, wrapping
// past the largest uint64 (seed -1 is 2^64-1), and every choice as the
// authenticated tenant, whatever the body says.
func TestNSeedsAndTenant(t *testing.T) {
	fake := gatewaytest.NewFake()
	var mu sync.Mutex
	var seeds []uint64
	var owners []request.Tenant
	fake.Behave = func(p request.Params) gatewaytest.Behavior {
		mu.Lock()
		defer mu.Unlock()
		seeds = append(seeds, p.Sampling.Seed)
		owners = append(owners, p.Owner.Tenant)
		return gatewaytest.Behavior{}
	}
	h := newHarness(t, fake)
	r := h.post("/v1/chat/completions", keyBeta, chatBody(map[string]any{"n": 3, "seed": -1, "tenant": "alpha", "user": "alpha"}))
	if r.status != 200 {
		t.Fatalf("status %d %s", r.status, r.body)
	}
	slices.Sort(seeds)
	if want := []uint64{0, 1, math.MaxUint64}; !slices.Equal(seeds, want) {
		t.Errorf("seeds %v, want %v", seeds, want)
	}
	for _, o := range owners {
		if o != "beta" {
			t.Errorf("a choice submitted as %q for tenant beta's request", o)
		}
	}
}

// TestNPageBudget: n sequences are charged n × the pages of one; n × pages
// over the tenant's budget is a 400 naming n, before anything is
// submitted, and an omitted max_tokens is shared among the choices.
func TestNPageBudget(t *testing.T) {
	fake := gatewaytest.NewFake() // 16-token pages
	h := newHarness(t, fake, func(c *gateway.Config) { c.Tenants = testTenants(tenants.Limits{MaxKVPages: 8}, tenants.Limits{}) })
	for _, tc := range []struct {
		name  string
		body  map[string]any
		want  int
		param string
	}{
		{"3 × 3 pages over 8", map[string]any{"prompt": "Hi", "max_tokens": 40, "n": 3}, 400, "n"},
		{"2 × 3 pages", map[string]any{"prompt": "Hi", "max_tokens": 40, "n": 2}, 200, ""},
		{"one choice over 8 pages", map[string]any{"prompt": "Hi", "max_tokens": 200, "n": 2}, 400, "max_tokens"},
		{"omitted max_tokens shared", map[string]any{"prompt": "Hi", "n": 8}, 200, ""},
		{"9 choices of at least a page", map[string]any{"prompt": "Hi", "n": 9}, 400, "n"},
		{"batch over the budget", map[string]any{"prompt": []string{"a", "b", "c"}, "max_tokens": 40}, 400, "prompt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := fake.Submits()
			tc.body["model"] = "fake-model"
			r := h.post("/v1/completions", keyAlpha, tc.body)
			if r.status != tc.want {
				t.Fatalf("status %d %s, want %d", r.status, r.body, tc.want)
			}
			if tc.want != 200 {
				if errorParam(t, r.body) != tc.param || errorCode(t, r.body) != "kv_page_limit_exceeded" {
					t.Errorf("%s: want kv_page_limit_exceeded naming %q", r.body, tc.param)
				}
				if fake.Submits() != before {
					t.Errorf("a refused request was submitted")
				}
			}
		})
	}
}
