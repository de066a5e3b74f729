package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sample"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// builtins caches generated models (immutable, shared by tests).
var builtins sync.Map

func builtinModel(tb testing.TB, name string) *model.Model {
	tb.Helper()
	if m, ok := builtins.Load(name); ok {
		return m.(*model.Model)
	}
	m, err := model.Builtin(name)
	if err != nil {
		tb.Fatal(err)
	}
	got, _ := builtins.LoadOrStore(name, m)
	return got.(*model.Model)
}

// stories loads stories260K, a small trained model: unlike the random
// builtin ones, its greedy continuations depend on the prompt, so a
// request that received another's KV or tokens would show.
func stories(tb testing.TB) *model.Model {
	tb.Helper()
	if m, ok := builtins.Load("stories260K"); ok {
		return m.(*model.Model)
	}
	m, err := model.Load(testdata.Path(tb, "models", "stories260K.bin"), model.Options{Tokenizer: testdata.Path(tb, "models", "tok512.bin")})
	if err != nil {
		tb.Fatal(err)
	}
	got, _ := builtins.LoadOrStore("stories260K", m)
	return got.(*model.Model)
}

// e2eModels are the models the end-to-end tests run on.
func e2eModels(t *testing.T) map[string]*model.Model {
	return map[string]*model.Model{"stories260K": stories(t), "tiny": builtinModel(t, "tiny")}
}

// distinct fails the test unless the solo outputs of jobs of different
// tenants differ: otherwise swapping them could not be detected.
func distinct(t *testing.T, jobs []job, want []outcome) {
	t.Helper()
	for i := range jobs {
		for j := range i {
			if jobs[i].tenant != jobs[j].tenant && cmp.Equal(want[i].Tokens, want[j].Tokens) {
				t.Fatalf("jobs %d and %d of different tenants generate the same tokens alone: the comparison has no power", j, i)
			}
		}
	}
}

// checkingExecutor wraps the engine's executor and checks, around every
// batch it runs, that no sequence can see a non-finite value: every KV
// position a step reads (written before it) and writes is finite, and the
// logits of every sampled item, recomputed through the same views, are
// finite and give the token the executor sampled (greedy). Under
// kvcache.ScrubPoison a fresh or released page holds NaN, so any read of a
// position that its sequence did not write (I3) or of a stale page (I8)
// shows here.
type checkingExecutor struct {
	inner   sched.Executor
	m       *model.Model
	compute *kernels.Pool
	scratch model.Scratch

	mu      sync.Mutex // the node loop writes, the test reads after Run
	batches int
	items   int
	sampled int
	mixed   int // batches with prefill chunks and decodes together
	tenants int // batches with more than one tenant
	errs    []string
}

func (x *checkingExecutor) fail(format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.errs) < 20 {
		x.errs = append(x.errs, fmt.Sprintf(format, args...))
	}
}

// checkKV checks positions [0, end) of the item's view in every layer.
func (x *checkingExecutor) checkKV(step uint64, it *sched.Item, end int, when string) {
	v := it.View
	ps, kvdim := v.PageSize(), x.m.Config.KVDim()
	for l := 0; l < x.m.Config.Layers; l++ {
		for p := 0; p*ps < end; p++ {
			n := min(end-p*ps, ps) * kvdim
			var bad bool
			if k := v.K(l, p); k != nil {
				bad = !finite32(k[:n]) || !finite32(v.V(l, p)[:n])
			} else {
				bad = !finite16(v.K16(l, p)[:n]) || !finite16(v.V16(l, p)[:n])
			}
			if bad {
				x.fail("step %d, %v, %s: layer %d page %d holds a non-finite K/V among its first %d positions", step, it.Owner, when, l, p, end)
				return
			}
		}
	}
}

func finite32(xs []float32) bool {
	for _, f := range xs {
		if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
			return false
		}
	}
	return true
}

