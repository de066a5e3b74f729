package kernels

import (
	"sync"
	"sync/atomic"
	"testing"

	"pgregory.net/rapid"
)

// checkCover runs Run/RunGrain and verifies the calls cover [0,n) exactly
// once, with every range non-empty and split points on grain multiples.
func checkCover(t *rapid.T, p *Pool, n, grain int) {
	hits := make([]int32, n)
	var calls atomic.Int32
	var bad atomic.Value
	p.RunGrain(n, grain, func(lo, hi int) {
		calls.Add(1)
		if lo >= hi || lo < 0 || hi > n {
			bad.Store([2]int{lo, hi})
			return
		}
		if g := max(grain, 1); lo%g != 0 {
			bad.Store([2]int{lo, hi})
		}
		for i := lo; i < hi; i++ {
			atomic.AddInt32(&hits[i], 1)
		}
	})
	if v := bad.Load(); v != nil {
		t.Fatalf("bad range %v for n=%d grain=%d", v, n, grain)
	}
	for i, h := range hits {
		if h != 1 {
			t.Fatalf("index %d covered %d times (n=%d grain=%d)", i, h, n, grain)
		}
	}
	if c := int(calls.Load()); c > p.Threads() {
		t.Fatalf("%d calls with %d threads", c, p.Threads())
	}
	if n > 0 && grain >= 1 && (n+grain-1)/grain == 1 && calls.Load() != 1 {
		t.Fatalf("work of one grain was split into %d calls", calls.Load())
	}
}

func TestPoolCoverage(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		threads := rapid.IntRange(0, 6).Draw(t, "threads")
		p := NewPool(threads)
		defer p.Close()
		for range rapid.IntRange(1, 5).Draw(t, "runs") {
			n := rapid.IntRange(0, 200).Draw(t, "n")
			grain := rapid.IntRange(0, 50).Draw(t, "grain")
			checkCover(t, p, n, grain)
		}
	})
}

func TestPoolNilAndClosed(t *testing.T) {
	var p *Pool
	if p.Threads() != 1 {
		t.Fatalf("nil pool Threads = %d", p.Threads())
	}
	var got [][2]int
	p.Run(10, func(lo, hi int) { got = append(got, [2]int{lo, hi}) })
	if len(got) != 1 || got[0] != [2]int{0, 10} {
		t.Fatalf("nil pool ran %v, want one call [0,10)", got)
	}
	q := NewPool(3)
	q.Close()
	q.Close() // idempotent
	got = nil
	q.Run(10, func(lo, hi int) { got = append(got, [2]int{lo, hi}) })
	if len(got) != 1 {
		t.Fatalf("closed pool ran %v, want inline", got)
	}
}

func TestPoolUsesWorkers(t *testing.T) {
	p := NewPool(4)
	defer p.Close()
	var calls atomic.Int32
	p.Run(100, func(lo, hi int) { calls.Add(1) })
	if calls.Load() != 4 {
		t.Fatalf("Run(100) on 4 threads made %d calls, want 4", calls.Load())
	}
}

// TestPoolNestedAndConcurrent: Run inside fn, and Runs from many goroutines
// at once, complete (inline when the workers are busy) and cover their
// ranges. Run under -race.
func TestPoolNestedAndConcurrent(t *testing.T) {
	p := NewPool(3)
	defer p.Close()
	var total atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < 50; k++ {
				p.Run(30, func(lo, hi int) {
					p.Run(hi-lo, func(a, b int) { total.Add(int64(b - a)) })
				})
			}
		}()
	}
	wg.Wait()
	if want := int64(8 * 50 * 30); total.Load() != want {
		t.Fatalf("covered %d indices, want %d", total.Load(), want)
	}
}

// TestPoolWritesVisible: writes made by workers are visible to the caller
// after Run returns (the barrier is a happens-before edge; -race checks it).
func TestPoolWritesVisible(t *testing.T) {
	p := NewPool(4)
	defer p.Close()
	buf := make([]int, 1000)
	for round := 1; round <= 20; round++ {
		p.Run(len(buf), func(lo, hi int) {
			for i := lo; i < hi; i++ {
				buf[i] = round
			}
		})
		for i, v := range buf {
			if v != round {
				t.Fatalf("round %d: buf[%d] = %d", round, i, v)
			}
		}
	}
}

func BenchmarkPoolRun(b *testing.B) {
	for _, threads := range []int{1, 2} {
		p := NewPool(threads)
		b.Run(map[int]string{1: "t1", 2: "t2"}[threads], func(b *testing.B) {
			b.ReportAllocs()
			var sink atomic.Int64
			fn := func(lo, hi int) { sink.Add(int64(hi - lo)) }
			for b.Loop() {
				p.Run(64, fn)
			}
		})
		p.Close()
	}
}
