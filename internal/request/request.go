// Package request holds the types that cross the boundary between the
// gateway, the scheduler and the engine: who a request belongs to, what it
// asks for, and what comes back. Every value that carries output also
// carries the owner it was produced for, so that each layer can check it
// against the owner it expects (invariant I10).
package request

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"

	"github.com/pagewarden/pagewarden/internal/grammar"
)

// ID is a request id: 128 random bits, unguessable, scoped to a tenant.
type ID [16]byte

// NewID returns a fresh random id.
func NewID() ID {
	var id ID
	if _, err := rand.Read(id[:]); err != nil {
		// crypto/rand never fails on supported platforms; an id we cannot
		// make unguessable must not be made at all.
		panic(fmt.Sprintf("request: crypto/rand failed: %v", err))
	}
	return id
}

// String is the id in lowercase hex.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id was never set.
func (id ID) IsZero() bool { return id == ID{} }

// NewSeed returns a fresh random sampling seed for a request that named
// none, so that two unseeded requests (of one tenant or two) never draw the
// same tokens. It fits in 63 bits, so a client can send it back as the
// API's (signed) seed to reproduce the output.
func NewSeed() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("request: crypto/rand failed: %v", err))
	}
	return binary.LittleEndian.Uint64(b[:]) >> 1
}

// Tenant identifies a customer. It comes only from authentication.
type Tenant string

// Owner is the pair every piece of per-request state and output is tagged with.
type Owner struct {
	Tenant Tenant
	ID     ID
}

func (o Owner) String() string { return string(o.Tenant) + "/" + o.ID.String() }

// Sampling holds the sampler settings of one request. The zero value is
// greedy decoding.
type Sampling struct {
	Temperature       float32 // 0 means greedy
	TopK              int     // 0 means off
	TopP              float32 // 0 or 1 means off
	MinP              float32 // 0 means off
	RepetitionPenalty float32 // 0 or 1 means off
	// PresencePenalty and FrequencyPenalty are OpenAI's (0 means off):
	// a token's logit is lowered by PresencePenalty once it has been
	// generated, and by FrequencyPenalty times the number of times it has.
	// Only generated tokens count, not the prompt's (as OpenAI and vLLM).
	PresencePenalty  float32
	FrequencyPenalty float32
	// LogitBias is added to its tokens' logits before any penalty. It is
	// sorted by token, each token at most once, at most MaxLogitBias
	// entries, each bias in [-MaxBias, MaxBias]; a bias of -MaxBias bans
	// its token outright. Nil means none.
	LogitBias []TokenBias
	Seed      uint64
	// Grammar constrains the output (response_format): only tokens that
	// keep it a valid prefix of a value the grammar accepts are drawn, and
	// an end-of-generation token only once the value is complete. Nil
	// means unconstrained. It is immutable and shared; each sequence
	// keeps its own automaton state.
	Grammar *grammar.Grammar
	// Logprobs asks for the log-probability of every generated token
	// (Token.Logprobs), and TopLogprobs (0..MaxTopLogprobs) for that
	// many of the most likely tokens at each position too. They are the
	// raw model distribution's: a log-softmax over the whole vocabulary
	// of the logits before the logit bias, penalties, temperature,
	// filters and output constraint (what OpenAI and vLLM's default
	// report), so that they do not depend on how the token was drawn.
	// Off, nothing is computed.
	Logprobs    bool
	TopLogprobs int
	// Forced, when not nil, is teacher forcing (the replay audit): the
	// generated token at index i is Forced[i], not a draw, and the
	// request's MaxTokens is at most len(Forced). The logits are computed
	// as for a draw, so Logprobs score the forced tokens.
	Forced []int
	// PromptLogprobs asks for the log-probability of every prompt token
	// but the first, given the tokens before it (vLLM's prompt_logprobs,
	// OpenAI's echo with logprobs), with PromptTopLogprobs
	// (0..MaxTopLogprobs) alternatives each: the same raw distribution as
	// Logprobs, computed from the logits of every prompt row of the
	// prefill that computes the prompt anyway (no extra forward pass). A
	// request that asks reuses no prefix-cache page: a cached position's
	// logits are never computed. They arrive with the first generated
	// token (Token.Prompt).
	PromptLogprobs    bool
	PromptTopLogprobs int
}

// MaxTopLogprobs bounds Sampling.TopLogprobs at every layer (OpenAI's
// top_logprobs limit).
const MaxTopLogprobs = 20

// TokenLogprob is one token's natural-log probability at a position.
type TokenLogprob struct {
	ID      int
	Logprob float32
}

// Logprobs are one generated position's log-probabilities: the emitted
// token's, and the TopLogprobs most likely tokens', best first (ties by
// lower id).
type Logprobs struct {
	Logprob float32
	Top     []TokenLogprob
}

// Check reports whether l is what a request asking for top alternatives
// may receive over a vocabulary of vocab tokens (vocab <= 0: unknown):
// exactly min(top, vocab) alternatives, every log-probability finite and
// at most 0, ids in the vocabulary, each once, best first. A peer that
// sends more than was asked, NaN or an infinity breaks the protocol.
func (l *Logprobs) Check(top, vocab int) error {
	want := top
	if vocab > 0 {
		want = min(top, vocab)
	}
	if len(l.Top) != want {
		return fmt.Errorf("request: %d top logprobs, %d asked", len(l.Top), want)
	}
	if !validLogprob(l.Logprob) {
		return fmt.Errorf("request: logprob %v is not a finite value <= 0", l.Logprob)
	}
	for i, t := range l.Top {
		if !validLogprob(t.Logprob) {
			return fmt.Errorf("request: top logprob %d is %v, not a finite value <= 0", i, t.Logprob)
		}
		if t.ID < 0 || (vocab > 0 && t.ID >= vocab) {
			return fmt.Errorf("request: top logprob %d names token %d outside the vocabulary", i, t.ID)
		}
		if i > 0 && t.Logprob > l.Top[i-1].Logprob {
			return fmt.Errorf("request: top logprobs out of order at %d", i)
		}
		for _, u := range l.Top[:i] {
			if u.ID == t.ID {
				return fmt.Errorf("request: top logprobs name token %d twice", t.ID)
			}
		}
	}
	return nil
}

