package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/loadgen"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
)

// benchNodeOptions are `pagewarden serve`'s defaults (zero scrub, prefix
// cache on, 512 batch tokens, 64 running) on two threads.
func benchNodeOptions() node.Options {
	return node.Options{Threads: 2, Scrub: kvcache.ScrubZero, PrefixCache: true, MaxBatchTokens: 512, MaxRunning: 64}
}

// BenchmarkServeLoad drives the real server (builtin:tiny behind the
// gateway on loopback) with 32 concurrent streaming clients from 4
// tenants, 64 requests of a 64-token prompt and 64 output tokens per
// iteration, and reports what the clients saw: throughput and p50/p99 time
// to first token and inter-token latency over every iteration.
//
//	go test -run '^$' -bench BenchmarkServeLoad -benchtime 3x ./internal/node
func BenchmarkServeLoad(b *testing.B) {
	ids := []string{"t0", "t1", "t2", "t3"}
	s := startE2E(b, e2eConfig{tenants: ids, node: benchNodeOptions(), direct: true, scrubAsGiven: true})
	b.ReportAllocs()
	r := runLoad(b, s, ids, loadgen.Config{Concurrency: 32, Requests: 64, MaxTokens: 64, PromptTokens: 64, RequestTimeout: time.Minute})
	b.ReportMetric(r.RequestsPerSec, "req/s")
	b.ReportMetric(r.OutputTokensPerSec, "tok/s")
	b.ReportMetric(ms(r.TTFT.P50), "ttft-p50-ms")
	b.ReportMetric(ms(r.TTFT.P99), "ttft-p99-ms")
	b.ReportMetric(ms(r.ITL.P50), "itl-p50-ms")
	b.ReportMetric(ms(r.ITL.P99), "itl-p99-ms")
}

// runLoad runs cfg (its URL and keys filled in: ids' tenants on s) b.N
// times with the benchmark timer on, and returns the report over every
// run; a request that failed fails the benchmark.
func runLoad(b *testing.B, s *e2eServer, ids []string, cfg loadgen.Config) *loadgen.Report {
	b.Helper()
	cfg.BaseURL, cfg.Keys = s.url, nil
	for _, id := range ids {
		cfg.Keys = append(cfg.Keys, e2eKey(id))
	}
	var samples []loadgen.Sample
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		r, err := loadgen.Run(context.Background(), cfg)
		if err != nil {
			b.Fatal(err)
		}
		samples = append(samples, r.Samples...)
		elapsed += r.Elapsed
	}
	b.StopTimer()
	r := loadgen.NewReport(samples, len(ids), elapsed)
	if r.Succeeded != r.Requests {
		b.Errorf("%d of %d requests failed: %v", r.Requests-r.Succeeded, r.Requests, r.Errors)
	}
	return r
}

// ms is d in milliseconds, for ReportMetric.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkGatewayAddedLatency measures what the gateway adds to a trivial
// request: each iteration runs one 1-token greedy request straight through
// node.Submit and the same request over HTTP (authentication, JSON,
// tokenization, quota, owner checks, response), back to back so that both
// see the same machine, and reports both and their difference in
// microseconds.
//
//	go test -run '^$' -bench BenchmarkGatewayAddedLatency ./internal/node
func BenchmarkGatewayAddedLatency(b *testing.B) {
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			s := startE2E(b, e2eConfig{node: benchNodeOptions(), direct: true, scrubAsGiven: true})
			const prompt = "Hello"
			ids, err := s.node.Tokenize(prompt, true, true)
			if err != nil {
				b.Fatal(err)
			}
			body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": stream})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1, DisableCompression: true}}
			defer client.CloseIdleConnections()
			direct := func() {
				st, err := s.node.Submit(context.Background(), request.Params{
					Owner: request.Owner{Tenant: "a", ID: request.NewID()}, Prompt: ids, MaxTokens: 1})
				if err != nil {
					b.Fatal(err)
				}
				for range st.Tokens() {
				}
				if res := st.Result(); !res.Reason.Success() {
					b.Fatalf("direct: %v %v", res.Reason, res.Err)
				}
			}
			viaHTTP := func() {
				req, _ := http.NewRequest("POST", s.url+"/v1/completions", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+e2eKeyA)
				resp, err := client.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				out, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 {
					b.Fatalf("http: status %d %v: %s", resp.StatusCode, err, out)
				}
			}
			direct() // warm both paths: the first step sizes scratch buffers
			viaHTTP()
			var dDirect, dHTTP time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				direct()
				t1 := time.Now()
				viaHTTP()
				dDirect += t1.Sub(t0)
				dHTTP += time.Since(t1)
			}
			us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(b.N) }
			b.ReportMetric(us(dDirect), "direct-us")
			b.ReportMetric(us(dHTTP), "http-us")
			b.ReportMetric(us(dHTTP-dDirect), "added-us")
		})
	}
}

