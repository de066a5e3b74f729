package link

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/syncbuf"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

var kinds = []string{"inproc", "grpc"}

func testRef() transfer.Ref {
	o := request.Owner{Tenant: "org_1"}
	o.ID[0], o.ID[15] = 0x42, 0xa5
	return transfer.Ref{ID: transfer.ReservationID{Incarnation: 0xfeed, Seq: 3}, Owner: o, Epoch: 2}
}

func pageData(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 1)
	}
	return b
}

type hop struct {
	from, to transfer.Peer
	msg      transfer.Message
}

// handoffHops is every message type the protocol has (but Hello, which
// only the handshake sends), each on a path the policy allows, in an order
// that opens each link from the side that can dial: on gRPC the gateway
// listens for nobody and is answered on the links it opened.
func handoffHops() []hop {
	ref := testRef()
	l := testLayout()
	job := transfer.Job{
		Prompt: []int{1, 200, 3, 1<<31 - 1}, MaxTokens: 30,
		Sampling:   request.Sampling{Temperature: 0.7, TopK: 40, TopP: 0.9, MinP: 0.05, RepetitionPenalty: 1.1, Seed: 1<<64 - 1},
		StopTokens: []int{2, 7}, CacheSalt: "salt", Priority: -3,
	}
	return []hop{
		{gw, dc, &transfer.Reserve{Owner: ref.Owner, Epoch: ref.Epoch, PromptTokens: 40, MaxNewTokens: 8, Sender: pf}},
		{dc, gw, &transfer.Grant{Ref: ref, PageCount: 3, PromptTokens: 40, MaxNewTokens: 8, LeaseTTL: 5 * transfer.Second}},
		{gw, pf, &transfer.Grant{Ref: ref, PageCount: 3, PromptTokens: 40, MaxNewTokens: 8, LeaseTTL: 5 * transfer.Second}},
		{pf, dc, &transfer.Page{Ref: ref, Index: 0, Filled: 16, Data: pageData(256)}},
		{pf, dc, &transfer.Heartbeat{Ref: ref}},
		{pf, dc, &transfer.Page{Ref: ref, Index: 2, Filled: 8, Data: pageData(128)}},
		{pf, dc, &transfer.Manifest{Ref: ref, Layout: l.Hash(), PageCount: 3, Filled: []int{16, 16, 8}, TotalTokens: 40,
			PageDigests: [][32]byte{{1}, {2}, {3}}, FirstToken: 42}},
		{pf, dc, &transfer.Commit{Ref: ref}},
		{dc, pf, &transfer.Committed{Ref: ref}},
		{dc, gw, &transfer.Committed{Ref: ref}},
		{gw, dc, &transfer.Abort{Ref: ref, Reason: transfer.ReasonAborted}},
		{dc, gw, &transfer.AbortAck{Ref: ref, Drained: true}},
		{dc, pf, &transfer.Abort{Ref: ref, Reason: transfer.ReasonDigestMismatch}},
		{pf, dc, &transfer.AbortAck{Ref: ref, Drained: false}},
		{pf, gw, &transfer.Abort{Ref: ref, Reason: transfer.ReasonPrefillFailed}},
		{gw, pf, &transfer.AbortAck{Ref: ref, Drained: true}},
		{gw, pf, &transfer.Abort{Ref: ref, Reason: transfer.ReasonShutdown}},
		{pf, gw, &transfer.AbortAck{Ref: ref, Drained: true}},
		// The request plane.
		{gw, dc, &transfer.Generate{Reserve: transfer.Reserve{Owner: ref.Owner, Epoch: ref.Epoch, PromptTokens: 4, MaxNewTokens: 30, Sender: pf}, Job: job}},
		{gw, pf, &transfer.Prefill{Grant: transfer.Grant{Ref: ref, PageCount: 1, PromptTokens: 4, MaxNewTokens: 30, LeaseTTL: transfer.Second}, Decode: dc, Job: job}},
		{dc, gw, &transfer.Tokens{Ref: ref, Start: 17, IDs: []int{0, 5, 1<<31 - 1}}},
		{dc, gw, &transfer.Result{Ref: ref, Reason: request.FinishStop, Usage: request.Usage{PromptTokens: 4, CompletionTokens: 9, CachedTokens: 2}}},
		{pf, gw, &transfer.Result{Ref: ref, Reason: request.FinishError, Code: transfer.CodeHandoff, Handoff: transfer.ReasonPageCountMismatch}},
		// The load plane.
		{gw, dc, &transfer.LoadQuery{Seq: 3}},
		{dc, gw, &transfer.Load{Seq: 3, UsablePages: 40, FreePages: 20, CachedPages: 4, Queued: 1, Running: 2}},
		{gw, pf, &transfer.LoadQuery{Seq: 4}},
		{pf, gw, &transfer.Load{Seq: 4, UsablePages: 10, FreePages: 10}},
	}
}

