package kvcache_test

import (
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// benchLayout is stories15M's shape (6 layers, 6 KV heads of 48) in f32.
var benchLayout = kvcache.Layout{Layers: 6, KVHeads: 6, HeadDim: 48, PageSize: 16}

func benchPool(b *testing.B, pages int, pol kvcache.ScrubPolicy) *kvcache.Pool {
	p, err := kvcache.NewPool(kvcache.Config{Layout: benchLayout, Pages: pages, Scrub: pol, AllowNoScrub: true})
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// BenchmarkReserveRelease: a 16-page sequence reserved and released, with
// and without the scrub (the difference is the scrub's cost).
func BenchmarkReserveRelease(b *testing.B) {
	for _, pol := range []kvcache.ScrubPolicy{kvcache.ScrubNone, kvcache.ScrubZero, kvcache.ScrubPoison} {
		b.Run(pol.String(), func(b *testing.B) {
			p := benchPool(b, 64, pol)
			o := owner("t", 1)
			b.ReportAllocs()
			for b.Loop() {
				s := p.NewSequence(o)
				if err := p.Reserve(s, 16*16); err != nil {
					b.Fatal(err)
				}
				p.Release(s)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/16, "ns/page")
		})
	}
}

// BenchmarkScrubPage: one page reserved and released; SetBytes makes the
// scrub's throughput visible, and none vs zero gives what it costs.
func BenchmarkScrubPage(b *testing.B) {
	for _, pol := range []kvcache.ScrubPolicy{kvcache.ScrubNone, kvcache.ScrubZero, kvcache.ScrubPoison} {
		b.Run(pol.String(), func(b *testing.B) {
			p := benchPool(b, 4, pol)
			o := owner("t", 1)
			b.SetBytes(benchLayout.PageBytes())
			b.ReportAllocs()
			for b.Loop() {
				s := p.NewSequence(o)
				if err := p.Reserve(s, 1); err != nil {
					b.Fatal(err)
				}
				p.Release(s)
			}
		})
	}
}

var benchPages = []int{1, 16, 256}

// BenchmarkBegin is the ownership check before a decode step over a
// sequence of n full pages (plus the page the new token goes to).
func BenchmarkBegin(b *testing.B) {
	for _, n := range benchPages {
		b.Run(fmt.Sprintf("pages=%d", n), func(b *testing.B) {
			p := benchPool(b, n+1, kvcache.ScrubNone)
			s := p.NewSequence(owner("t", 1))
			ctx := n * benchLayout.PageSize
			if err := p.Reserve(s, ctx+1); err != nil {
				b.Fatal(err)
			}
			v, err := p.Begin(s, ctx)
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Commit(v); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.Begin(s, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeAttention is the budget Begin is compared with: the
// attention reads alone (q·k over every position, then the weighted sum of
// values) of one decode token of stories15M (6 heads of 48, no GQA) at a
// context of n pages, in plain Go. A real decode step adds the matmuls
// (15M multiply-adds) on top, so this understates the step.
func BenchmarkDecodeAttention(b *testing.B) {
	hd, heads := benchLayout.HeadDim, benchLayout.KVHeads
	kvd := benchLayout.KVDim()
	for _, n := range benchPages {
		b.Run(fmt.Sprintf("pages=%d", n), func(b *testing.B) {
			p := benchPool(b, n+1, kvcache.ScrubZero)
			s := p.NewSequence(owner("t", 1))
			ctx := n * benchLayout.PageSize
			if err := p.Reserve(s, ctx+1); err != nil {
				b.Fatal(err)
			}
			v, err := p.Begin(s, ctx+1)
			if err != nil {
				b.Fatal(err)
			}
			ps := benchLayout.PageSize
			q := make([]float32, hd)
			out := make([]float32, hd)
			scores := make([]float32, ctx+1)
			b.ReportAllocs()
			for b.Loop() {
				for layer := range benchLayout.Layers {
					for h := range heads {
						for pos := range scores {
							k := v.K(layer, pos/ps)[(pos%ps)*kvd+h*hd:][:hd]
							var dot float32
							for d := range k {
								dot += q[d] * k[d]
							}
							scores[pos] = dot
						}
						for pos, w := range scores {
							vv := v.V(layer, pos/ps)[(pos%ps)*kvd+h*hd:][:hd]
							for d := range vv {
								out[d] += w * vv[d]
							}
						}
					}
				}
			}
		})
	}
}

// BenchmarkAttachPrefix: a 256-token prompt served from the cache (16
// SHA-256 keys and 16 references), then released.
func BenchmarkAttachPrefix(b *testing.B) {
	p := benchPool(b, 64, kvcache.ScrubZero)
	prompt := seqTokens(257, 1)
	s := p.NewSequence(owner("t", 1))
	if err := p.Reserve(s, len(prompt)); err != nil {
		b.Fatal(err)
	}
	v, err := p.Begin(s, len(prompt))
	if err != nil {
		b.Fatal(err)
	}
	if err := p.Commit(v); err != nil {
		b.Fatal(err)
	}
	if n := p.PublishPrefix(s, prompt, ""); n != 16 {
		b.Fatalf("published %d pages", n)
	}
	o := owner("t", 2)
	b.ReportAllocs()
	for b.Loop() {
		s := p.NewSequence(o)
		if got := p.AttachPrefix(s, prompt, ""); got != 256 {
			b.Fatalf("attached %d", got)
		}
		p.Release(s)
	}
}
