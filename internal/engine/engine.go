// Package engine runs one model over the paged KV cache for a single
// process: it owns the compute pool, the KV page pool and the scratch
// buffers, and offers single-stream generation (the run and bench commands)
// and teacher-forced scoring (conformance tests). Every step goes through
// kvcache.Pool.Begin, so even the simplest path is checked for ownership.
package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sample"
)

// Options configure an Engine. The zero value is usable.
type Options struct {
	Threads  int // compute threads; 0 means 1
	PageSize int // tokens per KV page; 0 means 16
	// Pages is the KV pool's size; 0 means enough for one full context,
	// or, for a model windowed on every layer, for one sequence's
	// window and a prefill chunk (step gives back the pages behind it).
	Pages        int
	KVType       kvcache.DType // F32 (default) or F16
	Scrub        kvcache.ScrubPolicy
	AllowNoScrub bool
	PrefillChunk int // tokens per prefill forward pass; 0 means 256
}

// Engine is a model bound to a KV pool and a compute pool. It is driven by
// one goroutine at a time.
type Engine struct {
	Model        *model.Model
	KV           *kvcache.Pool
	Compute      *kernels.Pool
	scratch      model.Scratch
	prefillChunk int
	cons         constraints // output constraints of the sequences sampled for
}

// ErrContext reports a request that cannot fit the model's window.
var ErrContext = errors.New("engine: prompt plus new tokens exceed the context window")

// New builds an engine for m.
func New(m *model.Model, o Options) (*Engine, error) {
	if o.Threads <= 0 {
		o.Threads = 1
	}
	if o.PageSize <= 0 {
		o.PageSize = 16
	}
	if o.PrefillChunk <= 0 {
		o.PrefillChunk = 256
	}
	c := m.Config
	layout := kvcache.Layout{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: o.PageSize, DType: o.KVType}
	if o.Pages <= 0 {
		o.Pages = (c.ContextLength + o.PageSize - 1) / o.PageSize
		if w := c.EveryLayerWindow(); w > 0 {
			// The most one sequence holds: the window's positions
			// before a step and the step's (at most a chunk), over
			// pages that need not be aligned to them.
			o.Pages = min(o.Pages, (w-1+o.PrefillChunk+o.PageSize-1)/o.PageSize+1)
		}
	}
	kv, err := kvcache.NewPool(kvcache.Config{Layout: layout, Pages: o.Pages, Scrub: o.Scrub, AllowNoScrub: o.AllowNoScrub, ModelDigest: m.Digest})
	if err != nil {
		return nil, err
	}
	return &Engine{Model: m, KV: kv, Compute: kernels.NewPool(o.Threads), prefillChunk: o.PrefillChunk}, nil
}

// Close stops the compute workers.
func (e *Engine) Close() { e.Compute.Close() }

// Stats describe one generation.
type Stats struct {
	PromptTokens    int
	GeneratedTokens int
	Prefill         time.Duration
	Decode          time.Duration // from the first to the last generated token
}

// PrefillRate is prompt tokens per second.
func (s Stats) PrefillRate() float64 { return rate(s.PromptTokens, s.Prefill) }

// DecodeRate is generated tokens per second after the first.
func (s Stats) DecodeRate() float64 { return rate(s.GeneratedTokens-1, s.Decode) }

