// Package ownerecho is the arithmetic of the owner-echo model, the fake
// model with which the scheduler's simulation (internal/sched tests) and
// the whole-system simulation (internal/sim) check isolation: per
// position the KV holds two 24-bit halves of a tag chained over (tenant,
// cache salt, every token so far) in K, and the token and position+1 in
// V, all exact in float32. A sampled token is a hash of every position
// attention read, so it equals Next over the request's own history only if
// every position read was the request's own, correctly written KV. Test
// support only: no production code imports it.
package ownerecho

import (
	"hash/fnv"
	"math"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// Seed starts the hash of what a step read.
const Seed = 14695981039346656037

// Layout is the KV layout the model writes.
func Layout(pageSize int) kvcache.Layout {
	return kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: 2, PageSize: pageSize, DType: kvcache.F32}
}

// Chain returns the tags of positions 0..len(history)-1: a hash chain over
// (tenant, cache salt, every token up to the position), so a position's
// tag is what its real KV would depend on. Requests of one tenant with the
// same salt and tokens share tags (the prefix cache may legitimately share
// their pages); anything else differs.
func Chain(tenant request.Tenant, salt string, history []int) []uint64 {
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

// Split gives the two 24-bit halves of a tag (exact in float32).
func Split(tag uint64) (float32, float32) {
	return float32(tag & 0xFFFFFF), float32(tag >> 24 & 0xFFFFFF)
}

// Fold folds one position's four stored values (K's two halves, the token,
// position+1) into the running hash.
func Fold(h uint64, v [4]float32) uint64 {
	for _, x := range v {
		h ^= uint64(math.Float32bits(x))
		h *= 1099511628211
	}
	return h
}

// Next is the token the model samples after reading history, when every
// position it read is o's own and correct: what a simulation expects,
// computed without any KV memory. A positive window makes it a
// sliding-window model that reads the last window positions only.
func Next(o request.Owner, salt string, history []int, vocab, window int) int {
	h := uint64(Seed)
	for p, tag := range Chain(o.Tenant, salt, history) {
		if window > 0 && p < len(history)-window {
			continue
		}
		a, b := Split(tag)
		h = Fold(h, [4]float32{a, b, float32(history[p]), float32(p + 1)})
	}
	return int(h % uint64(vocab))
}
