package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// errFenced is why a node that lost its etcd registration refuses new
// work. It is an overload refusal (a 503 if it reaches a client) because
// that is the refusal a gateway answers by trying the next decode node:
// the request moves to a node the cluster still holds.
var errFenced = fmt.Errorf("%w: this node lost its cluster registration and is draining", request.ErrOverloaded)

// fence stands between a node's transport and its driver (disagg.Decode
// or disagg.Prefill). Until it is closed it passes everything through and
// counts the work the node holds; once closed — the node's etcd
// registration was lost, so the cluster holds the node gone — it answers
// each new piece of work itself, with the refusal the driver would send
// for work it cannot take (a Result with an error for a Generate, an Abort
// for a Prefill), so that the driver starts nothing new, while every
// message of the work already in flight (pages, manifests, commits,
// aborts, acknowledgements, link-down events) still reaches the driver,
// which lets that work end by the protocol: completed, or aborted by a
// gateway that failed it.
//
// A piece of work is held from its Generate or Prefill until the driver
// sends what ends the node's part in it: a decode node's one Result; a
// prefill node's Commit or Abort, or an Abort that reaches it.
type fence struct {
	link.Transport
	inbox  chan link.Inbound
	log    *slog.Logger
	closed atomic.Bool
	// stop ends the pump when the driver no longer reads the inbox.
	stop     chan struct{}
	stopOnce sync.Once
	refused  atomic.Uint64

	mu   sync.Mutex
	held map[request.Owner]heldWork
}

// heldWork says which role took a piece of work, and so what ends it.
type heldWork uint8

const (
	heldDecode  heldWork = iota + 1 // ended by the Result the node sends
	heldPrefill                     // ended by a Commit or Abort either way
)

// refuseTimeout bounds how long the fence waits for a link to take a
// refusal: a peer that does not take it learns from its own timeouts.
const refuseTimeout = 5 * time.Second

func newFence(t link.Transport, log *slog.Logger) *fence {
	f := &fence{Transport: t, inbox: make(chan link.Inbound, 64), log: log, stop: make(chan struct{}), held: map[request.Owner]heldWork{}}
	go f.pump()
	return f
}

// Inbox is what the driver reads: the transport's inbox, less the new
// work the fence refused.
func (f *fence) Inbox() <-chan link.Inbound { return f.inbox }

func (f *fence) pump() {
	defer close(f.inbox)
	for in := range f.Transport.Inbox() {
		if in.Down == nil && f.intercept(in) {
			continue
		}
		select {
		case f.inbox <- in:
		case <-f.stop:
			return
		}
	}
}

// intercept records or refuses in; it reports whether in was refused
// (and so must not reach the driver).
func (f *fence) intercept(in link.Inbound) bool {
	switch m := in.Msg.(type) {
	case *transfer.Generate:
		if f.closed.Load() {
			res := &transfer.Result{Ref: transfer.Ref{Owner: m.Owner, Epoch: m.Epoch}, Reason: request.FinishError, Code: transfer.CodeOf(errFenced)}
			res.Usage.PromptTokens = len(m.Job.Prompt)
			f.refuse(in.From.Name, res)
			return true
		}
		f.hold(m.Owner, heldDecode)
	case *transfer.Prefill:
		if f.closed.Load() {
			f.refuse(in.From.Name, &transfer.Abort{Ref: m.Grant.Ref, Reason: transfer.ReasonPrefillFailed})
			return true
		}
		f.hold(m.Grant.Ref.Owner, heldPrefill)
	case *transfer.Abort:
		f.release(m.Owner, heldPrefill)
	}
	return false
}

func (f *fence) refuse(to transfer.Peer, m transfer.Message) {
	f.refused.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), refuseTimeout)
	defer cancel()
	if err := f.Transport.Send(ctx, to, m); err != nil {
		f.log.Debug("refusal not sent", "to", to, "type", m.Type(), "err", err)
	}
	f.log.Info("new work refused: this node lost its cluster registration", "from", to, "type", m.Type())
}

// Send passes m on, and ends the node's part in the work m finishes. A
// closed fence reports no room in the node's load answers, so that a
// gateway still routing here picks another decode node from its next
// load query on, rather than after a refusal.
func (f *fence) Send(ctx context.Context, to transfer.Peer, m transfer.Message) error {
	if l, ok := m.(*transfer.Load); ok && f.closed.Load() {
		full := *l
		full.FreePages, full.CachedPages = 0, 0
		m = &full
	}
	err := f.Transport.Send(ctx, to, m)
	switch m := m.(type) {
	case *transfer.Result:
		f.release(m.Owner, heldDecode)
	case *transfer.Commit:
		f.release(m.Owner, heldPrefill)
	case *transfer.Abort:
		f.release(m.Owner, heldPrefill)
	}
	return err
}

func (f *fence) hold(o request.Owner, w heldWork) {
	f.mu.Lock()
	f.held[o] = w
	f.mu.Unlock()
}

func (f *fence) release(o request.Owner, w heldWork) {
	f.mu.Lock()
	if f.held[o] == w {
		delete(f.held, o)
	}
	f.mu.Unlock()
}

// holding is how many pieces of work the node holds.
func (f *fence) holding() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.held)
}

// close refuses new work from now on.
func (f *fence) close() { f.closed.Store(true) }

// detach ends the pump once the driver stopped reading.
func (f *fence) detach() { f.stopOnce.Do(func() { close(f.stop) }) }

// drain waits until the node holds no work, within timeout, or until ctx
// ends; it returns how many pieces of work it still held.
func (f *fence) drain(ctx context.Context, timeout time.Duration) int {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for {
		if n := f.holding(); n == 0 {
			return 0
		}
		select {
		case <-poll.C:
		case <-deadline.C:
			return f.holding()
		case <-ctx.Done():
			return f.holding()
		}
	}
}

// errDrained says how a lost session's drain ended.
func errDrained(lost error, held int, took time.Duration) error {
	if held == 0 {
		return fmt.Errorf("%w; stopped taking work and drained what it held in %v", lost, took.Round(time.Millisecond))
	}
	return errors.Join(lost, fmt.Errorf("stopped taking work; %d requests still held after the drain (%v) were aborted", held, took.Round(time.Millisecond)))
}
