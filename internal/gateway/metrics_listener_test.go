package gateway_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway"
)

// TestSeparateMetrics: by default the API listener does not expose the
// tenant-labelled series; MetricsHandler does, and MetricsOnAPI puts them
// back on the API handler.
func TestSeparateMetrics(t *testing.T) {
	on := newHarness(t, nil, func(c *gateway.Config) { c.MetricsOnAPI = true })
	if r := on.do(context.Background(), "GET", "/metrics", "", nil); r.status != http.StatusOK {
		t.Errorf("MetricsOnAPI: GET /metrics %d", r.status)
	}
	h := newHarness(t, nil)
	resp, err := http.Get(h.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		t.Errorf("GET /metrics on the API listener: %d, want it absent", resp.StatusCode)
	}
	rec := httptest.NewRecorder()
	h.srv.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "pagewarden_response_owner_mismatch_total") {
		t.Errorf("MetricsHandler: %d %.200s", rec.Code, rec.Body.String())
	}
}
