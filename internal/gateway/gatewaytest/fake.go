// Package gatewaytest provides a deterministic fake Backend for testing the
// gateway (and anything that drives it) without a model.
//
// The fake model is byte-level: token id b+3 is the byte b, 1 is BOS "<s>",
// 2 is EOS "</s>". It "generates" a scripted reply one byte per token, then
// EOS (ending early at one of the request's StopTokens; with IgnoreEOS,
// EOS repeated up to MaxTokens), tags every token with the request's
// owner, and can be told per request to fail, abort, stall, or emit output
// with a wrong owner, so the gateway's error paths and echo check can be
// exercised exactly. It also accounts KV pages the way a real pool would
// (reserved on Submit, returned at the terminal state), so tests can
// assert that nothing leaks.
package gatewaytest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/request"
)

// Token ids of the fake vocabulary.
const (
	BOS       = 1
	EOS       = 2
	byteBase  = 3
	VocabSize = byteBase + 256
)

// DefaultReply is generated when a Behavior sets no Reply.
const DefaultReply = "Hello from pagewarden."

// Fault is something the fake does wrong on purpose.
type Fault int

const (
	NoFault                  Fault = iota
	FaultError                     // after At tokens: FinishError with request.ErrInternal
	FaultAbort                     // after At tokens: FinishAbort (a server-side abort)
	FaultStall                     // after At tokens: wait until aborted or ctx is done
	FaultWrongOwner                // token number At (0-based) carries another tenant's owner
	FaultResultOwner               // the terminal Result carries another owner
	FaultBadUsage                  // the Result's usage miscounts completion tokens
	FaultSuccessWithErr            // FinishStop with a non-nil Err
	FaultTokenIndex                // token number At carries index At+1 (a gap: a lost or reordered token)
	FaultRepeatIndex               // token number At carries index At-1 (a duplicate)
	FaultLogprobNaN                // token number At's logprob is NaN
	FaultExtraLogprobs             // token number At carries one more alternative than asked
	FaultShiftLogprobs             // every logprob is 0.5 lower: an answer whose re-score differs
	FaultShortPromptLogprobs       // the first token carries one prompt logprob fewer than the prompt's
)

// Logprob is the fake's log-probability of token id wherever it stands,
// generated or in a prompt (request.Sampling.PromptLogprobs): a function
// of the id alone, so that a re-score of the same tokens — teacher-forced
// decode, or one prefill over prompt and answer (the replay audit's) —
// gives the same values. Its alternatives are the ids after id, each 1
// lower than the one before.
func Logprob(id int) *request.Logprobs {
	return &request.Logprobs{Logprob: -0.125 - 0.25*float32(id%4)}
}

func logprobs(id, top int) *request.Logprobs {
	lp := Logprob(id)
	for k := range top {
		lp.Top = append(lp.Top, request.TokenLogprob{ID: (id + k) % VocabSize, Logprob: lp.Logprob - float32(k)})
	}
	return lp
}

// Behavior scripts one request.
type Behavior struct {
	Reply     string // generated text, one token per byte, then EOS; "" means DefaultReply
	SubmitErr error  // Submit fails with it; nothing is reserved
	Fault     Fault
	At        int
	Delay     time.Duration // before each token
	// Gate, when set, holds the first token until it is closed: a test
	// that must act while the request runs need not race its end.
	Gate      <-chan struct{}
	CachedTok int // reported as Usage.CachedTokens
	// AbortErr is the terminal error reported when the request is
	// aborted through Abort (nil: request.ErrAborted): e.g. an internal
	// failure that races the gateway's abort.
	AbortErr error
}

// Fake is a gateway.Backend. Set its fields before use.
type Fake struct {
	Model    string
	Window   int // served context window
	PageSize int
	Pages    int    // pool size, for PoolStats
	Template string // chat template; "" means none
	// FIMTokens, when three ids, are the fill-in-the-middle tokens the
	// fake's model offers (gateway.FillInTheMiddle); otherwise none.
	FIMTokens []int
	// Behave picks the behaviour of each request; nil means defaults.
	Behave func(p request.Params) Behavior

	submits    atomic.Int64
	aborts     atomic.Int64
	violations atomic.Uint64

	mu        sync.Mutex
	live      map[request.ID]*stream
	pagesUsed int
	last      request.Params
}

var (
	_ gateway.Backend         = (*Fake)(nil)
	_ gateway.StatsSource     = (*Fake)(nil)
	_ gateway.FillInTheMiddle = (*Fake)(nil)
)

// FIM returns FIMTokens (gateway.FillInTheMiddle).
func (f *Fake) FIM() (pre, suf, mid int, ok bool) {
	if len(f.FIMTokens) != 3 {
		return 0, 0, 0, false
	}
	return f.FIMTokens[0], f.FIMTokens[1], f.FIMTokens[2], true
}

// ErrUnknownToken is returned by Detokenize for ids outside the vocabulary.
var ErrUnknownToken = errors.New("gatewaytest: unknown token id")

