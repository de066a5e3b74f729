package disagg

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/testdata"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

func nodeOptions() node.Options {
	return node.Options{Threads: 1, KVMemory: 8 << 20, Scrub: kvcache.ScrubPoison, PageSize: 16}
}

func startLocal(t *testing.T, cfg LocalConfig) *Local {
	t.Helper()
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Node.KVMemory == 0 {
		cfg.Node = nodeOptions()
	}
	l, err := StartLocal(m, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return l
}

func startSingle(t *testing.T) *node.Node {
	t.Helper()
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(m, nodeOptions())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

type outcome struct {
	tokens []int
	res    request.Result
}

// run submits p and collects its tokens and result, checking owners and
// indexes.
func run(t *testing.T, b gateway.Backend, p request.Params) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := b.Submit(ctx, p)
	if err != nil {
		return outcome{res: request.Result{Reason: request.FinishError, Err: err}}
	}
	var o outcome
	for tok := range st.Tokens() {
		if tok.Owner != p.Owner || tok.Index != len(o.tokens) {
			t.Fatalf("token %+v on the stream of %v after %d tokens", tok, p.Owner, len(o.tokens))
		}
		o.tokens = append(o.tokens, tok.ID)
	}
	o.res = st.Result()
	return o
}

func params(tenant string, prompt []int, maxTokens int) request.Params {
	return request.Params{Owner: request.Owner{Tenant: request.Tenant(tenant), ID: request.NewID()}, Prompt: prompt, MaxTokens: maxTokens}
}

func prompts(t *testing.T, b gateway.Backend) [][]int {
	t.Helper()
	var out [][]int
	for _, text := range []string{"Once", "Once upon a time there was a little dog who", "The sun rose over the hills and the birds began to sing their morning songs while the farmer"} {
		ids, err := b.Tokenize(text, true, false)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ids)
	}
	// Prompts that end on a page boundary and one past it.
	long := out[2]
	for len(long) < 33 {
		long = append(long, long[1:]...)
	}
	out = append(out, long[:16], long[:17], long[:32], long[:33])
	return out
}

// TestDisaggregatedMatchesSingleNode: greedy output through gateway →
// decode (reserve) → prefill (prompt, handoff) → decode (commit, decode)
// is token-identical to one node computing everything, with the same
// usage; and every page comes back on every node.
func TestDisaggregatedMatchesSingleNode(t *testing.T) {
	single := startSingle(t)
	l := startLocal(t, LocalConfig{})
	for i, prompt := range prompts(t, single) {
		for _, maxTokens := range []int{1, 2, 24} {
			p := params("acme", prompt, maxTokens)
			want := run(t, single, p)
			p.Owner.ID = request.NewID()
			got := run(t, l, p)
			if !want.res.Reason.Success() || got.res.Reason != want.res.Reason {
				t.Fatalf("prompt %d, max %d: reason %v (%v), single node %v (%v)", i, maxTokens, got.res.Reason, got.res.Err, want.res.Reason, want.res.Err)
			}
			if fmt.Sprint(got.tokens) != fmt.Sprint(want.tokens) {
				t.Fatalf("prompt %d, max %d:\n got %v\nwant %v", i, maxTokens, got.tokens, want.tokens)
			}
			if got.res.Usage != want.res.Usage {
				t.Fatalf("prompt %d, max %d: usage %+v, single node %+v", i, maxTokens, got.res.Usage, want.res.Usage)
			}
		}
	}
	checkBaseline(t, l)
}

