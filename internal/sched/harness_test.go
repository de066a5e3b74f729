package sched

import (
	"cmp"
	"fmt"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched/ownerecho"
)

// harness drives a Core over a real pool with the owner-echo model, for
// directed tests.
type harness struct {
	core    *Core
	pool    *kvcache.Pool
	lim     Limits
	exec    *echoExecutor
	params  map[request.Owner]request.Params
	tokens  map[request.Owner][]int
	results map[request.Owner]request.Result
	nres    map[request.Owner]int
	ids     int
	// last is the owners and token counts of the last batch, in order.
	last []string
	// failNext fails the next executed item of these requests.
	failNext map[request.Owner]bool
	// failed records the requests an injected failure reached.
	failed map[request.Owner]bool
	// failErr is the error failNext injects (nil: errInjected).
	failErr error
}

type harnessOpts struct {
	window, pageSize, pages int
	batchTokens, maxRunning int
	watermark               int // 0: none
	prefix                  bool
	policy                  map[request.Tenant]TenantPolicy
	endTokens               []int
	reapAfter               time.Duration
	// attnWindow makes the echo model a sliding-window one and gives
	// the core its window (Config.Window).
	attnWindow int
}

const harnessVocab = 64

func newHarness(t testing.TB, o harnessOpts) *harness {
	t.Helper()
	layout := ownerecho.Layout(o.pageSize)
	lim, err := ComputeLimits(ModelShape{ContextLength: o.window, Vocab: harnessVocab}, layout, o.pages, o.window, 1)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kvcache.NewPool(kvcache.Config{Layout: layout, Pages: o.pages, Scrub: kvcache.ScrubPoison, VerifyScrub: true})
	if err != nil {
		t.Fatal(err)
	}
	wm := o.watermark
	if wm == 0 {
		wm = -1
	}
	cfg := Config{
		Limits: lim, Pool: pool, MaxBatchTokens: o.batchTokens, MaxRunning: o.maxRunning,
		WatermarkPages: wm, PrefixCache: o.prefix, EndTokens: o.endTokens,
		QuarantineReapAfter: o.reapAfter, Window: o.attnWindow,
	}
	if o.policy != nil {
		cfg.Policy = func(t request.Tenant) TenantPolicy { return o.policy[t] }
	}
	core, err := NewCore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{
		core: core, pool: pool, lim: lim, exec: &echoExecutor{vocab: harnessVocab, window: o.attnWindow},
		params: map[request.Owner]request.Params{}, tokens: map[request.Owner][]int{},
		results: map[request.Owner]request.Result{}, nres: map[request.Owner]int{},
		failNext: map[request.Owner]bool{}, failed: map[request.Owner]bool{},
	}
}

func (h *harness) owner(tenant request.Tenant) request.Owner {
	h.ids++
	var id request.ID
	id[0], id[1], id[15] = byte(h.ids), byte(h.ids>>8), 7
	return request.Owner{Tenant: tenant, ID: id}
}

// params makes a request whose prompt tokens avoid every end token.
func (h *harness) mkParams(tenant request.Tenant, prompt, maxTokens int) request.Params {
	o := h.owner(tenant)
	p := request.Params{Owner: o, Prompt: make([]int, prompt), MaxTokens: maxTokens}
	for i := range p.Prompt {
		p.Prompt[i] = (h.ids*7 + i*3) % harnessVocab
	}
	return p
}

func (h *harness) submitParams(p request.Params) error {
	a, err := h.lim.Admit(p)
	if err != nil {
		return err
	}
	if err := h.core.Submit(a); err != nil {
		return err
	}
	h.params[p.Owner] = p
	return nil
}

func (h *harness) submit(t testing.TB, tenant request.Tenant, prompt, maxTokens int) request.Owner {
	t.Helper()
	p := h.mkParams(tenant, prompt, maxTokens)
	if err := h.submitParams(p); err != nil {
		t.Fatalf("submit %v: %v", p.Owner, err)
	}
	return p.Owner
}

