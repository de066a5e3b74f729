package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Log-probabilities in OpenAI's shapes. The engine computes them only
// for a request that asks (request.Sampling.Logprobs), over the raw model
// distribution: the log-softmax of the logits before the logit bias,
// penalties, temperature, top-k/top-p/min-p and any output constraint,
// as OpenAI and vLLM (its default raw_logprobs mode) report them. So a
// token drawn at temperature 1.5 or forced by a JSON schema has the
// log-probability the model gave it, not the sampler's.
//
//   - chat: logprobs (boolean) and top_logprobs (0 to 20, only with
//     logprobs: true) give choices[].logprobs.content[], one entry
//     {token, logprob, bytes, top_logprobs[{token, logprob, bytes}]} per
//     generated token; streamed, each chunk carries the entries of the
//     tokens whose text it is the first to carry (the finish chunk those
//     left), so the chunks' entries concatenate to the whole answer's.
//   - completions: logprobs (0 to 20: OpenAI's limit is 5, vLLM's
//     default 20, and this server takes vLLM's) gives choices[].logprobs
//     {tokens, token_logprobs, top_logprobs, text_offset}, each
//     top_logprobs entry a {token: logprob} object of the logprobs most
//     likely tokens and the sampled one (so up to logprobs + 1 keys, as
//     OpenAI documents; tokens of equal text share a key). text_offset
//     counts characters of the choice's text. echo with logprobs would
//     need the prompt's log-probabilities, which this server does not
//     compute: refused with a 400 naming both.
//
// Entries cover the tokens whose text is shown: an end-of-generation
// token or a stop_token_ids token (whose text is never shown) has none,
// and a token cut by a stop sequence has its entry. Tool calls keep
// working: the entries are the tokens of the call's text.

// maxCompletionLogprobs bounds completions' integer logprobs (vLLM's
// default max_logprobs; OpenAI's is 5).
const maxCompletionLogprobs = request.MaxTopLogprobs

// parseIntField accepts an integer in [lo, hi] (an integral number such
// as 2.0 is that integer, as JSON does not tell them apart).
func parseIntField(raw json.RawMessage, param string, lo, hi int) (int, *apiError) {
	var f float64
	if err := json.Unmarshal(raw, &f); err != nil {
		e := badRequest(param, "Invalid type for '%s': expected an integer.", param)
		e.Code, e.Err = "invalid_type", err
		return 0, e
	}
	if f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
		return 0, badRequest(param, "'%s' must be an integer between %d and %d, got %s.", param, lo, hi, bytes.TrimSpace(raw))
	}
	return int(f), nil
}

// parseChatLogprobs reads chat's logprobs and top_logprobs into g.
func parseChatLogprobs(lp, top json.RawMessage, g *genParams) *apiError {
	if !isNull(lp) {
		if err := json.Unmarshal(lp, &g.logprobs); err != nil {
			e := badRequest("logprobs", "Invalid type for 'logprobs': expected a boolean.")
			e.Code, e.Err = "invalid_type", err
			return e
		}
	}
	if !isNull(top) {
		k, e := parseIntField(top, "top_logprobs", 0, request.MaxTopLogprobs)
		if e != nil {
			return e
		}
		if !g.logprobs {
			return badRequest("top_logprobs", "'top_logprobs' needs 'logprobs' to be true.")
		}
		g.topLogprobs = k
	}
	g.askLogprobs()
	return nil
}

// parseCompletionLogprobs reads completions' integer logprobs into g;
// echo must have been read.
func parseCompletionLogprobs(lp json.RawMessage, g *genParams) *apiError {
	if isNull(lp) {
		return nil
	}
	k, e := parseIntField(lp, "logprobs", 0, maxCompletionLogprobs)
	if e != nil {
		return e
	}
	if g.echo {
		return badRequest("logprobs", "'logprobs' with 'echo': true needs the prompt's log-probabilities, which this server does not compute. Send one of 'logprobs' and 'echo'.")
	}
	g.logprobs, g.topLogprobs = true, k
	g.askLogprobs()
	return nil
}

// askLogprobs has the engine compute what g's response shows.
func (g *genParams) askLogprobs() {
	if g.logprobs {
		g.sampling.Logprobs = true
		g.sampling.TopLogprobs = max(g.sampling.TopLogprobs, g.topLogprobs)
	}
}

