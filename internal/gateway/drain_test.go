package gateway_test

import (
	"context"
	"net/http"
	"testing"
)

// TestOperatorDrain: while the operator's drain is on, /readyz is 503 (a
// load balancer sends nothing new), a generation request that still
// arrives is a 503 "draining" with Retry-After, and everything else keeps
// answering; undrain takes requests again at once.
func TestOperatorDrain(t *testing.T) {
	h := newHarness(t, nil)
	ready := func() int { return h.do(context.Background(), "GET", "/readyz", "", nil).status }
	if ready() != 200 || h.srv.Draining() {
		t.Fatalf("ready %d, draining %v at start", ready(), h.srv.Draining())
	}
	if was := h.srv.SetDraining(true); was {
		t.Fatal("SetDraining reported a drain that was not on")
	}
	if ready() != http.StatusServiceUnavailable {
		t.Errorf("readyz while draining: %d", ready())
	}
	r := h.post("/v1/chat/completions", keyAlpha, chatBody(nil))
	if r.status != http.StatusServiceUnavailable || errorCode(t, r.body) != "draining" || r.header.Get("Retry-After") == "" {
		t.Errorf("chat while draining: %d %s (Retry-After %q)", r.status, r.body, r.header.Get("Retry-After"))
	}
	if r := h.do(context.Background(), "GET", "/v1/models", keyAlpha, nil); r.status != 200 {
		t.Errorf("models while draining: %d", r.status)
	}
	if r := h.do(context.Background(), "GET", "/healthz", "", nil); r.status != 200 {
		t.Errorf("healthz (liveness) while draining: %d", r.status)
	}
	if was := h.srv.SetDraining(false); !was {
		t.Error("SetDraining(false) did not report the drain")
	}
	if r := h.post("/v1/chat/completions", keyAlpha, chatBody(nil)); r.status != 200 || ready() != 200 {
		t.Errorf("after undrain: chat %d, readyz %d", r.status, ready())
	}
}
