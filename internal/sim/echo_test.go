package sim

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
)

// The owner-echo model, as package sched's tests define it (their
// echo_test.go cannot be imported): per position the KV holds two 24-bit
// halves of a tag chained over (tenant, cache salt, every token so far)
// in K, and the token and position+1 in V, all exact in float32. A sampled
// token is a hash of every position attention read, so it equals echoNext
// over the request's own history only if every position read was the
// request's own, correctly written KV.

// echoLayout is the KV layout the owner-echo model writes.
func echoLayout(pageSize int) kvcache.Layout {
	return kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: 2, PageSize: pageSize, DType: kvcache.F32}
}

// echoChain returns the tags of positions 0..len(history)-1. Requests of
// one tenant with the same salt and tokens share tags (the prefix cache may
// share their pages); anything else differs.
func echoChain(tenant request.Tenant, salt string, history []int) []uint64 {
	h := fnv.New64a()
	h.Write([]byte(tenant))
	h.Write([]byte{0})
	h.Write([]byte(salt))
	prev := h.Sum64()
	tags := make([]uint64, len(history))
	for p, t := range history {
		x := prev ^ uint64(uint32(t)) ^ uint64(p)<<32
		x *= 0x9E3779B97F4A7C15
		x ^= x >> 29
		x *= 0xBF58476D1CE4E5B9
		x ^= x >> 32
		tags[p], prev = x, x
	}
	return tags
}

func echoSplit(tag uint64) (float32, float32) {
	return float32(tag & 0xFFFFFF), float32(tag >> 24 & 0xFFFFFF)
}

func echoFold(h uint64, v [4]float32) uint64 {
	for _, x := range v {
		h ^= uint64(math.Float32bits(x))
		h *= 1099511628211
	}
	return h
}

const echoSeed = 14695981039346656037

// echoNext is the token the model samples after history when every
// position it read is owner's own: what the gateway expects, computed
// without any KV memory.
func echoNext(o request.Owner, salt string, history []int, vocab int) int {
	h := uint64(echoSeed)
	for p, tag := range echoChain(o.Tenant, salt, history) {
		a, b := echoSplit(tag)
		h = echoFold(h, [4]float32{a, b, float32(history[p]), float32(p + 1)})
	}
	return int(h % uint64(vocab))
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
	tags := echoChain(it.Owner.Tenant, e.salt(it.Owner), it.History)
	ps, start := v.PageSize(), v.Start()
	for j, tok := range it.Tokens {
		pos := start + j
		k, vv := v.K(0, pos/ps), v.V(0, pos/ps)
		off := (pos % ps) * 2
		k[off], k[off+1] = echoSplit(tags[pos])
		vv[off], vv[off+1] = float32(tok), float32(pos+1)
	}
	h := uint64(echoSeed)
	pos := 0
	for page := range v.NumPages() {
		k, vv := v.K(0, page), v.V(0, page)
		for off := 0; off+1 < len(k); off += 2 {
			want := [4]float32{-1, -1, -1, float32(pos + 1)}
			if pos < len(it.History) {
				want[0], want[1] = echoSplit(tags[pos])
				want[2] = float32(it.History[pos])
			}
			got := [4]float32{k[off], k[off+1], vv[off], vv[off+1]}
			if got != want && len(e.foreign) < 8 {
				e.foreign = append(e.foreign, fmt.Sprintf("%s: %v read position %d: %v, its own KV is %v", e.node, it.Owner, pos, got, want))
			}
			h = echoFold(h, got)
			pos++
		}
	}
	if pos != start+len(it.Tokens) && len(e.foreign) < 8 {
		e.foreign = append(e.foreign, fmt.Sprintf("%s: %v read %d positions, the step covers %d", e.node, it.Owner, pos, start+len(it.Tokens)))
	}
	return int(h % uint64(e.vocab))
}