func validLogprob(v float32) bool { return v <= 0 && v >= -math.MaxFloat32 }

// TokenBias is one entry of Sampling.LogitBias.
type TokenBias struct {
	Token int
	Bias  float32
}

// Bounds on a request's lists and biases, the same at every layer: the
// gateway refuses more, the wire (package transfer) carries no more, the
// scheduler admits no more.
const (
	MaxLogitBias  = 300 // entries of LogitBias (OpenAI's cap)
	MaxBias       = 100 // |bias| of one entry; -MaxBias bans the token
	MaxStopTokens = 64  // entries of Params.StopTokens
)

// Params is a tokenized generation request, as admitted by the gateway.
type Params struct {
	Owner     Owner
	Prompt    []int // token ids, BOS included where the model wants it
	MaxTokens int   // new tokens to generate at most
	Sampling  Sampling
	// StopTokens end generation (finish reason "stop") when sampled, as
	// the model's end-of-generation tokens do (the scheduler's
	// Config.EndTokens) unless IgnoreEOS. At most MaxStopTokens.
	StopTokens []int
	// IgnoreEOS keeps generating past the model's end-of-generation
	// tokens (vLLM's ignore_eos): only MaxTokens and StopTokens end it.
	IgnoreEOS bool
	// CacheSalt is mixed into prefix-cache keys under the tenant, never
	// instead of it.
	CacheSalt string
	Priority  int // higher runs first when pages are short; see BackgroundPriority
}

// BackgroundPriority is Params.Priority of background work (the replay
// audit's re-scores): the scheduler runs such a request only in steps
// that carry no other request's work and while no other request waits
// for pages, never preempts anyone for it, and preempts it first, so
// that it never lengthens or delays a customer's step. No tenant's
// configured priority is this low.
const BackgroundPriority = math.MinInt32

// MaxKVPages is the most KV pages a request of promptTokens and maxTokens
// holds: the last sampled token is never fed back, so it writes at most
// promptTokens+maxTokens-1 positions. The gateway's budget check and the
// scheduler's admission both use it, so the two can never disagree.
//
// It never wraps: a sum too large for an int gives math.MaxInt, a count no
// budget admits, so a caller that forgot to bound its inputs still refuses
// rather than charging zero (a negative input counts as zero tokens).
func MaxKVPages(promptTokens, maxTokens, pageSize int) int {
	if pageSize <= 0 {
		return 0
	}
	promptTokens, maxTokens = max(promptTokens, 0), max(maxTokens, 0)
	if maxTokens > math.MaxInt-promptTokens {
		return math.MaxInt
	}
	n := promptTokens + maxTokens - 1
	if n <= 0 {
		return 0
	}
	return n/pageSize + min(n%pageSize, 1)
}

// FinishReason says why a request ended.
type FinishReason uint8

const (
	FinishNone   FinishReason = iota // not finished
	FinishStop                       // an end-of-generation or stop token
	FinishLength                     // MaxTokens reached
	FinishAbort                      // aborted (client, operator, shutdown)
	FinishError                      // rejected or failed; Result.Err says why
)

func (r FinishReason) String() string {
	switch r {
	case FinishNone:
		return "none"
	case FinishStop:
		return "stop"
	case FinishLength:
		return "length"
	case FinishAbort:
		return "abort"
	case FinishError:
		return "error"
	}
	return fmt.Sprintf("FinishReason(%d)", uint8(r))
}

// Success reports whether the request finished normally (stop or length):
// only then may a gateway answer 200 / end a stream with [DONE].
func (r FinishReason) Success() bool { return r == FinishStop || r == FinishLength }

// Token is one generated token, tagged with the owner it was produced for.
type Token struct {
	Owner Owner
	Index int // 0 for the first generated token
	ID    int
	// Logprobs is set when the request asked for them
	// (Sampling.Logprobs), nil otherwise.
	Logprobs *Logprobs
	// Prompt, on the first token (Index 0) of a request that asked for
	// Sampling.PromptLogprobs, holds len(prompt)-1 entries: entry i is
	// prompt token i+1's log-probabilities given prompt tokens 0..i.
	// Nil otherwise.
	Prompt []Logprobs
}

// Usage counts tokens exactly.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int // prompt tokens served from the prefix cache
}

// Result is the single terminal outcome of a request.
type Result struct {
	Owner  Owner
	Reason FinishReason
	Err    error // set when Reason is FinishError or FinishAbort
	Usage  Usage
}

// Errors a Result may carry. Gateways map them to HTTP statuses.
var (
	ErrContextLength = errors.New("request: prompt plus max_tokens exceeds the context window")
	ErrOverloaded    = errors.New("request: server overloaded")
	ErrAborted       = errors.New("request: aborted")
	ErrShuttingDown  = errors.New("request: server shutting down")
	ErrInternal      = errors.New("request: internal error")
	// ErrNodeFailed: a node the request depended on went down or left the
	// cluster before the request finished. Nothing is wrong with the
	// request; another attempt may land on a healthy node.
	ErrNodeFailed = errors.New("request: a node serving it failed")
	ErrNotFound   = errors.New("request: no such request for this tenant")
	ErrQuota      = errors.New("request: tenant quota exceeded")
)
