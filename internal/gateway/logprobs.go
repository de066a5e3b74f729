package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
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
//     counts characters of the choice's text. echo with logprobs puts
//     the prompt tokens' entries first, as OpenAI does: the first
//     token's logprob and top_logprobs null (nothing precedes it), each
//     other's from the prefill that computed the prompt
//     (request.Sampling.PromptLogprobs: one forward pass, no extra one),
//     the answer's offsets counted after the echoed text.
//   - vLLM's prompt_logprobs (0 to 20, both endpoints, not streamed, as
//     vLLM refuses it streamed) gives a list with one entry per prompt
//     token: null for the first, then {"<token id>": {logprob, rank,
//     decoded_token}} holding the prompt token and the prompt_logprobs
//     most likely alternatives (rank: 1 for the most likely; the prompt
//     token's rank is null when it is not among the alternatives, which
//     are all the engine ranks). On completions it is each choice's
//     prompt_logprobs, on chat the response's.
//
// A request that asks for either uses no prefix-cache page for its
// prompt (a cached position's logits are never computed), so it costs a
// whole prefill, and each of n choices or best_of candidates computes
// its own.
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
	g.logprobs, g.topLogprobs = true, k
	g.askLogprobs()
	if g.echo {
		g.echoLogprobs = true
		g.askPromptLogprobs(k)
	}
	return nil
}

// parsePromptLogprobs reads vLLM's prompt_logprobs into g; stream must
// have been read.
func parsePromptLogprobs(raw json.RawMessage, g *genParams) *apiError {
	if isNull(raw) {
		return nil
	}
	k, e := parseIntField(raw, "prompt_logprobs", 0, request.MaxTopLogprobs)
	if e != nil {
		return e
	}
	if g.stream {
		return badRequest("prompt_logprobs", "'prompt_logprobs' cannot be streamed (as vLLM): send it without 'stream', or use 'echo' with 'logprobs' on completions.")
	}
	g.promptLogprobs, g.promptTop = true, k
	g.askPromptLogprobs(k)
	return nil
}

// askPromptLogprobs has the engine score the prompt with at least k
// alternatives per token.
func (g *genParams) askPromptLogprobs(k int) {
	g.sampling.PromptLogprobs = true
	g.sampling.PromptTopLogprobs = max(g.sampling.PromptTopLogprobs, k)
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
	Tokens []string `json:"tokens"`
	// TokenLogprobs and TopLogprobs are null for an echoed prompt's
	// first token (nothing precedes it), as OpenAI sends them.
	TokenLogprobs []*float32           `json:"token_logprobs"`
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
	v := lp.Logprob
	l.Tokens = append(l.Tokens, tok)
	l.TokenLogprobs = append(l.TokenLogprobs, &v)
	l.TopLogprobs = append(l.TopLogprobs, top)
	l.TextOffset = append(l.TextOffset, off)
	return off + utf8.RuneCount(piece)
}

// echoed is the entries of an echoed prompt (echo with logprobs): the
// first token's with null logprob and top_logprobs, the others' from
// lps (entry q-1 is token q's), k alternatives each. Offsets count the
// pieces' characters from 0, except a BOS the tokenizer added (its
// piece is not in the echoed text). It returns the entries and the
// offset after them.
func (c *call) echoed(prompt []int, lps []request.Logprobs, k int) (*completionLogprobs, int) {
	l := &completionLogprobs{}
	off := 0
	for q, id := range prompt {
		piece := c.s.backend.TokenPiece(id)
		if q == 0 {
			l.Tokens = append(l.Tokens, string(piece))
			l.TokenLogprobs = append(l.TokenLogprobs, nil)
			l.TopLogprobs = append(l.TopLogprobs, nil)
			l.TextOffset = append(l.TextOffset, 0)
			if id != c.s.backend.BOS() {
				off += utf8.RuneCount(piece)
			}
			continue
		}
		off = l.add(c, id, &lps[q-1], k, off)
	}
	return l, off
}

// checkPromptLogprobs is the relay's check of a token's prompt logprobs
// against what the request asked for: with the first token only, one per
// prompt token after the first, each with the alternatives asked.
func checkPromptLogprobs(tok request.Token, s request.Sampling, promptTokens int) error {
	if !s.PromptLogprobs || tok.Index != 0 {
		if tok.Prompt != nil {
			return fmt.Errorf("%w: prompt logprobs with token %d (asked: %v)", ErrBadStream, tok.Index, s.PromptLogprobs)
		}
		return nil
	}
	if want := max(promptTokens-1, 0); len(tok.Prompt) != want {
		return fmt.Errorf("%w: %d prompt logprobs for %d prompt tokens", ErrBadStream, len(tok.Prompt), promptTokens)
	}
	for i := range tok.Prompt {
		if err := tok.Prompt[i].Check(s.PromptTopLogprobs, 0); err != nil {
			return fmt.Errorf("%w: prompt token %d: %w", ErrBadStream, i+1, err)
		}
	}
	return nil
}

// promptLogprob is one token's entry in vLLM's prompt_logprobs.
type promptLogprob struct {
	Logprob      float32 `json:"logprob"`
	Rank         *int    `json:"rank"`
	DecodedToken string  `json:"decoded_token"`
}

// promptLogprobsJSON is vLLM's prompt_logprobs of prompt: null for the
// first token, then each token's entry and its k most likely
// alternatives', keyed by token id.
func (c *call) promptLogprobsJSON(prompt []int, lps []request.Logprobs, k int) []map[string]promptLogprob {
	out := make([]map[string]promptLogprob, len(prompt))
	for q := 1; q < len(prompt) && q-1 < len(lps); q++ {
		lp, id := &lps[q-1], prompt[q]
		m := make(map[string]promptLogprob, k+1)
		var rank *int
		for i, t := range lp.Top[:min(k, len(lp.Top))] {
			r := i + 1
			m[strconv.Itoa(t.ID)] = promptLogprob{Logprob: t.Logprob, Rank: &r, DecodedToken: string(c.s.backend.TokenPiece(t.ID))}
			if t.ID == id {
				rank = &r
			}
		}
		m[strconv.Itoa(id)] = promptLogprob{Logprob: lp.Logprob, Rank: rank, DecodedToken: string(c.s.backend.TokenPiece(id))}
		out[q] = m
	}
	return out
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