// TestRoundTrip sends every message type over each transport and checks
// that it arrives equal, with the sender's authenticated identity.
func TestRoundTrip(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			c := newCluster(t, kind)
			c.standard(Options{})
			seen := map[transfer.MsgType]bool{}
			for _, h := range handoffHops() {
				send(t, c.nodes[h.from], h.to, h.msg)
				in := recv(t, c.nodes[h.to])
				if in.Down != nil {
					t.Fatalf("%v %s→%s: link down: %v", h.msg.Type(), h.from, h.to, in.Down)
				}
				if want := (Identity{Name: h.from, Role: roleOf(h.from)}); in.From != want {
					t.Errorf("%v from %v, want %v", h.msg.Type(), in.From, want)
				}
				if d := cmp.Diff(h.msg, in.Msg); d != "" {
					t.Errorf("%v %s→%s (-sent +received):\n%s", h.msg.Type(), h.from, h.to, d)
				}
				seen[h.msg.Type()] = true
			}
			for mt := transfer.MsgReserve; mt.String() != fmt.Sprintf("MsgType(%d)", uint8(mt)); mt++ {
				if !seen[mt] {
					t.Errorf("no %v in the round trip", mt)
				}
			}
			for name, tr := range c.nodes {
				quiet(t, tr)
				if s := stats(tr); s.Refused != 0 {
					t.Errorf("%s refused %d", name, s.Refused)
				}
			}
		})
	}
}

// TestSendDoesNotRetain: the caller may reuse a page's buffer as soon as
// Send returns.
func TestSendDoesNotRetain(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			c := newCluster(t, kind)
			c.standard(Options{})
			data := pageData(64)
			want := bytes.Clone(data)
			send(t, c.nodes[pf], dc, &transfer.Page{Ref: testRef(), Index: 1, Filled: 16, Data: data})
			clear(data)
			in := recv(t, c.nodes[dc])
			if p, ok := in.Msg.(*transfer.Page); !ok || !bytes.Equal(p.Data, want) {
				t.Fatalf("got %+v, want the page as sent", in.Msg)
			}
		})
	}
}

// TestHelloMismatch: nodes whose layouts or limits differ never exchange a
// message, and both ends name the difference.
func TestHelloMismatch(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			c := newCluster(t, kind)
			var log syncbuf.Buffer
			c.listener(dc)
			decode := c.add(helloOf(dc, transfer.RoleDecode), Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
			l := testLayout()
			l.PageSize = 32
			prefill := c.add(transfer.NewHello(pf, transfer.RolePrefill, l), Options{})

			err := prefill.Send(t.Context(), dc, &transfer.Heartbeat{Ref: testRef()})
			var pm *transfer.PeerMismatch
			if !errors.As(err, &pm) || !errors.Is(err, ErrHandshake) {
				t.Fatalf("send: %v, want a handshake error with a *transfer.PeerMismatch", err)
			}
			if d := cmp.Diff(transfer.PeerMismatch{Field: "page size", Local: "32", Remote: "16"}, *pm); d != "" {
				t.Errorf("mismatch (-want +got):\n%s", d)
			}
			// Close waits for the decode node's side of the handshake.
			decode.Close()
			if s := stats(decode); s.Refused != 1 || s.Received != 0 || s.LinksUp != 0 {
				t.Errorf("decode stats %+v, want one refusal and nothing received", s)
			}
			if !strings.Contains(log.String(), "page size: local 16, remote 32") {
				t.Errorf("decode's log does not name the difference:\n%s", log.String())
			}
			for in := range decode.Inbox() {
				t.Errorf("decode received %+v", in)
			}
			quiet(t, prefill)
		})
	}
}

