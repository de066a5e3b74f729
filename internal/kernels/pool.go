package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is a fixed set of worker goroutines that split index ranges among
// themselves. The workers live as long as the pool, so a Run costs one
// hand-off and one barrier, not a goroutine start per worker; that matters
// for the many sub-100µs operations of a decode step.
//
// Work is claimed, not assigned: a Run cuts [0, n) into a few more chunks
// than threads and the caller and the workers take chunks from a shared
// counter until none are left. A worker that is slow to be scheduled (its
// CPU briefly busy with something else) therefore costs the Run nothing: the
// caller does the chunks it would have done, and waits only for workers that
// actually took a chunk. A worker that wakes after its Run is over finds the
// Run's generation gone and goes back to sleep without touching anything.
// After a Run a worker polls for the next one for about a millisecond
// before it parks (decode issues Runs microseconds apart, and a parked
// goroutine on a virtual machine can take hundreds of them to wake), so an
// active pool keeps its workers' CPUs busy between Runs; an idle one
// costs nothing.
//
// A nil *Pool is valid and runs everything inline on the caller.
// Run may be called from several goroutines; a Run that finds the workers
// busy (another Run in progress, or a Run nested inside fn) executes inline
// on its caller rather than waiting, so it can never deadlock.
//
// A panic in fn on a worker is carried back and re-raised on the goroutine
// that called Run, after every chunk has finished: the caller (the
// scheduler's step) recovers it into an error for the requests of that step
// instead of the whole process dying on a worker goroutine nobody owns.
type Pool struct {
	threads int
	mu      sync.Mutex // held for the duration of a parallel Run
	work    []chan task
	// state packs the current Run's claim counter (see the st* constants)
	// so that claiming a chunk and registering as its runner are one atomic
	// step: the caller can never miss a worker that is inside a chunk.
	state   atomic.Uint64
	gen     uint32        // generation of the latest Run; guarded by mu
	done    chan struct{} // the last worker out signals a waiting caller
	panicMu sync.Mutex
	panic   any // first panic of the current Run on a worker; guarded by panicMu
	closed  atomic.Bool
	wg      sync.WaitGroup // workers alive

	// beforeClaim, when set (tests only, before the first Run), runs on a
	// worker after it wakes and before it claims, to simulate a worker whose
	// CPU is busy elsewhere.
	beforeClaim func()
}

// Layout of Pool.state: generation in the high 32 bits, then a flag set by
// a caller blocked waiting for workers, the number of workers inside a
// chunk, and the index of the next unclaimed chunk.
const (
	stNextBits   = 16
	stActiveBits = 15
	stNextMask   = 1<<stNextBits - 1
	stActiveOne  = 1 << stNextBits
	stActiveMask = (1<<stActiveBits - 1) << stNextBits
	stWaiting    = 1 << (stNextBits + stActiveBits)
	stGenShift   = 32

	// chunksPerThread bounds the chunks of a Run: more chunks balance a
	// late or slow thread better; each costs a claim (one CAS).
	chunksPerThread = 4
	maxThreads      = 1<<stActiveBits - 1
	maxChunks       = stNextMask

	// waitSpin is how long a caller polls for workers to leave their
	// chunks before it sleeps, and idleSpin how long a worker polls for a
	// next Run before it parks. On a virtual machine a parked goroutine's
	// CPU halts, and waking it (an inter-processor interrupt through the
	// hypervisor) took 100–300 µs on the 2-vCPU VMs this was measured on:
	// with the earlier bounds of a few thousand polls (10–100 µs), a
	// 16-sequence decode step parked the caller in a third of its 151 Runs
	// and the worker arrived 100–300 µs late to about 30 of them, nearly a
	// Run's length. Polling through decode's longest gap between Runs (the
	// ~1 ms between steps: sampling, page bookkeeping) keeps both awake
	// while a step is running; an idle pool still parks within a
	// millisecond.
	waitSpin = 250 * time.Microsecond
	idleSpin = time.Millisecond
	// yieldPolls is how many polls go between runtime.Gosched calls while
	// spinning, so that other goroutines of the process (HTTP handlers,
	// the scheduler) are not shut out of a CPU for a whole spin.
	yieldPolls = 1024
)

// task is one Run as a worker sees it; it travels by value so that a late
// worker never reads fields a later Run is writing.
type task struct {
	fn     func(lo, hi int)
	gen    uint32
	n      int // indices
	grain  int // chunk boundaries are multiples of grain
	units  int // ceil(n/grain)
	chunks int
}

// bounds returns chunk i's range: chunks differ by at most one grain.
func (t *task) bounds(i int) (lo, hi int) {
	lo = min(t.n, i*t.units/t.chunks*t.grain)
	hi = min(t.n, (i+1)*t.units/t.chunks*t.grain)
	return lo, hi
}

