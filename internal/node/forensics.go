package node

import (
	"context"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
)

var _ gateway.Forensics = (*Node)(nil)

// QuarantineAnswer implements gateway.Forensics: the pages and epochs the
// pool remembers of owner's ended sequence, those still alive withdrawn.
func (n *Node) QuarantineAnswer(ctx context.Context, owner request.Owner) []gateway.AnswerPages {
	a, err := n.sched.QuarantineAnswer(ctx, owner)
	if err != nil || !a.Known {
		return nil
	}
	return []gateway.AnswerPages{AnswerPagesOf("", a)}
}

// AnswerPagesOf is a's account in the gateway's terms, for node name.
func AnswerPagesOf(name string, a sched.AnswerPages) gateway.AnswerPages {
	out := gateway.AnswerPages{Node: name, Quarantined: a.Quarantined, Withdrawn: a.Withdrawn}
	for _, p := range a.Pages {
		out.Pages = append(out.Pages, fmt.Sprintf("%d@%d", p.ID, p.Epoch))
	}
	return out
}
