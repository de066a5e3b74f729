package disagg

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// faulty wraps a node's transport: every message it sends passes through
// mutate, which returns what to send instead (nothing, the message, or
// several). Only messages of the victim tenant are touched, so that the
// other tenants' requests show whether a fault leaked into them.
type faulty struct {
	link.Transport
	name   transfer.Peer
	victim request.Tenant
	mu     sync.Mutex
	mutate func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message
	held   []transfer.Message // for reordering
	kill   func()             // closes this node's link (a crash)
	others *sync.Map          // every node's faulty, by name
}

// killOther crashes another node's link.
func (f *faulty) killOther(name transfer.Peer) {
	if v, ok := f.others.Load(name); ok {
		v.(*faulty).kill()
	}
}

func ownerOf(m transfer.Message) request.Owner {
	switch m := m.(type) {
	case *transfer.Page:
		return m.Owner
	case *transfer.Manifest:
		return m.Owner
	case *transfer.Commit:
		return m.Owner
	case *transfer.Heartbeat:
		return m.Owner
	case *transfer.Generate:
		return m.Owner
	case *transfer.Prefill:
		return m.Grant.Owner
	case *transfer.Grant:
		return m.Owner
	case *transfer.Tokens:
		return m.Owner
	case *transfer.Result:
		return m.Owner
	case *transfer.Committed:
		return m.Owner
	case *transfer.Abort:
		return m.Owner
	case *transfer.AbortAck:
		return m.Owner
	}
	return request.Owner{}
}

func (f *faulty) Send(ctx context.Context, to transfer.Peer, m transfer.Message) error {
	if f.mutate == nil || ownerOf(m).Tenant != f.victim {
		return f.Transport.Send(ctx, to, m)
	}
	f.mu.Lock()
	out := f.mutate(f, to, m)
	f.mu.Unlock()
	for _, m := range out {
		if err := f.Transport.Send(ctx, to, m); err != nil {
			return err
		}
	}
	return nil
}

// clonePage copies a page so that a mutation never touches the driver's.
func clonePage(p *transfer.Page) *transfer.Page {
	q := *p
	q.Data = slices.Clone(p.Data)
	return &q
}

func cloneManifest(m *transfer.Manifest) *transfer.Manifest {
	q := *m
	q.Filled = slices.Clone(m.Filled)
	q.PageDigests = slices.Clone(m.PageDigests)
	return &q
}

type faultCase struct {
	name string
	// on is the node whose sends are mutated ("prefill-0", "decode-0",
	// "gateway").
	on     transfer.Peer
	mutate func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message
	// ok: the request must succeed with the fault-free output (faults the
	// protocol absorbs: duplicates, reordering).
	ok bool
	// short leases, for faults that only a lease ends.
	shortLease bool
}

func keep(m transfer.Message) []transfer.Message { return []transfer.Message{m} }

