package disagg

import (
	"context"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
)

var _ gateway.Forensics = (*Local)(nil)

// QuarantineAnswer implements gateway.Forensics for the in-process split:
// every node's pool is asked (the prefill node that computed the prompt
// and the decode node that generated remember the answer's sequence under
// the same owner), each answering for its own pages. A Router across
// hosts does not implement it: its nodes' pools are not reachable from
// the gateway, and the audit's log line says the pages are unknown.
func (l *Local) QuarantineAnswer(ctx context.Context, owner request.Owner) []gateway.AnswerPages {
	var out []gateway.AnswerPages
	ask := func(role string, ns []*node.Node) {
		for i, n := range ns {
			a, err := n.Sched().QuarantineAnswer(ctx, owner)
			if err == nil && a.Known {
				out = append(out, node.AnswerPagesOf(fmt.Sprintf("%s-%d", role, i), a))
			}
		}
	}
	ask("prefill", l.Prefills)
	ask("decode", l.Decodes)
	return out
}
