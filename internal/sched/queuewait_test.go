package sched

import (
	"testing"
	"time"
)

// TestQueueWaitHistogram: each request's wait in its queue is observed
// once, when it first runs: one admitted at once waits 0, one that waits
// for pages is observed with the time that passed, and cumulative counts
// follow the bounds.
func TestQueueWaitHistogram(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 16, pageSize: 4, pages: 4, batchTokens: 64})
	t0 := time.Unix(100, 0)
	h.core.Tick(t0)
	h.submit(t, "a", 12, 4) // takes 3 of 4 pages at once
	h.submit(t, "a", 12, 4) // waits for them
	h.step(t)
	h.core.Tick(t0.Add(300 * time.Millisecond))
	h.drain(t)
	q := h.core.Stats().QueueWait
	if q.Count != 2 || q.Sum < 0.299 || q.Sum > 0.301 {
		t.Fatalf("QueueWait count %d sum %g, want 2 and 0.3 s", q.Count, q.Sum)
	}
	cum := q.Cumulative()
	for _, tc := range []struct {
		bound float64
		want  uint64
	}{{0.001, 1}, {0.25, 1}, {0.5, 2}, {60, 2}} {
		if cum[tc.bound] != tc.want {
			t.Errorf("at or below %gs: %d, want %d", tc.bound, cum[tc.bound], tc.want)
		}
	}
	h.checkFree(t)
}