// TestPolicyRefused: a node with a valid certificate of the wrong role
// cannot reserve, send pages or abort. The message is refused at the link
// (counted and logged), never delivered, and the link is closed.
func TestPolicyRefused(t *testing.T) {
	ref := testRef()
	cases := []struct {
		name string
		from transfer.Peer
		msg  transfer.Message
	}{
		{"prefill reserves", pf, &transfer.Reserve{Owner: ref.Owner, Epoch: 1, PromptTokens: 4, MaxNewTokens: 4, Sender: pf}},
		{"decode reserves", dc2, &transfer.Reserve{Owner: ref.Owner, Epoch: 1, PromptTokens: 4, MaxNewTokens: 4, Sender: pf}},
		{"gateway sends a page", gw, &transfer.Page{Ref: ref, Index: 0, Filled: 16, Data: pageData(64)}},
		{"decode sends a page", dc2, &transfer.Page{Ref: ref, Index: 0, Filled: 16, Data: pageData(64)}},
		{"gateway commits", gw, &transfer.Commit{Ref: ref}},
		{"gateway sends a manifest", gw, &transfer.Manifest{Ref: ref, PageCount: 0}},
		{"decode aborts at decode", dc2, &transfer.Abort{Ref: ref, Reason: transfer.ReasonAborted}},
		{"prefill grants", pf, &transfer.Grant{Ref: ref, PageCount: 1}},
		{"prefill says committed", pf, &transfer.Committed{Ref: ref}},
	}
	for _, kind := range kinds {
		for _, tc := range cases {
			t.Run(kind+"/"+tc.name, func(t *testing.T) {
				c := newCluster(t, kind)
				var log syncbuf.Buffer
				c.listener(dc)
				decode := c.add(helloOf(dc, transfer.RoleDecode), Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
				impostor := c.add(helloOf(tc.from, roleOf(tc.from)), Options{})
				// Send may return before the refusal (the link took the
				// frame); what matters is what decode delivers.
				_ = impostor.Send(t.Context(), dc, tc.msg)
				in := down(t, decode)
				if !errors.Is(in.Down, ErrPolicy) || in.From.Name != tc.from {
					t.Errorf("decode: %v from %v, want a policy refusal from %s", in.Down, in.From, tc.from)
				}
				if s := stats(decode); s.Refused != 1 || s.Received != 0 {
					t.Errorf("decode stats %+v, want one refusal, nothing received", s)
				}
				if !strings.Contains(log.String(), "may not send "+tc.msg.Type().String()) {
					t.Errorf("decode's log does not say what was refused:\n%s", log.String())
				}
				// The impostor's link is gone too.
				down(t, impostor)
			})
		}
	}
}

// TestPeerDown: a peer that goes away is reported in the inbox, after
// what it sent, and Send to it fails.
func TestPeerDown(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			c := newCluster(t, kind)
			c.standard(Options{})
			prefill, decode := c.nodes[pf], c.nodes[dc]
			send(t, prefill, dc, &transfer.Heartbeat{Ref: testRef()})
			send(t, decode, pf, &transfer.Abort{Ref: testRef()})
			if in := recv(t, decode); in.Msg == nil {
				t.Fatalf("decode got %+v, want the heartbeat", in)
			}
			if in := recv(t, prefill); in.Msg == nil {
				t.Fatalf("prefill got %+v, want the abort", in)
			}
			decode.Close()
			if in := down(t, prefill); in.From.Name != dc {
				t.Errorf("PeerDown from %v, want %s", in.From, dc)
			}
			// Both links with decode (each side dialled one) end; until
			// the second's reader has noticed, a Send on it could still
			// be accepted by the stream (gRPC buffers it): CI saw that.
			linksGone(t, prefill)
			err := prefill.Send(t.Context(), dc, &transfer.Heartbeat{Ref: testRef()})
			if err == nil {
				t.Fatal("send to a closed node succeeded")
			}
			if !errors.Is(err, ErrPeerDown) && !errors.Is(err, ErrNoRoute) {
				t.Errorf("send to a closed node: %v, want ErrPeerDown or ErrNoRoute", err)
			}
			if err := decode.Send(t.Context(), pf, &transfer.Abort{Ref: testRef()}); !errors.Is(err, ErrClosed) {
				t.Errorf("send from a closed transport: %v, want ErrClosed", err)
			}
		})
	}
}

