package kernels

import (
	"sync"
	"sync/atomic"
)

// Pool is a fixed set of worker goroutines that split index ranges among
// themselves. The workers live as long as the pool, so a Run costs one
// hand-off and one barrier, not a goroutine start per worker; that matters
// for the many sub-100µs operations of a decode step.
//
// A nil *Pool is valid and runs everything inline on the caller.
// Run may be called from several goroutines; a Run that finds the workers
// busy (another Run in progress, or a Run nested inside fn) executes inline
// on its caller rather than waiting, so it can never deadlock.
//
// A panic in fn on a worker is carried back and re-raised on the goroutine
// that called Run, after every share has finished: the caller (the
// scheduler's step) recovers it into an error for the requests of that step
// instead of the whole process dying on a worker goroutine nobody owns.
type Pool struct {
	threads int
	mu      sync.Mutex // held for the duration of a parallel Run
	work    []chan task
	done    chan any // one value per finished share: nil, or what it panicked with
	closed  atomic.Bool
	wg      sync.WaitGroup // workers alive
}

type task struct {
	fn     func(lo, hi int)
	lo, hi int
}

// NewPool starts a pool that runs work on threads goroutines: the caller of
// Run plus threads-1 workers. threads < 1 is treated as 1.
func NewPool(threads int) *Pool {
	if threads < 1 {
		threads = 1
	}
	p := &Pool{threads: threads, done: make(chan any, threads)}
	for i := 1; i < threads; i++ {
		ch := make(chan task, 1)
		p.work = append(p.work, ch)
		p.wg.Add(1)
		go p.worker(ch)
	}
	return p
}

func (p *Pool) worker(ch chan task) {
	defer p.wg.Done()
	for t := range ch {
		p.done <- runShare(t.fn, t.lo, t.hi)
	}
}

// runShare runs one share and returns what it panicked with, if anything.
func runShare(fn func(lo, hi int), lo, hi int) (panicked any) {
	defer func() { panicked = recover() }()
	fn(lo, hi)
	return nil
}

// Threads returns the number of goroutines a Run uses at most (1 for a nil
// pool).
func (p *Pool) Threads() int {
	if p == nil {
		return 1
	}
	return p.threads
}

// Close stops the workers. Runs after Close execute inline. Close is
// idempotent but must not race with a Run in progress.
func (p *Pool) Close() {
	if p == nil || p.closed.Swap(true) {
		return
	}
	p.mu.Lock()
	for _, ch := range p.work {
		close(ch)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Run calls fn over disjoint sub-ranges that together cover [0, n), using up
// to Threads goroutines, and returns when all calls have returned. The
// ranges are contiguous and in order of worker; each call gets at least one
// index. fn must be safe to run concurrently with itself on disjoint ranges.
// With one thread, n <= 1, or the workers busy, Run is fn(0, n) inline.
func (p *Pool) Run(n int, fn func(lo, hi int)) {
	p.RunGrain(n, 1, fn)
}

// RunGrain is Run with a minimum share: each call gets at least grain
// indices (except when n < grain), so work too small to be worth a
// hand-off stays on the caller. Split points are multiples of grain.
func (p *Pool) RunGrain(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	chunks := (n + grain - 1) / grain
	t := p.Threads()
	if t > chunks {
		t = chunks
	}
	if t <= 1 || p.closed.Load() || !p.mu.TryLock() {
		fn(0, n)
		return
	}
	defer p.mu.Unlock()
	if p.closed.Load() {
		fn(0, n)
		return
	}
	// Worker i gets chunks [i*chunks/t, (i+1)*chunks/t): sizes differ by at
	// most one chunk. The caller takes share 0 so it is not idle.
	bound := func(i int) int {
		b := i * chunks / t * grain
		if b > n {
			b = n
		}
		return b
	}
	for i := 1; i < t; i++ {
		p.work[i-1] <- task{fn: fn, lo: bound(i), hi: bound(i + 1)}
	}
	first := runShare(fn, 0, bound(1))
	for i := 1; i < t; i++ {
		if r := <-p.done; r != nil && first == nil {
			first = r
		}
	}
	if first != nil {
		panic(first)
	}
}