func finite16(xs []uint16) bool {
	for _, h := range xs {
		if h&0x7C00 == 0x7C00 { // exponent all ones: Inf or NaN
			return false
		}
	}
	return true
}

func (x *checkingExecutor) Execute(ctx context.Context, b *sched.Batch) ([]sched.Outcome, error) {
	tenants := map[request.Tenant]bool{}
	prefill, decode := false, false
	for i := range b.Items {
		it := &b.Items[i]
		x.checkKV(b.Step, it, it.View.Start(), "before the step")
		tenants[it.Owner.Tenant] = true
		if len(it.Tokens) > 1 {
			prefill = true
		} else {
			decode = true
		}
	}
	outs, err := x.inner.Execute(ctx, b)
	if err != nil {
		return outs, err
	}
	in := make([]model.Input, len(b.Items))
	for i := range b.Items {
		it := &b.Items[i]
		x.checkKV(b.Step, it, it.View.Start()+it.View.N(), "after the step")
		mode := model.LogitsNone
		if it.Sample {
			mode = model.LogitsLast
		}
		in[i] = model.Input{Tokens: it.Tokens, View: it.View, Logits: mode}
	}
	// Recompute through the same views: it rewrites the same K/V values
	// and yields the logits the executor sampled from.
	logits, ferr := x.m.Forward(x.compute, in, &x.scratch)
	if ferr != nil {
		x.fail("step %d: recompute: %v", b.Step, ferr)
		return outs, err
	}
	sampled := 0
	for i := range b.Items {
		it := &b.Items[i]
		if !it.Sample {
			continue
		}
		sampled++
		if !finite32(logits[i]) {
			x.fail("step %d, %v: non-finite logits", b.Step, it.Owner)
		}
		if sample.Greedy(it.Sampling) && !sample.Adjusts(it.Sampling) && outs[i].Token != sample.Argmax(logits[i]) {
			x.fail("step %d, %v: executor sampled %d, its logits' argmax is %d", b.Step, it.Owner, outs[i].Token, sample.Argmax(logits[i]))
		}
	}
	x.mu.Lock()
	x.batches++
	x.items += len(b.Items)
	x.sampled += sampled
	if prefill && decode {
		x.mixed++
	}
	if len(tenants) > 1 {
		x.tenants++
	}
	x.mu.Unlock()
	return outs, err
}

// job is one request of a scenario.
type job struct {
	tenant request.Tenant
	prompt string
	max    int
}

type outcome struct {
	Tokens []int
	Reason request.FinishReason
}

type nodeSetup struct {
	pageSize, pages int
	maxContext      int
	margin          float64
	batchTokens     int
	kv              kvcache.DType
	// wrap, if set, wraps the engine's executor (positive controls).
	wrap func(sched.Executor) sched.Executor
}

