package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Bounds enforced by Config.Validate.
const (
	MaxRequests     = 1_000_000
	MaxConcurrency  = 4096
	MaxKeys         = 1024
	MaxPromptTokens = 1 << 20
	MaxOutputTokens = 1 << 20
	// MaxResponseBytes caps how much of one response body is read.
	MaxResponseBytes = 64 << 20
	// maxLine caps one SSE line; longer lines fail the request.
	maxLine = 1 << 20
)

// ErrConfig is wrapped by every Config validation error.
var ErrConfig = errors.New("loadgen: invalid config")

// Endpoint selects the API a load test drives.
type Endpoint string

// The endpoints Run can drive.
const (
	Completions Endpoint = "completions"      // POST /v1/completions
	Chat        Endpoint = "chat/completions" // POST /v1/chat/completions
)

// Config describes one load test. Zero values take the defaults noted.
type Config struct {
	// BaseURL is the server root, e.g. "http://127.0.0.1:8080"; the API
	// paths (/v1/..., /tokenize) are appended. A trailing "/v1" is
	// accepted and dropped.
	BaseURL string
	// Keys are API keys, one per tenant. Request i uses Keys[i%len(Keys)].
	Keys []string
	// Concurrency is the number of clients with a request in flight at
	// once (default 16).
	Concurrency int
	// Requests is the number of requests in all (default 200).
	Requests int
	// MaxTokens is each request's max_tokens (default 64).
	MaxTokens int
	// PromptTokens is the approximate prompt length in tokens (default
	// 64). Run sizes the prompt text with one /tokenize call when the
	// server offers it, and assumes four characters a token otherwise.
	// For Chat it is the user message's length; the chat template adds
	// its own tokens.
	PromptTokens int
	// Endpoint is Completions (default) or Chat.
	Endpoint Endpoint
	// Model is sent as "model" when not empty.
	Model string
	// Temperature is sent as is; 0 (the default) is greedy decoding.
	Temperature float64
	// RequestTimeout bounds each request from send to last byte
	// (default 2 minutes).
	RequestTimeout time.Duration
	// Client sends the requests. The default client keeps Concurrency
	// connections alive per host and ignores proxy settings.
	Client *http.Client
	// Prompt, when set, returns the prompt of request i of tenant
	// (i is global, 0-based); PromptTokens is then only reported.
	Prompt func(i, tenant int) string
}

func (c Config) withDefaults() Config {
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	if c.Requests == 0 {
		c.Requests = 200
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = 64
	}
	if c.PromptTokens == 0 {
		c.PromptTokens = 64
	}
	if c.Endpoint == "" {
		c.Endpoint = Completions
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 2 * time.Minute
	}
	c.BaseURL = strings.TrimSuffix(strings.TrimSuffix(c.BaseURL, "/"), "/v1")
	return c
}