// pieceJSON is a token's text for a logprobs entry: its bytes as a
// string (invalid UTF-8, a piece of a character, becomes U+FFFD as JSON
// writes it) and the exact bytes.
func pieceBytes(piece []byte) []int {
	b := make([]int, len(piece))
	for i, c := range piece {
		b[i] = int(c)
	}
	return b
}

// chatLogprobs is choices[].logprobs of a chat completion (and chunk).
type chatLogprobs struct {
	Content []chatLogprob `json:"content"`
}

type chatLogprob struct {
	Token       string         `json:"token"`
	Logprob     float32        `json:"logprob"`
	Bytes       []int          `json:"bytes"`
	TopLogprobs []chatTopEntry `json:"top_logprobs"`
}

type chatTopEntry struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

// chatEntry is one token's entry with its top k alternatives.
func (c *call) chatEntry(id int, lp *request.Logprobs, k int) chatLogprob {
	piece := c.s.backend.TokenPiece(id)
	e := chatLogprob{Token: string(piece), Logprob: lp.Logprob, Bytes: pieceBytes(piece), TopLogprobs: []chatTopEntry{}}
	for _, t := range lp.Top[:min(k, len(lp.Top))] {
		p := c.s.backend.TokenPiece(t.ID)
		e.TopLogprobs = append(e.TopLogprobs, chatTopEntry{Token: string(p), Logprob: t.Logprob, Bytes: pieceBytes(p)})
	}
	return e
}

// completionLogprobs is choices[].logprobs of a (legacy) completion.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func (l *completionLogprobs) empty() bool { return l == nil || len(l.Tokens) == 0 }

// add appends one token's entry at text offset off (characters) and
// returns the offset after it.
func (l *completionLogprobs) add(c *call, id int, lp *request.Logprobs, k, off int) int {
	piece := c.s.backend.TokenPiece(id)
	tok := string(piece)
	top := map[string]float32{tok: lp.Logprob}
	for _, t := range lp.Top[:min(k, len(lp.Top))] {
		if p := string(c.s.backend.TokenPiece(t.ID)); p != tok {
			top[p] = t.Logprob
		}
	}
	l.Tokens = append(l.Tokens, tok)
	l.TokenLogprobs = append(l.TokenLogprobs, lp.Logprob)
	l.TopLogprobs = append(l.TopLogprobs, top)
	l.TextOffset = append(l.TextOffset, off)
	return off + utf8.RuneCount(piece)
}

// checkTokenLogprobs is the relay's check of a token's logprobs against
// what the request asked the engine for.
func checkTokenLogprobs(tok request.Token, s request.Sampling) error {
	switch {
	case !s.Logprobs && tok.Logprobs != nil:
		return fmt.Errorf("%w: logprobs with token %d of a request that asked for none", ErrBadStream, tok.Index)
	case s.Logprobs && tok.Logprobs == nil:
		return fmt.Errorf("%w: token %d without the logprobs asked for", ErrBadStream, tok.Index)
	case s.Logprobs:
		if err := tok.Logprobs.Check(s.TopLogprobs, 0); err != nil {
			return fmt.Errorf("%w: token %d: %w", ErrBadStream, tok.Index, err)
		}
	}
	return nil
}

// parseBestOf reads completions' best_of (1 to maxN, at least n): with
// best_of > n, g.n becomes best_of candidates per prompt and g.keep the
// n returned, the ones of highest cumulative log-probability (vLLM's
// semantics), so the engine computes logprobs for every candidate. Not
// with streaming: which candidates win is known only once all ended
// (OpenAI refuses it too).
func parseBestOf(raw json.RawMessage, g *genParams) *apiError {
	if isNull(raw) {
		return nil
	}
	b, e := parseIntField(raw, "best_of", 1, maxN)
	if e != nil {
		return e
	}
	switch {
	case b < g.n:
		return badRequest("best_of", "'best_of' (%d) must be at least 'n' (%d): it is the number of candidates the n choices are picked from.", b, g.n)
	case b > 1 && g.stream:
		return badRequest("best_of", "'best_of' greater than 1 cannot be streamed: the choices returned are known only once every candidate ended.")
	case b == g.n:
		return nil
	}
	g.keep, g.n = g.n, b
	g.sampling.Logprobs = true
	return nil
}