// TestConnectionCut: a connection cut mid-stream (a crashed host, a broken
// network) is a PeerDown at both ends, and the next Send opens a new link.
func TestConnectionCut(t *testing.T) {
	c := newCluster(t, "grpc")
	c.standard(Options{})
	prefill, decode := c.nodes[pf], c.nodes[dc]
	send(t, prefill, dc, &transfer.Page{Ref: testRef(), Index: 0, Filled: 16, Data: pageData(4096)})
	recv(t, decode)
	c.lns[dc].cut()
	if in := down(t, decode); in.From.Name != pf {
		t.Errorf("decode: PeerDown from %v", in.From)
	}
	if in := down(t, prefill); in.From.Name != dc {
		t.Errorf("prefill: PeerDown from %v", in.From)
	}
	send(t, prefill, dc, &transfer.Page{Ref: testRef(), Index: 1, Filled: 16, Data: pageData(4096)})
	if in := recv(t, decode); in.Msg == nil || in.Msg.Type() != transfer.MsgPage {
		t.Fatalf("after the cut: %+v, want the page on a new link", in)
	}
	if s := stats(decode); s.LinksUp != 2 || s.LinksDown != 1 || s.Links != 1 {
		t.Errorf("decode stats %+v, want 2 links up, 1 down, 1 open", s)
	}
}