// together runs all jobs concurrently through the scheduler on one engine,
// each submitted from its own goroutine, and returns their outputs, the
// checking executor and the final node stats.
func together(t *testing.T, m *model.Model, s nodeSetup, jobs []job) ([]outcome, *checkingExecutor, sched.NodeStats) {
	t.Helper()
	e, err := New(m, Options{Threads: 2, PageSize: s.pageSize, Pages: s.pages, KVType: s.kv, Scrub: kvcache.ScrubPoison})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	lim, err := sched.ComputeLimits(sched.ModelShape{ContextLength: m.Config.ContextLength, Vocab: m.Config.Vocab},
		e.KV.Layout(), e.KV.TotalPages(), s.maxContext, s.margin)
	if err != nil {
		t.Fatal(err)
	}
	var end []int
	for id := 0; id < m.Tokenizer.VocabSize(); id++ {
		if m.Tokenizer.IsEOG(id) {
			end = append(end, id)
		}
	}
	var inner sched.Executor = e.Executor()
	if s.wrap != nil {
		inner = s.wrap(inner)
	}
	check := &checkingExecutor{inner: inner, m: m, compute: kernels.NewPool(1)}
	defer check.compute.Close()
	n, err := sched.NewNode(sched.NodeConfig{
		Core:     sched.Config{Limits: lim, Pool: e.KV, MaxBatchTokens: s.batchTokens, EndTokens: end},
		Executor: check,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	}()

	out := make([]outcome, len(jobs))
	var wg sync.WaitGroup
	errs := make(chan error, len(jobs))
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner := request.Owner{Tenant: j.tenant, ID: request.NewID()}
			st, err := n.Submit(ctx, request.Params{Owner: owner, Prompt: m.Tokenizer.Encode(j.prompt, true, false), MaxTokens: j.max})
			if err != nil {
				errs <- fmt.Errorf("job %d: submit: %w", i, err)
				return
			}
			for {
				tok, err := st.Recv(ctx)
				if err == io.EOF {
					break
				}
				if err != nil {
					errs <- fmt.Errorf("job %d: recv: %w", i, err)
					return
				}
				if tok.Owner != owner || tok.Index != len(out[i].Tokens) {
					errs <- fmt.Errorf("job %d: token %+v on the stream of %v (want index %d)", i, tok, owner, len(out[i].Tokens))
					return
				}
				out[i].Tokens = append(out[i].Tokens, tok.ID)
			}
			res := st.Result()
			if res.Owner != owner {
				errs <- fmt.Errorf("job %d: result for %v on the stream of %v", i, res.Owner, owner)
			}
			if res.Err != nil {
				errs <- fmt.Errorf("job %d: %v: %w", i, res.Reason, res.Err)
			}
			if res.Usage.CompletionTokens != len(out[i].Tokens) && res.Reason == request.FinishLength {
				errs <- fmt.Errorf("job %d: usage says %d completion tokens, stream had %d", i, res.Usage.CompletionTokens, len(out[i].Tokens))
			}
			out[i].Reason = res.Reason
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	stats, err := n.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return out, check, stats
}

// checkClean checks the end state: every page free and nothing left
// running, no violation, no executor check failed.
func checkClean(t *testing.T, x *checkingExecutor, st sched.NodeStats) {
	t.Helper()
	p := st.Pool
	if p.FreePages != p.TotalPages || p.OwnedPages != 0 || p.SharedPages != 0 || p.QuarantinedPages != 0 || p.Sequences != 0 {
		t.Errorf("pages not all free after every request ended: %+v", p)
	}
	if p.Violations != 0 {
		t.Errorf("%d isolation violations", p.Violations)
	}
	if st.Core.Running != 0 || st.Core.Queued != 0 || st.Core.AbortedButCompleted != 0 || st.Core.Aborted != 0 {
		t.Errorf("scheduler not idle and clean: %+v", st.Core)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, e := range x.errs {
		t.Error(e)
	}
}

var twoTenantJobs = []job{
	{"acme", "Once upon a time, there was a dog named Max. Max", 40},
	{"globex", "Lily wanted to bake a cake for her mom.", 40},
	{"acme", "The sun", 24},
	{"globex", "One day, Tom went to the park with his big red ball. He saw a little bird sitting in a tree. The bird was sad because it could not fly. Tom wanted to help the bird, so he", 30},
}

// TestTwoTenantsMatchSolo is issue 3's end-to-end check in one process:
// two tenants generate concurrently through the scheduler on one engine
// and one page pool (greedy), and each request's tokens are exactly the
// tokens it produces alone. The pool poisons released and fresh pages, the
// executor is wrapped to check that no step reads or produces a non-finite
// value, and at the end every page is free again.
func TestTwoTenantsMatchSolo(t *testing.T) {
	for name, m := range e2eModels(t) {
		for _, kv := range []kvcache.DType{kvcache.F32, kvcache.F16} {
			t.Run(name+"/"+kv.String(), func(t *testing.T) {
				want := soloKV(t, m, twoTenantJobs, kv)
				if name == "stories260K" {
					distinct(t, twoTenantJobs, want)
				}
				got, x, st := together(t, m, nodeSetup{pageSize: 16, pages: 64, batchTokens: 32, kv: kv, maxContext: 512}, twoTenantJobs)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("batched outputs differ from solo (-solo +batched):\n%s", diff)
				}
				checkClean(t, x, st)
				x.mu.Lock()
				defer x.mu.Unlock()
				// The scenario must really have batched tenants together
				// and mixed prefill with decode, or it proved nothing.
				if x.tenants == 0 || x.mixed == 0 {
					t.Errorf("no batch held both tenants (%d) or mixed prefill and decode (%d) over %d batches", x.tenants, x.mixed, x.batches)
				}
				t.Logf("%d batches, %d items, %d sampled, %d with both tenants, %d mixed prefill+decode", x.batches, x.items, x.sampled, x.tenants, x.mixed)
			})
		}
	}
}

// TestPreemptionMatchesSolo runs many requests from two tenants on a pool
// far too small for all of them at once, so that the scheduler preempts
// and recomputes sequences; outputs must still equal the solo runs, and
// the pool must end empty, with F32 and F16 caches alike.
func TestPreemptionMatchesSolo(t *testing.T) {
	starts := []string{"Once upon a time", "Lily saw a cat", "Tom had a ball", "The bird", "Mom said", "One day, Max", "Sue and Ben", "The big tree"}
	var jobs []job
	for i, p := range starts {
		tenant := request.Tenant("acme")
		if i%2 == 1 {
			tenant = "globex"
		}
		jobs = append(jobs, job{tenant, p, 20 + 4*i})
	}
	for name, m := range e2eModels(t) {
		for _, kv := range []kvcache.DType{kvcache.F32, kvcache.F16} {
			t.Run(name+"/"+kv.String(), func(t *testing.T) {
				want := soloKV(t, m, jobs, kv)
				if name == "stories260K" {
					distinct(t, jobs, want)
				}
				// 32 pages of 4 positions (128, twice the 64-token
				// window): one request holds up to 14 pages, all eight
				// together about 80.
				got, x, st := together(t, m, nodeSetup{pageSize: 4, pages: 32, maxContext: 64, margin: 2, batchTokens: 16, kv: kv}, jobs)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("outputs under preemption differ from solo (-solo +batched):\n%s", diff)
				}
				checkClean(t, x, st)
				if st.Core.Preemptions == 0 {
					t.Errorf("no preemption happened: the pool was not small enough to test it")
				}
				t.Logf("%d preemptions, %d steps, %d batches checked", st.Core.Preemptions, st.Core.Steps, x.batches)
			})
		}
	}
}