// TestDisaggregatedConcurrentTenants: many requests of several tenants at
// once, seeded sampling included, each identical to its single-node run.
func TestDisaggregatedConcurrentTenants(t *testing.T) {
	single := startSingle(t)
	l := startLocal(t, LocalConfig{Prefill: 2, Decode: 2})
	ps := prompts(t, single)
	type job struct {
		p    request.Params
		want outcome
	}
	var jobs []job
	for i := range 12 {
		p := params(fmt.Sprintf("tenant-%d", i%3), ps[i%len(ps)], 8+i)
		if i%2 == 1 {
			p.Sampling = request.Sampling{Temperature: 0.9, TopP: 0.95, Seed: uint64(i)}
		}
		want := run(t, single, p)
		p.Owner.ID = request.NewID()
		jobs = append(jobs, job{p, want})
	}
	var wg sync.WaitGroup
	errs := make(chan string, len(jobs))
	for _, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := run(t, l, j.p)
			if got.res.Reason != j.want.res.Reason || fmt.Sprint(got.tokens) != fmt.Sprint(j.want.tokens) {
				errs <- fmt.Sprintf("%v: %v %v, want %v %v (%v)", j.p.Owner, got.res.Reason, got.tokens, j.want.res.Reason, j.want.tokens, got.res.Err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	checkBaseline(t, l)
}

// checkBaseline waits until every node's pool is back to all free (or
// cached) with nothing quarantined, and no request is left anywhere.
func checkBaseline(t *testing.T, l *Local) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		bad := ""
		for i, n := range append(append([]*node.Node(nil), l.Prefills...), l.Decodes...) {
			st, err := n.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			ps := st.Pool
			if ps.FreePages+ps.CachedPages != ps.TotalPages || ps.Sequences != 0 || ps.QuarantinedPages != 0 || st.Core.Running != 0 || st.Core.Queued != 0 {
				bad = fmt.Sprintf("node %d: pool %+v, core %+v", i, ps, st.Core)
			}
			if st.Pool.Violations != 0 {
				t.Fatalf("node %d: %d isolation violations", i, st.Pool.Violations)
			}
		}
		l.Router.mu.Lock()
		if n := len(l.Router.calls); n != 0 {
			bad = fmt.Sprintf("%d requests left at the router", n)
		}
		l.Router.mu.Unlock()
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(bad)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRouting: a tenant's prompts that start alike go to the prefill node
// that holds their prefix (and are served from its cache), another
// tenant's identical prompt is not steered by it, and requests spread over
// the decode nodes.
func TestRouting(t *testing.T) {
	o := nodeOptions()
	o.PrefixCache = true
	l := startLocal(t, LocalConfig{Prefill: 2, Decode: 2, Node: o})
	ps := prompts(t, l)
	long := ps[6] // 33 tokens: two full pages to share
	first := run(t, l, params("acme", long, 2))
	// The prefill node caches the prefix when it releases the sequence,
	// after the handoff: the answer can reach the client before that (CI
	// under -race saw the second prompt find nothing cached).
	checkBaseline(t, l)
	second := run(t, l, params("acme", append(append([]int(nil), long[:32]...), 7, 8, 9), 2))
	if !first.res.Reason.Success() || !second.res.Reason.Success() {
		t.Fatalf("%v %v", first.res, second.res)
	}
	if second.res.Usage.CachedTokens != 32 {
		t.Errorf("second prompt served %d cached tokens, want 32 (the prefill node that holds the prefix)", second.res.Usage.CachedTokens)
	}
	other := run(t, l, params("globex", long, 2))
	if other.res.Usage.CachedTokens != 0 {
		t.Errorf("another tenant's prompt hit a cache: %d tokens", other.res.Usage.CachedTokens)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			run(t, l, params(fmt.Sprint("t", i), ps[i%3], 16))
		}()
	}
	wg.Wait()
	for i, d := range l.DecodeDrivers {
		if d.Stats().Committed == 0 {
			t.Errorf("decode-%d took no request", i)
		}
	}
	checkBaseline(t, l)
}

// lateUsage holds back a prefill node's successful Results (its account
// of the prompt, sent to the gateway), once on: until the router holds
// the answer (so the answer surely comes first), or for good.
type lateUsage struct {
	link.Transport
	drop   bool
	router func() *Router
	on     atomic.Bool
	held   atomic.Int64
}

func (l *lateUsage) Send(ctx context.Context, to transfer.Peer, m transfer.Message) error {
	if r, ok := m.(*transfer.Result); ok && r.Reason.Success() && l.on.Load() {
		l.held.Add(1)
		if !l.drop {
			go func() {
				for deadline := time.Now().Add(10 * time.Second); !l.router().holding() && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				_ = l.Transport.Send(context.Background(), to, m)
			}()
		}
		return nil
	}
	return l.Transport.Send(ctx, to, m)
}

// TestUsageWaitsForThePrefillNode: the prefill node's account of how much
// of a prompt its cache served and the decode node's answer come over
// different links, so the answer may arrive first (CI saw it: a cached
// prefix reported as 0 tokens). The answer waits for the account; when
// the account never comes, it ends after UsageWait anyway, whole, with no
// cached tokens claimed.
func TestUsageWaitsForThePrefillNode(t *testing.T) {
	for _, tc := range []struct {
		name       string
		drop       bool
		wait       time.Duration
		wantCached int
		// decodeDown: the decode node's link ends while the answer
		// waits, which must not turn it into a failure.
		decodeDown bool
	}{
		{"late", false, 30 * time.Second, 32, false},
		{"lost", true, 300 * time.Millisecond, 0, false},
		{"lost, then the decode node goes down", true, 30 * time.Second, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := nodeOptions()
			o.PrefixCache = true
			var late *lateUsage
			var decodeLink link.Transport
			var l *Local
			l = startLocal(t, LocalConfig{Prefill: 1, Decode: 1, Node: o,
				Router: RouterConfig{UsageWait: tc.wait},
				Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
					switch name {
					case "prefill-0":
						late = &lateUsage{Transport: tr, drop: tc.drop, router: func() *Router { return l.Router }}
						return late
					case "decode-0":
						decodeLink = tr
					}
					return tr
				}})
			single := startSingle(t)
			long := prompts(t, l)[6]
			run(t, l, params("acme", long, 2))
			checkBaseline(t, l)
			p := params("acme", append(append([]int(nil), long[:32]...), 7, 8, 9), 4)
			want := run(t, single, p)
			p.Owner.ID = request.NewID()
			late.on.Store(true)
			ran := make(chan outcome, 1)
			start := time.Now()
			go func() { ran <- run(t, l, p) }()
			if tc.decodeDown {
				for deadline := time.Now().Add(10 * time.Second); !l.Router.holding(); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the answer never waited for the prefill node's account")
					}
				}
				decodeLink.Close()
			}
			got := <-ran
			if !got.res.Reason.Success() || !slices.Equal(got.tokens, want.tokens) {
				t.Fatalf("%+v %v, want %v", got.res, got.tokens, want.tokens)
			}
			if got.res.Usage.CachedTokens != tc.wantCached || got.res.Usage.PromptTokens != len(p.Prompt) {
				t.Errorf("usage %+v, want %d cached of %d", got.res.Usage, tc.wantCached, len(p.Prompt))
			}
			switch took := time.Since(start); {
			case tc.decodeDown && took > tc.wait/2:
				t.Errorf("the answer ended %v after it began: it waited out UsageWait (%v) with its decode node gone", took, tc.wait)
			case tc.drop && !tc.decodeDown && took < tc.wait:
				t.Errorf("the answer ended %v after it began, before UsageWait (%v), without the prefill node's account", took, tc.wait)
			}
			if late.held.Load() != 1 {
				t.Fatalf("%d results held back, want 1: the test did not exercise a late account", late.held.Load())
			}
			checkBaseline(t, l)
		})
	}
}