var faultCases = []faultCase{
	{name: "fewer pages than reserved (the incident)", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		switch m := m.(type) {
		case *transfer.Page:
			if m.Index > 0 {
				return nil
			}
		case *transfer.Manifest:
			q := cloneManifest(m)
			q.PageCount, q.Filled, q.PageDigests, q.TotalTokens = 1, q.Filled[:1], q.PageDigests[:1], q.Filled[0]
			return keep(q)
		}
		return keep(m)
	}},
	{name: "fewer pages, manifest unchanged", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok && p.Index > 0 {
			return nil
		}
		return keep(m)
	}, shortLease: true},
	{name: "more pages than reserved", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok && p.Index == 0 {
			extra := clonePage(p)
			extra.Index = 1000
			return []transfer.Message{m, extra}
		}
		if mf, ok := m.(*transfer.Manifest); ok {
			q := cloneManifest(mf)
			q.PageCount++
			q.Filled = append(q.Filled, q.Filled[0])
			q.PageDigests = append(q.PageDigests, q.PageDigests[0])
			return keep(q)
		}
		return keep(m)
	}},
	{name: "wrong tenant", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok {
			q := clonePage(p)
			q.Owner.Tenant = "someone-else"
			return keep(q)
		}
		return keep(m)
	}},
	{name: "wrong request", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if mf, ok := m.(*transfer.Manifest); ok {
			q := cloneManifest(mf)
			q.Owner.ID[0] ^= 1
			return keep(q)
		}
		return keep(m)
	}},
	{name: "stale epoch", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok {
			q := clonePage(p)
			q.Epoch--
			return keep(q)
		}
		return keep(m)
	}},
	{name: "wrong layout hash", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if mf, ok := m.(*transfer.Manifest); ok {
			q := cloneManifest(mf)
			q.Layout[0] ^= 1
			return keep(q)
		}
		return keep(m)
	}},
	{name: "corrupted page bytes", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok && p.Index == 0 {
			q := clonePage(p)
			q.Data[len(q.Data)/2] ^= 0x40
			return keep(q)
		}
		return keep(m)
	}},
	{name: "swapped pages", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok && p.Index < 2 {
			q := clonePage(p)
			q.Index = 1 - p.Index
			return keep(q)
		}
		return keep(m)
	}},
	{name: "lost page", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok && p.Index == 1 {
			return nil
		}
		return keep(m)
	}, shortLease: true},
	{name: "duplicated messages", on: "prefill-0", ok: true, mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok {
			return []transfer.Message{m, clonePage(p)}
		}
		return keep(m)
	}},
	{name: "reordered pages", on: "prefill-0", ok: true, mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok {
			f.held = append([]transfer.Message{clonePage(p)}, f.held...)
			return nil
		}
		if _, ok := m.(*transfer.Manifest); ok {
			out := append(f.held, m)
			f.held = nil
			return out
		}
		return keep(m)
	}},
	{name: "late write after release", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		switch m := m.(type) {
		case *transfer.Page:
			f.held = append(f.held, clonePage(m))
			if m.Index == 0 {
				q := clonePage(m)
				q.Data[0] ^= 1 // the handoff fails on its digest...
				return keep(q)
			}
		case *transfer.AbortAck, *transfer.Abort:
			// ...and once it is aborted, every page is sent again.
			return append([]transfer.Message{m}, f.held...)
		}
		return keep(m)
	}},
	{name: "prefill stops heartbeating and sending", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		switch m.(type) {
		case *transfer.Page, *transfer.Manifest, *transfer.Commit, *transfer.Heartbeat:
			return nil
		}
		return keep(m)
	}, shortLease: true},
	{name: "prefill killed mid-transfer", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok && p.Index == 1 {
			go f.kill()
			return nil
		}
		return keep(m)
	}},
	{name: "decode killed mid-transfer", on: "prefill-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if p, ok := m.(*transfer.Page); ok && p.Index == 1 {
			go f.killOther("decode-0")
			return nil
		}
		return keep(m)
	}},
	{name: "decode sends tokens before the commit", on: "decode-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if g, ok := m.(*transfer.Grant); ok {
			return []transfer.Message{m, &transfer.Tokens{Ref: g.Ref, Start: 0, IDs: []int{5, 6}}}
		}
		return keep(m)
	}},
	{name: "decode claims success without a commit", on: "decode-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if g, ok := m.(*transfer.Grant); ok {
			return []transfer.Message{m, &transfer.Result{Ref: g.Ref, Reason: request.FinishStop}}
		}
		return keep(m)
	}},
	{name: "decode's tokens out of order", on: "decode-0", mutate: func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if tk, ok := m.(*transfer.Tokens); ok {
			// The first half in place, the rest one position late.
			h := (len(tk.IDs) + 1) / 2
			a, b := *tk, *tk
			a.IDs, b.IDs, b.Start = tk.IDs[:h], tk.IDs[h:], tk.Start+h+1
			if len(b.IDs) == 0 {
				a.Start++
				return keep(&a)
			}
			return []transfer.Message{&a, &b}
		}
		return keep(m)
	}},
}

// others is the other tenants' workload that runs during every fault: its
// output must be byte-identical to a fault-free run.
func others(t *testing.T, l *Local, ps [][]int) []request.Params {
	var out []request.Params
	for i := range 3 {
		p := params(fmt.Sprintf("bystander-%d", i), ps[(i+2)%len(ps)], 16)
		out = append(out, p)
	}
	return out
}

