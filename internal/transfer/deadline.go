package transfer

import "container/heap"

// entry is an item's place in a deadline queue: its next deadline, a
// tie-break that makes the order total (and so deterministic), and its
// index in the heap (-1 when not queued).
type entry struct {
	at  Time
	tie uint64
	idx int
}

type scheduled interface{ sched() *entry }

// queue is a min-heap of items by (deadline, tie): the reaper's order.
// Each item is in it at most once; schedule moves it.
type queue[T scheduled] []T

func (q queue[T]) Len() int { return len(q) }
func (q queue[T]) Less(i, j int) bool {
	a, b := q[i].sched(), q[j].sched()
	if a.at != b.at {
		return a.at < b.at
	}
	return a.tie < b.tie
}
func (q queue[T]) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].sched().idx = i
	q[j].sched().idx = j
}
func (q *queue[T]) Push(x any) {
	it := x.(T)
	it.sched().idx = len(*q)
	*q = append(*q, it)
}
func (q *queue[T]) Pop() any {
	old := *q
	n := len(old) - 1
	it := old[n]
	var zero T
	old[n] = zero
	*q = old[:n]
	it.sched().idx = -1
	return it
}

// schedule puts it in the queue at deadline at, or moves it there.
func (q *queue[T]) schedule(it T, at Time) {
	e := it.sched()
	e.at = at
	if e.idx < 0 {
		heap.Push(q, it)
		return
	}
	heap.Fix(q, e.idx)
}

// remove takes it out of the queue if it is in it.
func (q *queue[T]) remove(it T) {
	if e := it.sched(); e.idx >= 0 {
		heap.Remove(q, e.idx)
	}
}

// due returns the item with the earliest deadline if that is at or before
// now.
func (q queue[T]) due(now Time) (T, bool) {
	if len(q) == 0 || q[0].sched().at > now {
		var zero T
		return zero, false
	}
	return q[0], true
}
