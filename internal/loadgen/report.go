package loadgen

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"time"
)

// Summary describes a set of durations. Percentiles use the nearest-rank
// method: P99 of 100 values is the 99th smallest.
type Summary struct {
	N                        int
	Mean, P50, P90, P99, Max time.Duration
}

// Summarize computes a Summary; it sorts a copy and leaves d alone.
func Summarize(d []time.Duration) Summary {
	if len(d) == 0 {
		return Summary{}
	}
	s := slices.Clone(d)
	slices.Sort(s)
	var sum time.Duration
	for _, v := range s {
		sum += v
	}
	return Summary{
		N: len(s), Mean: sum / time.Duration(len(s)),
		P50: Percentile(s, 50), P90: Percentile(s, 90), P99: Percentile(s, 99), Max: s[len(s)-1],
	}
}

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of sorted,
// which must be sorted ascending; 0 for an empty slice.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// rank = ceil(p/100 * n); the epsilon keeps exact ranks exact
	// (p=50 of 10 values is rank 5, not 6 through rounding error).
	n := len(sorted)
	rank := int(math.Ceil(p/100*float64(n) - 1e-9))
	rank = max(1, min(n, rank))
	return sorted[rank-1]
}

// TenantReport is one API key's share of a load test.
type TenantReport struct {
	Requests, Succeeded int
	OutputTokens        int
	TTFT                Summary
	Errors              map[string]int
}

// Report is the outcome of Run.
type Report struct {
	Requests  int // sent
	Succeeded int // ended with [DONE]
	Elapsed   time.Duration
	// RequestsPerSec and OutputTokensPerSec count successful requests and
	// the output tokens of every request over Elapsed.
	RequestsPerSec     float64
	OutputTokensPerSec float64
	OutputTokens       int
	PromptTokens       int // as reported in usage
	// TTFT and Latency are over successful requests; ITL over the gaps
	// between text events of successful requests.
	TTFT, ITL, Latency Summary
	// Errors counts failed requests by HTTP status ("429") or kind
	// (FailTransport, FailStreamError, ...).
	Errors  map[string]int
	Tenants []TenantReport // by index into Config.Keys
	// PromptCalibrated says the prompt was sized with /tokenize rather
	// than the four-characters-a-token guess.
	PromptCalibrated bool
	// Samples are the requests sent, in request order, for callers that
	// aggregate several runs.
	Samples []Sample
}

// NewReport summarises samples of a run over keys API keys that took
// elapsed; Run uses it, and callers merging several runs can too.
func NewReport(samples []Sample, keys int, elapsed time.Duration) *Report {
	r := &Report{Requests: len(samples), Elapsed: elapsed, Errors: map[string]int{}, Tenants: make([]TenantReport, keys), Samples: samples}
	var ttft, itl, lat []time.Duration
	tenantTTFT := make([][]time.Duration, keys)
	for i := range r.Tenants {
		r.Tenants[i].Errors = map[string]int{}
	}
	for _, s := range samples {
		t := &r.Tenants[s.Tenant]
		t.Requests++
		r.OutputTokens += s.OutputTokens
		t.OutputTokens += s.OutputTokens
		r.PromptTokens += s.PromptTokens
		if s.Failure != "" {
			r.Errors[s.Failure]++
			t.Errors[s.Failure]++
			continue
		}
		r.Succeeded++
		t.Succeeded++
		lat = append(lat, s.Latency)
		if s.TTFT > 0 {
			ttft = append(ttft, s.TTFT)
			tenantTTFT[s.Tenant] = append(tenantTTFT[s.Tenant], s.TTFT)
		}
		itl = append(itl, s.Gaps...)
	}
	r.TTFT, r.ITL, r.Latency = Summarize(ttft), Summarize(itl), Summarize(lat)
	for i := range r.Tenants {
		r.Tenants[i].TTFT = Summarize(tenantTTFT[i])
	}
	if secs := elapsed.Seconds(); secs > 0 {
		r.RequestsPerSec = float64(r.Succeeded) / secs
		r.OutputTokensPerSec = float64(r.OutputTokens) / secs
	}
	return r
}

// Write prints r for people.
func (r *Report) Write(w io.Writer) error {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
	line := func(name string, s Summary) string {
		if s.N == 0 {
			return fmt.Sprintf("%-16s n/a\n", name)
		}
		return fmt.Sprintf("%-16s p50 %s  p90 %s  p99 %s  mean %s  max %s  (n=%d)\n", name,
			ms(s.P50), ms(s.P90), ms(s.P99), ms(s.Mean), ms(s.Max), s.N)
	}
	out := fmt.Sprintf("requests         %d sent, %d succeeded in %.2f s\n", r.Requests, r.Succeeded, r.Elapsed.Seconds())
	out += fmt.Sprintf("throughput       %.2f req/s, %.1f output tok/s (%d output tokens, %d prompt tokens)\n",
		r.RequestsPerSec, r.OutputTokensPerSec, r.OutputTokens, r.PromptTokens)
	out += line("ttft", r.TTFT) + line("inter-token", r.ITL) + line("latency", r.Latency)
	if len(r.Errors) == 0 {
		out += "errors           none\n"
	} else {
		out += "errors          "
		for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
			out += fmt.Sprintf(" %s: %d", k, r.Errors[k])
		}
		out += "\n"
	}
	if len(r.Tenants) > 1 {
		for i, t := range r.Tenants {
			out += fmt.Sprintf("tenant %-9d %d/%d ok, %d tokens, ttft p50 %s p99 %s", i+1, t.Succeeded, t.Requests, t.OutputTokens, ms(t.TTFT.P50), ms(t.TTFT.P99))
			for _, k := range slices.Sorted(maps.Keys(t.Errors)) {
				out += fmt.Sprintf(", %s: %d", k, t.Errors[k])
			}
			out += "\n"
		}
	}
	if !r.PromptCalibrated {
		out += "note             prompt sized at ~4 characters a token (the server has no /tokenize)\n"
	}
	_, err := io.WriteString(w, out)
	return err
}