// NewFake returns a fake serving "fake-model" with a 256-token window and
// 16-token pages.
func NewFake() *Fake {
	return &Fake{Model: "fake-model", Window: 256, PageSize: 16, Pages: 1024}
}

func (f *Fake) ModelID() string { return f.Model }

func (f *Fake) Limits() gateway.Limits {
	return gateway.Limits{MaxContext: f.Window, PageSize: f.PageSize}
}

func (f *Fake) Tokenize(text string, addSpecial, parseSpecial bool) ([]int, error) {
	ids := make([]int, 0, len(text)+1)
	if addSpecial {
		ids = append(ids, BOS)
	}
	for i := 0; i < len(text); {
		if parseSpecial && strings.HasPrefix(text[i:], "<s>") {
			ids, i = append(ids, BOS), i+3
			continue
		}
		if parseSpecial && strings.HasPrefix(text[i:], "</s>") {
			ids, i = append(ids, EOS), i+4
			continue
		}
		ids, i = append(ids, byteBase+int(text[i])), i+1
	}
	return ids, nil
}

func (f *Fake) Detokenize(ids []int) (string, error) {
	var b strings.Builder
	for _, id := range ids {
		p := f.TokenPiece(id)
		if p == nil {
			return "", fmt.Errorf("%w: %d", ErrUnknownToken, id)
		}
		b.Write(p)
	}
	return b.String(), nil
}

func (f *Fake) TokenPiece(id int) []byte {
	switch {
	case id == BOS:
		return []byte("<s>")
	case id == EOS:
		return []byte("</s>")
	case id >= byteBase && id < VocabSize:
		return []byte{byte(id - byteBase)}
	}
	return nil
}

func (f *Fake) ChatTemplate() string { return f.Template }
func (f *Fake) BOS() int             { return BOS }
func (f *Fake) EOS() int             { return EOS }
func (f *Fake) IsEOG(id int) bool    { return id == EOS }

// Submits is the number of Submit calls (successful or not).
func (f *Fake) Submits() int { return int(f.submits.Load()) }

// Aborts is the number of Abort calls, whether or not the request was
// still live (it may have ended on its own, or on ctx, a moment before).
func (f *Fake) Aborts() int { return int(f.aborts.Load()) }

// PagesUsed is the number of pages reserved by live requests.
func (f *Fake) PagesUsed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pagesUsed
}

// Live is the number of requests not yet terminal.
func (f *Fake) Live() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live)
}

// LastParams is the most recent request submitted.
func (f *Fake) LastParams() request.Params {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last
}

// SetIsolationViolations sets the value reported by IsolationViolations.
func (f *Fake) SetIsolationViolations(n uint64) { f.violations.Store(n) }

func (f *Fake) PoolStats() gateway.PoolStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return gateway.PoolStats{PagesTotal: f.Pages, PagesUsed: f.pagesUsed, PagesFree: f.Pages - f.pagesUsed, Running: len(f.live)}
}

func (f *Fake) IsolationViolations() uint64 { return f.violations.Load() }
func (f *Fake) AbortedButCompleted() uint64 { return 0 }

type stream struct {
	f      *Fake
	p      request.Params
	b      Behavior
	pages  int
	tokens chan request.Token
	abort  chan struct{}
	once   sync.Once
	done   chan struct{}
	res    request.Result
}

func (s *stream) Tokens() <-chan request.Token { return s.tokens }
func (s *stream) Result() request.Result       { <-s.done; return s.res }

func (f *Fake) Submit(ctx context.Context, p request.Params) (gateway.Stream, error) {
	f.submits.Add(1)
	var b Behavior
	if f.Behave != nil {
		b = f.Behave(p)
	}
	if b.SubmitErr != nil {
		return nil, b.SubmitErr
	}
	if len(p.Prompt)+p.MaxTokens > f.Window {
		// The scheduler's own admission check: the gateway must never
		// let such a request through, so reaching this is a bug there.
		return nil, fmt.Errorf("gatewaytest: %w: %d+%d > %d", request.ErrContextLength, len(p.Prompt), p.MaxTokens, f.Window)
	}
	if b.Reply == "" {
		b.Reply = DefaultReply
	}
	s := &stream{f: f, p: p, b: b, tokens: make(chan request.Token), abort: make(chan struct{}), done: make(chan struct{})}
	if f.PageSize > 0 {
		s.pages = (len(p.Prompt) + p.MaxTokens + f.PageSize - 1) / f.PageSize
	}
	f.mu.Lock()
	if f.live == nil {
		f.live = make(map[request.ID]*stream)
	}
	f.live[p.Owner.ID] = s
	f.pagesUsed += s.pages
	f.last = p
	f.mu.Unlock()
	go s.run(ctx)
	return s, nil
}

func (f *Fake) Abort(tenant request.Tenant, id request.ID) error {
	f.aborts.Add(1)
	f.mu.Lock()
	s := f.live[id]
	f.mu.Unlock()
	if s == nil || s.p.Owner.Tenant != tenant {
		return request.ErrNotFound
	}
	s.once.Do(func() { close(s.abort) })
	return nil
}

