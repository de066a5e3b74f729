package engine

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sample"
	"github.com/pagewarden/pagewarden/internal/sched"
)

var (
	benchThreads = flag.Int("engine.threads", 1, "compute threads for the engine benchmarks")
	schedPrompt  = flag.Int("engine.prompt", 8, "prompt tokens per sequence in BenchmarkSchedDecode")
	schedGen     = flag.Int("engine.gen", 32, "generated tokens per sequence in BenchmarkSchedDecode")
)

// benchModels are the shapes the decode benchmarks run: the small builtin
// and SmolLM2-135M's shape (Q8_0). -short keeps to the small one.
func benchModels(b *testing.B) []string {
	if testing.Short() {
		return []string{"tiny"}
	}
	return []string{"tiny", "135m-q8_0"}
}

const (
	benchPrompt = 16 // prompt positions before the timed decode
	benchDecode = 32 // decode steps timed per iteration
)

// BenchmarkDecode measures single-sequence decode speed and, side by side
// in the same run, what the isolation machinery costs:
//
//   - check-%: kvcache.Pool.Begin (the per-step ownership check of every
//     page, I2/I3) as a share of a whole decode step. The check cannot be
//     switched off (a View only comes from Begin), so "off" is the step
//     minus the measured Begin time.
//   - begin-ns and begin-ns@2k: one Begin on the decoded sequence (4
//     pages) and on a 2048-position sequence (128 pages).
//   - scrub=zero vs scrub=none: release-µs is the release of the
//     sequence's pages (zero fill vs nothing, I8), and e2e-tok/s counts it
//     against the decode.
//
// Run: go test ./internal/engine -run '^$' -bench 'Decode$' -benchtime 20x
func BenchmarkDecode(b *testing.B) {
	for _, name := range benchModels(b) {
		m := builtinModel(b, name)
		for _, scrub := range []kvcache.ScrubPolicy{kvcache.ScrubZero, kvcache.ScrubNone} {
			b.Run(fmt.Sprintf("model=%s/scrub=%v", name, scrub), func(b *testing.B) {
				benchDecodeOne(b, m, scrub)
			})
		}
	}
}

func benchDecodeOne(b *testing.B, m *model.Model, scrub kvcache.ScrubPolicy) {
	e, err := New(m, Options{Threads: *benchThreads, Pages: 2048/16 + 16, Scrub: scrub, AllowNoScrub: scrub == kvcache.ScrubNone})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	owner := request.Owner{Tenant: "bench", ID: request.NewID()}
	prompt := make([]int, benchPrompt)
	for i := range prompt {
		prompt[i] = (i*7919 + 3) % m.Config.Vocab
	}
	// A long sequence whose positions are marked written (not computed):
	// Begin's cost depends only on its page count.
	long := e.KV.NewSequence(owner)
	if err := e.KV.Reserve(long, 2049); err != nil {
		b.Fatal(err)
	}
	v, err := e.KV.Begin(long, 2048)
	if err != nil {
		b.Fatal(err)
	}
	if err := e.KV.Commit(v); err != nil {
		b.Fatal(err)
	}
	timeBegin := func(s *kvcache.Sequence) time.Duration {
		const reps = 2000
		start := time.Now()
		for range reps {
			if _, err := e.KV.Begin(s, 1); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start) / reps
	}

	var decode, release, begin, beginLong time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		seq := e.KV.NewSequence(owner)
		logits, err := e.step(seq, prompt, model.LogitsLast, true)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		for range benchDecode {
			if logits, err = e.step(seq, []int{sample.Argmax(logits)}, model.LogitsLast, true); err != nil {
				b.Fatal(err)
			}
		}
		decode += time.Since(start)
		start = time.Now()
		e.KV.Release(seq) // the scrub (or not) happens here
		release += time.Since(start)
		b.StopTimer()
		// The check alone, on a sequence of the same length.
		seq = e.KV.NewSequence(owner)
		if err := e.KV.Reserve(seq, benchPrompt+benchDecode+1); err != nil {
			b.Fatal(err)
		}
		if v, err := e.KV.Begin(seq, benchPrompt+benchDecode); err != nil {
			b.Fatal(err)
		} else if err := e.KV.Commit(v); err != nil {
			b.Fatal(err)
		}
		begin += timeBegin(seq)
		beginLong += timeBegin(long)
		e.KV.Release(seq)
		b.StartTimer()
	}
	b.StopTimer()
	n := float64(b.N)
	step := decode.Seconds() / (n * benchDecode)
	b.ReportMetric(1/step, "tok/s")
	b.ReportMetric(float64(benchDecode)*n/(decode+release).Seconds(), "e2e-tok/s")
	b.ReportMetric(step*1e6, "step-µs")
	b.ReportMetric(float64(begin.Nanoseconds())/n, "begin-ns")
	b.ReportMetric(float64(beginLong.Nanoseconds())/n, "begin-ns@2k")
	b.ReportMetric(100*begin.Seconds()/n/step, "check-%")
	b.ReportMetric(float64(release.Microseconds())/n, "release-µs")
}

