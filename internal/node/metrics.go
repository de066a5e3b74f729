package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pagewarden/pagewarden/internal/invariants"
)

// collector exports the page pool's and the scheduler's counters that the
// gateway's own metrics do not cover. One scrape takes one snapshot.
type collector struct {
	n     *Node
	descs map[string]*prometheus.Desc
}

var counterHelp = map[string]string{
	"pagewarden_kv_page_allocations_total":     "KV pages handed out by the pool.",
	"pagewarden_kv_page_scrubs_total":          "KV pages scrubbed on release.",
	"pagewarden_kv_page_evictions_total":       "Unreferenced prefix-cache pages evicted.",
	"pagewarden_kv_page_quarantines_total":     "KV pages put in quarantine after a violation.",
	"pagewarden_kv_quarantine_reaped_total":    "Quarantined KV pages scrubbed and freed by the reaper (--quarantine-reap-after).",
	"pagewarden_kv_quarantine_scrubbed_total":  "Quarantined KV pages scrubbed and freed by the operator (SIGUSR1).",
	"pagewarden_prefix_cache_hit_pages_total":  "Prompt pages served from the tenant's prefix cache.",
	"pagewarden_prefix_cache_miss_pages_total": "Full prompt pages the prefix cache could not serve.",
	"pagewarden_sched_steps_total":             "Scheduler steps (batches) run.",
	"pagewarden_sched_preemptions_total":       "Sequences preempted (pages freed, recomputed later).",
	"pagewarden_sched_rejected_total":          "Requests rejected at submission or after waiting too long.",
	"pagewarden_sched_owner_mismatches_total":  "Outcomes whose engine-echoed owner was not the request they were for (must stay 0).",
	"pagewarden_invariant_violations_total":    "Broken internal invariants reported in this process (must stay 0).",
}

// Collector returns a Prometheus collector for the node's counters and the
// per-tenant page gauge.
func (n *Node) Collector() prometheus.Collector {
	c := &collector{n: n, descs: map[string]*prometheus.Desc{}}
	for name, help := range counterHelp {
		c.descs[name] = prometheus.NewDesc(name, help, nil, nil)
	}
	c.descs["pagewarden_kv_pages_by_tenant"] = prometheus.NewDesc("pagewarden_kv_pages_by_tenant",
		"KV pages held (owned or shared) per tenant.", []string{"tenant"}, nil)
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	st, ok := c.n.snapshot()
	if !ok {
		return
	}
	vals := map[string]uint64{
		"pagewarden_kv_page_allocations_total":     st.Pool.Allocations,
		"pagewarden_kv_page_scrubs_total":          st.Pool.Scrubs,
		"pagewarden_kv_page_evictions_total":       st.Pool.Evictions,
		"pagewarden_kv_page_quarantines_total":     st.Pool.Quarantines,
		"pagewarden_kv_quarantine_reaped_total":    st.Core.Reaped,
		"pagewarden_kv_quarantine_scrubbed_total":  st.Core.Scrubbed,
		"pagewarden_prefix_cache_hit_pages_total":  st.Pool.PrefixHitPages,
		"pagewarden_prefix_cache_miss_pages_total": st.Pool.PrefixMissPages,
		"pagewarden_sched_steps_total":             st.Core.Steps,
		"pagewarden_sched_preemptions_total":       st.Core.Preemptions,
		"pagewarden_sched_rejected_total":          st.Core.Rejected,
		"pagewarden_sched_owner_mismatches_total":  st.Core.OwnerMismatches,
		"pagewarden_invariant_violations_total":    invariants.Count(),
	}
	for name, v := range vals {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v))
	}
	for t, pages := range st.Pool.TenantPages {
		ch <- prometheus.MustNewConstMetric(c.descs["pagewarden_kv_pages_by_tenant"], prometheus.GaugeValue, float64(pages), string(t))
	}
}
