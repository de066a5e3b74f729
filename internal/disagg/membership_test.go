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
