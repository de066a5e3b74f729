package sim

import (
	"context"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/sched/ownerecho"
)

// The owner-echo model (package ownerecho, shared with package sched's
// simulation): a sampled token is a hash of every position attention read,
// so it equals echoNext over the request's own history only if every
// position read was the request's own, correctly written KV.

// echoNext is the token the model samples after history when every
// position it read is owner's own: what the gateway expects, computed
// without any KV memory.
func echoNext(o request.Owner, salt string, history []int, vocab int) int {
	return ownerecho.Next(o, salt, history, vocab, 0)
}

// echoExecutor is the owner-echo sched.Executor of one node. foreign
// collects every read that was not the item's own KV (the invariant "no
// read of a page not owned and written by the reader").
type echoExecutor struct {
	node    string
	vocab   int
	salt    func(request.Owner) string
	foreign []string
	items   int
}

var _ sched.Executor = (*echoExecutor)(nil)

func (e *echoExecutor) Execute(_ context.Context, b *sched.Batch) ([]sched.Outcome, error) {
	outs := make([]sched.Outcome, len(b.Items))
	for i, it := range b.Items {
		e.items++
		outs[i].Owner = it.View.Owner()
		outs[i].Token = e.run(it)
	}
	return outs, nil
}

func (e *echoExecutor) run(it sched.Item) int {
	v := it.View
	tags := ownerecho.Chain(it.Owner.Tenant, e.salt(it.Owner), it.History)
	ps, start := v.PageSize(), v.Start()
	for j, tok := range it.Tokens {
		pos := start + j
		k, vv := v.K(0, pos/ps), v.V(0, pos/ps)
		off := (pos % ps) * 2
		k[off], k[off+1] = ownerecho.Split(tags[pos])
		vv[off], vv[off+1] = float32(tok), float32(pos+1)
	}
	h := uint64(ownerecho.Seed)
	pos := 0
	for page := range v.NumPages() {
		k, vv := v.K(0, page), v.V(0, page)
		for off := 0; off+1 < len(k); off += 2 {
			want := [4]float32{-1, -1, -1, float32(pos + 1)}
			if pos < len(it.History) {
				want[0], want[1] = ownerecho.Split(tags[pos])
				want[2] = float32(it.History[pos])
			}
			got := [4]float32{k[off], k[off+1], vv[off], vv[off+1]}
			if got != want && len(e.foreign) < 8 {
				e.foreign = append(e.foreign, fmt.Sprintf("%s: %v read position %d: %v, its own KV is %v", e.node, it.Owner, pos, got, want))
			}
			h = ownerecho.Fold(h, got)
			pos++
		}
	}
	if pos != start+len(it.Tokens) && len(e.foreign) < 8 {
		e.foreign = append(e.foreign, fmt.Sprintf("%s: %v read %d positions, the step covers %d", e.node, it.Owner, pos, start+len(it.Tokens)))
	}
	return int(h % uint64(e.vocab))
}