// BenchmarkSchedDecode measures aggregate decode throughput through the
// scheduler with 1, 4, 8 and 16 sequences decoding together (continuous
// batching: one forward pass per step for all of them), next to the
// single-stream engine (seqs=solo: Engine.Bench, no scheduler). Each
// sequence has an 8-token prompt and decodes 32 tokens; tok/s counts
// generated tokens of all sequences per second of wall time.
//
// Run: go test ./internal/engine -run '^$' -bench 'SchedDecode$' -benchtime 5x
func BenchmarkSchedDecode(b *testing.B) {
	promptLen, gen := *schedPrompt, *schedGen
	for _, name := range benchModels(b) {
		m := builtinModel(b, name)
		b.Run(fmt.Sprintf("model=%s/seqs=solo", name), func(b *testing.B) {
			e, err := New(m, Options{Threads: *benchThreads, Pages: 8})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			var decode time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				r, err := e.Bench(promptLen, gen)
				if err != nil {
					b.Fatal(err)
				}
				decode += r.Decode
			}
			b.ReportMetric(float64(gen*b.N)/decode.Seconds(), "tok/s")
		})
		for _, seqs := range []int{1, 4, 8, 16} {
			b.Run(fmt.Sprintf("model=%s/seqs=%d", name, seqs), func(b *testing.B) {
				benchSched(b, m, seqs, promptLen, gen)
			})
		}
	}
}

func benchSched(b *testing.B, m *model.Model, seqs, promptLen, gen int) {
	pages := seqs * ((promptLen+gen+15)/16 + 1)
	e, err := New(m, Options{Threads: *benchThreads, Pages: pages})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	lim, err := sched.ComputeLimits(sched.ModelShape{ContextLength: m.Config.ContextLength, Vocab: m.Config.Vocab}, e.KV.Layout(), pages, promptLen+gen, 1)
	if err != nil {
		b.Fatal(err)
	}
	// No end tokens: every sequence decodes exactly gen tokens.
	n, err := sched.NewNode(sched.NodeConfig{Core: sched.Config{Limits: lim, Pool: e.KV, WatermarkPages: -1}, Executor: e.Executor()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	prompt := make([]int, promptLen)
	for i := range prompt {
		prompt[i] = (i*7919 + 3) % m.Config.Vocab
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		streams := make([]*sched.Stream, seqs)
		for i := range streams {
			s, err := n.Submit(ctx, request.Params{Owner: request.Owner{Tenant: request.Tenant(fmt.Sprint("t", i%2)), ID: request.NewID()}, Prompt: prompt, MaxTokens: gen})
			if err != nil {
				b.Fatal(err)
			}
			streams[i] = s
		}
		for _, s := range streams {
			if res := s.Result(); res.Reason != request.FinishLength || res.Usage.CompletionTokens != gen {
				b.Fatalf("request ended %v after %d tokens: %v", res.Reason, res.Usage.CompletionTokens, res.Err)
			}
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(seqs*gen*b.N)/elapsed.Seconds(), "tok/s")
}
