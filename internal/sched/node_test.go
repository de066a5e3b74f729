package sched

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched/ownerecho"
)

// gatedExecutor runs the owner-echo model, optionally waiting for a signal
// before each batch, so that tests can act while a batch is in flight.
type gatedExecutor struct {
	echo    *echoExecutor
	gate    chan struct{} // nil: no waiting
	entered chan struct{} // signalled when a batch starts, if not nil
	mu      sync.Mutex
	params  map[request.Owner]request.Params
	// violate: every item of this tenant fails with an engine-detected
	// violation, which quarantines its pages.
	violate request.Tenant
}

func (g *gatedExecutor) Execute(ctx context.Context, b *Batch) ([]Outcome, error) {
	if g.entered != nil {
		select {
		case g.entered <- struct{}{}:
		case <-ctx.Done():
		}
	}
	if g.gate != nil {
		select {
		case <-g.gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	outs, err := g.echo.Execute(ctx, b)
	if err == nil && g.violate != "" {
		for i, it := range b.Items {
			if it.Owner.Tenant == g.violate {
				outs[i] = Outcome{Owner: it.Owner, Err: errEngineViolation}
			}
		}
	}
	return outs, err
}

type nodeOpts struct {
	window, pageSize, pages, batchTokens int
	gate, entered                        bool
	maxQueueWait                         time.Duration
	reapAfter                            time.Duration
	violate                              request.Tenant
}

func newTestNode(t *testing.T, o nodeOpts) (*Node, *gatedExecutor, context.CancelFunc, chan error) {
	t.Helper()
	layout := ownerecho.Layout(o.pageSize)
	lim, err := ComputeLimits(ModelShape{ContextLength: o.window, Vocab: harnessVocab}, layout, o.pages, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kvcache.NewPool(kvcache.Config{Layout: layout, Pages: o.pages, Scrub: kvcache.ScrubPoison, VerifyScrub: true})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedExecutor{echo: &echoExecutor{vocab: harnessVocab}, violate: o.violate}
	if o.gate {
		g.gate = make(chan struct{})
	}
	if o.entered {
		g.entered = make(chan struct{}, 1024) // never blocks the executor
	}
	n, err := NewNode(NodeConfig{Core: Config{Limits: lim, Pool: pool, MaxBatchTokens: o.batchTokens, WatermarkPages: -1, MaxQueueWait: o.maxQueueWait, QuarantineReapAfter: o.reapAfter}, Executor: g})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		if len(g.echo.foreign) > 0 {
			t.Errorf("foreign reads: %v", g.echo.foreign)
		}
	})
	return n, g, cancel, done
}

func testParams(tenant request.Tenant, prompt, maxTokens, seed int) request.Params {
	p := request.Params{Owner: request.Owner{Tenant: tenant, ID: request.NewID()}, Prompt: make([]int, prompt), MaxTokens: maxTokens}
	for i := range p.Prompt {
		p.Prompt[i] = (seed*13 + i*5) % harnessVocab
	}
	return p
}

// collect reads a stream to its end, checking every token's owner and
// value against the owner-echo model.
func collect(t *testing.T, s *Stream, p request.Params) ([]int, request.Result) {
	t.Helper()
	hist := append([]int(nil), p.Prompt...)
	var toks []int
	for {
		tok, err := s.Recv(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Errorf("recv: %v", err)
			break
		}
		if tok.Owner != p.Owner || tok.Index != len(toks) {
			t.Errorf("token %+v on the stream of %v (index %d)", tok, p.Owner, len(toks))
		}
		if want := echoNext(p.Owner, "", hist, harnessVocab); tok.ID != want {
			t.Errorf("token %d of %v: %d, want %d", tok.Index, p.Owner, tok.ID, want)
		}
		hist = append(hist, tok.ID)
		toks = append(toks, tok.ID)
	}
	res := s.Result()
	if res.Owner != p.Owner {
		t.Errorf("result of %v on the stream of %v", res.Owner, p.Owner)
	}
	return toks, res
}

// TestNodeConcurrentTenants: many goroutines of many tenants submit, read
// and sometimes abort or cancel; every stream gets its own tokens only and
// exactly one result; the pool ends free. Run with -race.
func TestNodeConcurrentTenants(t *testing.T) {
	n, _, _, _ := newTestNode(t, nodeOpts{window: 64, pageSize: 4, pages: 48, batchTokens: 32})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tenant := request.Tenant(fmt.Sprint("tenant", w%4))
			for i := range 12 {
				p := testParams(tenant, 1+(w*7+i*3)%40, 1+(w+i)%20, w*100+i)
				ctx, cancel := context.WithCancel(context.Background())
				s, err := n.Submit(ctx, p)
				if err != nil {
					cancel()
					if !errors.Is(err, request.ErrOverloaded) {
						t.Errorf("submit: %v", err)
					}
					continue
				}
				switch i % 5 {
				case 1:
					if err := n.Abort(tenant, p.Owner.ID); err != nil && !errors.Is(err, request.ErrNotFound) {
						t.Errorf("abort: %v", err)
					}
				case 2:
					cancel()
				case 3:
					if err := n.Abort("intruder", p.Owner.ID); !errors.Is(err, request.ErrNotFound) {
						t.Errorf("abort by another tenant: %v", err)
					}
				}
				toks, res := collect(t, s, p)
				cancel()
				switch {
				case res.Reason == request.FinishLength && len(toks) != p.MaxTokens,
					res.Reason == request.FinishAbort && !errors.Is(res.Err, request.ErrAborted),
					res.Reason == request.FinishError || res.Reason == request.FinishNone,
					(i%5 == 0 || i%5 == 3) && res.Reason != request.FinishLength && res.Reason != request.FinishStop:
					t.Errorf("%v (case %d): %s %v with %d tokens", p.Owner, i%5, res.Reason, res.Err, len(toks))
				}
			}
		}()
	}
	wg.Wait()
	st, err := n.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pool.FreePages != st.Pool.TotalPages || st.Core.Running != 0 || st.Core.Queued != 0 {
		t.Errorf("after all streams ended: %+v", st)
	}
}

