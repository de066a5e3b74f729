//go:build unix

package engine

import (
	"syscall"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/request"
)

// cpuTime is the process's user+system CPU time so far: on a shared
// machine it moves far less with other work than wall time does.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLogprobsCost is what asking for logprobs costs a request on
// builtin:135m-q8_0 (a 49,152-token vocabulary): each iteration runs the
// same 32-token greedy generation through the scheduler without
// logprobs, with the emitted token's and with 20 alternatives, one after
// the other, and reports each one's CPU milliseconds per token.
//
//	go test -run '^$' -bench BenchmarkLogprobsCost -benchtime 5x ./internal/engine
func BenchmarkLogprobsCost(b *testing.B) {
	m := builtinModel(b, "135m-q8_0")
	n, _ := lpNodeTB(b, m)
	prompt := m.Tokenizer.Encode("Once upon a time there was a little dog", true, false)
	variants := []struct {
		name string
		s    request.Sampling
	}{
		{"off", request.Sampling{}},
		{"top0", request.Sampling{Logprobs: true}},
		{"top20", request.Sampling{Logprobs: true, TopLogprobs: 20}},
	}
	const tokens = 32
	cpu := make([]time.Duration, len(variants))
	for b.Loop() {
		for i, v := range variants {
			p := request.Params{Owner: request.Owner{Tenant: "a", ID: request.NewID()}, Prompt: prompt, MaxTokens: tokens, IgnoreEOS: true, Sampling: v.s}
			start := cpuTime(b)
			if _, _, err := lpTry(n, p); err != nil {
				b.Fatal(err)
			}
			cpu[i] += cpuTime(b) - start
		}
	}
	for i, v := range variants {
		b.ReportMetric(float64(cpu[i].Microseconds())/1000/float64(tokens*b.N), "cpu-ms/tok-"+v.name)
	}
}
