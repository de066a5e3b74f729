package model_test

import (
	"flag"
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
)

var benchModel = flag.String("model.bench", "135m-q8_0", "builtin model for BenchmarkDecodeStep")

// BenchmarkDecodeStep measures one decode step of a single sequence after
// a 128-token prompt, with the projections fused (as loaded) and unfused
// (the reference), so the fusion's gain shows side by side in one process.
//
// Run: go test ./internal/model -run '^$' -bench DecodeStep -benchtime 64x -count 3
func BenchmarkDecodeStep(b *testing.B) {
	if testing.Short() {
		*benchModel = "tiny"
	}
	fused := builtin(b, *benchModel)
	plain, err := model.BuiltinUnfused(*benchModel)
	if err != nil {
		b.Fatal(err)
	}
	for _, threads := range []int{1, 2} {
		for _, m := range []struct {
			name string
			m    *model.Model
		}{{"fused", fused}, {"unfused", plain}} {
			b.Run(fmt.Sprintf("threads=%d/%s", threads, m.name), func(b *testing.B) {
				r := newRunner(b, m.m, kvcache.F32, 1+(128+b.N)/16)
				r.compute = computePool(b, threads)
				seq := r.seq("bench")
				vocab := m.m.Config.Vocab
				r.step(part{seq, tokens(1, 128, vocab), model.LogitsLast})
				next := tokens(2, b.N, vocab)
				b.ReportAllocs()
				b.ResetTimer()
				for i := range b.N {
					r.step(part{seq, next[i : i+1], model.LogitsLast})
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			})
		}
	}
}

// BenchmarkPrefill measures a whole prompt's prefill in one step (the
// scheduler's chunk is larger than these) at 128 and 512 tokens, with an
// F32 and an F16 KV cache: attention over the prompt grows with its
// square, so the two rates side by side in one run show how it scales.
// Besides tok/s it reports tok/cpu-s, tokens per second of the process's
// CPU time: on a machine shared with other work a one-thread run's CPU
// time hardly moves when its wall time doubles, so its ratios are the
// steadier ones (at two threads the workers' waits count too).
//
// Run: go test ./internal/model -run '^$' -bench Prefill -benchtime 4x -count 3
func BenchmarkPrefill(b *testing.B) {
	name := *benchModel
	if testing.Short() {
		name = "tiny"
	}
	m := builtin(b, name)
	for _, threads := range []int{1, 2} {
		for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
			for _, n := range []int{128, 512} {
				b.Run(fmt.Sprintf("threads=%d/kv=%v/p=%d", threads, dt, n), func(b *testing.B) {
					r := newRunner(b, m, dt, 1+n/16)
					r.compute = computePool(b, threads)
					prompt := tokens(1, n, m.Config.Vocab)
					b.ReportAllocs()
					cpu := cpuSeconds()
					b.ResetTimer()
					for range b.N {
						seq := r.seq("bench")
						r.step(part{seq, prompt, model.LogitsLast})
						r.kv.Release(seq)
					}
					b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
					if c := cpuSeconds() - cpu; c > 0 {
						b.ReportMetric(float64(n*b.N)/c, "tok/cpu-s")
					}
				})
			}
		}
	}
}
