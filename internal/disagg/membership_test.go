package disagg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// TestRouterMembership: the router's node lists change at run time
// (SetNodes, from cluster membership). A node out of the set takes no
// request; with no prefill or no decode node a request fails as
// overloaded; a request in flight on a decode node that leaves ends with
// an error at once (its tokens held back here so that it is surely in
// flight) and the node frees its pages; a node that rejoins is in
// rotation again.
func TestRouterMembership(t *testing.T) {
	var holding sync.Map // tenant → true: decode-1 withholds its tokens and result
	l := startLocal(t, LocalConfig{Prefill: 2, Decode: 2, Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
		if name != "decode-1" {
			return tr
		}
		return &faulty{Transport: tr, name: name, victim: "victim", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
			switch m.(type) {
			case *transfer.Tokens, *transfer.Result:
				if _, ok := holding.Load("victim"); ok {
					return nil
				}
			}
			return keep(m)
		}}
	}})
	ps := prompts(t, l)
	p0, p1, d0, d1 := transfer.Peer("prefill-0"), transfer.Peer("prefill-1"), transfer.Peer("decode-0"), transfer.Peer("decode-1")
	started := func() (uint64, uint64) {
		return l.PrefillDrivers[0].Stats().Started, l.PrefillDrivers[1].Stats().Started
	}
	committed := func() (uint64, uint64) {
		return l.DecodeDrivers[0].Stats().Committed, l.DecodeDrivers[1].Stats().Committed
	}

	// Only prefill-0 and decode-0.
	l.SetNodes([]transfer.Peer{p0}, []transfer.Peer{d0})
	_, s1 := started()
	_, c1 := committed()
	for i := range 6 {
		if o := run(t, l, params(fmt.Sprint("t", i), ps[i%4], 4)); !o.res.Reason.Success() {
			t.Fatalf("request %d: %+v", i, o.res)
		}
	}
	if _, s := started(); s != s1 {
		t.Errorf("prefill-1, out of the set, started %d prefills", s-s1)
	}
	if _, c := committed(); c != c1 {
		t.Errorf("decode-1, out of the set, committed %d handoffs", c-c1)
	}

	// No node of a role: overloaded, at once.
	for _, tc := range []struct{ prefill, decode []transfer.Peer }{{nil, []transfer.Peer{d0}}, {[]transfer.Peer{p0}, nil}} {
		l.SetNodes(tc.prefill, tc.decode)
		if o := run(t, l, params("t", ps[1], 4)); !errors.Is(o.res.Err, request.ErrOverloaded) {
			t.Errorf("prefill %v, decode %v: %+v, want overloaded", tc.prefill, tc.decode, o.res)
		}
	}

	// A request in flight on decode-1 when it leaves.
	holding.Store("victim", true)
	l.SetNodes([]transfer.Peer{p1}, []transfer.Peer{d1})
	before := l.Stats().Committed
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := l.Submit(ctx, params("victim", ps[2], 8))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Stats().Committed == before {
		if time.Now().After(deadline) {
			t.Fatal("the victim's handoff did not commit")
		}
		time.Sleep(5 * time.Millisecond)
	}
	l.SetNodes([]transfer.Peer{p0, p1}, []transfer.Peer{d0})
	for range st.Tokens() {
		t.Error("a token reached the client from a withheld stream")
	}
	if res := st.Result(); res.Reason.Success() || res.Err == nil || !strings.Contains(res.Err.Error(), "decode-1") || !strings.Contains(res.Err.Error(), "left the cluster") {
		t.Fatalf("victim's result %+v, want an error naming decode-1 leaving", res)
	}
	holding.Delete("victim")
	if p, d := l.Nodes(); len(p) != 2 || len(d) != 1 || d[0] != d0 {
		t.Errorf("Nodes() = %v %v", p, d)
	}
	_, c1 = committed()
	for i := range 4 {
		if o := run(t, l, params(fmt.Sprint("u", i), ps[i%4], 4)); !o.res.Reason.Success() {
			t.Fatalf("after decode-1 left, request %d: %+v", i, o.res)
		}
	}
	if _, c := committed(); c != c1 {
		t.Errorf("decode-1 took %d requests after it left", c-c1)
	}

	// decode-1 rejoins: both take requests again.
	l.SetNodes([]transfer.Peer{p0, p1}, []transfer.Peer{d0, d1})
	c0, c1 := committed()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			if o := run(t, l, params(fmt.Sprint("v", i), ps[i%4], 8)); !o.res.Reason.Success() {
				t.Errorf("after the rejoin, request %d: %+v", i, o.res)
			}
		})
	}
	wg.Wait()
	if a, b := committed(); a == c0 || b == c1 {
		t.Errorf("after the rejoin, decode-0 took %d and decode-1 %d requests; want both some", a-c0, b-c1)
	}
	checkBaseline(t, l)
}

