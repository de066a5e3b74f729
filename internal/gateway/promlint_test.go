package gateway_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
)

// TestMetricsLint: every metric the gateway exports passes promlint (the
// checks of `promtool check metrics`), after traffic so that every vector
// has series; Go, process and build-info metrics are there; and the page
// gauges add up.
func TestMetricsLint(t *testing.T) {
	fake := gatewaytest.NewFake()
	h := newHarness(t, fake)
	for _, key := range []string{keyAlpha, keyBeta} {
		if r := h.post("/v1/completions", key, map[string]any{"prompt": "hi", "max_tokens": 4, "stream": true}); r.status != 200 {
			t.Fatalf("%d %s", r.status, r.body)
		}
	}
	text := scrape(t, h)
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	for _, want := range []string{"go_goroutines", "process_cpu_seconds_total", "go_build_info", "pagewarden_kv_pages_cached"} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	ps := fake.PoolStats()
	if ps.PagesFree+ps.PagesCached+ps.PagesUsed+ps.PagesQuarantined != ps.PagesTotal {
		t.Errorf("page gauges do not add up: %+v", ps)
	}
	_ = gateway.PoolStats{}
}
