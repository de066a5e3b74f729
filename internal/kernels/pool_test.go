package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
	if c := int(calls.Load()); c > chunksPerThread*p.Threads() {
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

// TestPoolUsesWorkers: while the caller's first chunk blocks, workers take
// the others, so calls run concurrently (on a pool that did not hand work
// out, the first call would wait for a second until the deadline).
func TestPoolUsesWorkers(t *testing.T) {
	p := NewPool(4)
	defer p.Close()
	var inside, peak atomic.Int32
	p.Run(100, func(lo, hi int) {
		c := inside.Add(1)
		defer inside.Add(-1)
		for {
			if m := peak.Load(); c <= m || peak.CompareAndSwap(m, c) {
				break
			}
		}
		deadline := time.Now().Add(10 * time.Second)
		for peak.Load() < 2 && time.Now().Before(deadline) {
			runtime.Gosched()
		}
	})
	if peak.Load() < 2 {
		t.Fatalf("Run(100) on 4 threads never ran two calls at once")
	}
}

// TestPoolLateWorker: a worker that has not woken up by the time the caller
// has taken every chunk does not hold the Run up, and when it does wake it
// runs nothing of the finished Run (the Run's fn would fail the test if it
// were called after its Run returned) and still serves later Runs.
func TestPoolLateWorker(t *testing.T) {
	p := NewPool(2)
	defer p.Close()
	release := make(chan struct{})
	woke := make(chan struct{}, 16)
	var hold atomic.Bool
	hold.Store(true)
	p.beforeClaim = func() {
		if hold.Load() {
			woke <- struct{}{}
			<-release
		}
	}
	var over atomic.Bool
	hits := make([]int32, 100)
	p.Run(len(hits), func(lo, hi int) {
		if over.Load() {
			t.Errorf("fn(%d, %d) called after its Run returned", lo, hi)
		}
		for i := lo; i < hi; i++ {
			atomic.AddInt32(&hits[i], 1)
		}
	})
	over.Store(true)
	for i, h := range hits {
		if h != 1 {
			t.Fatalf("index %d covered %d times", i, h)
		}
	}
	<-woke // the worker was woken for the Run and is stuck before claiming
	hold.Store(false)
	close(release)
	// The worker now finds the old Run over; later Runs use it again.
	var inside, peak atomic.Int32
	p.Run(100, func(lo, hi int) {
		c := inside.Add(1)
		defer inside.Add(-1)
		if c > 1 {
			peak.Store(c)
		}
		deadline := time.Now().Add(10 * time.Second)
		for peak.Load() < 2 && time.Now().Before(deadline) {
			runtime.Gosched()
		}
	})
	if peak.Load() < 2 {
		t.Fatalf("worker did not take part in a Run after waking late")
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