// TestBackpressure: a receiver that does not read holds the sender back;
// what is buffered stays bounded, and a Send whose context ends while it
// waits closes the link and reports it at both ends.
func TestBackpressure(t *testing.T) {
	t.Run("inproc", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			nw := NewNetwork()
			decode, err := nw.Join(helloOf(dc, transfer.RoleDecode), Options{InboxSize: 2})
			if err != nil {
				t.Fatal(err)
			}
			prefill, err := nw.Join(helloOf(pf, transfer.RolePrefill), Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer decode.Close()
			defer prefill.Close()
			ctx, cancel := context.WithCancel(t.Context())
			var (
				sent int
				err2 error
			)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for err2 == nil {
					if err2 = prefill.Send(ctx, dc, &transfer.Heartbeat{Ref: testRef()}); err2 == nil {
						sent++
					}
				}
			}()
			synctest.Wait()
			// The inbox, the pipe and the frame the reader holds.
			if want := 2 + pipeDepth + 1; sent != want {
				t.Errorf("%d sends went through to a receiver that does not read, want %d", sent, want)
			}
			cancel()
			<-done
			if !errors.Is(err2, ErrPeerDown) || !errors.Is(err2, context.Canceled) {
				t.Errorf("blocked send: %v, want ErrPeerDown wrapping context.Canceled", err2)
			}
			// Decode gets every frame the link took before it closed, as
			// from a network stream, then the PeerDown.
			got := 0
			for in := range decode.Inbox() {
				if in.Down != nil {
					break
				}
				got++
			}
			if got != sent {
				t.Errorf("decode got %d messages before the PeerDown, want the %d sent", got, sent)
			}
			if in := <-prefill.Inbox(); in.Down == nil {
				t.Fatalf("prefill got %+v, want a PeerDown", in)
			}
		})
	})
	t.Run("grpc", func(t *testing.T) {
		c := newCluster(t, "grpc")
		c.listener(dc)
		decode := c.add(helloOf(dc, transfer.RoleDecode), Options{InboxSize: 1})
		prefill := c.add(helloOf(pf, transfer.RolePrefill), Options{})
		page := &transfer.Page{Ref: testRef(), Index: 0, Filled: 16, Data: pageData(256 << 10)}
		// gRPC's windows and the sockets' buffers hold a few MiB; 64 MiB
		// would be a receiver that lets memory grow.
		const limit = 256
		var err error
		sent := 0
		for ; sent < limit; sent++ {
			// The first Send also dials and handshakes: on a loaded
			// machine that alone can take more than the 500 ms that
			// says a send is blocked.
			wait := 500 * time.Millisecond
			if sent == 0 {
				wait = 10 * time.Second
			}
			ctx, cancel := context.WithTimeout(t.Context(), wait)
			err = prefill.Send(ctx, dc, page)
			cancel()
			if err != nil {
				break
			}
		}
		if sent == limit {
			t.Fatalf("%d pages of 256 KiB went to a receiver that does not read", limit)
		}
		t.Logf("%d pages of 256 KiB buffered before Send blocked", sent)
		if !errors.Is(err, ErrPeerDown) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("blocked send: %v, want ErrPeerDown wrapping the deadline", err)
		}
		down(t, prefill)
		for {
			in := recv(t, decode)
			if in.Down != nil {
				break
			}
		}
	})
}

// TestInprocLifecycle runs a handoff's messages and a close in a synctest
// bubble: every goroutine the transport started has ended when the
// bubble does (synctest fails the test otherwise).
func TestInprocLifecycle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		nw := NewNetwork()
		nodes := map[transfer.Peer]*Inproc{}
		for _, n := range []transfer.Peer{gw, pf, dc} {
			tr, err := nw.Join(helloOf(n, roleOf(n)), Options{})
			if err != nil {
				t.Fatal(err)
			}
			nodes[n] = tr
		}
		if _, err := nw.Join(helloOf(dc, transfer.RoleDecode), Options{}); err == nil {
			t.Error("a second node named decode-1 joined")
		}
		for _, h := range handoffHops() {
			if err := nodes[h.from].Send(t.Context(), h.to, h.msg); err != nil {
				t.Fatal(err)
			}
			if in := <-nodes[h.to].Inbox(); in.Msg == nil {
				t.Fatalf("%+v", in)
			}
		}
		nodes[dc].Close()
		nodes[dc].Close() // idempotent
		for _, n := range []transfer.Peer{gw, pf} {
			if in := <-nodes[n].Inbox(); in.Down == nil || in.From.Name != dc {
				t.Errorf("%s: %+v, want PeerDown from decode", n, in)
			}
		}
		if _, ok := <-nodes[dc].Inbox(); ok {
			t.Error("a closed transport's inbox is open")
		}
		// The name is free again.
		again, err := nw.Join(helloOf(dc, transfer.RoleDecode), Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := nodes[pf].Send(t.Context(), dc, &transfer.Heartbeat{Ref: testRef()}); err != nil {
			t.Fatal(err)
		}
		if in := <-again.Inbox(); in.Msg == nil {
			t.Fatalf("%+v", in)
		}
		for _, tr := range []*Inproc{again, nodes[gw], nodes[pf]} {
			tr.Close()
		}
	})
}