func rate(n int, d time.Duration) float64 {
	if n <= 0 || d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// step runs tokens through the model for seq and commits them. For a model
// windowed on every layer it then gives back the pages behind the window
// (kvcache.Pool.DropBefore): the next position, Len(), sees keys from
// Len()-window+1 on, so a long generation holds a window's pages, not the
// whole context's.
//
// With reuse the logits row lives in the engine's scratch and the next
// step overwrites it (model.ForwardReusing): for callers done with it by
// then; Score, which keeps every chunk's rows, passes false.
func (e *Engine) step(seq *kvcache.Sequence, tokens []int, mode model.LogitsMode, reuse bool) ([]float32, error) {
	if err := e.KV.Reserve(seq, len(tokens)); err != nil {
		return nil, err
	}
	v, err := e.KV.Begin(seq, len(tokens))
	if err != nil {
		return nil, err
	}
	forward := e.Model.Forward
	if reuse {
		forward = e.Model.ForwardReusing
	}
	out, err := forward(e.Compute, []model.Input{{Tokens: tokens, View: v, Logits: mode}}, &e.scratch)
	if err != nil {
		return nil, err
	}
	if err := e.KV.Commit(v); err != nil {
		return nil, err
	}
	if w := e.Model.Config.EveryLayerWindow(); w > 0 {
		if _, err := e.KV.DropBefore(seq, seq.Len()-w+1); err != nil {
			return nil, err
		}
	}
	return out[0], nil
}

// Generate feeds prompt and samples up to maxTokens new tokens, calling emit
// for each. It stops early at an end-of-generation token (which is not
// emitted). The returned reason is FinishStop or FinishLength on success.
func (e *Engine) Generate(ctx context.Context, owner request.Owner, prompt []int, maxTokens int, cfg request.Sampling,
	emit func(tok int) error) (Stats, request.FinishReason, error) {
	return e.GenerateParams(ctx, request.Params{Owner: owner, Prompt: prompt, MaxTokens: maxTokens, Sampling: cfg}, emit)
}

// GenerateParams is Generate for a whole request: besides the model's
// end-of-generation tokens, p.StopTokens end it (neither is emitted), and
// with p.IgnoreEOS the end-of-generation tokens are emitted like any other
// and only p.StopTokens and p.MaxTokens end it, as in the scheduler.
func (e *Engine) GenerateParams(ctx context.Context, p request.Params, emit func(tok int) error) (Stats, request.FinishReason, error) {
	owner, prompt, maxTokens, cfg := p.Owner, p.Prompt, p.MaxTokens, p.Sampling
	st := Stats{PromptTokens: len(prompt)}
	if len(prompt) == 0 {
		return st, request.FinishError, errors.New("engine: empty prompt (a model needs at least one token, e.g. BOS)")
	}
	if w := e.Model.Config.ContextLength; len(prompt)+maxTokens > w {
		return st, request.FinishError, fmt.Errorf("%w: %d prompt tokens + %d new tokens > %d", ErrContext, len(prompt), maxTokens, w)
	}
	seq := e.KV.NewSequence(owner)
	defer e.KV.Release(seq)
	history := append(make([]int, 0, len(prompt)+maxTokens), prompt...)
	var smp sample.Sampler
	tok := e.Model.Tokenizer
	start := time.Now()
	var logits []float32
	for lo := 0; lo < len(prompt); lo += e.prefillChunk {
		hi := min(lo+e.prefillChunk, len(prompt))
		mode := model.LogitsNone
		if hi == len(prompt) {
			mode = model.LogitsLast
		}
		out, err := e.step(seq, prompt[lo:hi], mode, true)
		if err != nil {
			return st, request.FinishError, err
		}
		logits = out
		if err := ctx.Err(); err != nil {
			return st, request.FinishAbort, err
		}
	}
	st.Prefill = time.Since(start)
	decodeStart := time.Now()
	if cfg.Grammar != nil {
		defer e.cons.forget(owner)
	}
	for st.GeneratedTokens < maxTokens {
		var allowed []uint64
		if cfg.Grammar != nil {
			var err error
			if allowed, err = e.cons.mask(e, owner, cfg.Grammar, st.GeneratedTokens, history); err != nil {
				return st, request.FinishError, err
			}
		}
		next, err := DrawAllowed(&smp, cfg, st.GeneratedTokens, history, logits, allowed)
		if err != nil {
			return st, request.FinishError, err
		}
		if slices.Contains(p.StopTokens, next) || (!p.IgnoreEOS && tok.IsEOG(next)) {
			st.Decode = time.Since(decodeStart)
			return st, request.FinishStop, nil
		}
		if st.GeneratedTokens == 0 {
			decodeStart = time.Now()
		}
		st.GeneratedTokens++
		history = append(history, next)
		if err := emit(next); err != nil {
			return st, request.FinishAbort, err
		}
		if st.GeneratedTokens == maxTokens {
			break
		}
		if err := ctx.Err(); err != nil {
			return st, request.FinishAbort, err
		}
		out, err := e.step(seq, []int{next}, model.LogitsLast, true)
		if err != nil {
			return st, request.FinishError, err
		}
		logits = out
	}
	st.Decode = time.Since(decodeStart)
	return st, request.FinishLength, nil
}

// Score runs tokens teacher-forced and returns the logits after every
// position (len(tokens) rows of Vocab values).
func (e *Engine) Score(owner request.Owner, tokens []int) ([][]float32, error) {
	seq := e.KV.NewSequence(owner)
	defer e.KV.Release(seq)
	vocab := e.Model.Config.Vocab
	var rows [][]float32
	for lo := 0; lo < len(tokens); lo += e.prefillChunk {
		hi := min(lo+e.prefillChunk, len(tokens))
		out, err := e.step(seq, tokens[lo:hi], model.LogitsAll, false)
		if err != nil {
			return nil, err
		}
		for r := 0; r < hi-lo; r++ {
			rows = append(rows, out[r*vocab:(r+1)*vocab])
		}
	}
	return rows, nil
}
