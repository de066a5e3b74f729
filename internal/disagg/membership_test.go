package disagg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/cluster"
	"github.com/pagewarden/pagewarden/internal/cluster/etcdtest"
	"github.com/pagewarden/pagewarden/internal/gateway"
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

// stalledLocal starts one prefill and one decode node whose prefill node
// withholds everything it sends the decode node about the victim tenant
// while holding is set (pages, manifest, commit, heartbeats), and whose
// decode node's leases are long: only a peer's leaving can end the
// victim's reservation.
func stalledLocal(t *testing.T) (*Local, *sync.Map) {
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
	return startLocal(t, cfg), &holding
}

// submitStalled submits the victim's request and returns once its
// reservation is live at decode-0 and its prefill started.
func submitStalled(t *testing.T, l *Local, holding *sync.Map, prompt []int) gateway.Stream {
	t.Helper()
	holding.Store("victim", true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	st, err := l.Submit(ctx, params("victim", prompt, 8))
	if err != nil {
		t.Fatal(err)
	}
	d := l.DecodeDrivers[0]
	deadline := time.Now().Add(20 * time.Second)
	for l.PrefillDrivers[0].Stats().Started == 0 || d.Stats().Receiver.Live != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the victim's prefill did not start (%d live reservations at decode-0)", d.Stats().Receiver.Live)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return st
}

// awaitReclaimed checks that the victim's request ended with an error
// naming the expired lease, that decode-0 aborted (not committed) its
// reservation and that every page came back; then that the nodes serve.
func awaitReclaimed(t *testing.T, l *Local, holding *sync.Map, st gateway.Stream, prompt []int) {
	t.Helper()
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
	case <-time.After(20 * time.Second):
		t.Fatal("the victim's request did not end after its peer left")
	}
	holding.Delete("victim")
	checkBaseline(t, l)
	// The receiver's counters are published after each input's effects,
	// which may trail the gateway's view by a tick.
	d := l.DecodeDrivers[0]
	deadline := time.Now().Add(10 * time.Second)
	for st := d.Stats(); st.Failed != 1 || st.Receiver.Aborted != 1 || st.Receiver.PagesQuarantined != 0 || st.Receiver.Live != 0; st = d.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("decode-0: %+v; want one failed handoff, one aborted reservation, none live or quarantined", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Nothing else was harmed: the same nodes serve.
	if o := run(t, l, params("other", prompt, 4)); !o.res.Reason.Success() {
		t.Fatalf("after the peer left: %+v", o.res)
	}
	checkBaseline(t, l)
}

// TestDecodePeerLeft: a decode node told that a peer left the cluster
// (its etcd lease expired) aborts at once every reservation that peer
// takes part in and has not committed: the victim's handoff, stalled at
// the prefill node (see stalledLocal: nothing else could end it), ends
// with an error at the gateway naming the lease, and the pages come back.
// The router is not told (SetNodes): the decode node's own reaction is
// what is tested. Other tenants' requests, and other peers, are
// untouched.
func TestDecodePeerLeft(t *testing.T) {
	for _, left := range []transfer.Peer{"prefill-0", "gateway"} {
		t.Run(string(left), func(t *testing.T) {
			l, holding := stalledLocal(t)
			ps := prompts(t, l)
			d := l.DecodeDrivers[0]
			if n := d.PeerLeft("prefill-0"); n != 0 {
				t.Fatalf("PeerLeft with nothing in flight aborted %d reservations", n)
			}
			st := submitStalled(t, l, holding, ps[2])
			if n := d.PeerLeft("prefill-1"); n != 0 {
				t.Errorf("a peer the victim does not use left: %d reservations aborted", n)
			}
			if n := d.PeerLeft(left); n != 1 {
				t.Fatalf("PeerLeft(%s) aborted %d reservations, want 1", left, n)
			}
			awaitReclaimed(t, l, holding, st, ps[1])
		})
	}
}

// TestDecodePeerLeftThroughEtcd: the same, with the prefill node's
// leaving as a real etcd tells it: registered on a lease (TTL 1s) and
// killed (its client closed without revoking), it leaves the member set
// when the lease expires, and the decode node, following the set as the
// decode role does (package cli), reclaims its reservation.
func TestDecodePeerLeftThroughEtcd(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	l, holding := stalledLocal(t)
	ps := prompts(t, l)
	dial := func(ttl time.Duration) *cluster.Client {
		c, err := cluster.Dial(t.Context(), cluster.Config{Endpoints: []string{srv.Endpoint}, TTL: ttl, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	layout := l.Decodes[0].HandoffLayout()
	member := func(name transfer.Peer, role transfer.Role) cluster.Member {
		h := transfer.NewHello(name, role, layout)
		return cluster.Member{Name: name, Role: role, Addr: "127.0.0.1:7000", LayoutHash: h.Hash, Limits: h.Limits,
			UsablePages: l.Decodes[0].SchedLimits().UsablePages, SafetyMargin: l.Decodes[0].SchedLimits().SafetyMargin}
	}
	pc := dial(time.Second)
	if _, err := pc.Register(t.Context(), member("prefill-0", transfer.RolePrefill)); err != nil {
		t.Fatal(err)
	}
	dc := dial(0)
	s, err := dc.Register(t.Context(), member("decode-0", transfer.RoleDecode))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan error, 1)
	var aborted atomic.Int64
	go func() {
		watched <- dc.Watch(ctx, func(v cluster.View) {
			for _, ch := range v.Changes {
				if ch.Kind == cluster.Left && ch.Member.Name != "decode-0" {
					aborted.Add(int64(l.DecodeDrivers[0].PeerLeft(ch.Member.Name)))
				}
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		<-watched
	})

	st := submitStalled(t, l, holding, ps[2])
	killed := time.Now()
	pc.Close() // no revoke: the lease is left to expire
	awaitReclaimed(t, l, holding, st, ps[1])
	t.Logf("reclaimed %v after the prefill node's etcd client died (lease TTL 1s)", time.Since(killed))
	if n := aborted.Load(); n != 1 {
		t.Errorf("PeerLeft from the watch aborted %d reservations, want 1", n)
	}
}