// holding reports whether an answer waits for its prefill node's account.
func (rt *Router) holding() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, c := range rt.calls {
		if c.held != nil {
			return true
		}
	}
	return false
}

// TestDisaggregatedMatchesOnTestModels: on stories260K (a trained llama2.c
// model) and the GGUF test models (F32, F16, Q8_0, Q4_0, Q4_K_M, a tied
// MHA model), greedy output through the split equals one node's, token
// for token, with the same usage, on a KV cache of F32 and of F16.
func TestDisaggregatedMatchesOnTestModels(t *testing.T) {
	type spec struct{ name, file, tok string }
	specs := []spec{
		{"stories260K", "stories260K.bin", "tok512.bin"},
		{"f32", "tiny-llama-f32.gguf", ""}, {"f16", "tiny-llama-f16.gguf", ""}, {"q8_0", "tiny-llama-q8_0.gguf", ""},
		{"q4_0", "tiny-llama-d256-q4_0.gguf", ""}, {"q4_k_m", "tiny-llama-d256-q4_k_m.gguf", ""}, {"mha-tied", "tiny-llama-d128-mha-tied.gguf", ""},
	}
	load := func(s spec) *model.Model {
		o := model.Options{}
		if s.tok != "" {
			o.Tokenizer = testdata.Path(t, "models", s.tok)
		}
		m, err := model.Load(testdata.Path(t, "models", s.file), o)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, s := range specs {
		for _, kv := range []kvcache.DType{kvcache.F32, kvcache.F16} {
			if testing.Short() && kv == kvcache.F16 {
				continue
			}
			t.Run(fmt.Sprintf("%s/%v", s.name, kv), func(t *testing.T) {
				o := node.Options{Threads: 1, KVMemory: 8 << 20, MaxContext: 256, Scrub: kvcache.ScrubPoison, PageSize: 16, KVType: kv}
				single, err := node.Start(load(s), o)
				if err != nil {
					t.Fatal(err)
				}
				defer single.Close()
				l, err := StartLocal(load(s), LocalConfig{Node: o})
				if err != nil {
					t.Fatal(err)
				}
				defer l.Close()
				for _, text := range []string{"Once upon a time", "One day, Tom saw a big dog in the park. The dog was"} {
					prompt, _ := single.Tokenize(text, true, false)
					p := params("acme", prompt, 24)
					want := run(t, single, p)
					p.Owner.ID = request.NewID()
					got := run(t, l, p)
					if got.res.Reason != want.res.Reason || fmt.Sprint(got.tokens) != fmt.Sprint(want.tokens) || got.res.Usage != want.res.Usage {
						t.Fatalf("%q: split %v %v %+v, one node %v %v %+v", text, got.res.Reason, got.tokens, got.res.Usage, want.res.Reason, want.tokens, want.res.Usage)
					}
				}
				checkBaseline(t, l)
			})
		}
	}
}

// TestSplitKV: with ShareKV the budget is divided, a quarter to the
// prefill nodes and the rest to the decode nodes, each holding at least
// the window with its margin; a budget that cannot give every node that is
// refused with the numbers and the way out.
func TestSplitKV(t *testing.T) {
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	o := nodeOptions()
	capa, err := node.Plan(m, o)
	if err != nil {
		t.Fatal(err)
	}
	lim := capa.Limits
	window := int64(float64(lim.MaxContext)*lim.SafetyMargin+float64(lim.PageSize)-1) / int64(lim.PageSize) * lim.PageBytes
	tests := []struct {
		name              string
		budget            int64
		prefills, decodes int
		prefill, decode   int64 // 0: refused
	}{
		{"quarter to prefill", 64 * window, 1, 1, 16 * window, 48 * window},
		{"two of each", 64 * window, 2, 2, 8 * window, 24 * window},
		{"tight: prefill keeps its window", 3 * window, 1, 1, window, 2 * window},
		{"exactly two windows", 2 * window, 1, 1, window, window},
		{"too small", 2*window - 1, 1, 1, 0, 0},
		{"too small for four nodes", 3 * window, 2, 2, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := o
			o.KVMemory = tc.budget
			p, d, err := SplitKV(m, o, tc.prefills, tc.decodes)
			if tc.prefill == 0 {
				if err == nil || !strings.Contains(err.Error(), "--colocated") || !strings.Contains(err.Error(), "--kv-memory") {
					t.Fatalf("SplitKV(%d) = %d, %d, %v; want a refusal naming --kv-memory and --colocated", tc.budget, p, d, err)
				}
				return
			}
			if err != nil || p != tc.prefill || d != tc.decode {
				t.Fatalf("SplitKV(%d) = %d, %d, %v; want %d, %d", tc.budget, p, d, err, tc.prefill, tc.decode)
			}
			if int64(tc.prefills)*p+int64(tc.decodes)*d > tc.budget {
				t.Fatalf("shares %d+%d exceed the budget %d", p, d, tc.budget)
			}
		})
	}
}