func (s *stream) run(ctx context.Context) {
	owner := s.p.Owner
	res := request.Result{Owner: owner, Usage: request.Usage{PromptTokens: len(s.p.Prompt), CachedTokens: s.b.CachedTok}}
	defer func() {
		close(s.tokens)
		s.f.mu.Lock()
		delete(s.f.live, owner.ID)
		s.f.pagesUsed -= s.pages
		s.f.mu.Unlock()
		s.res = res
		close(s.done)
	}()
	aborted := func(err error) {
		res.Reason, res.Err = request.FinishAbort, err
	}
	ids := make([]int, 0, len(s.b.Reply)+1)
	for i := 0; i < len(s.b.Reply); i++ {
		ids = append(ids, byteBase+int(s.b.Reply[i]))
	}
	reason := request.FinishLength
	stop := slices.IndexFunc(ids, func(id int) bool { return slices.Contains(s.p.StopTokens, id) })
	switch {
	case stop >= 0 && stop < s.p.MaxTokens:
		// A stop token id ends the reply, delivered (as the scheduler does).
		ids, reason = ids[:stop+1], request.FinishStop
	case len(ids) < s.p.MaxTokens && s.p.IgnoreEOS:
		// Past the end of the reply, a model keeps drawing; here it
		// draws EOS until max_tokens.
		for len(ids) < s.p.MaxTokens {
			ids = append(ids, EOS)
		}
	case len(ids) < s.p.MaxTokens:
		ids = append(ids, EOS)
		reason = request.FinishStop
	default:
		ids = ids[:s.p.MaxTokens]
	}
	if f := s.p.Sampling.Forced; f != nil {
		// Teacher forcing (the replay audit's re-score): the forced
		// tokens, ending as the scheduler ends them.
		ids, reason = f[:min(len(f), s.p.MaxTokens)], request.FinishLength
		if stop := slices.IndexFunc(ids, func(id int) bool {
			return slices.Contains(s.p.StopTokens, id) || (id == EOS && !s.p.IgnoreEOS)
		}); stop >= 0 {
			ids, reason = ids[:stop+1], request.FinishStop
		}
	}
	if s.b.Gate != nil {
		select {
		case <-s.b.Gate:
		case <-ctx.Done():
		case <-s.abort:
		}
	}
	for i, id := range ids {
		if i == s.b.At {
			switch s.b.Fault {
			case FaultError:
				res.Reason, res.Err = request.FinishError, fmt.Errorf("gatewaytest: injected failure at /srv/model.go:42 (0xc000123456): %w", request.ErrInternal)
				return
			case FaultAbort:
				aborted(request.ErrAborted)
				return
			case FaultStall:
				select {
				case <-ctx.Done():
				case <-s.abort:
				}
				aborted(request.ErrAborted)
				return
			}
		}
		if s.b.Delay > 0 {
			t := time.NewTimer(s.b.Delay)
			select {
			case <-t.C:
			case <-ctx.Done():
			case <-s.abort:
			}
			t.Stop()
		}
		tok := request.Token{Owner: owner, Index: i, ID: id}
		if s.p.Sampling.Logprobs {
			tok.Logprobs = logprobs(id, s.p.Sampling.TopLogprobs)
			if s.b.Fault == FaultShiftLogprobs {
				tok.Logprobs.Logprob -= 0.5
			}
		}
		if i == 0 && s.p.Sampling.PromptLogprobs {
			tok.Prompt = make([]request.Logprobs, max(len(s.p.Prompt)-1, 0))
			for q := range tok.Prompt {
				tok.Prompt[q] = *logprobs(s.p.Prompt[q+1], s.p.Sampling.PromptTopLogprobs)
				if s.b.Fault == FaultShiftLogprobs {
					tok.Prompt[q].Logprob -= 0.5
				}
			}
			if s.b.Fault == FaultShortPromptLogprobs && len(tok.Prompt) > 0 {
				tok.Prompt = tok.Prompt[1:]
			}
		}
		if i == s.b.At {
			switch s.b.Fault {
			case FaultLogprobNaN:
				tok.Logprobs = &request.Logprobs{Logprob: float32(math.NaN())}
			case FaultExtraLogprobs:
				tok.Logprobs = logprobs(id, s.p.Sampling.TopLogprobs+1)
			case FaultWrongOwner:
				tok.Owner = request.Owner{Tenant: "intruder", ID: request.NewID()}
			case FaultTokenIndex:
				tok.Index++
			case FaultRepeatIndex:
				tok.Index--
			}
		}
		select {
		case s.tokens <- tok:
			res.Usage.CompletionTokens++
		case <-ctx.Done():
			aborted(ctx.Err())
			return
		case <-s.abort:
			aborted(cmpOr(s.b.AbortErr, request.ErrAborted))
			return
		}
	}
	res.Reason = reason
	switch s.b.Fault {
	case FaultResultOwner:
		res.Owner = request.Owner{Tenant: "intruder", ID: request.NewID()}
	case FaultBadUsage:
		res.Usage.CompletionTokens++
	case FaultSuccessWithErr:
		res.Err = request.ErrAborted
	}
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
