package transfer

import (
	"math"
	"slices"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Log-probabilities on the wire (protocol 3). A request that asked for
// them (request.Sampling.Logprobs) gets them with every token; one that
// did not gets none. The encoding:
//
//	logprobs := lp:f32 k:u8 (id:u32 lp:f32)×k     (k ≤ request.MaxTopLogprobs)
//	Tokens   := ref start:int n:u16 id:u32×n has:u8 logprobs×n (when has = 1)
//	            prompt                            (protocol 4)
//	Manifest := ... has:u8 logprobs (when has = 1; the first token's) prompt
//	prompt   := has:u8 [n:u32 logprobs×n]         (n ≤ MaxPromptTokens)
//
// prompt is the request's prompt logprobs (request.Token.Prompt, protocol
// 4): the prefill node sends them in the manifest, the decode node with
// the first token (start 0) and never with a later one; a job carries
// promptLogprobs:u8 promptTopLogprobs:u8 after its forced tokens. The
// receiver that knows the request checks that their count is the prompt's
// less one and each has the alternatives asked (sched.CommitImportPrompt,
// disagg's router).
//
// Both ends check each one with request.Logprobs.Check (finite values at
// most 0, ids in int32, best first, each once): a NaN, an infinity or a
// positive log-probability is a protocol error. Only the party that
// knows the request can check that a peer sent exactly what was asked
// (no logprobs when none were, and top_logprobs entries, no more): the
// gateway (disagg's router) does for Tokens and the decode scheduler
// (sched.Core.CommitImport) for the manifest's first token.

func (e *encoder) logprobs(field string, l *request.Logprobs) {
	if len(l.Top) > request.MaxTopLogprobs {
		e.fail("%s: %d top logprobs (limit %d)", field, len(l.Top), request.MaxTopLogprobs)
		return
	}
	if err := l.Check(len(l.Top), 0); err != nil {
		e.fail("%s: %v", field, err)
		return
	}
	e.u32(math.Float32bits(l.Logprob))
	e.u8(uint8(len(l.Top)))
	for _, t := range l.Top {
		e.int32(field+" id", t.ID, maxInt32)
		e.u32(math.Float32bits(t.Logprob))
	}
}

func (d *decoder) logprobs(field string) *request.Logprobs {
	l := &request.Logprobs{Logprob: math.Float32frombits(d.u32())}
	k := int(d.u8())
	if d.err != nil {
		return nil
	}
	if k > request.MaxTopLogprobs {
		d.fail("%s: %d top logprobs (limit %d)", field, k, request.MaxTopLogprobs)
		return nil
	}
	if 8*k > len(d.b) {
		d.fail("%s: %d top logprobs need %d bytes, %d remain", field, k, 8*k, len(d.b))
		return nil
	}
	if k > 0 {
		l.Top = make([]request.TokenLogprob, k)
	}
	for i := range l.Top {
		l.Top[i].ID = d.int32(field+" id", maxInt32)
		l.Top[i].Logprob = math.Float32frombits(d.u32())
	}
	if d.err != nil {
		return nil
	}
	if err := l.Check(k, 0); err != nil {
		d.fail("%s: %v", field, err)
		return nil
	}
	return l
}

// tokenLogprobs encodes the logprobs of a Tokens message: none, or one
// per token.
func (e *encoder) tokenLogprobs(m *Tokens) {
	if m.Logprobs == nil {
		e.u8(0)
		return
	}
	if len(m.Logprobs) != len(m.IDs) {
		e.fail("tokens: %d logprobs for %d tokens", len(m.Logprobs), len(m.IDs))
		return
	}
	e.u8(1)
	for i := range m.Logprobs {
		if m.Logprobs[i] == nil {
			e.fail("tokens: token %d without logprobs", i)
			return
		}
		e.logprobs("token logprobs", m.Logprobs[i])
	}
}

func (d *decoder) tokenLogprobs(n int) []*request.Logprobs {
	if !d.bool("tokens have logprobs") || d.err != nil {
		return nil
	}
	// Each takes at least 5 bytes: check before allocating.
	if 5*n > len(d.b) {
		d.fail("tokens: %d logprobs need at least %d bytes, %d remain", n, 5*n, len(d.b))
		return nil
	}
	v := make([]*request.Logprobs, n)
	for i := range v {
		if v[i] = d.logprobs("token logprobs"); d.err != nil {
			return nil
		}
	}
	return v
}

// optLogprobs encodes an optional single logprobs (the manifest's first
// token's).
func (e *encoder) optLogprobs(field string, l *request.Logprobs) {
	if l == nil {
		e.u8(0)
		return
	}
	e.u8(1)
	e.logprobs(field, l)
}

func (d *decoder) optLogprobs(field string) *request.Logprobs {
	if !d.bool(field) || d.err != nil {
		return nil
	}
	return d.logprobs(field)
}

// promptLogprobs encodes an optional list of prompt logprobs.
func (e *encoder) promptLogprobs(field string, v []request.Logprobs) {
	if v == nil {
		e.u8(0)
		return
	}
	if len(v) > MaxPromptTokens {
		e.fail("%s: %d entries (limit %d)", field, len(v), MaxPromptTokens)
		return
	}
	e.u8(1)
	e.u32(uint32(len(v)))
	for i := range v {
		e.logprobs(field, &v[i])
	}
}

func (d *decoder) promptLogprobs(field string) []request.Logprobs {
	if !d.bool(field) || d.err != nil {
		return nil
	}
	n := int(d.u32())
	if d.err != nil {
		return nil
	}
	// Each takes at least 5 bytes: check before allocating.
	if n > MaxPromptTokens || 5*n > len(d.b) {
		d.fail("%s: %d entries (limit %d) need at least %d bytes, %d remain", field, n, MaxPromptTokens, 5*n, len(d.b))
		return nil
	}
	v := make([]request.Logprobs, n)
	for i := range v {
		l := d.logprobs(field)
		if d.err != nil {
			return nil
		}
		v[i] = *l
	}
	return v
}

// promptLogprobsEqual compares two optional lists by value.
func promptLogprobsEqual(a, b []request.Logprobs) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for i := range a {
		if !logprobsEqual(&a[i], &b[i]) {
			return false
		}
	}
	return true
}

// forced encodes a job's teacher-forced tokens: has:u8 n:u32 id×n, so
// that an empty list and none differ (none: a request that draws).
func (e *encoder) forced(v []int, maxTokens int) {
	if v == nil {
		e.u8(0)
		return
	}
	if len(v) < maxTokens {
		e.fail("forced: %d tokens for max_tokens %d", len(v), maxTokens)
		return
	}
	e.u8(1)
	e.ids("forced tokens", v, MaxForcedTokens, true)
}

func (d *decoder) forced(maxTokens int) []int {
	if !d.bool("forced") || d.err != nil {
		return nil
	}
	v := d.ids("forced tokens", MaxForcedTokens, true)
	if d.err == nil && len(v) < maxTokens {
		d.fail("forced: %d tokens for max_tokens %d", len(v), maxTokens)
	}
	if v == nil && d.err == nil {
		v = []int{}
	}
	return v
}

// logprobsEqual compares two optional logprobs by value (a duplicated
// manifest must match the first in every field).
func logprobsEqual(a, b *request.Logprobs) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Logprob == b.Logprob && slices.Equal(a.Top, b.Top)
}
