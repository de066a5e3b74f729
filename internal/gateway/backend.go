package gateway

import (
	"context"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Limits is the part of the engine's start-up limits (invariant I5) that the
// gateway checks before it submits anything. It must be the same value the
// scheduler admits against, so that a request the gateway accepts is never
// refused or truncated later for length.
type Limits struct {
	// MaxContext is the served window W: a request is accepted only if
	// prompt tokens + max_tokens <= W. Reported as max_model_len.
	MaxContext int
	// MaxPromptTokens caps the prompt alone; 0 means MaxContext-1.
	MaxPromptTokens int
	// PageSize is the number of token positions per KV page, used to
	// charge a tenant's max_kv_pages budget; 0 disables that budget.
	PageSize int
}

// Backend is what the gateway needs from the engine and scheduler. The lead
// adapts the real scheduler to it; gatewaytest.Fake implements it for tests.
//
// Every method must be safe for concurrent use.
type Backend interface {
	// ModelID is the served model's name, as listed by /v1/models.
	ModelID() string
	// Limits returns the served limits; it must not change while serving.
	Limits() Limits
	// Tokenize turns text into token ids. addSpecial adds BOS (or whatever
	// the model's tokenizer adds); parseSpecial lets text such as
	// "<|im_start|>" become a single special token.
	Tokenize(text string, addSpecial, parseSpecial bool) ([]int, error)
	// Detokenize turns ids back into text.
	Detokenize(ids []int) (string, error)
	// TokenPiece is the raw bytes one token contributes to the output; it
	// may be part of a multi-byte UTF-8 sequence, which the gateway
	// buffers. Unknown ids give nil.
	TokenPiece(id int) []byte
	// ChatTemplate is the GGUF tokenizer.chat_template, "" if absent.
	ChatTemplate() string
	// BOS and EOS are the model's special token ids, -1 if absent.
	BOS() int
	EOS() int
	// IsEOG reports whether id ends generation (its text is not shown).
	IsEOG(id int) bool
	// Submit starts a request. p.Owner is set by the gateway from
	// authentication. An error means nothing was started (no page is held);
	// it should wrap one of the request package's sentinel errors
	// (ErrOverloaded, ErrShuttingDown, ErrContextLength, ErrQuota, ...).
	// The backend must stop producing when ctx is done.
	Submit(ctx context.Context, p request.Params) (Stream, error)
	// Abort ends a request of tenant; a tenant can only abort its own
	// requests (request.ErrNotFound otherwise).
	Abort(tenant request.Tenant, id request.ID) error
}

// Stream is the output of one submitted request.
type Stream interface {
	// Tokens delivers generated tokens in order, each tagged with the
	// owner it was produced for. The channel is closed when generation
	// ends for any reason.
	Tokens() <-chan request.Token
	// Result blocks until the request is terminal and returns its single
	// terminal outcome. It may be called after Tokens is closed, or after
	// the gateway aborted the request without draining Tokens.
	Result() request.Result
}

// PoolStats is a snapshot of the backend's state for gauges.
// The page counts add up: PagesTotal = PagesFree + PagesCached +
// PagesUsed + PagesQuarantined.
type PoolStats struct {
	PagesTotal       int
	PagesFree        int // on the free list
	PagesCached      int // prefix-cache pages no sequence holds: evictable, still their tenant's
	PagesUsed        int // held by sequences (owned, or shared and referenced)
	PagesQuarantined int
	QueueDepth       int // requests admitted but not yet running
	Running          int // requests prefilling or decoding
}

// StatsSource is implemented by backends that can report pool state and the
// must-be-zero counters they own. It is optional: the gateway exports these
// metrics only when the backend implements it.
type StatsSource interface {
	PoolStats() PoolStats
	// IsolationViolations is pagewarden_isolation_violations_total (I2).
	IsolationViolations() uint64
	// AbortedButCompleted counts requests the scheduler saw aborted that
	// nevertheless reached Finished (I4); it must stay zero.
	AbortedButCompleted() uint64
}
