package disagg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// routerFor builds a router over named nodes whose load is set by hand;
// nothing is sent (pick* do not send).
func routerFor(t *testing.T, prefill, decode []transfer.Peer) *Router {
	t.Helper()
	rt, err := NewRouter(RouterConfig{Vocabulary: startSingle(t), Transport: struct{ link.Transport }{}, Prefill: prefill, Decode: decode})
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// nodeState is one node's load for the pick tests: its answer (nil: none
// yet), what this router sent it since, and whether it is silent or down.
type nodeState struct {
	load         *transfer.Load
	sincePages   int
	sinceReqs    int
	promised     int // rt.pages: worst-case pages of this router's requests there
	inFlight     int // rt.load: this router's requests there (prefill)
	silent, down bool
	tried        bool
}

func (rt *Router) setState(n transfer.Peer, s nodeState) {
	l := rt.loadOf(n)
	if s.load != nil {
		l.last, l.known = *s.load, true
	}
	l.pages, l.reqs = s.sincePages, s.sinceReqs
	if s.silent {
		l.asked = time.Now().Add(-2 * rt.cfg.SilentAfter)
	}
	if s.down {
		rt.down[n] = time.Now().Add(time.Hour)
	}
	rt.pages[n], rt.load[n] = s.promised, s.inFlight
}

func ld(free, cached, queued, running int) *transfer.Load {
	return &transfer.Load{UsablePages: 1000, FreePages: free, CachedPages: cached, Queued: queued, Running: running}
}

// TestPickDecodeByLoad: the decode node is one with room for the whole
// request by its own account (or no answer yet), the least busy, then the
// roomiest, then the one with the fewest promised pages; nodes with too
// little room come after, by promised pages; a silent or down node only
// when nothing else is left.
func TestPickDecodeByLoad(t *testing.T) {
	tests := []struct {
		name  string
		pages int // the request's worst case
		a, b  nodeState
		want  transfer.Peer
	}{
		{"room decides before work", 50, nodeState{load: ld(40, 0, 0, 0)}, nodeState{load: ld(100, 0, 0, 9)}, "b"},
		{"cached pages are room", 50, nodeState{load: ld(10, 45, 0, 0)}, nodeState{load: ld(100, 0, 0, 9)}, "a"},
		{"least busy", 10, nodeState{load: ld(100, 0, 1, 3)}, nodeState{load: ld(500, 0, 0, 2)}, "b"},
		{"queued counts as work", 10, nodeState{load: ld(100, 0, 4, 0)}, nodeState{load: ld(100, 0, 0, 3)}, "b"},
		{"equal work: most room", 10, nodeState{load: ld(100, 0, 0, 2)}, nodeState{load: ld(300, 0, 1, 1)}, "b"},
		{"sent since the answer is work", 10, nodeState{load: ld(100, 0, 0, 0), sinceReqs: 3}, nodeState{load: ld(100, 0, 0, 2)}, "b"},
		{"sent since the answer takes room", 50, nodeState{load: ld(100, 0, 0, 0), sincePages: 60}, nodeState{load: ld(60, 0, 0, 5)}, "b"},
		{"a node that just joined gets work at once", 10, nodeState{}, nodeState{load: ld(20, 0, 0, 8)}, "a"},
		{"no answer yet: its work is what was sent since", 10, nodeState{sinceReqs: 3}, nodeState{load: ld(20, 0, 0, 2)}, "b"},
		{"equal work, no answer counts as roomy", 10, nodeState{sinceReqs: 2}, nodeState{load: ld(900, 0, 0, 2)}, "a"},
		{"no answers: fewest promised pages", 10, nodeState{promised: 30}, nodeState{promised: 20}, "b"},
		{"nobody has room: fewest promised pages", 200, nodeState{load: ld(100, 0, 0, 0), promised: 5}, nodeState{load: ld(150, 0, 0, 0), promised: 9}, "a"},
		{"silent is out of rotation", 10, nodeState{load: ld(900, 0, 0, 0), silent: true}, nodeState{load: ld(20, 0, 0, 8)}, "b"},
		{"down is out of rotation", 10, nodeState{load: ld(900, 0, 0, 0), down: true}, nodeState{load: ld(20, 0, 0, 8)}, "b"},
		{"tried is never again", 10, nodeState{load: ld(900, 0, 0, 0), tried: true}, nodeState{load: ld(20, 0, 0, 8), silent: true}, "b"},
		{"only silent or down left: still tried", 10, nodeState{silent: true}, nodeState{down: true, promised: 5}, "a"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := routerFor(t, []transfer.Peer{"p"}, []transfer.Peer{"a", "b"})
			rt.setState("a", tc.a)
			rt.setState("b", tc.b)
			c := &call{pages: tc.pages, tried: map[transfer.Peer]bool{"a": tc.a.tried, "b": tc.b.tried}}
			if got, ok := rt.pickDecode(c); !ok || got != tc.want {
				t.Fatalf("pickDecode = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
	rt := routerFor(t, []transfer.Peer{"p"}, []transfer.Peer{"a"})
	if got, ok := rt.pickDecode(&call{pages: 1, tried: map[transfer.Peer]bool{"a": true}}); ok {
		t.Fatalf("every node tried: pickDecode = %q, want none", got)
	}
}

// TestPickPrefillByLoad: the prefill node with the least work by its own
// account (never less than this router's requests in flight there); the
// node that holds the prompt's prefix if it is within the slack.
func TestPickPrefillByLoad(t *testing.T) {
	prompt := make([]int, 40)
	for i := range prompt {
		prompt[i] = i + 3
	}
	p := request.Params{Owner: request.Owner{Tenant: "t"}, Prompt: prompt}
	tests := []struct {
		name     string
		a, b     nodeState
		affinity transfer.Peer
		want     transfer.Peer
	}{
		{"fewer queued", nodeState{load: ld(10, 0, 5, 1)}, nodeState{load: ld(10, 0, 1, 1)}, "", "b"},
		{"another gateway's work counts", nodeState{load: ld(10, 0, 6, 0), inFlight: 1}, nodeState{load: ld(10, 0, 0, 0), inFlight: 2}, "", "b"},
		{"own requests in flight count", nodeState{load: ld(10, 0, 0, 0), inFlight: 4}, nodeState{load: ld(10, 0, 2, 0), inFlight: 0}, "", "b"},
		{"prefix holder within the slack", nodeState{load: ld(10, 0, 2, 0)}, nodeState{load: ld(10, 0, 0, 0)}, "a", "a"},
		{"prefix holder too busy", nodeState{load: ld(10, 0, 9, 0)}, nodeState{load: ld(10, 0, 0, 0)}, "a", "b"},
		{"silent prefix holder", nodeState{load: ld(10, 0, 0, 0), silent: true}, nodeState{load: ld(10, 0, 1, 0)}, "a", "b"},
		{"all out of rotation: the first", nodeState{down: true}, nodeState{silent: true}, "", "a"},
	}
	// A node that refused this request is never picked for it again.
	rt := routerFor(t, []transfer.Peer{"a", "b"}, []transfer.Peer{"d"})
	rt.setState("a", nodeState{load: ld(10, 0, 0, 0)})
	rt.setState("b", nodeState{load: ld(10, 0, 9, 0)})
	for _, tc := range []struct {
		skip map[transfer.Peer]bool
		want transfer.Peer
	}{{nil, "a"}, {map[transfer.Peer]bool{"a": true}, "b"}, {map[transfer.Peer]bool{"a": true, "b": true}, ""}} {
		if got := rt.pickPrefill(p, tc.skip); got != tc.want {
			t.Errorf("pickPrefill skipping %v = %q, want %q", tc.skip, got, tc.want)
		}
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt := routerFor(t, []transfer.Peer{"a", "b"}, []transfer.Peer{"d"})
			rt.setState("a", tc.a)
			rt.setState("b", tc.b)
			if tc.affinity != "" {
				k, ok := prefixKey(p, rt.Limits().PageSize)
				if !ok {
					t.Fatal("no prefix key")
				}
				rt.affinity[k] = tc.affinity
			}
			if got := rt.pickPrefill(p, nil); got != tc.want {
				t.Fatalf("pickPrefill = %q, want %q", got, tc.want)
			}
		})
	}
}

// muteLoad drops a node's answers to load queries while mute is set.
type muteLoad struct {
	link.Transport
	mute *atomic.Bool
}

func (m muteLoad) Send(ctx context.Context, to transfer.Peer, msg transfer.Message) error {
	if _, ok := msg.(*transfer.Load); ok && m.mute.Load() {
		return nil
	}
	return m.Transport.Send(ctx, to, msg)
}

// TestLoadReports: in a running cluster every node answers the router's
// load queries with its pool's figures; a decode node that stops answering
// (its link still up) leaves rotation after SilentAfter, so new requests
// go to the other one, and comes back when it answers again.
func TestLoadReports(t *testing.T) {
	var mute atomic.Bool
	l := startLocal(t, LocalConfig{Prefill: 1, Decode: 2,
		Router: RouterConfig{LoadEvery: 20 * time.Millisecond, SilentAfter: 3 * time.Second},
		Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
			if name == "decode-0" {
				return muteLoad{tr, &mute}
			}
			return tr
		}})
	known := func(n transfer.Peer) (transfer.Load, bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if ld := l.loads[n]; ld != nil && ld.known {
			return ld.last, true
		}
		return transfer.Load{}, false
	}
	waitUntil := func(what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	nodes := map[transfer.Peer]int{"prefill-0": l.Prefills[0].SchedLimits().UsablePages,
		"decode-0": l.Decodes[0].SchedLimits().UsablePages, "decode-1": l.Decodes[1].SchedLimits().UsablePages}
	for n, usable := range nodes {
		waitUntil(string(n)+" answers", func() bool { ld, ok := known(n); return ok && ld.UsablePages == usable && ld.FreePages == usable })
	}

	committed := func(i int) uint64 { return l.DecodeDrivers[i].Stats().Committed }
	mute.Store(true)
	waitUntil("decode-0 is silent", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.silent("decode-0", time.Now())
	})
	c0, c1 := committed(0), committed(1)
	for i := range 6 {
		if o := run(t, l, params("t", []int{5, 6, 7, 8, 9}, 3)); !o.res.Reason.Success() {
			t.Fatalf("request %d with decode-0 silent: %+v", i, o.res)
		}
	}
	if got := committed(0) - c0; got != 0 {
		t.Errorf("silent decode-0 took %d handoffs", got)
	}
	if got := committed(1) - c1; got != 6 {
		t.Errorf("decode-1 took %d handoffs, want 6", got)
	}
	mute.Store(false)
	waitUntil("decode-0 answers again", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return !l.silent("decode-0", time.Now())
	})
	c0 = committed(0)
	for i := range 6 {
		if o := run(t, l, params("t", []int{5, 6, 7, 8, 9}, 3)); !o.res.Reason.Success() {
			t.Fatalf("request %d after decode-0 came back: %+v", i, o.res)
		}
	}
	if committed(0) == c0 {
		t.Error("decode-0, answering again, took no handoff")
	}
}

// refusePrefill makes a prefill node refuse every prompt it is sent, as a
// draining node does: the Prefill never reaches its driver, and the
// gateway gets an Abort (ReasonPrefillFailed) for the grant.
type refusePrefill struct {
	link.Transport
	in      chan link.Inbound
	refused atomic.Int64
	reason  transfer.Reason
	// viaDecode sends the Abort to the decode node only, which passes it
	// on to the gateway: a prefill node's own copy to the gateway can
	// come after that one (another link), or not at all.
	viaDecode atomic.Bool
}

func newRefusePrefill(t link.Transport) *refusePrefill {
	r := &refusePrefill{Transport: t, in: make(chan link.Inbound, 64), reason: transfer.ReasonPrefillFailed}
	go func() {
		defer close(r.in)
		for in := range t.Inbox() {
			if m, ok := in.Msg.(*transfer.Prefill); ok {
				r.refused.Add(1)
				to := in.From.Name
				if r.viaDecode.Load() {
					to = m.Decode
				}
				_ = t.Send(context.Background(), to, &transfer.Abort{Ref: m.Grant.Ref, Reason: r.reason})
				continue
			}
			r.in <- in
		}
	}()
	return r
}

func (r *refusePrefill) Inbox() <-chan link.Inbound { return r.in }

// TestPrefillRefusalMoves: a prompt refused by its prefill node before the
// handoff (a draining node does that) moves to the other prefill node with
// a new reservation, and the answer is the one a single node gives; with
// no other prefill node left it fails with an error naming the refusal.
// Every pool comes back.
func TestPrefillRefusalMoves(t *testing.T) {
	for _, viaDecode := range []bool{false, true} {
		t.Run(fmt.Sprint("via decode ", viaDecode), func(t *testing.T) { testPrefillRefusalMoves(t, viaDecode) })
	}
}

func testPrefillRefusalMoves(t *testing.T, viaDecode bool) {
	var refusing *refusePrefill
	l := startLocal(t, LocalConfig{Prefill: 2, Decode: 2, Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
		if name == "prefill-0" {
			refusing = newRefusePrefill(tr)
			refusing.viaDecode.Store(viaDecode)
			return refusing
		}
		return tr
	}})
	single := startSingle(t)
	prompt := []int{5, 6, 7, 8, 9, 10, 11}
	want := run(t, single, params("t", prompt, 6))
	for i := range 4 {
		got := run(t, l, params("t", prompt, 6))
		if !got.res.Reason.Success() || !slices.Equal(got.tokens, want.tokens) {
			t.Fatalf("request %d: %+v %v, want %v", i, got.res, got.tokens, want.tokens)
		}
	}
	if refusing.refused.Load() == 0 {
		t.Fatal("prefill-0 was never asked: the test did not exercise a refusal")
	}
	// Only the refusing node left: the request fails, never a 200.
	l.SetNodes([]transfer.Peer{"prefill-0"}, []transfer.Peer{"decode-0", "decode-1"})
	if o := run(t, l, params("t", prompt, 6)); o.res.Reason.Success() || o.res.Err == nil {
		t.Fatalf("with only a refusing prefill node: %+v, want an error", o.res)
	}
	for _, n := range append(append([]*node.Node(nil), l.Prefills...), l.Decodes...) {
		deadline := time.Now().Add(10 * time.Second)
		for n.PoolStats().PagesUsed != 0 || n.PoolStats().PagesQuarantined != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("pool not back: %+v", n.PoolStats())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestPrefillOverloadIs503: a prefill node that had no room for a prompt
// in time says so (ReasonOverloaded); with no other prefill node to move
// it to, the request fails as overloaded (a 503 with Retry-After at the
// gateway), not as an internal error.
func TestPrefillOverloadIs503(t *testing.T) {
	l := startLocal(t, LocalConfig{Prefill: 1, Decode: 1, Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
		if name == "prefill-0" {
			r := newRefusePrefill(tr)
			r.reason = transfer.ReasonOverloaded
			return r
		}
		return tr
	}})
	o := run(t, l, params("t", []int{5, 6, 7}, 4))
	if o.res.Reason.Success() || !errors.Is(o.res.Err, request.ErrOverloaded) {
		t.Fatalf("result %+v, want an overloaded error", o.res)
	}
	checkBaseline(t, l)
}

// slowQueries is a gateway's link to decode-0 that takes a LoadQuery only
// after hold (a node busy importing pages leaves its link full). A query
// whose context ends while it is held is what a real link closes for:
// counted as abandoned.
type slowQueries struct {
	link.Transport
	hold                time.Duration
	inFlight, most      atomic.Int64
	abandoned, answered atomic.Int64
}

func (s *slowQueries) Send(ctx context.Context, to transfer.Peer, m transfer.Message) error {
	if _, ok := m.(*transfer.LoadQuery); !ok || to != "decode-0" {
		return s.Transport.Send(ctx, to, m)
	}
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for most := s.most.Load(); n > most && !s.most.CompareAndSwap(most, n); most = s.most.Load() {
	}
	select {
	case <-time.After(s.hold):
	case <-ctx.Done():
		s.abandoned.Add(1)
		return context.Cause(ctx)
	}
	s.answered.Add(1)
	return s.Transport.Send(ctx, to, m)
}

// TestSlowLinkKeepsLoadQueries: a load query to a node whose link is slow
// to take frames waits for it like any control message, instead of being
// abandoned after LoadEvery (which closes the link every request on that
// node shares), and the node is not asked again until it took the last.
func TestSlowLinkKeepsLoadQueries(t *testing.T) {
	var slow *slowQueries
	l := startLocal(t, LocalConfig{Prefill: 1, Decode: 2,
		Router: RouterConfig{LoadEvery: 20 * time.Millisecond},
		Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
			if name == "gateway" {
				slow = &slowQueries{Transport: tr, hold: 150 * time.Millisecond}
				return slow
			}
			return tr
		}})
	for deadline := time.Now().Add(10 * time.Second); slow.answered.Load() < 3; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("decode-0 took %d slow queries in 10s", slow.answered.Load())
		}
	}
	for i := range 4 {
		if o := run(t, l, params("t", []int{5, 6, 7, 8, 9}, 3)); !o.res.Reason.Success() {
			t.Fatalf("request %d: %+v", i, o.res)
		}
	}
	if n := slow.abandoned.Load(); n != 0 {
		t.Errorf("%d load queries abandoned while the link took them: a real link closes for each", n)
	}
	if n := slow.most.Load(); n != 1 {
		t.Errorf("%d load queries to one node in flight at once, want 1", n)
	}
	checkBaseline(t, l)
}
