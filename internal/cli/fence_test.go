package cli

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// fakeLink is a Transport whose inbox the test fills and whose sends it
// reads.
type fakeLink struct {
	in   chan link.Inbound
	mu   sync.Mutex
	sent []sentMsg
}

type sentMsg struct {
	to transfer.Peer
	m  transfer.Message
}

func (l *fakeLink) Send(_ context.Context, to transfer.Peer, m transfer.Message) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sent = append(l.sent, sentMsg{to, m})
	return nil
}
func (l *fakeLink) Inbox() <-chan link.Inbound { return l.in }
func (l *fakeLink) Close() error               { close(l.in); return nil }

func (l *fakeLink) taken() []sentMsg {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sentMsg(nil), l.sent...)
}

// TestFence: before the loss, work passes and is counted until the
// message that ends the node's part in it; after it, every Generate and
// Prefill is refused by the fence (an overload Result, which a gateway
// answers by trying the next decode node; an Abort) and
// never reaches the driver, while the messages of the work in flight
// still do; drain waits for what is held, within its timeout.
func TestFence(t *testing.T) {
	fl := &fakeLink{in: make(chan link.Inbound, 16)}
	f := newFence(fl, slog.New(slog.DiscardHandler))
	gw := link.Identity{Name: "gw", Role: transfer.RoleGateway}
	owner := func(id byte) request.Owner { return request.Owner{Tenant: "t", ID: request.ID{id}} }
	generate := func(id byte) link.Inbound {
		return link.Inbound{From: gw, Msg: &transfer.Generate{Reserve: transfer.Reserve{Owner: owner(id), Epoch: 7, PromptTokens: 3}, Job: transfer.Job{Prompt: []int{1, 2, 3}, MaxTokens: 4}}}
	}
	prefill := func(id byte) link.Inbound {
		return link.Inbound{From: gw, Msg: &transfer.Prefill{Grant: transfer.Grant{Ref: transfer.Ref{ID: transfer.ReservationID{Seq: 9}, Owner: owner(id), Epoch: 7}}, Decode: "d0"}}
	}
	next := func() link.Inbound {
		t.Helper()
		select {
		case in := <-f.Inbox():
			return in
		case <-time.After(5 * time.Second):
			t.Fatal("nothing reached the driver")
		}
		return link.Inbound{}
	}
	quiet := func() {
		t.Helper()
		select {
		case in := <-f.Inbox():
			t.Fatalf("%T reached the driver", in.Msg)
		case <-time.After(50 * time.Millisecond):
		}
	}
	ctx := t.Context()

	// Open: work passes and is held until its end.
	fl.in <- generate(1)
	fl.in <- prefill(2)
	next()
	next()
	if n := f.holding(); n != 2 {
		t.Fatalf("holding %d, want 2", n)
	}
	_ = f.Send(ctx, "gw", &transfer.Tokens{Ref: transfer.Ref{Owner: owner(1)}})
	_ = f.Send(ctx, "d0", &transfer.Page{Ref: transfer.Ref{Owner: owner(2)}})
	if n := f.holding(); n != 2 {
		t.Fatalf("tokens and pages ended work: holding %d", n)
	}
	_ = f.Send(ctx, "gw", &transfer.Result{Ref: transfer.Ref{Owner: owner(1)}})
	_ = f.Send(ctx, "d0", &transfer.Commit{Ref: transfer.Ref{Owner: owner(2)}})
	if n := f.holding(); n != 0 {
		t.Fatalf("holding %d after a Result and a Commit, want 0", n)
	}
	// An Abort that reaches a prefill node ends its part; on a decode node
	// only its Result does.
	fl.in <- prefill(3)
	fl.in <- link.Inbound{From: gw, Msg: &transfer.Abort{Ref: transfer.Ref{Owner: owner(3)}, Reason: transfer.ReasonAborted}}
	fl.in <- generate(4)
	fl.in <- link.Inbound{From: gw, Msg: &transfer.Abort{Ref: transfer.Ref{Owner: owner(4)}, Reason: transfer.ReasonAborted}}
	for range 4 {
		next()
	}
	if n := f.holding(); n != 1 {
		t.Fatalf("holding %d, want 1 (the decode request the gateway aborted, until its Result)", n)
	}
	_ = f.Send(ctx, "gw", &transfer.Load{Seq: 1, UsablePages: 100, FreePages: 60})
	if len(fl.taken()) != 5 || f.refused.Load() != 0 {
		t.Fatalf("the open fence refused: %v", fl.taken())
	}
	if l := fl.taken()[4].m.(*transfer.Load); l.FreePages != 60 {
		t.Errorf("the open fence changed a load answer: %+v", l)
	}

	// Closed: new work is refused, the work held still hears its messages.
	f.close()
	fl.in <- generate(5)
	fl.in <- prefill(6)
	// The refusals come from the fence's own goroutine: wait for them
	// (a fixed wait failed under load), then make sure nothing passed.
	for deadline := time.Now().Add(5 * time.Second); len(fl.taken()) < 7 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	quiet()
	sent := fl.taken()[5:]
	if len(sent) != 2 {
		t.Fatalf("refusals sent: %v", sent)
	}
	if r, ok := sent[0].m.(*transfer.Result); !ok || sent[0].to != "gw" || r.Owner != owner(5) || r.Epoch != 7 || r.Reason != request.FinishError ||
		!errors.Is(r.Code.Err(), request.ErrOverloaded) || r.Usage.PromptTokens != 3 {
		t.Errorf("refused Generate answered %+v to %s", sent[0].m, sent[0].to)
	}
	if a, ok := sent[1].m.(*transfer.Abort); !ok || sent[1].to != "gw" || a.Ref != (transfer.Ref{ID: transfer.ReservationID{Seq: 9}, Owner: owner(6), Epoch: 7}) || a.Reason != transfer.ReasonPrefillFailed {
		t.Errorf("refused Prefill answered %+v to %s", sent[1].m, sent[1].to)
	}
	if f.refused.Load() != 2 || f.holding() != 1 {
		t.Errorf("refused %d, holding %d; want 2 and 1", f.refused.Load(), f.holding())
	}
	// Its load answers say it has no room (the rest as the node says).
	_ = f.Send(ctx, "gw", &transfer.Load{Seq: 3, UsablePages: 100, FreePages: 60, CachedPages: 10, Queued: 1, Running: 2})
	if got := fl.taken()[len(fl.taken())-1].m; got.(*transfer.Load).Room() != 0 || *got.(*transfer.Load) != (transfer.Load{Seq: 3, UsablePages: 100, Queued: 1, Running: 2}) {
		t.Errorf("a closed fence's load answer: %+v", got)
	}
	fl.in <- link.Inbound{From: gw, Msg: &transfer.Abort{Ref: transfer.Ref{Owner: owner(4)}, Reason: transfer.ReasonAborted}}
	fl.in <- link.Inbound{From: gw, Down: link.ErrPeerDown}
	if in := next(); in.Msg == nil {
		t.Fatal("the in-flight request's Abort did not reach the driver")
	}
	if in := next(); in.Down == nil {
		t.Fatal("a link-down event did not reach the driver")
	}

	// drain: bounded while work is held, at once when it ends.
	start := time.Now()
	if n := f.drain(ctx, 100*time.Millisecond); n != 1 || time.Since(start) < 100*time.Millisecond {
		t.Errorf("drain returned %d after %v, want 1 after the timeout", n, time.Since(start))
	}
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = f.Send(ctx, "gw", &transfer.Result{Ref: transfer.Ref{Owner: owner(4)}, Reason: request.FinishError})
	}()
	start = time.Now()
	if n := f.drain(ctx, 10*time.Second); n != 0 || time.Since(start) > 5*time.Second {
		t.Errorf("drain returned %d after %v, want 0 once the Result went", n, time.Since(start))
	}

	// Once the driver stopped reading, the pump does not hold the link.
	f.detach()
	fl.in <- generate(7)
	fl.in <- link.Inbound{From: gw, Down: link.ErrPeerDown}
	fl.Close()
	select {
	case _, ok := <-f.Inbox():
		for ok {
			_, ok = <-f.Inbox()
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the fence's inbox did not close after the transport's")
	}
}
