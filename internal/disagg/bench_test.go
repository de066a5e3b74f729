package disagg

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
)

// BenchmarkTTFT measures the time to the first token of a lone request on
// one node and through the split (reserve, prefill, handoff of every page,
// commit), side by side, on builtin:135m-q8_0 with one thread per node:
// the difference is what the handoff adds.
//
//	go test ./internal/disagg -run XXX -bench TTFT -benchtime 10x
func BenchmarkTTFT(b *testing.B) {
	o := node.Options{Threads: 1, KVMemory: 96 << 20, MaxContext: 1024, Scrub: kvcache.ScrubZero}
	load := func() *model.Model {
		m, err := model.Load(model.BuiltinPrefix+"135m-q8_0", model.Options{})
		if err != nil {
			b.Fatal(err)
		}
		return m
	}
	single, err := node.Start(load(), o)
	if err != nil {
		b.Fatal(err)
	}
	defer single.Close()
	split, err := StartLocal(load(), LocalConfig{Node: o})
	if err != nil {
		b.Fatal(err)
	}
	defer split.Close()
	for _, n := range []int{128, 512} {
		prompt := make([]int, n)
		for i := range prompt {
			prompt[i] = 100 + i%1000
		}
		for _, be := range []struct {
			name string
			b    gateway.Backend
		}{{"single", single}, {"split", split}} {
			b.Run(fmt.Sprintf("p%d/%s", n, be.name), func(b *testing.B) {
				var total time.Duration
				for range b.N {
					p := request.Params{Owner: request.Owner{Tenant: "bench", ID: request.NewID()}, Prompt: prompt, MaxTokens: 1}
					start := time.Now()
					st, err := be.b.Submit(context.Background(), p)
					if err != nil {
						b.Fatal(err)
					}
					for range st.Tokens() {
					}
					total += time.Since(start)
					if res := st.Result(); !res.Reason.Success() {
						b.Fatalf("%v: %v", res.Reason, res.Err)
					}
				}
				b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "ms/ttft")
			})
		}
	}
}