var auditModel = flag.String("model.audit", "135m-q8_0", "builtin model for BenchmarkAuditOverhead")

// BenchmarkAuditOverhead measures what the replay audit costs the clients:
// 4 tenants, 16 concurrent requests of a 64-token prompt and 64 output
// tokens on builtin:135m-q8_0 (-model.audit to change it) at audit rates
// 0, 1%, 10% and 100%, one after the other in one run, with throughput and request
// latencies as the clients saw them, and how many replays ran (each after
// the load it audits, until the queue is empty) or were dropped.
//
// An audited answer also has the engine compute its tokens' logprobs (the
// record its re-score is compared with), and its re-score is a
// teacher-forced run of the answer at the lowest priority.
//
//	go test -run '^$' -bench BenchmarkAuditOverhead -benchtime 2x ./internal/node
func BenchmarkAuditOverhead(b *testing.B) {
	ids := []string{"t0", "t1", "t2", "t3"}
	for _, rate := range []float64{0, 0.01, 0.1, 1} {
		b.Run(fmt.Sprintf("rate=%g", rate), func(b *testing.B) {
			s := startE2E(b, e2eConfig{model: *auditModel, tenants: ids, node: benchNodeOptions(), direct: true, scrubAsGiven: true, auditRate: rate})
			r := runLoad(b, s, ids, loadgen.Config{Concurrency: 16, Requests: 32, MaxTokens: 64, PromptTokens: 64, RequestTimeout: 5 * time.Minute})
			// The replays still queued run now (at the lowest priority,
			// most of them wait for the load to end): wait until the
			// count has not moved for 20 s (longer than one replay takes
			// on a loaded machine),
			// and report how long after the load the last one ended —
			// the audit's work that the load did not pay for.
			loadEnd, lastMove := time.Now(), time.Now()
			for last, still := -1.0, 0; still < 400; time.Sleep(50 * time.Millisecond) {
				if n := s.metricValue("pagewarden_audit_replays_total"); n != last {
					if last >= 0 {
						lastMove = time.Now()
					}
					last, still = n, 0
				} else {
					still++
				}
			}
			b.ReportMetric(lastMove.Sub(loadEnd).Seconds(), "drain-s")
			// Request latency as the clients saw it; inter-token latency
			// as the gateway timed it (pagewarden_inter_token_latency_seconds,
			// every token of the tenants' requests, text or not: the
			// random weights of the 135m shapes often write tokens with
			// no text, which a client cannot time; replays are not in it).
			b.ReportMetric(r.OutputTokensPerSec, "tok/s")
			b.ReportMetric(ms(r.Latency.P50), "latency-p50-ms")
			b.ReportMetric(ms(r.Latency.P99), "latency-p99-ms")
			itl := s.histogram("pagewarden_inter_token_latency_seconds")
			b.ReportMetric(1000*itl.mean(), "itl-mean-ms")
			b.ReportMetric(1000*itl.quantile(0.99), "itl-p99-ms")
			b.ReportMetric(s.replays("match")+s.replays("mismatch"), "replays")
			b.ReportMetric(s.replays("dropped"), "dropped")
			if v := s.metricValue("pagewarden_audit_mismatches_total"); v != 0 {
				b.Errorf("%v audit mismatches", v)
			}
		})
	}
}

// hist is a histogram summed over its label values.
type hist struct {
	count, sum float64
	bounds     []float64 // upper bounds, ascending
	cum        []float64 // cumulative counts at each bound
}

func (h hist) mean() float64 {
	if h.count == 0 {
		return 0
	}
	return h.sum / h.count
}

// quantile interpolates linearly within the bucket holding q (Prometheus'
// histogram_quantile).
func (h hist) quantile(q float64) float64 {
	if h.count == 0 {
		return 0
	}
	rank := q * h.count
	lo, below := 0.0, 0.0
	for i, b := range h.bounds {
		if h.cum[i] >= rank {
			if h.cum[i] == below {
				return b
			}
			return lo + (b-lo)*(rank-below)/(h.cum[i]-below)
		}
		lo, below = b, h.cum[i]
	}
	return lo
}

// histogram gathers the gateway's histogram name, summed over its series.
func (s *e2eServer) histogram(name string) hist {
	s.t.Helper()
	mfs, err := s.srv.Metrics().Gather()
	if err != nil {
		s.t.Fatal(err)
	}
	var h hist
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			hg := m.GetHistogram()
			h.count += float64(hg.GetSampleCount())
			h.sum += hg.GetSampleSum()
			for i, bk := range hg.GetBucket() {
				if i >= len(h.bounds) {
					h.bounds = append(h.bounds, bk.GetUpperBound())
					h.cum = append(h.cum, 0)
				}
				h.cum[i] += float64(bk.GetCumulativeCount())
			}
		}
	}
	return h
}