// TestFaultsFailClosed: each fault on the handoff path ends the victim's
// request with an error (never a success, never a token it should not
// have), returns every page on every node, and leaves the other tenants'
// outputs identical to a fault-free run.
func TestFaultsFailClosed(t *testing.T) {
	single := startSingle(t)
	ps := prompts(t, single)
	victimPrompt := ps[6] // 33 tokens: 3 pages
	want := run(t, single, params("victim", victimPrompt, 12))
	for _, tc := range faultCases {
		t.Run(tc.name, func(t *testing.T) {
			var nodes sync.Map // name → *faulty
			cfg := LocalConfig{Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
				f := &faulty{Transport: tr, name: name, victim: "victim"}
				f.kill = func() { tr.Close() }
				if name == tc.on {
					f.mutate = tc.mutate
				}
				nodes.Store(name, f)
				return f
			}}
			if tc.shortLease {
				// Short enough that the victim's stalled handoff ends soon,
				// long enough that a bystander's heartbeats (every 50 ms,
				// sent on the prefill loop's 20 ms tick) keep it alive on
				// a loaded machine.
				cfg.Decoder.Receiver = transfer.ReceiverConfig{LeaseTTL: transfer.Duration(time.Second), MaxLease: 10 * transfer.Second,
					DrainTimeout: transfer.Duration(100 * time.Millisecond), RetryEvery: transfer.Duration(50 * time.Millisecond)}
				cfg.Decoder.TickEvery = 20 * time.Millisecond
				cfg.Prefiller.Sender = transfer.SenderConfig{HeartbeatEvery: transfer.Duration(50 * time.Millisecond)}
				cfg.Prefiller.TickEvery = 20 * time.Millisecond
			}
			l := startLocal(t, cfg)
			nodes.Range(func(k, v any) bool {
				v.(*faulty).others = &nodes
				return true
			})
			bystanders := others(t, l, ps)
			wantOthers := make([]outcome, len(bystanders))
			for i, p := range bystanders {
				wantOthers[i] = run(t, single, p)
			}
			var wg sync.WaitGroup
			gotOthers := make([]outcome, len(bystanders))
			for i, p := range bystanders {
				wg.Add(1)
				go func() {
					defer wg.Done()
					p.Owner.ID = request.NewID()
					gotOthers[i] = run(t, l, p)
				}()
			}
			got := run(t, l, params("victim", victimPrompt, 12))
			wg.Wait()
			if tc.ok {
				if got.res.Reason != want.res.Reason || fmt.Sprint(got.tokens) != fmt.Sprint(want.tokens) {
					t.Fatalf("absorbed fault changed the output: %v %v (%v), want %v %v", got.res.Reason, got.tokens, got.res.Err, want.res.Reason, want.tokens)
				}
			} else {
				if got.res.Reason.Success() {
					t.Fatalf("the victim's request succeeded under the fault: %v, tokens %v", got.res.Reason, got.tokens)
				}
				if len(got.tokens) > 0 && tc.on == "prefill-0" {
					t.Fatalf("tokens %v reached the client from a failed handoff", got.tokens)
				}
				if got.res.Err == nil {
					t.Fatalf("failure without an error: %+v", got.res)
				}
			}
			if !killed(tc) {
				for i := range bystanders {
					if gotOthers[i].res.Reason != wantOthers[i].res.Reason || fmt.Sprint(gotOthers[i].tokens) != fmt.Sprint(wantOthers[i].tokens) {
						t.Errorf("bystander %d: %v %v (%v), fault-free %v %v", i, gotOthers[i].res.Reason, gotOthers[i].tokens, gotOthers[i].res.Err, wantOthers[i].res.Reason, wantOthers[i].tokens)
					}
				}
			} else {
				// A killed node takes its bystanders' requests with it:
				// they may fail, but never with wrong output.
				for i := range bystanders {
					g := gotOthers[i]
					if g.res.Reason.Success() && fmt.Sprint(g.tokens) != fmt.Sprint(wantOthers[i].tokens) {
						t.Errorf("bystander %d succeeded with other output: %v, want %v", i, g.tokens, wantOthers[i].tokens)
					}
					if !g.res.Reason.Success() && fmt.Sprint(g.tokens) != fmt.Sprint(wantOthers[i].tokens[:len(g.tokens)]) {
						t.Errorf("bystander %d streamed wrong tokens before failing: %v", i, g.tokens)
					}
				}
			}
			checkBaselineAlive(t, l, tc)
		})
	}
}

func killed(tc faultCase) bool {
	return tc.name == "prefill killed mid-transfer" || tc.name == "decode killed mid-transfer"
}

