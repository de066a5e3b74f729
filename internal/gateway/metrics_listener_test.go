package gateway_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway"
)

// TestSeparateMetrics: with SeparateMetrics the API listener no longer
// exposes the tenant-labelled series; MetricsHandler still does.
func TestSeparateMetrics(t *testing.T) {
	h := newHarness(t, nil, func(c *gateway.Config) { c.SeparateMetrics = true })
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
