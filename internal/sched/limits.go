package sched

import (
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// DefaultSafetyMargin is --kv-safety-margin's default: the pool must hold
// at least twice the advertised window, as in the incident's fix.
const DefaultSafetyMargin = 2.0

// Errors of ComputeLimits.
var (
	// ErrCapacity: the KV pool cannot serve the advertised window with the
	// safety margin. The node must not start.
	ErrCapacity = errors.New("sched: KV cache too small for the context window")
	// ErrBadLimits: the inputs of ComputeLimits are inconsistent.
	ErrBadLimits = errors.New("sched: invalid limits configuration")
)

// ModelShape is what the limits need to know about the model.
type ModelShape struct {
	// ContextLength is the model's trained context window; it is the
	// default --max-context and an upper bound for it.
	ContextLength int
	// Vocab is the vocabulary size; prompt tokens outside [0, Vocab) are
	// refused at admission. 0 skips that check.
	Vocab int
}

// Limits is the one set of limits of a node (invariant I5), computed once
// at start-up by ComputeLimits and then only read. The gateway, admission
// and the scheduler all check against this value; a prefill and a decode
// node compare theirs in the handshake (Limits is comparable with ==).
type Limits struct {
	TotalPages    int // pages in the pool
	ReservedPages int // pages the pool keeps for itself (sentinels)
	UsablePages   int // TotalPages - ReservedPages
	PageSize      int // token positions per page
	PageBytes     int64
	UsableTokens  int // UsablePages * PageSize

	ModelContext int     // the model's trained window
	MaxContext   int     // W: prompt + max_tokens ≤ W
	SafetyMargin float64 // UsableTokens ≥ MaxContext * SafetyMargin
	// MaxPromptTokens is MaxContext-1: a prompt must leave room for at
	// least one generated token.
	MaxPromptTokens int
	// PagesPerMaxRequest is the number of pages one request at the full
	// window holds at most.
	PagesPerMaxRequest int
	Vocab              int
}

// ComputeLimits derives the limits from the model, the pool's layout and
// page count, the advertised window (0: the model's) and the safety margin
// (0: DefaultSafetyMargin). It refuses, with ErrCapacity and a message
// naming the numbers and the flags to change, when the usable KV capacity
// divided by the margin is below the window.
func ComputeLimits(m ModelShape, layout kvcache.Layout, pages, maxContext int, margin float64) (Limits, error) {
	if margin == 0 {
		margin = DefaultSafetyMargin
	}
	if maxContext == 0 {
		maxContext = m.ContextLength
	}
	switch {
	case m.ContextLength <= 0:
		return Limits{}, fmt.Errorf("%w: model context length %d", ErrBadLimits, m.ContextLength)
	case layout.Validate() != nil:
		return Limits{}, fmt.Errorf("%w: %w", ErrBadLimits, layout.Validate())
	case pages < 0:
		return Limits{}, fmt.Errorf("%w: %d pages", ErrBadLimits, pages)
	case maxContext < 2:
		return Limits{}, fmt.Errorf("%w: --max-context %d is below 2 tokens", ErrBadLimits, maxContext)
	case maxContext > m.ContextLength:
		return Limits{}, fmt.Errorf("%w: --max-context %d exceeds the model's trained context length %d", ErrBadLimits, maxContext, m.ContextLength)
	case math.IsNaN(margin) || margin < 1 || margin > 1000:
		return Limits{}, fmt.Errorf("%w: --kv-safety-margin %g must be between 1 and 1000", ErrBadLimits, margin)
	}
	if layout.PageSize == 0 {
		layout.PageSize = kvcache.DefaultPageSize
	}
	// The pool keeps its sentinel (PageID 0) outside the pages it counts,
	// so every counted page is usable; the field stays so that a pool
	// that sets pages aside reports them here.
	reserved := 0
	l := Limits{
		TotalPages:    pages,
		ReservedPages: reserved,
		UsablePages:   pages - reserved,
		PageSize:      layout.PageSize,
		PageBytes:     layout.PageBytes(),
		ModelContext:  m.ContextLength,
		MaxContext:    maxContext,
		SafetyMargin:  margin,
		Vocab:         m.Vocab,
	}
	l.UsableTokens = l.UsablePages * l.PageSize
	l.MaxPromptTokens = maxContext - 1
	l.PagesPerMaxRequest = (maxContext + l.PageSize - 1) / l.PageSize
	// Compare in float64 so a fractional margin is exact enough and a huge
	// window cannot overflow.
	need := float64(maxContext) * margin
	if float64(l.UsableTokens) < need {
		needPages := int64(math.Ceil(need / float64(l.PageSize)))
		fit := int(float64(l.UsableTokens) / margin)
		return Limits{}, fmt.Errorf("%w: to serve --max-context %d tokens with --kv-safety-margin %g, the KV cache needs %d tokens "+
			"(%d pages, %s), but it holds %d usable tokens (%d pages of %d tokens, %s); "+
			"raise --kv-memory to at least %s, lower --max-context to at most %d, or lower --kv-safety-margin",
			ErrCapacity, maxContext, margin, int64(math.Ceil(need)),
			needPages+int64(reserved), gib(needPages*l.PageBytes), l.UsableTokens, l.UsablePages, l.PageSize, gib(int64(l.UsablePages)*l.PageBytes),
			gib((needPages+int64(reserved))*l.PageBytes), fit)
	}
	return l, nil
}

func gib(b int64) string { return kvcache.FormatBytes(b) }

// String is the capacity report `pagewarden capacity` prints.
func (l Limits) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "KV pages:          %d total, %d reserved, %d usable\n", l.TotalPages, l.ReservedPages, l.UsablePages)
	fmt.Fprintf(&b, "page:              %d tokens, %d bytes\n", l.PageSize, l.PageBytes)
	fmt.Fprintf(&b, "usable KV tokens:  %d (%s)\n", l.UsableTokens, gib(int64(l.UsablePages)*l.PageBytes))
	fmt.Fprintf(&b, "model context:     %d\n", l.ModelContext)
	fmt.Fprintf(&b, "max context (W):   %d (prompt + max_tokens must not exceed it)\n", l.MaxContext)
	fmt.Fprintf(&b, "max prompt tokens: %d\n", l.MaxPromptTokens)
	fmt.Fprintf(&b, "safety margin:     %g (usable tokens / W = %.2f)\n", l.SafetyMargin, float64(l.UsableTokens)/float64(max(l.MaxContext, 1)))
	fmt.Fprintf(&b, "full-window requests that fit at once: %d\n", l.UsablePages/max(l.PagesPerMaxRequest, 1))
	return b.String()
}

// PagesFor is the number of pages n token positions occupy.
func (l Limits) PagesFor(n int) int {
	if n <= 0 {
		return 0
	}
	return (n + l.PageSize - 1) / l.PageSize
}
