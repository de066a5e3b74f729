package sched

import "time"

// QueueWaitBounds are the upper bounds, in seconds, of the queue-wait
// histogram's buckets (the gateway's latency buckets).
var QueueWaitBounds = [...]float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// QueueWait is a histogram of how long requests waited in their tenant's
// queue before they first started running: the core observes each
// request once, when it is first admitted (a preempted request's second
// wait is not a queue wait the client chose to make). Counts are per
// bucket, not cumulative; Count includes the waits beyond the last bound.
type QueueWait struct {
	Buckets [len(QueueWaitBounds)]uint64
	Count   uint64
	Sum     float64 // seconds
}

func (q *QueueWait) observe(d time.Duration) {
	s := d.Seconds()
	q.Count++
	q.Sum += s
	for i, b := range QueueWaitBounds {
		if s <= b {
			q.Buckets[i]++
			return
		}
	}
}

// Cumulative returns the counts at or below each bound, as Prometheus
// histograms give them.
func (q *QueueWait) Cumulative() map[float64]uint64 {
	out := make(map[float64]uint64, len(QueueWaitBounds))
	var n uint64
	for i, b := range QueueWaitBounds {
		n += q.Buckets[i]
		out[b] = n
	}
	return out
}
