package sched

import (
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// BenchmarkCoreStep measures one scheduler step (Ready, then Advance with
// a constant-token fake executor that does no model work) with a steady
// number of decoding sequences of 8 tenants; a finished request is replaced
// at once, so admission and prefill are part of the steady state.
func BenchmarkCoreStep(b *testing.B) {
	for _, running := range []int{64, 256} {
		b.Run(fmt.Sprintf("running=%d", running), func(b *testing.B) {
			const window, maxTokens = 512, 200
			layout := kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: 1, PageSize: 16, DType: kvcache.F32}
			pages := running*window/16 + 64
			lim, err := ComputeLimits(ModelShape{ContextLength: window, Vocab: 100}, layout, pages, 0, 2)
			if err != nil {
				b.Fatal(err)
			}
			pool, err := kvcache.NewPool(kvcache.Config{Layout: layout, Pages: pages})
			if err != nil {
				b.Fatal(err)
			}
			c, err := NewCore(Config{Limits: lim, Pool: pool, MaxRunning: running, MaxBatchTokens: running + 64})
			if err != nil {
				b.Fatal(err)
			}
			prompt := make([]int, 24)
			n := 0
			submit := func() {
				n++
				o := request.Owner{Tenant: request.Tenant(fmt.Sprint("t", n%8)), ID: request.ID{byte(n), byte(n >> 8), byte(n >> 16), 1}}
				a, err := lim.Admit(request.Params{Owner: o, Prompt: prompt, MaxTokens: maxTokens - n%50})
				if err != nil {
					b.Fatal(err)
				}
				if err := c.Submit(a); err != nil {
					b.Fatal(err)
				}
			}
			for range running {
				submit()
			}
			outs := make([]Outcome, 0, running+64)
			step := func() {
				rd := c.Ready()
				for range rd.Results {
					submit()
				}
				if rd.Batch == nil {
					b.Fatal("no batch")
				}
				outs = outs[:len(rd.Batch.Items)]
				for i := range outs {
					outs[i] = Outcome{Owner: rd.Batch.Items[i].Owner, Token: 1}
				}
				if err := c.Advance(rd.Batch, outs, nil); err != nil {
					b.Fatal(err)
				}
			}
			for range 300 { // reach the steady state
				step()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				step()
			}
			b.ReportMetric(float64(c.Stats().Running), "running")
		})
	}
}
