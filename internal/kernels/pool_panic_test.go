package kernels

import (
	"strings"
	"testing"
)

// TestPoolPanicReachesCaller: a panic on a worker comes back to Run's caller
// (where the scheduler recovers it) and the pool keeps working.
func TestPoolPanicReachesCaller(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	for _, where := range []int{0, 99} { // the caller's share, a worker's share
		got := func() (r any) {
			defer func() { r = recover() }()
			p.Run(100, func(lo, hi int) {
				if lo <= where && where < hi {
					panic("boom in share")
				}
			})
			return nil
		}()
		if s, ok := got.(string); !ok || !strings.Contains(s, "boom") {
			t.Fatalf("index %d: Run recovered %v, want the worker's panic", where, got)
		}
	}
	sum := make([]int, 100)
	p.Run(100, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			sum[i] = i
		}
	})
	for i, v := range sum {
		if v != i {
			t.Fatalf("pool broken after a panic: sum[%d] = %d", i, v)
		}
	}
}
