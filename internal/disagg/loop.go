package disagg

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
)

// loop is what the decode and prefill drivers share: one goroutine that
// owns a protocol core and takes, one at a time, what arrives on the link,
// results posted by the driver's own goroutines, and the clock's ticks.
type loop struct {
	tickEvery time.Duration
	clock     func() time.Time
	log       *slog.Logger
	events    chan func()
	wg        sync.WaitGroup // the driver's goroutines, waited for on exit
	// done is closed when run returns: what is posted after that is
	// dropped, never left waiting.
	done chan struct{}
}

func newLoop(tickEvery time.Duration, clock func() time.Time, log *slog.Logger) *loop {
	if tickEvery <= 0 {
		tickEvery = 100 * time.Millisecond
	}
	if clock == nil {
		clock = time.Now
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &loop{tickEvery: tickEvery, clock: clock, log: log, events: make(chan func(), 64), done: make(chan struct{})}
}

// handlers are a driver's reactions; after runs after each input.
type handlers struct {
	inbound func(context.Context, link.Inbound)
	tick    func(time.Time)
	after   func(context.Context)
	stop    func() // the link or ctx ended: end everything the driver started
}

// run takes inputs until ctx ends or the inbox closes, then stops the
// driver's work and waits for its goroutines.
func (l *loop) run(ctx context.Context, inbox <-chan link.Inbound, h handlers) error {
	tick := time.NewTicker(l.tickEvery)
	defer tick.Stop()
	defer close(l.done)
	defer l.wg.Wait()
	for {
		select {
		case <-ctx.Done():
			h.stop()
			return nil
		case in, ok := <-inbox:
			if !ok {
				// The link is gone: nobody can send the pages or take
				// the tokens. Ending everything frees every page.
				h.stop()
				return nil
			}
			h.inbound(ctx, in)
		case f := <-l.events:
			f()
		case now := <-tick.C:
			h.tick(now)
		}
		h.after(ctx)
	}
}

// post runs f on the loop, unless the loop has stopped.
func (l *loop) post(ctx context.Context, f func()) {
	select {
	case l.events <- f:
	case <-ctx.Done():
	case <-l.done:
	}
}

// do runs f on the loop and waits for it; it reports false if the loop
// stopped first (f did not run, or its effects may not have been carried
// out).
func (l *loop) do(f func()) bool {
	ran := make(chan struct{})
	l.post(context.Background(), func() {
		f()
		close(ran)
	})
	select {
	case <-ran:
		return true
	case <-l.done:
		return false
	}
}
