package model_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
)

// TestAttentionSameBitsAnyChunking: a prompt's logits have the same bits
// whether it arrives as one prefill step (the tiled path: every KV head's
// keys packed, blocks of queries against them), one token per step (the
// decode path: page by page), or chunks of mixed sizes that cross pages
// anywhere, on every kernel tier this machine runs, for F32 and F16
// caches, with a sliding window (on every layer and on alternate ones),
// and with a soft-cap and a non-default scale — the settings the two
// paths must honour alike. Page sizes 16 and 5 (not a multiple of a
// vector) are both exercised.
func TestAttentionSameBitsAnyChunking(t *testing.T) {
	prev := kernels.Implementation() // PAGEWARDEN_KERNELS may have forced one
	defer func() {
		if err := kernels.SetTier(prev); err != nil {
			t.Fatal(err)
		}
	}()
	type variant struct {
		name string
		set  func(c *model.Config)
	}
	variants := []variant{
		{"full", func(c *model.Config) {}},
		{"window7", func(c *model.Config) { c.SlidingWindow = 7 }},
		{"window7-alternate", func(c *model.Config) {
			c.SlidingWindow = 7
			c.WindowedLayers = []bool{true, false, true, false}
		}},
		{"softcap-scale", func(c *model.Config) { c.AttnSoftcap, c.AttnScale = 2.5, 0.3 }},
	}
	const n = 45
	chunkings := [][]int{{1}, {4, 13, 1, 27}, {3}, {17, 28}}
	for _, tier := range kernels.Tiers() {
		if err := kernels.SetTier(tier); err != nil {
			t.Fatal(err)
		}
		var full []float32 // the "full" variant's logits, to show the others change them
		for _, v := range variants {
			m, err := model.Builtin("tiny")
			if err != nil {
				t.Fatal(err)
			}
			v.set(&m.Config)
			vocab := m.Config.Vocab
			prompt := tokens(11, n, vocab)
			for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
				for _, ps := range []int{16, 5} {
					name := fmt.Sprintf("%s/%s/kv-%v/page%d", tier, v.name, dt, ps)
					mk := func() *runner {
						return &runner{t: t, m: m, kv: newPool(t, m, dt, ps, 2+n/ps), compute: computePool(t, 2)}
					}
					one := mk()
					want := one.step(part{one.seq("t"), prompt, model.LogitsAll})[0]
					if v.name == "full" && dt == kvcache.F32 && ps == 16 {
						full = want
					} else if dt == kvcache.F32 && ps == 16 && relDiff(want, full) < 1e-3 {
						t.Fatalf("%s: logits within %.2g of full attention's: the variant changes nothing, the test has no power", name, relDiff(want, full))
					}
					for _, sizes := range chunkings {
						r := mk()
						s := r.seq("t")
						var got []float32
						for lo, i := 0, 0; lo < n; i++ {
							hi := min(n, lo+sizes[i%len(sizes)])
							got = append(got, r.step(part{s, prompt[lo:hi], model.LogitsAll})[0]...)
							lo = hi
						}
						for k := range want {
							if math.Float32bits(got[k]) != math.Float32bits(want[k]) {
								t.Fatalf("%s, chunks %v: position %d logit %d = %g, one-shot prefill %g",
									name, sizes, k/vocab, k%vocab, got[k], want[k])
							}
						}
					}
				}
			}
		}
	}
}