// TestSharedKVCluster: a cluster started with ShareKV serves and its
// pools add up to the one budget.
func TestSharedKVCluster(t *testing.T) {
	o := nodeOptions()
	o.KVMemory = 32 << 20
	l := startLocal(t, LocalConfig{Node: o, ShareKV: true})
	if got := l.Prefills[0].PoolStats().PagesTotal + l.Decodes[0].PoolStats().PagesTotal; int64(got)*l.Decodes[0].SchedLimits().PageBytes > o.KVMemory {
		t.Fatalf("%d pages in all exceed the budget %d", got, o.KVMemory)
	}
	if p, d := l.Prefills[0].PoolStats().PagesTotal, l.Decodes[0].PoolStats().PagesTotal; d < 2*p {
		t.Fatalf("prefill %d pages, decode %d: want decode to hold most", p, d)
	}
}

// lostAbort is a test's hand in a gateway's and a decode node's links: the
// gateway's Aborts to decode-0 that name no reservation (sent before the
// grant came) are lost, as when the gateway failed the request for a link
// that went down and sent nothing; the decode node's Grant is held back
// for delay.
type lostAbort struct {
	link.Transport
	gateway bool
	delay   time.Duration
	granted *atomic.Bool
	dropped *atomic.Int64
}

func (l *lostAbort) Send(ctx context.Context, to transfer.Peer, m transfer.Message) error {
	switch m := m.(type) {
	case *transfer.Abort:
		if l.gateway && to == "decode-0" && m.ID.IsZero() {
			l.dropped.Add(1)
			return nil
		}
	case *transfer.Grant:
		if !l.gateway {
			time.AfterFunc(l.delay, func() {
				l.granted.Store(true)
				_ = l.Transport.Send(context.Background(), to, m)
			})
			return nil
		}
	}
	return l.Transport.Send(ctx, to, m)
}

