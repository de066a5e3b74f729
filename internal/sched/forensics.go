package sched

import (
	"context"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// AnswerPages is what a node's pool remembers of an ended answer's
// sequence (kvcache.Pool.QuarantineAnswer): the pages and epochs it
// held, and how many of them, still alive in the prefix cache, were
// quarantined or withdrawn from the index. Known is false when the pool
// does not remember the answer.
type AnswerPages struct {
	Pages                  []kvcache.PageRef
	Quarantined, Withdrawn int
	Known                  bool
}

// QuarantineAnswer asks the loop, between two steps, for owner's pages
// and withdraws those still alive: the replay audit's answer to a
// mismatch.
func (n *Node) QuarantineAnswer(ctx context.Context, owner request.Owner) (AnswerPages, error) {
	ev := event{kind: evForensics, owner: owner, answer: make(chan AnswerPages, 1)}
	if err := n.send(ctx, ev); err != nil {
		return AnswerPages{}, err
	}
	select {
	case a := <-ev.answer:
		return a, nil
	case <-n.done:
		select {
		case a := <-ev.answer:
			return a, nil
		default:
			return AnswerPages{}, request.ErrShuttingDown
		}
	case <-ctx.Done():
		return AnswerPages{}, ctx.Err()
	}
}