// TestNodeRejectsBeforeAllocation: over-long and malformed requests are
// refused by Submit with nothing allocated.
func TestNodeRejectsBeforeAllocation(t *testing.T) {
	n, _, _, _ := newTestNode(t, nodeOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 8})
	before, err := n.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p    request.Params
		want error
	}{
		{testParams("a", 30, 3, 1), request.ErrContextLength},
		{testParams("a", 33, 1, 1), request.ErrContextLength},
		{testParams("a", 0, 1, 1), ErrInvalidRequest},
		{testParams("", 3, 1, 1), ErrInvalidRequest},
	} {
		if _, err := n.Submit(context.Background(), tc.p); !errors.Is(err, tc.want) {
			t.Errorf("prompt %d + %d: %v, want %v", len(tc.p.Prompt), tc.p.MaxTokens, err, tc.want)
		}
	}
	after, err := n.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("rejections changed the node:\n%s", diff)
	}
	// A zero id is filled in.
	p := testParams("a", 3, 2, 1)
	p.Owner.ID = request.ID{}
	s, err := n.Submit(context.Background(), p)
	if err != nil || s.Owner().ID.IsZero() {
		t.Fatalf("submit without id: %v, owner %v", err, s.Owner())
	}
	p.Owner = s.Owner()
	if _, res := collect(t, s, p); res.Reason != request.FinishLength {
		t.Errorf("result %+v", res)
	}
}

// TestNodeAbortWhileInFlight: an abort from another goroutine while the
// request's batch runs is applied by the loop after the batch; the stream
// ends aborted; another tenant cannot abort it.
func TestNodeAbortWhileInFlight(t *testing.T) {
	n, g, _, _ := newTestNode(t, nodeOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 8, gate: true, entered: true})
	p := testParams("alice", 4, 20, 3)
	s, err := n.Submit(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered // the first batch is in flight
	// Both aborts wait for the loop, which is inside the executor.
	byBob, byAlice := make(chan error, 1), make(chan error, 1)
	go func() { byBob <- n.Abort("bob", p.Owner.ID) }()
	go func() { byAlice <- n.Abort("alice", p.Owner.ID) }()
	for len(n.events) < 2 {
		runtime.Gosched() // both abort events are queued before the batch ends
	}
	go func() {
		// Let batches run until the request ends; the loop applies the
		// aborts between two of them.
		for {
			select {
			case g.gate <- struct{}{}:
			case <-s.Done():
				return
			}
		}
	}()
	if err := <-byBob; !errors.Is(err, request.ErrNotFound) {
		t.Errorf("abort by bob: %v", err)
	}
	if err := <-byAlice; err != nil {
		t.Fatal(err)
	}
	toks, res := collect(t, s, p)
	if res.Reason != request.FinishAbort || !errors.Is(res.Err, request.ErrAborted) || len(toks) > 1 {
		t.Errorf("result %s %v after %d tokens", res.Reason, res.Err, len(toks))
	}
}

