//go:build unix

package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/request"
)

// BenchmarkAuditRescore is the replay audit's cost per audited answer on
// builtin:135m-q8_0: a 24-token prompt and a 64-token answer recorded
// with 5 alternatives per position, re-scored each iteration both ways,
// one after the other — teacher-forced decode (one step per answer
// token, the audit's re-score before prompt logprobs) and one prefill
// over prompt+answer with prompt logprobs (the audit's re-score now) —
// and reports each one's wall and CPU milliseconds per answer. Both must
// give the recorded bits (checked every iteration).
func BenchmarkAuditRescore(b *testing.B) {
	m := builtinModel(b, "135m-q8_0")
	n, _ := lpNodeTB(b, m)
	prompt := m.Tokenizer.Encode("Once upon a time there was a little dog who lived in a small house by the sea, and every morning", true, false)
	const answer = 64
	ids, lps, err := lpTry(n, request.Params{Owner: request.Owner{Tenant: "a", ID: request.NewID()}, Prompt: prompt, MaxTokens: answer,
		IgnoreEOS: true, Sampling: request.Sampling{Temperature: 0.8, Seed: 5, Logprobs: true, TopLogprobs: 5}})
	if err != nil {
		b.Fatal(err)
	}
	variants := []struct {
		name string
		run  func() ([]*request.Logprobs, error)
	}{
		{"forced-decode", func() ([]*request.Logprobs, error) {
			got, lp, err := lpTry(n, request.Params{Owner: request.Owner{Tenant: "_audit", ID: request.NewID()}, Prompt: prompt, MaxTokens: len(ids),
				IgnoreEOS: true, Sampling: request.Sampling{Logprobs: true, TopLogprobs: 5, Forced: ids}})
			if err == nil && !slices.Equal(got, ids) {
				b.Fatalf("forced %v, emitted %v", ids, got)
			}
			return lp, err
		}},
		{"prefill", func() ([]*request.Logprobs, error) { return prefillRescore(n, prompt, ids, 5) }},
	}
	wall := make([]time.Duration, len(variants))
	cpu := make([]time.Duration, len(variants))
	for b.Loop() {
		for i, v := range variants {
			start, c := time.Now(), cpuTime(b)
			got, err := v.run()
			if err != nil {
				b.Fatal(err)
			}
			cpu[i] += cpuTime(b) - c
			wall[i] += time.Since(start)
			if k := sameLogprobs(got, lps); k >= 0 {
				b.Fatalf("%s: answer position %d differs from the record", v.name, k)
			}
		}
	}
	for i, v := range variants {
		b.ReportMetric(float64(wall[i].Microseconds())/1000/float64(b.N), "ms/answer-"+v.name)
		b.ReportMetric(float64(cpu[i].Microseconds())/1000/float64(b.N), "cpu-ms/answer-"+v.name)
	}
}