// TestLateGrantIsGivenBack: a grant that reaches the gateway after its
// request ended there (the client left; the aborts sent then were lost) is
// answered with an abort, so the decode node frees the reservation at
// once rather than when its lease runs out (10 s).
func TestLateGrantIsGivenBack(t *testing.T) {
	var granted atomic.Bool
	var dropped atomic.Int64
	l := startLocal(t, LocalConfig{Prefill: 1, Decode: 1, Router: RouterConfig{AbortWait: 50 * time.Millisecond},
		Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
			switch name {
			case "gateway":
				return &lostAbort{Transport: tr, gateway: true, granted: &granted, dropped: &dropped}
			case "decode-0":
				return &lostAbort{Transport: tr, delay: 300 * time.Millisecond, granted: &granted, dropped: &dropped}
			}
			return tr
		}})
	ctx, cancel := context.WithCancel(context.Background())
	st, err := l.Submit(ctx, params("t", []int{5, 6, 7, 8, 9}, 8))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	cancel()
	for range st.Tokens() {
	}
	if res := st.Result(); res.Reason.Success() {
		t.Fatalf("a request whose client left: %+v", res)
	}
	for deadline := time.Now().Add(10 * time.Second); !granted.Load(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the grant never went out")
		}
	}
	if dropped.Load() == 0 {
		t.Fatal("no abort was lost: the test did not make the grant late")
	}
	start := time.Now()
	for l.Decodes[0].PoolStats().PagesUsed != 0 {
		if time.Since(start) > 3*time.Second {
			t.Fatalf("decode-0 still holds %d pages %v after the late grant", l.Decodes[0].PoolStats().PagesUsed, time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	checkBaseline(t, l)
}