// Validate checks c after defaults: a plain http(s) URL with a host and
// no credentials, at least one well-formed key, and every count within
// its bound.
func (c Config) Validate() error {
	c = c.withDefaults()
	u, err := url.Parse(c.BaseURL)
	if err != nil {
		return fmt.Errorf("%w: base URL: %v", ErrConfig, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: base URL %q: want http://host[:port] or https://host[:port]", ErrConfig, c.BaseURL)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w: base URL %q: no credentials, query or fragment", ErrConfig, c.BaseURL)
	}
	if len(c.Keys) == 0 || len(c.Keys) > MaxKeys {
		return fmt.Errorf("%w: want 1 to %d API keys, got %d", ErrConfig, MaxKeys, len(c.Keys))
	}
	for i, k := range c.Keys {
		if k == "" || strings.ContainsAny(k, "\r\n\x00 \t") {
			return fmt.Errorf("%w: API key %d is empty or holds whitespace", ErrConfig, i+1)
		}
	}
	for _, b := range []struct {
		name   string
		v, max int
	}{
		{"concurrency", c.Concurrency, MaxConcurrency},
		{"requests", c.Requests, MaxRequests},
		{"max tokens", c.MaxTokens, MaxOutputTokens},
		{"prompt tokens", c.PromptTokens, MaxPromptTokens},
	} {
		if b.v < 1 || b.v > b.max {
			return fmt.Errorf("%w: %s %d: want 1 to %d", ErrConfig, b.name, b.v, b.max)
		}
	}
	if c.Endpoint != Completions && c.Endpoint != Chat {
		return fmt.Errorf("%w: endpoint %q: want %q or %q", ErrConfig, c.Endpoint, Completions, Chat)
	}
	if c.RequestTimeout < 0 {
		return fmt.Errorf("%w: negative request timeout", ErrConfig)
	}
	if !(c.Temperature >= 0 && c.Temperature <= 2) {
		return fmt.Errorf("%w: temperature %g: want 0 to 2", ErrConfig, c.Temperature)
	}
	return nil
}

// Sample is what one request saw.
type Sample struct {
	Tenant int // index into Config.Keys
	// Status is the HTTP status, 0 when no response arrived.
	Status int
	// Failure is "" for a request that finished with [DONE]; otherwise
	// the key it is counted under in Report.Errors.
	Failure      string
	TTFT         time.Duration   // 0 when no text arrived
	Gaps         []time.Duration // between consecutive text events
	OutputTokens int             // from usage, else text events
	PromptTokens int             // from usage; 0 when not reported
	Latency      time.Duration   // send to end of stream
}

// Failure keys other than HTTP statuses ("429", "503", ...).
const (
	FailTransport   = "transport"    // connection refused, reset, ...
	FailTimeout     = "timeout"      // RequestTimeout passed
	FailStreamError = "stream_error" // an SSE error event after a 200
	FailTruncated   = "truncated"    // the stream ended without [DONE]
	FailMalformed   = "malformed"    // an event that is not JSON, or a line too long
	FailCancelled   = "cancelled"    // Run's context ended
)

// Run performs the load test described by cfg and reports on it. It
// stops early, with what it measured so far and ctx's error, when ctx is
// done.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if cfg.Client == nil {
		cfg.Client = defaultClient(cfg.Concurrency)
	}
	prompt := cfg.Prompt
	calibrated := false
	if prompt == nil {
		perToken := 4.0
		if r, ok := calibrate(ctx, cfg); ok {
			perToken, calibrated = r, true
		}
		chars := int(float64(cfg.PromptTokens)*perToken + 0.5)
		prompt = func(i, tenant int) string { return promptText(i, tenant, chars) }
	}

	samples := make([]Sample, cfg.Requests)
	sent := make([]bool, cfg.Requests)
	next := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < min(cfg.Concurrency, cfg.Requests); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				tenant := i % len(cfg.Keys)
				samples[i] = one(ctx, cfg, tenant, prompt(i, tenant))
				sent[i] = true
			}
		}()
	}
feed:
	for i := 0; i < cfg.Requests; i++ {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)

	var done []Sample
	for i, s := range samples {
		if sent[i] {
			done = append(done, s)
		}
	}
	r := NewReport(done, len(cfg.Keys), elapsed)
	r.PromptCalibrated = calibrated
	return r, ctx.Err()
}

func defaultClient(conns int) *http.Client {
	t := &http.Transport{
		Proxy:               nil, // a load test goes straight to the URL it was given
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
	}
	return &http.Client{Transport: t}
}

// filler is English-like text for prompts; a real tokenizer splits it much
// as it splits real prompts.
const filler = "The quick brown fox jumps over the lazy dog while the server keeps every tenant's pages apart. " +
	"A careful scheduler batches requests from many customers and streams each answer back to its owner. "

// promptText is request i's prompt: a unique head (so that no two
// requests share a prefix-cache page) padded with filler to chars bytes.
func promptText(i, tenant, chars int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Request %d for tenant %d. ", i, tenant)
	for b.Len() < chars {
		b.WriteString(filler[:min(len(filler), chars-b.Len())])
	}
	return b.String()
}