// swapExecutor re-introduces the bug class the end-to-end test exists for:
// once, it hands one tenant's sampled token to another tenant's item.
type swapExecutor struct {
	inner   sched.Executor
	swapped bool
}

func (x *swapExecutor) Execute(ctx context.Context, b *sched.Batch) ([]sched.Outcome, error) {
	outs, err := x.inner.Execute(ctx, b)
	if err != nil || x.swapped {
		return outs, err
	}
	for i := range b.Items {
		for j := range i {
			a, c := &b.Items[i], &b.Items[j]
			if a.Sample && c.Sample && a.Owner.Tenant != c.Owner.Tenant && outs[i].Token != outs[j].Token {
				outs[i].Token, outs[j].Token = outs[j].Token, outs[i].Token
				x.swapped = true
				return outs, nil
			}
		}
	}
	return outs, nil
}

// TestE2ECatchesSwap is the positive control of the end-to-end test: with
// an executor that crosses one token between tenants, both the comparison
// with the solo outputs and the checking executor must notice.
func TestE2ECatchesSwap(t *testing.T) {
	m := stories(t)
	want := soloKV(t, m, twoTenantJobs, kvcache.F32)
	var sw *swapExecutor
	got, x, _ := together(t, m, nodeSetup{pageSize: 16, pages: 64, batchTokens: 32, maxContext: 512,
		wrap: func(e sched.Executor) sched.Executor { sw = &swapExecutor{inner: e}; return sw }}, twoTenantJobs)
	if !sw.swapped {
		t.Fatal("no batch held two tenants' samples to swap")
	}
	if cmp.Equal(want, got) {
		t.Error("outputs equal the solo runs although a token crossed tenants")
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.errs) == 0 || !strings.Contains(x.errs[0], "argmax") {
		t.Errorf("checking executor did not flag the crossed token: %q", x.errs)
	}
}

