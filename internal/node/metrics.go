package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/sched"
)

// Metrics never wait for a step. The scheduler loop publishes its counts
// (core stats and the pool's Counts) at every turn through
// sched.NodeConfig.Observe, and every counter and gauge is read from that
// publication. The counters therefore never go backwards and never read 0
// for lack of an answer: during a long step they hold the values from just
// before it, which are still the true ones, since only the loop changes
// them. Only the per-tenant pages need the loop to answer (the map is too
// costly to copy every turn): a scrape asks for them with a timeout and
// keeps the last answer otherwise. pagewarden_scheduler_snapshot_age_seconds
// says how old the publication is, so that an alert can tell a stuck loop
// from an idle one.

// published is what the loop last reported, and when: its last turn, or
// its last answer to a refresh (an idle loop has no turns, but answers at
// once). TenantPages is from the last answer.
type published struct {
	st sched.NodeStats
	at time.Time
}

// fullSnapshot is the loop's answer to a refresh.
type fullSnapshot struct {
	st  sched.NodeStats
	at  time.Time
	err error
}

// statsTimeout bounds how long a metrics scrape waits for the scheduler
// loop, which answers between steps.
const statsTimeout = 2 * time.Second

// snapshotTTL lets scrapes close together share one refresh.
const snapshotTTL = 100 * time.Millisecond

// observe is the loop's sched.NodeConfig.Observe. It runs on the loop
// goroutine at every turn.
func (n *Node) observe(st sched.NodeStats) {
	now := time.Now()
	n.pubMu.Lock()
	st.Pool.TenantPages = n.pub.st.Pool.TenantPages // Counts has none
	n.pub = published{st: st, at: now}
	n.pubMu.Unlock()
}

// published returns the last publication and its age.
func (n *Node) published() (sched.NodeStats, time.Duration) {
	n.pubMu.Lock()
	defer n.pubMu.Unlock()
	return n.pub.st, time.Since(n.pub.at)
}

// refresh asks the loop for a full snapshot, for the per-tenant pages and
// as proof that the loop is responsive, and waits at most statsTimeout. A
// loop inside a long step answers only after it: the request then stays
// pending, and later scrapes wait for that one instead of queueing more
// behind the step. Counters are never taken from the answer: the loop's
// own publication may already be newer.
func (n *Node) refresh() {
	n.refreshMu.Lock()
	defer n.refreshMu.Unlock()
	if time.Since(n.refreshAt) < snapshotTTL {
		return
	}
	if n.pending == nil {
		ch := make(chan fullSnapshot, 1)
		n.pending = ch
		// Ends when the loop answers or stops (Close): Stats returns
		// then, and the buffered send never blocks.
		go func() {
			st, err := n.sched.Stats(n.ctx)
			ch <- fullSnapshot{st: st, at: time.Now(), err: err}
		}()
	}
	t := time.NewTimer(n.statsTimeout)
	defer t.Stop()
	select {
	case r := <-n.pending:
		n.pending = nil
		if r.err != nil {
			return
		}
		n.refreshAt = r.at
		n.pubMu.Lock()
		n.pub.st.Pool.TenantPages = r.st.Pool.TenantPages
		if r.at.After(n.pub.at) {
			n.pub.at = r.at
		}
		n.pubMu.Unlock()
	case <-t.C:
	}
}

// PoolStats implements gateway.StatsSource.
func (n *Node) PoolStats() gateway.PoolStats {
	st, _ := n.published()
	return gateway.PoolStats{
		PagesTotal: st.Pool.TotalPages, PagesFree: st.Pool.FreePages, PagesCached: st.Pool.CachedPages,
		PagesUsed:        st.Pool.OwnedPages + st.Pool.SharedPages - st.Pool.CachedPages,
		PagesQuarantined: st.Pool.QuarantinedPages,
		QueueDepth:       st.Core.Queued, Running: st.Core.Running,
	}
}

// IsolationViolations implements gateway.StatsSource.
func (n *Node) IsolationViolations() uint64 {
	st, _ := n.published()
	// Both detectors of I2: the pool's ownership check and the core's
	// check of the owner the engine echoed with each outcome.
	return st.Pool.Violations + st.Core.OwnerMismatches
}

// AbortedButCompleted implements gateway.StatsSource.
func (n *Node) AbortedButCompleted() uint64 {
	st, _ := n.published()
	return st.Core.AbortedButCompleted
}

// collector exports the page pool's and the scheduler's counters that the
// gateway's own metrics do not cover, the per-tenant pages and the age of
// what they show.
type collector struct {
	n     *Node
	descs map[string]*prometheus.Desc
}

const (
	snapshotAgeName = "pagewarden_scheduler_snapshot_age_seconds"
	queueWaitName   = "pagewarden_queue_wait_seconds"
)

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

// Collector returns a Prometheus collector for the node's counters, the
// per-tenant page gauge and the snapshot-age gauge.
func (n *Node) Collector() prometheus.Collector {
	c := &collector{n: n, descs: map[string]*prometheus.Desc{}}
	for name, help := range counterHelp {
		c.descs[name] = prometheus.NewDesc(name, help, nil, nil)
	}
	c.descs["pagewarden_kv_pages_by_tenant"] = prometheus.NewDesc("pagewarden_kv_pages_by_tenant",
		"KV pages held (owned or shared) per tenant.", []string{"tenant"}, nil)
	c.descs[queueWaitName] = prometheus.NewDesc(queueWaitName,
		"Seconds requests waited in their tenant's queue before they first ran (a preempted request's second wait is not counted).", nil, nil)
	c.descs[snapshotAgeName] = prometheus.NewDesc(snapshotAgeName,
		"Seconds since the scheduler loop last reported its counts or answered a scrape; "+
			"it grows while one step runs. The node's counters and gauges describe the state that old.", nil, nil)
	return c
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.n.refresh()
	st, age := c.n.published()
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
	qw := st.Core.QueueWait
	ch <- prometheus.MustNewConstHistogram(c.descs[queueWaitName], qw.Count, qw.Sum, qw.Cumulative())
	ch <- prometheus.MustNewConstMetric(c.descs[snapshotAgeName], prometheus.GaugeValue, age.Seconds())
}
