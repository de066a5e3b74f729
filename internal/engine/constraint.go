package engine

import (
	"fmt"
	"strconv"

	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
)

// constraints holds the output constraints (response_format) of the
// sequences an engine samples for: the model's vocabulary as bytes (built
// at the first constrained request), each grammar bound to it with its mask
// cache (shared by requests with the same schema), and each sequence's
// matcher between steps.
//
// A matcher is only a cache: the state after a sequence's generated tokens
// is a function of those tokens, which every draw is given (its history).
// A matcher that is missing (evicted, first draw on this node after a
// handoff) or ahead of the draw (recompute after preemption) is rebuilt by
// replaying them, so no bookkeeping of finished requests is needed beyond
// dropping matchers not used for a while.
type constraints struct {
	vocab    *grammar.Vocab
	bound    map[string]*grammar.Bound
	matchers map[request.Owner]*seqMatcher
	step     uint64
}

type seqMatcher struct {
	g    *grammar.Grammar
	m    *grammar.Matcher
	used uint64
}

// Bounds on what the engine keeps: bound grammars (each with its mask
// cache of at most grammar's maxCached masks of vocab/8 bytes: 16 bound
// grammars on a 128k-token vocabulary hold at most 32 MiB) and matchers of
// sequences not drawn for idleSteps steps.
const (
	maxBound  = 16
	idleSteps = 256
)

func (c *constraints) init(e *Engine) {
	if c.vocab != nil {
		return
	}
	t := e.Model.Tokenizer
	c.vocab = grammar.NewVocab(e.Model.Config.Vocab, t.Piece, t.IsEOG)
	c.bound = map[string]*grammar.Bound{}
	c.matchers = map[request.Owner]*seqMatcher{}
}

// specKey keys a bound grammar by tenant and spec: requests with the same
// schema share masks, but only within a tenant, so that how fast a mask
// comes back never tells one tenant which schemas another uses.
func specKey(t request.Tenant, s grammar.Spec) string {
	return string(t) + "\x00" + strconv.Itoa(int(s.Kind)) + strconv.FormatBool(s.Strict) + string(s.Schema)
}

// mask returns the tokens owner's sequence may draw as generated token
// number index, history being the sequence so far (prompt, then the index
// tokens generated before).
func (c *constraints) mask(e *Engine, owner request.Owner, g *grammar.Grammar, index int, history []int) ([]uint64, error) {
	c.init(e)
	sm := c.matchers[owner]
	if sm == nil || sm.g != g || sm.m.Accepted() > index {
		key := specKey(owner.Tenant, g.Spec())
		b := c.bound[key]
		// A grammar compiled from the same spec is the same automaton:
		// a tenant's requests that share a schema share its mask cache.
		if b == nil {
			if len(c.bound) >= maxBound {
				clear(c.bound)
			}
			b = g.Bind(c.vocab)
			c.bound[key] = b
		}
		sm = &seqMatcher{g: g, m: b.NewMatcher()}
		c.matchers[owner] = sm
	}
	sm.used = c.step
	if index > len(history) {
		return nil, fmt.Errorf("engine: token %d of a sequence of %d", index, len(history))
	}
	for _, t := range history[len(history)-index+sm.m.Accepted():] {
		if err := sm.m.Accept(t); err != nil {
			delete(c.matchers, owner)
			return nil, err
		}
	}
	return sm.m.Mask(), nil
}

// endStep drops the matchers of sequences that were not drawn for a while
// (finished, or waiting; a waiting one replays when it comes back).
func (c *constraints) endStep() {
	c.step++
	if c.step%idleSteps != 0 {
		return
	}
	for o, sm := range c.matchers {
		if c.step-sm.used > idleSteps {
			delete(c.matchers, o)
		}
	}
}

// forget drops owner's matcher (its sequence is done).
func (c *constraints) forget(owner request.Owner) { delete(c.matchers, owner) }
