package sched

import (
	"errors"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// The two halves of a disaggregated request (DESIGN.md, "The handoff").
//
// On a prefill node a request submitted with SubmitPrefill runs like any
// other until its first token is sampled. Then, instead of decoding, it
// moves Prefilling → Handoff, its prompt's pages are exported (their
// written rows only, after the ledger check of kvcache.ExportPage) into an
// Export that Ready hands out, and it finishes: its pages go back, scrubbed,
// at once. Nothing on the prefill node refers to them afterwards, so
// nothing it does later can change what was sent.
//
// On a decode node Reserve admits a request and reserves pages for its
// prompt at once, or refuses (request.ErrOverloaded) when there is no room
// now: the gateway picks a decode node with room, and a reservation never
// waits in a queue holding nothing. The request is Prefilling with an
// import pending: it is never scheduled and never preempted (nothing local
// could recompute what it waits for). ImportPage writes arriving pages into
// its reservation; CommitImport makes them its content only if they are
// exactly the prompt the request was admitted with (kvcache.CommitImport:
// every reserved page, each with the fill the total implies), then takes
// the first token as if it had been sampled here. Any failure ends the
// request (aborted, pages scrubbed or, on a violation, quarantined), so a
// handoff that does not match can never reach attention. Abort works as
// for every request.

// ErrHandoff: pages or a commit for a request that is not waiting for them
// (unknown, not reserved for an import, already committed or ended).
var ErrHandoff = errors.New("sched: no import pending for this request")

// Export is a finished prefill's prompt KV, ready to send to a decode node:
// the wire form of each page (kvcache.ExportPage) and its filled count.
type Export struct {
	Owner      request.Owner
	Tokens     int // positions: the prompt's length
	FirstToken int // sampled from the prompt's last position
	// FirstLogprobs are FirstToken's, when the request asked for them.
	FirstLogprobs *request.Logprobs
	// PromptLogprobs are the prompt's (request.Token.Prompt), when the
	// request asked for them: the decode node hands them out with the
	// first token.
	PromptLogprobs []request.Logprobs
	Filled         []int
	Pages          [][]byte
}

// SubmitPrefill is Submit for a request that ends after its prompt: when
// its first token is sampled, its pages are exported (Ready.Exports) and
// it finishes with FinishLength.
func (c *Core) SubmitPrefill(a Admitted) error {
	r, err := c.accept(a)
	if err != nil {
		return err
	}
	r.prefillOnly = true
	return c.enqueue(a, false)
}

// Reserve admits a request whose prompt KV comes from another node and
// reserves pages for the whole prompt now. It returns the reserved pages,
// or an error with nothing held: Submit's errors, or
// request.ErrOverloaded when the pages, the tenant's caps or the running
// slots have no room now (Reserve never queues).
func (c *Core) Reserve(a Admitted) ([]kvcache.PageID, error) {
	r, err := c.accept(a)
	if err != nil {
		return nil, err
	}
	t := r.tenant
	need := c.lim.PagesFor(len(r.params.Prompt))
	room := c.pool.FreePages()
	if len(c.running) > 0 {
		room -= c.cfg.WatermarkPages
	}
	var cause error
	switch {
	case len(c.running) >= c.cfg.MaxRunning:
		cause = fmt.Errorf("%w: %d sequences are running", request.ErrOverloaded, len(c.running))
	case t.policy.MaxRunning > 0 && t.running >= t.policy.MaxRunning:
		cause = fmt.Errorf("%w: the tenant runs %d sequences, its cap", request.ErrOverloaded, t.running)
	case t.policy.MaxPages > 0 && t.pages+need > t.policy.MaxPages:
		cause = fmt.Errorf("%w: the tenant holds %d KV pages, %d more would pass its cap of %d", request.ErrOverloaded, t.pages, need, t.policy.MaxPages)
	case need > room:
		cause = fmt.Errorf("%w: the prompt needs %d KV pages, %d are free for it now", request.ErrOverloaded, need, room)
	}
	var seq *kvcache.Sequence
	if cause == nil {
		seq = c.pool.NewSequence(r.owner)
		if err := c.pool.Reserve(seq, len(r.params.Prompt)); err != nil {
			c.pool.Release(seq)
			cause = fmt.Errorf("%w: %w", request.ErrOverloaded, err)
		}
	}
	if cause != nil {
		if err := r.life.Reject(cause); err != nil {
			return nil, invariants.Failf("sched: reject of a reservation: %v", err)
		}
		delete(c.reqs, r.owner)
		c.stats.Rejected++
		c.retire(t)
		return nil, cause
	}
	if err := r.life.StartPrefill(); err != nil {
		c.pool.Release(seq)
		return nil, invariants.Failf("sched: start of reservation %v: %v", r.owner, err)
	}
	r.awaitingImport = true
	r.seq, r.pages = seq, seq.NumPages()
	t.pages += r.pages
	t.running++
	t.served = c.step
	r.started = c.step
	c.running = append(c.running, r)
	return seq.Pages(), nil
}

// importing returns owner's request if it waits for an import.
func (c *Core) importing(owner request.Owner) (*req, error) {
	r, ok := c.reqs[owner]
	if !ok || !r.awaitingImport || r.life.State() != StatePrefilling || r.seq == nil {
		return nil, fmt.Errorf("%w: %v", ErrHandoff, owner)
	}
	return r, nil
}

// ImportPage writes logical page i of owner's reserved prompt
// (kvcache.ImportPage). A page that does not fit the reservation is an
// error the caller answers by aborting the handoff; a page the ledger says
// the request does not own is a violation: the request is aborted and its
// pages quarantined.
func (c *Core) ImportPage(owner request.Owner, i, filled int, data []byte) error {
	r, err := c.importing(owner)
	if err != nil {
		return err
	}
	err = c.pool.ImportPage(r.seq, i, filled, data)
	if errors.Is(err, kvcache.ErrViolation) {
		c.failImport(r, err)
	}
	return err
}

// CommitImport ends owner's import: the imported pages must be exactly its
// prompt (tokens positions, kvcache.CommitImport), and firstToken then
// becomes its first generated token, delivered and checked as a sampled
// one would be. On any error the request is aborted and its pages go back
// scrubbed (quarantined on a violation): a handoff that does not match is
// never decoded from.
func (c *Core) CommitImport(owner request.Owner, tokens, firstToken int, firstLogprobs *request.Logprobs) error {
	return c.CommitImportPrompt(owner, tokens, firstToken, firstLogprobs, nil)
}

// CommitImportPrompt is CommitImport with the prompt logprobs the
// prefill node computed (Export.PromptLogprobs): exactly one per prompt
// token after the first, each with the alternatives asked, when the
// request asked for them, and none when it did not; anything else fails
// the handoff like a wrong page count.
func (c *Core) CommitImportPrompt(owner request.Owner, tokens, firstToken int, firstLogprobs *request.Logprobs, prompt []request.Logprobs) error {
	r, err := c.importing(owner)
	if err != nil {
		return err
	}
	if trustsReservation() {
		tokens = len(r.params.Prompt)
	}
	switch {
	case tokens != len(r.params.Prompt):
		err = fmt.Errorf("%w: the handoff holds %d positions, the prompt has %d", kvcache.ErrHandoff, tokens, len(r.params.Prompt))
	case c.lim.Vocab > 0 && (firstToken < 0 || firstToken >= c.lim.Vocab):
		err = fmt.Errorf("%w: first token %d outside the vocabulary of %d", kvcache.ErrHandoff, firstToken, c.lim.Vocab)
	case (firstLogprobs != nil) != r.params.Sampling.Logprobs:
		err = fmt.Errorf("%w: first token's logprobs sent %v, asked %v", kvcache.ErrHandoff, firstLogprobs != nil, r.params.Sampling.Logprobs)
	case firstLogprobs != nil && firstLogprobs.Check(r.params.Sampling.TopLogprobs, c.lim.Vocab) != nil:
		err = fmt.Errorf("%w: first token's logprobs: %w", kvcache.ErrHandoff, firstLogprobs.Check(r.params.Sampling.TopLogprobs, c.lim.Vocab))
	default:
		err = checkPromptLogprobs(r.params, prompt, c.lim.Vocab)
	}
	if err == nil {
		err = c.pool.CommitImport(r.seq, tokens)
	}
	if err != nil {
		c.failImport(r, err)
		return err
	}
	r.awaitingImport, r.imported = false, true
	r.computed = tokens
	r.promptLP = prompt
	c.take(r, firstToken, firstLogprobs)
	return nil
}

// checkPromptLogprobs checks an import's prompt logprobs against what
// request p asked for.
func checkPromptLogprobs(p *request.Params, prompt []request.Logprobs, vocab int) error {
	s := p.Sampling
	if !s.PromptLogprobs {
		if prompt != nil {
			return fmt.Errorf("%w: %d prompt logprobs sent, none asked", kvcache.ErrHandoff, len(prompt))
		}
		return nil
	}
	if want := max(len(p.Prompt)-1, 0); len(prompt) != want {
		return fmt.Errorf("%w: %d prompt logprobs for %d prompt tokens", kvcache.ErrHandoff, len(prompt), len(p.Prompt))
	}
	for i := range prompt {
		if err := prompt[i].Check(s.PromptTopLogprobs, vocab); err != nil {
			return fmt.Errorf("%w: prompt token %d's logprobs: %w", kvcache.ErrHandoff, i+1, err)
		}
	}
	return nil
}

// failImport aborts r after a failed import, pages first so that a
// violation quarantines them.
func (c *Core) failImport(r *req, err error) {
	c.noteQuarantine(err)
	c.dropPages(r, err)
	c.end(r, func(l *Lifecycle) error { return l.Abort(fmt.Errorf("%w: %w", request.ErrInternal, err)) })
}

// export hands r's prompt KV out (Ready.Exports) and finishes r: the end
// of a prefill-only request, called with its first token.
func (c *Core) export(r *req, tok int, lp *request.Logprobs) {
	if err := r.life.Handoff(); err != nil {
		_ = invariants.Failf("sched: %v", err)
		return
	}
	ex := Export{Owner: r.owner, Tokens: r.computed, FirstToken: tok, FirstLogprobs: lp}
	pages, filled, err := c.pool.ExportPages(r.seq)
	if err == nil && len(pages) != c.lim.PagesFor(r.computed) {
		err = invariants.Failf("sched: export of %v: %d pages for %d computed positions", r.owner, len(pages), r.computed)
	}
	if err != nil {
		// A violation ended the sequence in the pool (quarantined);
		// anything else is a bug of ours. Either way nothing leaves.
		c.noteQuarantine(err)
		c.dropPages(r, err)
		c.end(r, func(l *Lifecycle) error { return l.Abort(fmt.Errorf("%w: export: %w", request.ErrInternal, err)) })
		return
	}
	ex.Pages, ex.Filled = pages, filled
	r.generated++
	t := request.Token{Owner: r.owner, Index: 0, ID: tok, Logprobs: lp}
	if r.params.Sampling.PromptLogprobs {
		t.Prompt = c.promptOut(r)
		ex.PromptLogprobs, r.promptLP = t.Prompt, nil
	}
	c.out.Tokens = append(c.out.Tokens, t)
	c.out.Exports = append(c.out.Exports, ex)
	c.end(r, (*Lifecycle).HandedOff)
}