// checkBaselineAlive is checkBaseline for the nodes that still have a link.
func checkBaselineAlive(t *testing.T, l *Local, tc faultCase) {
	t.Helper()
	if !killed(tc) {
		checkBaseline(t, l)
		return
	}
	// A killed node's scheduler is still there (only its link died): it
	// must still end every request and give back every page.
	checkBaseline(t, l)
}

// TestClientAbortAtEveryPhase: a client that leaves while its request is
// being reserved, granted, prefilled, handed off or streamed gets no
// success, and every node gives back every page.
func TestClientAbortAtEveryPhase(t *testing.T) {
	single := startSingle(t)
	ps := prompts(t, single)
	for _, phase := range []struct {
		on   transfer.Peer
		when transfer.MsgType
	}{
		{"gateway", transfer.MsgGenerate},
		{"decode-0", transfer.MsgGrant},
		{"gateway", transfer.MsgPrefill},
		{"prefill-0", transfer.MsgPage},
		{"prefill-0", transfer.MsgManifest},
		{"prefill-0", transfer.MsgCommit},
		{"decode-0", transfer.MsgCommitted},
		{"decode-0", transfer.MsgTokens},
	} {
		t.Run(fmt.Sprintf("%s sends %v", phase.on, phase.when), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var once sync.Once
			l := startLocal(t, LocalConfig{Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
				f := &faulty{Transport: tr, name: name, victim: "victim"}
				if name == phase.on {
					f.mutate = func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
						if m.Type() == phase.when {
							once.Do(cancel)
						}
						return keep(m)
					}
				}
				return f
			}})
			p := params("victim", ps[6], 64)
			st, err := l.Submit(ctx, p)
			if err != nil {
				if !errors.Is(err, context.Canceled) {
					t.Fatal(err)
				}
				checkBaseline(t, l)
				return
			}
			n := 0
			for range st.Tokens() {
				n++
			}
			res := st.Result()
			if res.Reason.Success() && res.Usage.CompletionTokens == 64 {
				// The abort lost the race with the last token: the client
				// had already left, nothing was answered. Pages must still
				// come back.
				checkBaseline(t, l)
				return
			}
			if res.Reason.Success() {
				t.Fatalf("aborted request ended %v after %d tokens", res.Reason, n)
			}
			if res.Reason != request.FinishAbort {
				t.Errorf("aborted request ended %v (%v), want abort", res.Reason, res.Err)
			}
			checkBaseline(t, l)
		})
	}
}

// TestGatewayAbortIsRetried: the gateway's abort reaches the decode node
// even when the link loses it the first time: it is sent again until the
// node acknowledges, so the reservation is given back at once, not when its
// lease runs out. (The prefill node's own aborts to decode are lost here
// too, so that only the gateway's retry can free the pages in time.)
func TestGatewayAbortIsRetried(t *testing.T) {
	single := startSingle(t)
	ps := prompts(t, single)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var dropped int
	var mu sync.Mutex
	cfg := LocalConfig{
		Router: RouterConfig{AbortRetry: 20 * time.Millisecond},
		// An hour-long lease: only an abort can free the pages in time.
		Decoder: DecodeConfig{Receiver: transfer.ReceiverConfig{LeaseTTL: transfer.Duration(time.Hour), MaxLease: transfer.Duration(2 * time.Hour)}},
		Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
			f := &faulty{Transport: tr, name: name, victim: "victim"}
			switch name {
			case "gateway":
				f.mutate = func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
					mu.Lock()
					defer mu.Unlock()
					switch m.(type) {
					case *transfer.Prefill:
						cancel() // the client leaves once the prompt is on its way
						return nil
					case *transfer.Abort:
						if to == "decode-0" && dropped == 0 {
							dropped++
							return nil // the gateway's first abort to decode is lost
						}
					}
					return keep(m)
				}
			case "prefill-0":
				f.mutate = func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
					if _, ok := m.(*transfer.Abort); ok && to == "decode-0" {
						return nil
					}
					return keep(m)
				}
			}
			return f
		},
	}
	l := startLocal(t, cfg)
	st, err := l.Submit(ctx, params("victim", ps[6], 8))
	if err != nil {
		t.Fatal(err)
	}
	for range st.Tokens() {
	}
	if res := st.Result(); res.Reason.Success() {
		t.Fatalf("an aborted request succeeded: %+v", res)
	}
	checkBaseline(t, l)
	mu.Lock()
	defer mu.Unlock()
	if dropped != 1 {
		t.Fatalf("%d aborts dropped", dropped)
	}
}