// NewPool starts a pool that runs work on threads goroutines: the caller of
// Run plus threads-1 workers. threads < 1 is treated as 1 (and more than
// 32767 as 32767).
func NewPool(threads int) *Pool {
	threads = max(1, min(threads, maxThreads))
	p := &Pool{threads: threads, done: make(chan struct{}, 1)}
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
	for {
		t, ok := p.next(ch)
		if !ok {
			return
		}
		if p.beforeClaim != nil {
			p.beforeClaim()
		}
		for {
			i, ok := p.claim(&t, stActiveOne)
			if !ok {
				break
			}
			lo, hi := t.bounds(i)
			if r := runShare(t.fn, lo, hi); r != nil {
				p.panicMu.Lock()
				if p.panic == nil {
					p.panic = r
				}
				p.panicMu.Unlock()
			}
			// Leave the chunk. The Run cannot have ended while we were
			// inside it, so the generation is still ours; if we are the
			// last one out and the caller sleeps, wake it.
			v := p.state.Add(^uint64(stActiveOne - 1))
			if v&stActiveMask == 0 && v&stWaiting != 0 {
				p.done <- struct{}{}
			}
		}
	}
}

// next waits for the worker's next task. Decode issues Runs a few µs apart,
// so the worker polls for a while before it parks: a parked goroutine takes
// from microseconds to a few hundred of them to wake (see idleSpin).
func (p *Pool) next(ch chan task) (task, bool) {
	for w := (poller{limit: idleSpin}); w.more(); {
		select {
		case t, ok := <-ch:
			return t, ok
		default:
		}
	}
	t, ok := <-ch
	return t, ok
}

// poller bounds a spin-wait by the clock: more reports whether to poll
// once more, yielding the processor every yieldPolls polls, until limit
// has passed since the first yield; from then on it stays false.
type poller struct {
	limit    time.Duration
	polls    int
	deadline time.Time
	expired  bool
}

func (w *poller) more() bool {
	w.polls++
	if w.polls%yieldPolls != 0 || w.expired {
		return !w.expired
	}
	return w.yield()
}

// yield is more's every yieldPolls-th poll, out of line so that more
// inlines into the polling loops.
func (w *poller) yield() bool {
	if w.deadline.IsZero() {
		w.deadline = time.Now().Add(w.limit)
	} else if time.Now().After(w.deadline) {
		w.expired = true
		return false
	}
	runtime.Gosched()
	return true
}

// claim takes the next chunk of Run t, adding active to the count of
// workers inside a chunk (the caller passes 0: it is never waited for). It
// fails when t's chunks are all taken or t is no longer the current Run.
func (p *Pool) claim(t *task, active uint64) (int, bool) {
	for {
		v := p.state.Load()
		i := int(v & stNextMask)
		if uint32(v>>stGenShift) != t.gen || i >= t.chunks {
			return 0, false
		}
		if p.state.CompareAndSwap(v, v+1+active) {
			return i, true
		}
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
// to Threads goroutines, and returns when all calls have returned. Each call
// gets at least one index; how many calls there are, which goroutine makes
// each and in what order is not specified (up to a few per thread). fn must
// be safe to run concurrently with itself on disjoint ranges, and must not
// depend on how [0, n) is split. With one thread, n <= 1, or the workers
// busy, Run is fn(0, n) inline.
func (p *Pool) Run(n int, fn func(lo, hi int)) {
	p.RunGrain(n, 1, fn)
}

// RunGrain is Run with a minimum share: each call gets a range that starts
// at a multiple of grain and holds at least grain indices (except the one
// that ends at n), so work too small to be worth a hand-off stays on the
// caller.
func (p *Pool) RunGrain(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	units := (n + grain - 1) / grain
	if units <= 1 || p.Threads() <= 1 || p.closed.Load() || !p.mu.TryLock() {
		fn(0, n)
		return
	}
	defer p.mu.Unlock()
	if p.closed.Load() {
		fn(0, n)
		return
	}
	t := task{fn: fn, n: n, grain: grain, units: units, chunks: min(units, chunksPerThread*p.threads, maxChunks)}
	p.gen++
	t.gen = p.gen
	// No worker is inside a chunk of the previous Run (its caller waited for
	// them all), and late ones compare generations, so a plain store is a
	// clean start.
	p.state.Store(uint64(t.gen) << stGenShift)
	// Wake only as many workers as there are chunks beyond the caller's
	// first.
	for _, ch := range p.work[:min(len(p.work), t.chunks-1)] {
		// A worker that has not yet taken its previous task is asleep or
		// late; replace that stale task rather than block on it. Only this
		// goroutine (holding mu) sends, so after the drain the send cannot
		// block.
		select {
		case ch <- t:
		default:
			select {
			case <-ch:
			default:
			}
			ch <- t
		}
	}
	var first any
	for {
		i, ok := p.claim(&t, 0)
		if !ok {
			break
		}
		lo, hi := t.bounds(i)
		if r := runShare(fn, lo, hi); r != nil && first == nil {
			first = r
		}
	}
	// Every chunk is claimed; wait for the workers still inside one. They
	// are at most one chunk from done, so poll up to waitSpin before
	// sleeping: waking a parked goroutine can cost more than a chunk.
	w := poller{limit: waitSpin}
	for {
		v := p.state.Load()
		if v&stActiveMask == 0 {
			break
		}
		if w.more() {
			continue
		}
		if p.state.CompareAndSwap(v, v|stWaiting) {
			<-p.done
			break
		}
	}
	p.panicMu.Lock()
	if first == nil {
		first = p.panic
	}
	p.panic = nil
	p.panicMu.Unlock()
	if first != nil {
		panic(first)
	}
}
