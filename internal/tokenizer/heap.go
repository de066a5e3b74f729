package tokenizer

// minHeap is a binary heap ordered by before. The SPM, BPE and llama2.c
// mergers all keep their candidate pairs in one, popping the best pair next.
type minHeap[T any] struct {
	items  []T
	before func(a, b T) bool
}

// reset empties the heap, keeping its storage, and sets the order.
func (h *minHeap[T]) reset(before func(a, b T) bool) {
	h.items = h.items[:0]
	h.before = before
}

func (h *minHeap[T]) len() int { return len(h.items) }

func (h *minHeap[T]) push(x T) {
	q := append(h.items, x)
	for i := len(q) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.before(q[i], q[p]) {
			break
		}
		q[i], q[p] = q[p], q[i]
		i = p
	}
	h.items = q
}

// pop removes and returns the first item; the heap must not be empty.
func (h *minHeap[T]) pop() T {
	q := h.items
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q = q[:last]
	for i := 0; ; {
		l, r, best := 2*i+1, 2*i+2, i
		if l < len(q) && h.before(q[l], q[best]) {
			best = l
		}
		if r < len(q) && h.before(q[r], q[best]) {
			best = r
		}
		if best == i {
			break
		}
		q[i], q[best] = q[best], q[i]
		i = best
	}
	h.items = q
	return top
}
