package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/grammar"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sample"
)

// BenchmarkConstrained measures what an output constraint costs end to
// end: the same greedy generation (prompt, 64 new tokens) with and
// without a json_schema constraint, side by side in one run, as tokens
// per second of the whole Generate (prefill included). The schema keeps
// the output in one long string, the widest state (almost every token
// continues it), so the mask is at its largest.
//
// Run: go test ./internal/engine -run '^$' -bench Constrained -benchtime 5x
func BenchmarkConstrained(b *testing.B) {
	g, err := grammar.Compile(grammar.Spec{Kind: grammar.JSONSchema, Strict: true,
		Schema: []byte(`{"type":"object","properties":{"story":{"type":"string"}},"required":["story"],"additionalProperties":false}`)})
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range benchModels(b) {
		m := builtinModel(b, name)
		prompt := make([]int, benchPrompt)
		for i := range prompt {
			prompt[i] = (i*7919 + 3) % 300
		}
		b.Run("model="+name, func(b *testing.B) {
			e, err := New(m, Options{Threads: *benchThreads, Pages: 64})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			// Interleaved, so that a busy machine slows both alike.
			var tokens [2]int
			var elapsed [2]time.Duration
			for b.Loop() {
				for i, cfg := range []request.Sampling{{}, {Grammar: g}} {
					start := time.Now()
					st, _, err := e.Generate(context.Background(), request.Owner{Tenant: "bench", ID: request.NewID()}, prompt, 64, cfg,
						func(int) error { return nil })
					if err != nil {
						b.Fatal(err)
					}
					elapsed[i] += time.Since(start)
					tokens[i] += st.GeneratedTokens
				}
			}
			plain, cons := float64(tokens[0])/elapsed[0].Seconds(), float64(tokens[1])/elapsed[1].Seconds()
			b.ReportMetric(plain, "plain-tok/s")
			b.ReportMetric(cons, "constrained-tok/s")
			b.ReportMetric(100*(plain/cons-1), "slowdown-%")
			b.ReportMetric(float64(tokens[1])/float64(b.N), "constrained-tokens/op")
		})
	}
}

// BenchmarkDrawMasked is the sampling side of the constraint's cost on a
// 32,000-token vocabulary: one greedy and one sampled draw, without a mask
// and with one that allows half the tokens (the mask itself comes from
// the grammar's cache, see grammar's BenchmarkMask).
//
// Run: go test ./internal/engine -run '^$' -bench DrawMasked
func BenchmarkDrawMasked(b *testing.B) {
	const vocab = 32000
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32((i*7919)%1000) / 100
	}
	mask := make([]uint64, (vocab+63)/64)
	for i := range mask {
		mask[i] = 0x5555555555555555
	}
	work := make([]float32, vocab)
	var s sample.Sampler
	for _, cfg := range []request.Sampling{{}, {Temperature: 0.8, TopP: 0.95, Seed: 1}} {
		for _, m := range [][]uint64{nil, mask} {
			b.Run(fmt.Sprintf("greedy=%v/mask=%v", cfg.Temperature == 0, m != nil), func(b *testing.B) {
				for b.Loop() {
					copy(work, logits)
					if _, err := DrawAllowed(&s, cfg, 3, nil, work, m); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