// soloKV runs each job alone through Engine.Generate on a fresh engine
// with a kv cache.
func soloKV(t *testing.T, m *model.Model, jobs []job, kv kvcache.DType) []outcome {
	t.Helper()
	e, err := New(m, Options{Threads: 1, KVType: kv, Scrub: kvcache.ScrubPoison})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	out := make([]outcome, len(jobs))
	for i, j := range jobs {
		ids := m.Tokenizer.Encode(j.prompt, true, false)
		_, reason, err := e.Generate(context.Background(), request.Owner{Tenant: j.tenant, ID: request.NewID()}, ids, j.max, request.Sampling{},
			func(tok int) error { out[i].Tokens = append(out[i].Tokens, tok); return nil })
		if err != nil {
			t.Fatalf("solo %d: %v", i, err)
		}
		out[i].Reason = reason
	}
	return out
}

// TestPoisonIsVisible is the positive control for the checking executor:
// under ScrubPoison, positions a sequence has not written, in fresh pages
// and in pages released by another tenant, read as NaN through a View, so
// a step that read them would be caught.
func TestPoisonIsVisible(t *testing.T) {
	m := builtinModel(t, "tiny")
	for _, kv := range []kvcache.DType{kvcache.F32, kvcache.F16} {
		e, err := New(m, Options{Threads: 1, KVType: kv, Pages: 4, Scrub: kvcache.ScrubPoison})
		if err != nil {
			t.Fatal(err)
		}
		x := &checkingExecutor{m: m}
		it := func(s *kvcache.Sequence, n int) *sched.Item {
			if err := e.KV.Reserve(s, n); err != nil {
				t.Fatal(err)
			}
			v, err := e.KV.Begin(s, n)
			if err != nil {
				t.Fatal(err)
			}
			return &sched.Item{Owner: s.Owner(), View: v, Tokens: make([]int, n)}
		}
		a := e.KV.NewSequence(request.Owner{Tenant: "a", ID: request.NewID()})
		x.checkKV(1, it(a, 5), 5, "fresh page")
		if _, err := e.step(a, []int{1, 2, 3, 4, 5}, model.LogitsLast, true); err != nil {
			t.Fatal(err)
		}
		x.checkKV(2, it(a, 1), 5, "written positions")
		e.KV.Release(a)
		b := e.KV.NewSequence(request.Owner{Tenant: "b", ID: request.NewID()})
		x.checkKV(3, it(b, 16), 16, "page released by another tenant")
		e.Close()
		want := []string{"fresh page", "page released by another tenant"}
		var got []string
		for _, msg := range x.errs {
			for _, w := range want {
				if strings.Contains(msg, w) {
					got = append(got, w)
				}
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%v: poison reads caught (-want +got):\n%s\nall: %q", kv, diff, x.errs)
		}
	}
	// And the F16 check recognises half-precision NaN and Inf.
	if finite16([]uint16{quant.F32ToF16(float32(math.NaN()))}) || finite16([]uint16{quant.F32ToF16(float32(math.Inf(1)))}) || !finite16([]uint16{quant.F32ToF16(65504)}) {
		t.Error("finite16 is wrong")
	}
}