// calibrate asks the server's /tokenize (vLLM's and pagewarden's) how many
// tokens the filler is, and returns characters per token.
func calibrate(ctx context.Context, cfg Config) (float64, bool) {
	text := strings.Repeat(filler, 4)
	body, _ := json.Marshal(map[string]any{"prompt": text, "add_special_tokens": false})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", cfg.BaseURL+"/tokenize", bytes.NewReader(body))
	if err != nil {
		return 0, false
	}
	req.Header.Set("Authorization", "Bearer "+cfg.Keys[0])
	req.Header.Set("Content-Type", "application/json")
	resp, err := cfg.Client.Do(req)
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	var out struct {
		Count int `json:"count"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out) != nil || out.Count <= 0 {
		return 0, false
	}
	return float64(len(text)) / float64(out.Count), true
}

// one sends one streaming request and measures it.
func one(ctx context.Context, cfg Config, tenant int, prompt string) (s Sample) {
	s.Tenant = tenant
	body := map[string]any{
		"max_tokens": cfg.MaxTokens, "temperature": cfg.Temperature, "stream": true,
		"stream_options": map[string]any{"include_usage": true},
	}
	if cfg.Model != "" {
		body["model"] = cfg.Model
	}
	if cfg.Endpoint == Chat {
		body["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	} else {
		body["prompt"] = prompt
	}
	b, _ := json.Marshal(body)
	rctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, "POST", cfg.BaseURL+"/v1/"+string(cfg.Endpoint), bytes.NewReader(b))
	if err != nil {
		s.Failure = FailTransport
		return s
	}
	req.Header.Set("Authorization", "Bearer "+cfg.Keys[tenant])
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")

	start := time.Now()
	defer func() { s.Latency = time.Since(start) }()
	fail := func(err error) string {
		switch {
		case ctx.Err() != nil:
			return FailCancelled
		case rctx.Err() != nil:
			return FailTimeout
		case errors.Is(err, errMalformed):
			return FailMalformed
		}
		return FailTransport
	}
	resp, err := cfg.Client.Do(req)
	if err != nil {
		s.Failure = fail(err)
		return s
	}
	defer resp.Body.Close()
	s.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20)) // reuse the connection
		s.Failure = strconv.Itoa(resp.StatusCode)
		return s
	}
	var last time.Time
	texts := 0
	res, err := readStream(io.LimitReader(resp.Body, MaxResponseBytes), func() {
		now := time.Now()
		if texts == 0 {
			s.TTFT = now.Sub(start)
		} else {
			s.Gaps = append(s.Gaps, now.Sub(last))
		}
		last = now
		texts++
	})
	switch {
	case err != nil:
		s.Failure = fail(err)
	case res.errorEvent:
		s.Failure = FailStreamError
	case !res.done:
		s.Failure = FailTruncated
	}
	s.OutputTokens, s.PromptTokens = texts, res.promptTokens
	if res.completionTokens > 0 {
		s.OutputTokens = res.completionTokens
	}
	return s
}

var errMalformed = errors.New("loadgen: malformed event stream")

type streamResult struct {
	done, errorEvent               bool
	promptTokens, completionTokens int
}

// event is the part of a completion or chat chunk, or an error event,
// that a load test needs.
type event struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// readStream reads server-sent events until [DONE], an error event or the
// end of r, calling onText for every event that carries generated text.
func readStream(r io.Reader, onText func()) (streamResult, error) {
	var res streamResult
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 32<<10), maxLine)
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // comments, event names, blank separators
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			res.done = true
			return res, nil
		}
		var ev event
		if err := json.Unmarshal(data, &ev); err != nil {
			return res, fmt.Errorf("%w: %v", errMalformed, err)
		}
		if len(ev.Error) > 0 && string(ev.Error) != "null" {
			res.errorEvent = true
			return res, nil
		}
		if ev.Usage != nil {
			res.promptTokens, res.completionTokens = ev.Usage.PromptTokens, ev.Usage.CompletionTokens
		}
		for _, c := range ev.Choices {
			if c.Text != "" || c.Delta.Content != "" {
				onText()
				break
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return res, fmt.Errorf("%w: a line is longer than %d bytes", errMalformed, maxLine)
		}
		return res, err
	}
	return res, nil
}
