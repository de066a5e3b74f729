package gateway_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
)

// GET /v1/models/{id} returns the entry /v1/models lists for the served
// id, slashes and all, and a 404 model_not_found for any other id.
func TestModelByID(t *testing.T) {
	fake := gatewaytest.NewFake()
	fake.Model = "org/fake-model"
	h := newHarness(t, fake)
	list := h.do(context.Background(), "GET", "/v1/models", keyAlpha, nil)
	if list.status != 200 {
		t.Fatalf("models: %d %s", list.status, list.body)
	}
	entry := decodeBody(t, list.body)["data"].([]any)[0]
	r := h.do(context.Background(), "GET", "/v1/models/org/fake-model", keyAlpha, nil)
	if r.status != 200 {
		t.Fatalf("model: %d %s", r.status, r.body)
	}
	if diff := cmp.Diff(entry, any(decodeBody(t, r.body))); diff != "" {
		t.Errorf("model by id (-list entry +got):\n%s", diff)
	}
	for _, path := range []string{"/v1/models/fake-model", "/v1/models/org/other", "/v1/models/org/fake-model/x", "/v1/models/"} {
		r := h.do(context.Background(), "GET", path, keyAlpha, nil)
		if r.status != 404 || errorCode(t, r.body) != "model_not_found" {
			t.Errorf("GET %s: %d %s", path, r.status, r.body)
		}
	}
	if r := h.do(context.Background(), "GET", "/v1/models/org/fake-model", "", nil); r.status != 401 {
		t.Errorf("unauthenticated: %d %s", r.status, r.body)
	}
	r = h.do(context.Background(), "POST", "/v1/models/org/fake-model", keyAlpha, nil)
	if r.status != 405 || r.header.Get("Allow") != "GET" || errorCode(t, r.body) != "method_not_allowed" {
		t.Errorf("POST: %d Allow=%q %s", r.status, r.header.Get("Allow"), r.body)
	}
}

// "created" in /v1/models is the server's start time, the same on every
// call however the clock moves.
func TestModelsCreatedStable(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	h := newHarness(t, nil, func(c *gateway.Config) { c.Now = clock.Now })
	clock.Advance(time.Hour)
	for _, path := range []string{"/v1/models", "/v1/models", "/v1/models/fake-model"} {
		clock.Advance(90 * time.Second)
		m := decodeBody(t, h.do(context.Background(), "GET", path, keyAlpha, nil).body)
		if d, ok := m["data"].([]any); ok {
			m = d[0].(map[string]any)
		}
		if m["created"] != float64(1e9) {
			t.Errorf("GET %s: created %v, want the start time %v", path, m["created"], int64(1e9))
		}
	}
}