// TestNodeShutdown: stopping the loop ends every stream with
// ErrShuttingDown and refuses new work.
func TestNodeShutdown(t *testing.T) {
	n, g, cancel, done := newTestNode(t, nodeOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 8, gate: true, entered: true})
	first, err := n.Submit(context.Background(), testParams("a", 3, 10, 0))
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered // a batch is in flight: later submits wait for the loop
	got := make(chan *Stream, 2)
	for i := range 2 {
		go func() {
			s, err := n.Submit(context.Background(), testParams("a", 3, 10, i+1))
			if err != nil && !errors.Is(err, request.ErrShuttingDown) {
				t.Errorf("submit during shutdown: %v", err)
			}
			got <- s
		}()
	}
	cancel() // the executor sees ctx done and fails the batch
	streams := []*Stream{first}
	for range 2 {
		if s := <-got; s != nil {
			streams = append(streams, s)
		}
	}
	for _, s := range streams {
		res := s.Result()
		if res.Reason != request.FinishAbort || !errors.Is(res.Err, request.ErrShuttingDown) {
			t.Errorf("%v: %s %v", s.Owner(), res.Reason, res.Err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the cleanup
	if _, err := n.Submit(context.Background(), testParams("a", 3, 1, 9)); !errors.Is(err, request.ErrShuttingDown) {
		t.Errorf("submit after shutdown: %v", err)
	}
	if err := n.Abort("a", request.NewID()); !errors.Is(err, request.ErrShuttingDown) {
		t.Errorf("abort after shutdown: %v", err)
	}
}

// TestNodeTokensChannel: the channel form delivers the same tokens.
func TestNodeTokensChannel(t *testing.T) {
	n, _, _, _ := newTestNode(t, nodeOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 8})
	p := testParams("a", 5, 9, 4)
	s, err := n.Submit(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	hist := append([]int(nil), p.Prompt...)
	for tok := range s.Tokens() {
		if want := echoNext(p.Owner, "", hist, harnessVocab); tok.ID != want || tok.Owner != p.Owner {
			t.Errorf("token %+v, want id %d", tok, want)
		}
		hist = append(hist, tok.ID)
	}
	if res := s.Result(); res.Reason != request.FinishLength || len(hist)-len(p.Prompt) != 9 {
		t.Errorf("result %+v after %d tokens", res, len(hist)-len(p.Prompt))
	}
}

// TestNodeQueueTimeout runs the node in a synctest bubble: a request that
// cannot get pages waits MaxQueueWait and is then refused as overloaded.
func TestNodeQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, g, _, _ := newTestNode(t, nodeOpts{window: 16, pageSize: 4, pages: 4, batchTokens: 16, gate: true, maxQueueWait: time.Second})
		first, err := n.Submit(context.Background(), testParams("a", 12, 4, 1)) // 3 of 4 pages
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // the loop is inside the executor with the first batch
		got := make(chan *Stream, 1)
		go func() {
			s, err := n.Submit(context.Background(), testParams("b", 12, 4, 2))
			if err != nil {
				t.Error(err)
			}
			got <- s
		}()
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			// Each step takes 600ms of (fake) time.
			for {
				select {
				case <-stop:
					return
				case <-time.After(600 * time.Millisecond):
				}
				select {
				case <-stop:
					return
				case g.gate <- struct{}{}:
				}
			}
		}()
		second := <-got
		if second == nil {
			t.FailNow()
		}
		if res := first.Result(); res.Reason != request.FinishLength {
			t.Errorf("first: %+v", res)
		}
		if res := second.Result(); res.Reason != request.FinishError || !errors.Is(res.Err, request.ErrOverloaded) {
			t.Errorf("second: %s %v", res.Reason, res.Err)
		}
	})
}
