package sched

import (
	"errors"
	"fmt"
	"slices"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Admission errors that are not in package request: they describe a
// malformed request rather than a limit, and gateways map them to 400
// invalid_request_error.
var (
	ErrInvalidRequest = errors.New("sched: invalid request")
	// ErrNotAdmitted is returned when a value that did not come from
	// Limits.Admit (its zero value) is offered to a queue.
	ErrNotAdmitted = errors.New("sched: request was not admitted")
	// ErrLimitsMismatch is returned when a request admitted against one
	// Limits is offered to a scheduler running under another (I5: every
	// admission point checks the same limits).
	ErrLimitsMismatch = errors.New("sched: request admitted under different limits")
)

// Admitted is a request that passed admission. Only Limits.Admit constructs
// one (its fields are unexported and its zero value is refused), so a
// rejected request cannot reach a queue: the queue's element type says so.
type Admitted struct {
	a *admission
}

type admission struct {
	params request.Params
	limits Limits
}

// Owner is the admitted request's owner (zero for the zero value).
func (a Admitted) Owner() request.Owner {
	if a.a == nil {
		return request.Owner{}
	}
	return a.a.params.Owner
}

// Valid reports whether a came from Limits.Admit.
func (a Admitted) Valid() bool { return a.a != nil }

// Admit checks p against the limits and returns the admitted value, or the
// reason for refusal. It allocates nothing in any pool: a refusal leaves
// every counter as it was. Rules:
//   - an owner with a tenant and a non-zero id;
//   - at least one prompt token, each a valid id when the vocabulary size
//     is known (stop tokens and logit-bias tokens too, and at most
//     request.MaxStopTokens and request.MaxLogitBias of them); at least
//     one new token asked for;
//   - prompt + max_tokens ≤ MaxContext, else request.ErrContextLength with
//     the numbers (the request is never truncated to fit).
//
// The params are deep-copied, so the caller may reuse its slices.
func (l Limits) Admit(p request.Params) (Admitted, error) {
	if l.MaxContext <= 0 {
		return Admitted{}, fmt.Errorf("%w: limits not computed", ErrInvalidRequest)
	}
	if p.Owner.Tenant == "" || p.Owner.ID.IsZero() {
		return Admitted{}, fmt.Errorf("%w: request has no owner", ErrInvalidRequest)
	}
	n := len(p.Prompt)
	if n == 0 {
		return Admitted{}, fmt.Errorf("%w: empty prompt (at least one token is needed to generate from)", ErrInvalidRequest)
	}
	if p.MaxTokens < 1 {
		return Admitted{}, fmt.Errorf("%w: max_tokens %d, must be at least 1", ErrInvalidRequest, p.MaxTokens)
	}
	// Written so that a huge MaxTokens cannot overflow the sum.
	if n > l.MaxContext || p.MaxTokens > l.MaxContext-n {
		return Admitted{}, fmt.Errorf("%w: %d prompt tokens + %d max_tokens exceeds the context window of %d tokens",
			request.ErrContextLength, n, p.MaxTokens, l.MaxContext)
	}
	if len(p.StopTokens) > request.MaxStopTokens || len(p.Sampling.LogitBias) > request.MaxLogitBias {
		return Admitted{}, fmt.Errorf("%w: %d stop tokens and %d logit-bias entries (at most %d and %d)",
			ErrInvalidRequest, len(p.StopTokens), len(p.Sampling.LogitBias), request.MaxStopTokens, request.MaxLogitBias)
	}
	if s := p.Sampling; s.TopLogprobs < 0 || s.TopLogprobs > request.MaxTopLogprobs || (s.TopLogprobs > 0 && !s.Logprobs) {
		return Admitted{}, fmt.Errorf("%w: %d top logprobs (logprobs %v; at most %d)", ErrInvalidRequest, s.TopLogprobs, s.Logprobs, request.MaxTopLogprobs)
	}
	if s := p.Sampling; s.PromptTopLogprobs < 0 || s.PromptTopLogprobs > request.MaxTopLogprobs || (s.PromptTopLogprobs > 0 && !s.PromptLogprobs) {
		return Admitted{}, fmt.Errorf("%w: %d prompt top logprobs (prompt logprobs %v; at most %d)", ErrInvalidRequest, s.PromptTopLogprobs, s.PromptLogprobs, request.MaxTopLogprobs)
	}
	if f := p.Sampling.Forced; f != nil && len(f) < p.MaxTokens {
		return Admitted{}, fmt.Errorf("%w: %d forced tokens for max_tokens %d", ErrInvalidRequest, len(f), p.MaxTokens)
	}
	if l.Vocab > 0 {
		for i, t := range p.Sampling.Forced {
			if t < 0 || t >= l.Vocab {
				return Admitted{}, fmt.Errorf("%w: forced token %d is %d, outside the vocabulary of %d", ErrInvalidRequest, i, t, l.Vocab)
			}
		}
		for i, t := range p.Prompt {
			if t < 0 || t >= l.Vocab {
				return Admitted{}, fmt.Errorf("%w: prompt token %d is %d, outside the vocabulary of %d", ErrInvalidRequest, i, t, l.Vocab)
			}
		}
		for _, t := range p.StopTokens {
			if t < 0 || t >= l.Vocab {
				return Admitted{}, fmt.Errorf("%w: stop token %d outside the vocabulary of %d", ErrInvalidRequest, t, l.Vocab)
			}
		}
		for _, b := range p.Sampling.LogitBias {
			if b.Token < 0 || b.Token >= l.Vocab {
				return Admitted{}, fmt.Errorf("%w: logit-bias token %d outside the vocabulary of %d", ErrInvalidRequest, b.Token, l.Vocab)
			}
		}
	}
	q := p
	q.Prompt = slices.Clone(p.Prompt)
	q.StopTokens = slices.Clone(p.StopTokens)
	q.Sampling.LogitBias = slices.Clone(p.Sampling.LogitBias)
	q.Sampling.Forced = slices.Clone(p.Sampling.Forced)
	return Admitted{a: &admission{params: q, limits: l}}, nil
}
