package sched

import (
	"context"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// Batch is one step of continuous batching: prefill chunks and decode
// tokens of many sequences of many tenants, run together by an Executor.
type Batch struct {
	// Step numbers batches from 1; Advance must be given the batch the
	// last Ready returned.
	Step  uint64
	Items []Item
}

// Item is one sequence's share of a step.
type Item struct {
	// Owner is the request the item computes for; every token sampled
	// for it is tagged with this owner.
	Owner request.Owner
	// View is the verified window onto the sequence's KV pages (kvcache
	// checked ownership of every page before handing it out). The new
	// tokens' K/V go to positions View.Start() .. View.Start()+len(Tokens)-1.
	View *kvcache.View
	// Tokens are fed at those positions: a prefill chunk (many) or the
	// last sampled token (one).
	Tokens []int
	// Sample asks for the next token from the logits of the last fed
	// position; false for a prefill chunk that is not the last.
	Sample   bool
	Sampling request.Sampling
	// SampleIndex is the index of the generated token being sampled (0 for
	// the first): seeded samplers use it so that a recompute after
	// preemption draws the same token.
	SampleIndex int
	// History is every token of the sequence up to and including Tokens
	// (prompt, then generated). Read-only; repetition penalties use it.
	History []int
	// ScorePrompt, for a request that asked for prompt logprobs
	// (request.Sampling.PromptLogprobs), are the prompt tokens the fed
	// positions predict: ScorePrompt[j] is the token at position
	// View.Start()+j+1, scored from the logits of fed token j (the last
	// chunk of a prompt has one fewer: its last row predicts the first
	// generated token, which Sample draws). Nil otherwise. Read-only.
	ScorePrompt []int
}

// Outcome is what executing one Item produced, at the same index as the
// Item.
type Outcome struct {
	// Owner echoes the owner of the View the item was computed with
	// (View.Owner). The core refuses an outcome whose owner is not the
	// request it would be delivered to: the request is aborted, its pages
	// quarantined and the mismatch counted (Stats.OwnerMismatches).
	Owner request.Owner
	// Token is the sampled token id when the item asked for a sample.
	Token int
	// Logprobs are the token's log-probabilities when the request asked
	// for them (request.Sampling.Logprobs); they go out with the token.
	Logprobs *request.Logprobs
	// PromptLogprobs are the log-probabilities of Item.ScorePrompt's
	// tokens, one each, with PromptTopLogprobs alternatives.
	PromptLogprobs []request.Logprobs
	// Err fails this item only: its request is aborted with an internal
	// error and its pages are handed to kvcache.Pool.Abort.
	Err error
}

// Executor runs batches: the forward pass and sampling. The node's real one
// wraps the model; tests use an owner-echo fake. Execute must not retain
// the Views after it returns, and must write K/V only through them.
type Executor interface {
	// Execute runs one batch. It returns one Outcome per Item, or an
	// error that fails the whole batch (every item's request is aborted).
	Execute(ctx context.Context, b *Batch) ([]Outcome, error)
}

// Ready is what the core asks its driver to do: run a batch, deliver
// tokens and results. Tokens are to be delivered before Results, each to
// the stream of the owner it carries.
type Ready struct {
	Batch   *Batch
	Tokens  []request.Token
	Results []request.Result
	// Preempted lists requests whose pages were released this step to
	// be recomputed later (for metrics and logs; no action needed).
	Preempted []request.Owner
	// Exports are the prompt KV of prefill-only requests (SubmitPrefill)
	// that finished this step; each comes before its request's Result.
	Exports []Export
}

// Empty reports whether there is nothing to do.
func (r *Ready) Empty() bool {
	return r.Batch == nil && len(r.Tokens) == 0 && len(r.Results) == 0 && len(r.Preempted) == 0 && len(r.Exports) == 0
}