// deliver records and checks tokens and results.
func (h *harness) deliver(t testing.TB, rd Ready) {
	t.Helper()
	for _, tok := range rd.Tokens {
		p := h.params[tok.Owner]
		hist := append(append([]int(nil), p.Prompt...), h.tokens[tok.Owner]...)
		if want := echoNextWindow(tok.Owner, p.CacheSalt, hist, harnessVocab, h.exec.window); tok.ID != want {
			t.Fatalf("token %d of %v is %d, want %d", tok.Index, tok.Owner, tok.ID, want)
		}
		if tok.Index != len(h.tokens[tok.Owner]) {
			t.Fatalf("token index %d, want %d", tok.Index, len(h.tokens[tok.Owner]))
		}
		if err := checkEchoPrompt(p, tok); err != nil {
			t.Fatal(err)
		}
		h.tokens[tok.Owner] = append(h.tokens[tok.Owner], tok.ID)
	}
	for _, res := range rd.Results {
		h.nres[res.Owner]++
		if h.nres[res.Owner] > 1 {
			t.Fatalf("second result for %v: %+v", res.Owner, res)
		}
		h.results[res.Owner] = res
	}
}

// checkEchoPrompt checks a token's prompt logprobs: none unless it is
// the first of a request that asked, then the owner-echo model's for
// every prompt position after the first, in order.
func checkEchoPrompt(p request.Params, tok request.Token) error {
	if tok.Index != 0 || !p.Sampling.PromptLogprobs {
		if tok.Prompt != nil {
			return fmt.Errorf("token %d of %v carries %d prompt logprobs", tok.Index, tok.Owner, len(tok.Prompt))
		}
		return nil
	}
	if len(tok.Prompt) != max(len(p.Prompt)-1, 0) {
		return fmt.Errorf("%v: %d prompt logprobs for %d prompt tokens", tok.Owner, len(tok.Prompt), len(p.Prompt))
	}
	for i, l := range tok.Prompt {
		want := echoPromptLogprobs(i+1, p.Prompt[i+1], p.Sampling.PromptTopLogprobs)
		if l.Logprob != want.Logprob || len(l.Top) != len(want.Top) {
			return fmt.Errorf("%v: prompt token %d: %+v, want %+v", tok.Owner, i+1, l, want)
		}
	}
	return nil
}

// ready takes the core's Ready and delivers it.
func (h *harness) ready(t testing.TB) Ready {
	t.Helper()
	rd := h.core.Ready()
	h.deliver(t, rd)
	h.last = h.last[:0]
	if rd.Batch != nil {
		for _, it := range rd.Batch.Items {
			h.last = append(h.last, fmt.Sprintf("%s:%d", it.Owner.Tenant, len(it.Tokens)))
		}
	}
	return rd
}

// finish executes and advances a batch from ready.
func (h *harness) finish(t testing.TB, rd Ready) {
	t.Helper()
	if rd.Batch == nil {
		return
	}
	outs, err := h.exec.Execute(nil, rd.Batch)
	if len(h.exec.foreign) > 0 {
		t.Fatalf("foreign reads: %v", h.exec.foreign)
	}
	for i, it := range rd.Batch.Items {
		if h.failNext[it.Owner] && err == nil {
			outs[i].Err = cmp.Or(h.failErr, errInjected)
			delete(h.failNext, it.Owner)
			h.failed[it.Owner] = true
		}
	}
	if err := h.core.Advance(rd.Batch, outs, err); err != nil {
		t.Fatal(err)
	}
	if err := h.core.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// step is one Ready, execute, Advance.
func (h *harness) step(t testing.TB) Ready {
	t.Helper()
	rd := h.ready(t)
	h.finish(t, rd)
	return rd
}

// drain steps until the core is idle.
func (h *harness) drain(t testing.TB) {
	t.Helper()
	for i := 0; !h.core.Idle(); i++ {
		if i > 10000 {
			t.Fatalf("no quiescence: %+v", h.core.Stats())
		}
		h.step(t)
	}
}

// checkFree checks every page is back.
func (h *harness) checkFree(t testing.TB) {
	t.Helper()
	st := h.pool.Stats()
	if st.FreePages+st.CachedPages != st.TotalPages || st.Sequences != 0 || st.OwnedPages != 0 || st.QuarantinedPages != 0 {
		t.Fatalf("pool not back to free: %+v", st)
	}
}