// TestRouterMembershipConcurrent: SetNodes races with Submit (run with
// -race): every request ends, with a success or an error, and every page
// comes back.
func TestRouterMembershipConcurrent(t *testing.T) {
	l := startLocal(t, LocalConfig{Prefill: 2, Decode: 2})
	ps := prompts(t, l)
	sets := [][2][]transfer.Peer{
		{{"prefill-0", "prefill-1"}, {"decode-0", "decode-1"}},
		{{"prefill-0"}, {"decode-1"}},
		{{"prefill-1"}, {"decode-0"}},
		{nil, {"decode-0"}},
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				l.SetNodes(sets[0][0], sets[0][1])
				return
			default:
			}
			s := sets[i%len(sets)]
			l.SetNodes(s[0], s[1])
			time.Sleep(2 * time.Millisecond)
		}
	})
	var reqs sync.WaitGroup
	for i := range 16 {
		reqs.Go(func() {
			o := run(t, l, params(fmt.Sprint("t", i%3), ps[i%len(ps)], 6))
			if !o.res.Reason.Success() && o.res.Err == nil {
				t.Errorf("request %d failed without an error: %+v", i, o.res)
			}
		})
	}
	reqs.Wait()
	close(stop)
	wg.Wait()
	checkBaseline(t, l)
}

// TestDecodePeerLeft: a decode node told that a peer left the cluster
// (its etcd lease expired) aborts at once every reservation that peer
// takes part in and has not committed: the victim's handoff, stalled at
// the prefill node (its pages, manifest, commit and heartbeats withheld,
// and the lease long, so that nothing else could end it), ends with an
// error at the gateway naming the lease, and the pages come back. The
// router is not told (SetNodes): the decode node's own reaction is what
// is tested. Other tenants' requests, and other peers, are untouched.
func TestDecodePeerLeft(t *testing.T) {
	for _, left := range []transfer.Peer{"prefill-0", "gateway"} {
		t.Run(string(left), func(t *testing.T) {
			var holding sync.Map
			cfg := LocalConfig{Prefill: 1, Decode: 1, Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
				if name != "prefill-0" {
					return tr
				}
				return &faulty{Transport: tr, name: name, victim: "victim", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
					if _, ok := holding.Load("victim"); ok && to == "decode-0" {
						return nil
					}
					return keep(m)
				}}
			}}
			cfg.Decoder.Receiver.LeaseTTL = transfer.Duration(time.Hour)
			cfg.Decoder.Receiver.MaxLease = transfer.Duration(time.Hour)
			l := startLocal(t, cfg)
			ps := prompts(t, l)
			d := l.DecodeDrivers[0]
			if n := d.PeerLeft("prefill-0"); n != 0 {
				t.Fatalf("PeerLeft with nothing in flight aborted %d reservations", n)
			}

			holding.Store("victim", true)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			st, err := l.Submit(ctx, params("victim", ps[2], 8))
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(20 * time.Second)
			for l.PrefillDrivers[0].Stats().Started == 0 || d.Stats().Receiver.Live != 1 {
				if time.Now().After(deadline) {
					t.Fatalf("the victim's prefill did not start (%d live reservations at decode-0)", d.Stats().Receiver.Live)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if n := d.PeerLeft("prefill-1"); n != 0 {
				t.Errorf("a peer the victim does not use left: %d reservations aborted", n)
			}
			if n := d.PeerLeft(left); n != 1 {
				t.Fatalf("PeerLeft(%s) aborted %d reservations, want 1", left, n)
			}
			done := make(chan request.Result, 1)
			go func() {
				for range st.Tokens() {
					t.Error("a token of an aborted handoff reached the client")
				}
				done <- st.Result()
			}()
			select {
			case res := <-done:
				if res.Reason.Success() || res.Err == nil || !strings.Contains(res.Err.Error(), transfer.ReasonLeaseExpired.String()) {
					t.Errorf("victim's result %+v, want an error naming the expired lease", res)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the victim's request did not end after its peer left")
			}
			holding.Delete("victim")
			checkBaseline(t, l)
			// The receiver's counters are published after each input's
			// effects, which may trail the gateway's view by a tick.
			for st := d.Stats(); st.Failed != 1 || st.Receiver.Aborted != 1 || st.Receiver.PagesQuarantined != 0 || st.Receiver.Live != 0; st = d.Stats() {
				if time.Now().After(deadline) {
					t.Fatalf("decode-0: %+v; want one failed handoff, one aborted reservation, none live or quarantined", st)
				}
				time.Sleep(5 * time.Millisecond)
			}
			// Nothing else was harmed: the same nodes serve.
			if o := run(t, l, params("other", ps[1], 4)); !o.res.Reason.Success() {
				t.Fatalf("after %s left: %+v", left, o.res)
			}
			checkBaseline(t, l)
		})
	}
}
