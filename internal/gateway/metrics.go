package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics are registered on a registry private to one Server, so that
// several servers (tests, benchmarks) never collide on global state.
type metrics struct {
	reg *prometheus.Registry

	requests         *prometheus.CounterVec   // tenant, endpoint, status
	ttft             *prometheus.HistogramVec // tenant
	interToken       *prometheus.HistogramVec // tenant
	promptTokens     *prometheus.CounterVec   // tenant
	completionTokens *prometheus.CounterVec   // tenant
	inFlight         *prometheus.GaugeVec     // tenant
	duration         *prometheus.HistogramVec // tenant, endpoint
	finishes         *prometheus.CounterVec   // tenant, reason
	ownerMismatch    prometheus.Counter
	abortedCompleted prometheus.Counter
	badStream        prometheus.Counter
}

var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

func newMetrics(b Backend) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pagewarden_requests_total", Help: "HTTP requests by tenant, endpoint and status code.",
	}, []string{"tenant", "endpoint", "status"})
	m.ttft = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "pagewarden_time_to_first_token_seconds", Help: "Time from request arrival to the first generated token.",
		Buckets: latencyBuckets,
	}, []string{"tenant"})
	m.interToken = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "pagewarden_inter_token_latency_seconds", Help: "Time between consecutive generated tokens.",
		Buckets: latencyBuckets,
	}, []string{"tenant"})
	m.promptTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pagewarden_prompt_tokens_total", Help: "Prompt tokens of admitted requests.",
	}, []string{"tenant"})
	m.completionTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pagewarden_completion_tokens_total", Help: "Generated tokens delivered to clients.",
	}, []string{"tenant"})
	m.inFlight = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pagewarden_requests_in_flight", Help: "Generation requests submitted and not yet finished.",
	}, []string{"tenant"})
	m.ownerMismatch = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pagewarden_response_owner_mismatch_total",
		Help: "Backend output whose owner differed from the connection's; dropped. Must stay 0.",
	})
	m.abortedCompleted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pagewarden_gateway_inconsistent_results_total",
		Help: "Terminal results that claimed success while carrying an error; answered as failures. Must stay 0.",
	})
	m.badStream = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pagewarden_gateway_stream_contract_violations_total",
		Help: "Backend streams with out-of-order tokens or a usage count that differs from the tokens delivered. Must stay 0.",
	})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "pagewarden_request_duration_seconds", Help: "Generation requests from arrival to the last byte of the answer (or of the error), by tenant and endpoint.",
		Buckets: latencyBuckets,
	}, []string{"tenant", "endpoint"})
	// reason takes the finish reasons of the API (stop, length,
	// tool_calls) and of the failures (error, abort, client_closed, ...):
	// a fixed, small set.
	m.finishes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pagewarden_finish_reasons_total", Help: "Generation requests by how they ended: stop, length, tool_calls, or the failure (error, abort, client_closed, ...).",
	}, []string{"tenant", "reason"})
	m.reg.MustRegister(m.requests, m.ttft, m.interToken, m.promptTokens, m.completionTokens,
		m.inFlight, m.ownerMismatch, m.abortedCompleted, m.badStream, m.duration, m.finishes)
	m.reg.MustRegister(ProcessCollectors()...)

	if src, ok := b.(StatsSource); ok {
		m.reg.MustRegister(PoolCollectors(src)...)
	}
	return m
}

// PoolCollectors are the page-pool gauges and the must-be-zero counters
// of src, for any process that runs a node (serve registers them on the
// gateway's registry; a prefill or decode node on its own).
func PoolCollectors(src StatsSource) []prometheus.Collector {
	gauge := func(name, help string, f func(PoolStats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help},
			func() float64 { return float64(f(src.PoolStats())) })
	}
	return []prometheus.Collector{
		gauge("pagewarden_kv_pages", "KV pages in the pool: free + cached + used + quarantined.", func(p PoolStats) int { return p.PagesTotal }),
		gauge("pagewarden_kv_pages_free", "KV pages on the free list.", func(p PoolStats) int { return p.PagesFree }),
		gauge("pagewarden_kv_pages_cached", "Prefix-cache KV pages that no sequence holds (evictable; counted under their tenant in pagewarden_kv_pages_by_tenant).", func(p PoolStats) int { return p.PagesCached }),
		gauge("pagewarden_kv_pages_used", "KV pages held by sequences (owned, or shared and referenced).", func(p PoolStats) int { return p.PagesUsed }),
		gauge("pagewarden_kv_pages_quarantined", "Quarantined KV pages.", func(p PoolStats) int { return p.PagesQuarantined }),
		gauge("pagewarden_queue_depth", "Requests admitted and waiting to run.", func(p PoolStats) int { return p.QueueDepth }),
		gauge("pagewarden_running_requests", "Requests prefilling or decoding.", func(p PoolStats) int { return p.Running }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "pagewarden_isolation_violations_total",
			Help: "Attention steps refused because a page was not owned by the sequence (I2). Must stay 0.",
		}, func() float64 { return float64(src.IsolationViolations()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "pagewarden_aborted_but_completed_total",
			Help: "Requests that reached Finished after being aborted (I4). Must stay 0.",
		}, func() float64 { return float64(src.AbortedButCompleted()) }),
	}
}

// ProcessCollectors are the Go runtime, process and build-info metrics
// every pagewarden process exports (go_*, process_*, go_build_info).
func ProcessCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		collectors.NewBuildInfoCollector(),
	}
}
