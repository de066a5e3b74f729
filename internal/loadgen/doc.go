// Package loadgen is a small load generator for OpenAI-compatible
// streaming endpoints. Run drives a fixed number of streaming requests
// through a bounded number of concurrent clients, spread round-robin over
// one API key per tenant, and reports what a client sees: throughput
// (requests and output tokens per second), time to first token and
// inter-token latency percentiles, and failures by HTTP status or kind.
//
// It promises to be bounded: the request count, the concurrency and the
// prompt size are capped by Config.Validate, every request has a deadline,
// and a response body is read no further than MaxResponseBytes. It sends
// nothing but the requests it is asked for, to the one base URL it is
// given; it never retries (a 429 is counted, not hidden).
//
// Time to first token (TTFT) is measured from just before the request is
// sent to the arrival of the first event carrying generated text.
// Inter-token latency (ITL) is the gap between consecutive text events of
// one request; output tokens come from the stream's usage chunk
// (stream_options.include_usage), or are counted as text events when the
// server sends none.
package loadgen
