package gateway_test

import (
	"strconv"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
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
