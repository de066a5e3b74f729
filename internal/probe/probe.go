package probe

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrConfig wraps every invalid Config.
var ErrConfig = errors.New("probe: invalid config")

// Config says what to probe and how hard.
type Config struct {
	// URL is the server's base URL (scheme and host, optionally a path
	// prefix before /v1).
	URL string
	// Keys are two or more API keys, ideally of different tenants. They
	// are never written to the report.
	Keys []string
	// Model is the model name sent; "" takes the first from /v1/models.
	Model string
	// Window is the context window in tokens; 0 takes max_model_len from
	// /v1/models or /tokenize.
	Window int
	// PageSize is the KV page size in tokens, for the "+one page"
	// boundary; 0 means 16 (pagewarden's and vLLM's default block).
	PageSize int
	// Quick runs fewer trials (for tests and smoke checks).
	Quick bool
	// Trials is the number of canary requests per key; 0 means 40, or 6
	// with Quick.
	Trials int
	// Timeout bounds each request; 0 means 2 minutes: longer than the
	// usual server-side queue limit (a minute), so that a server that is
	// full answers 503 before the probe gives up and calls it no answer.
	Timeout time.Duration
	// OneTenant says that the keys are one tenant to the server: it has
	// keys but no tenants (llama.cpp's server: every key of --api-key-file
	// opens the same slots and cache), or it has one key, given twice or
	// once. The canaries then test isolation between requests, not
	// tenants, and prefix-cache sharing between keys is by design, so that
	// check is not applicable.
	OneTenant bool
	// MetricsURL is where the server's Prometheus metrics are read for
	// the must-be-zero counters; "" means URL + "/metrics".
	MetricsURL string
	// ZeroMetrics are counters, besides DefaultZeroMetrics, that must not
	// rise while the probe runs.
	ZeroMetrics []string
	// CounterSettle is how long the probe waits after its last request
	// before it reads the must-be-zero counters again; 0 means 1 s with
	// Quick, else 3 s.
	CounterSettle time.Duration
	// HTTPClient is used for every request; nil makes one.
	HTTPClient *http.Client
	// Progress receives progress lines while the probe runs; nil: none.
	Progress io.Writer
}

// Validate checks c and fills in defaults.
func (c *Config) Validate() error {
	u, err := url.Parse(c.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: --url %q: want http://host:port or https://host:port", ErrConfig, c.URL)
	}
	c.URL = strings.TrimRight(c.URL, "/")
	c.URL = strings.TrimSuffix(c.URL, "/v1")
	if c.OneTenant && len(c.Keys) == 1 {
		// One key plays both clients: the probe still tells its requests
		// apart by their secrets.
		c.Keys = []string{c.Keys[0], c.Keys[0]}
	}
	if len(c.Keys) < 2 {
		return fmt.Errorf("%w: want at least two --key (of two tenants; or one with --one-tenant), got %d", ErrConfig, len(c.Keys))
	}
	seen := map[string]bool{}
	for i, k := range c.Keys {
		if k == "" || strings.ContainsAny(k, " \t\r\n") {
			return fmt.Errorf("%w: key %d is empty or holds white space", ErrConfig, i)
		}
		if seen[k] && !c.OneTenant {
			return fmt.Errorf("%w: key %d is given twice (say --one-tenant if the server has one key)", ErrConfig, i)
		}
		seen[k] = true
	}
	if c.MetricsURL != "" {
		if u, err := url.Parse(c.MetricsURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%w: --metrics-url %q: want http://host:port/metrics", ErrConfig, c.MetricsURL)
		}
	}
	for _, n := range c.ZeroMetrics {
		if !validMetricName(n) {
			return fmt.Errorf("%w: --zero-metric %q is not a Prometheus metric name", ErrConfig, n)
		}
	}
	if c.Window < 0 || c.Window > 1<<24 {
		return fmt.Errorf("%w: --window %d: want 0 (discover) or 1..%d", ErrConfig, c.Window, 1<<24)
	}
	if c.PageSize == 0 {
		c.PageSize = 16
	}
	if c.PageSize < 1 || c.PageSize > 1<<16 {
		return fmt.Errorf("%w: --page-size %d: want 1..65536", ErrConfig, c.PageSize)
	}
	if c.Trials == 0 {
		c.Trials = 40
		if c.Quick {
			c.Trials = 6
		}
	}
	if c.Trials < 1 || c.Trials > 10000 {
		return fmt.Errorf("%w: --trials %d: want 1..10000", ErrConfig, c.Trials)
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	if c.CounterSettle < 0 {
		return fmt.Errorf("%w: counter settle time %v must not be negative", ErrConfig, c.CounterSettle)
	}
	if c.CounterSettle == 0 {
		c.CounterSettle = 3 * time.Second
		if c.Quick {
			c.CounterSettle = time.Second
		}
	}
	if c.Timeout < 0 {
		return fmt.Errorf("%w: --timeout %v must be positive", ErrConfig, c.Timeout)
	}
	return nil
}

// Verdict is a check's outcome.
type Verdict string

const (
	Pass Verdict = "pass"
	Fail Verdict = "fail"
	Skip Verdict = "skip"
)

// Evidence is one observation behind a verdict. Key is the index of the
// key that sent the request (-1: a made-up key), never the key itself.
type Evidence struct {
	What    string `json:"what"`
	Request string `json:"request,omitempty"`
	Key     int    `json:"key"`
	Status  int    `json:"status,omitempty"`
	Error   string `json:"error,omitempty"`
	Bytes   string `json:"bytes,omitempty"`
}

// Check is one check's result.
type Check struct {
	Name     string         `json:"name"`
	Verdict  Verdict        `json:"verdict"`
	Reason   string         `json:"reason"`
	Requests int            `json:"requests"`
	Evidence []Evidence     `json:"evidence,omitempty"`
	Numbers  map[string]any `json:"numbers,omitempty"`
}

// maxEvidence bounds the evidence kept per check.
const maxEvidence = 20

func (c *Check) fail(ev Evidence) {
	c.Verdict = Fail
	if len(c.Evidence) < maxEvidence {
		c.Evidence = append(c.Evidence, ev)
	}
}

// Leak is the canary trials' result.
type Leak struct {
	Trials int `json:"trials"`
	Leaks  int `json:"leaks"`
	// Upper95 is the one-sided 95% Clopper-Pearson upper bound on the
	// probability that a response carries another key's secret.
	Upper95 float64 `json:"upper95"`
}

// Report is the probe's result.
type Report struct {
	URL       string `json:"url"`
	Model     string `json:"model"`
	Keys      int    `json:"keys"`
	Window    int    `json:"window"`
	WindowSrc string `json:"window_source"`
	Tokenize  bool   `json:"tokenize"`
	// TokenizeForm is the /tokenize dialect used: "vllm" or "llama.cpp".
	TokenizeForm string `json:"tokenize_form,omitempty"`
	// Server is what the server looks like from /props and /v1/models
	// ("llama.cpp server b4748-c392e509", "vLLM", "pagewarden"), or "".
	Server    string    `json:"server,omitempty"`
	OneTenant bool      `json:"one_tenant"`
	Quick     bool      `json:"quick"`
	Started   time.Time `json:"started"`
	Seconds   float64   `json:"seconds"`
	Requests  int       `json:"requests"`
	Checks    []Check   `json:"checks"`
	Leak      Leak      `json:"leak"`
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool {
	for _, c := range r.Checks {
		if c.Verdict == Fail {
			return true
		}
	}
	return false
}

// Check returns the named check, or nil.
func (r *Report) Check(name string) *Check {
	for i := range r.Checks {
		if r.Checks[i].Name == name {
			return &r.Checks[i]
		}
	}
	return nil
}

// JSON is the report as indented JSON.
func (r *Report) JSON() []byte {
	b, _ := json.MarshalIndent(r, "", "  ")
	return append(b, '\n')
}

// prober is one run's state.
type prober struct {
	cfg      Config
	c        *client
	model    string
	window   int
	tokenize bool
	tok      tokenizer
	server   string
	canaries *canarySet
	progress *progress

	mu  sync.Mutex
	all []*exchange // every exchange, for the canary and error scans
}

// send runs e and remembers it.
func (p *prober) send(ctx context.Context, e *exchange) *exchange {
	e.foreign = p.canaries.foreignTo(e.body)
	p.c.do(ctx, e)
	p.mu.Lock()
	p.all = append(p.all, e)
	p.mu.Unlock()
	p.progress.requests.Add(1)
	return e
}

// sendRetry is send for load phases: a 429 or 503 (the server saying it
// is full, which the overload check judges) is retried a few times after
// its Retry-After, at most a second, so that a tenant's concurrency cap
// does not empty the trials.
func (p *prober) sendRetry(ctx context.Context, mk func() *exchange) *exchange {
	var e *exchange
	for try := 0; try < 5; try++ {
		e = p.send(ctx, mk())
		if e.status != http.StatusTooManyRequests && e.status != http.StatusServiceUnavailable {
			return e
		}
		wait := 200 * time.Millisecond << try
		select {
		case <-ctx.Done():
			return e
		case <-time.After(min(wait, time.Second)):
		}
	}
	return e
}

// Run probes cfg.URL and returns the report. An error means the probe
// could not run at all (a bad config, or no model to probe); a failing
// check is a report with Failed() true, not an error.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hc, fresh := cfg.HTTPClient, (*http.Client)(nil)
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, Proxy: http.ProxyFromEnvironment}}
		fresh = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: http.ProxyFromEnvironment}}
	}
	p := &prober{cfg: cfg, c: &client{base: cfg.URL, keys: cfg.Keys, http: hc, fresh: fresh, timeout: cfg.Timeout},
		canaries: newCanarySet(), progress: newProgress(cfg.Progress)}
	defer p.progress.stop()
	r := &Report{URL: cfg.URL, Keys: len(cfg.Keys), Quick: cfg.Quick, OneTenant: cfg.OneTenant, Started: time.Now().UTC()}
	p.progress.phase("discovering the model and window")
	if err := p.discover(ctx, r); err != nil {
		return nil, err
	}
	r.Model, r.Window, r.Tokenize, r.TokenizeForm, r.Server = p.model, p.window, p.tokenize, string(p.tok), p.server

	before, errBefore := p.scrape(ctx)
	r.Checks = append(r.Checks, p.boundary(ctx))
	base := p.baselines(ctx)
	r.Checks = append(r.Checks, p.prefixCache(ctx))
	load := p.load(ctx, base)
	after := p.replay(ctx, base, "after the storm")
	copies := p.replayCopies(ctx, load)
	r.Checks = append(r.Checks, p.stormCheck(load, base, after))
	r.Checks = append(r.Checks, p.determinism(base, load.replays, after, copies))
	r.Checks = append(r.Checks, p.errorHygiene(ctx))
	r.Checks = append(r.Checks, p.overload(ctx))
	// A server counts an abort's broken promise when it gets to the
	// aborted work, which may be after the last answer: the counters are
	// read once the server has had a moment.
	p.progress.phase("reading the server's counters")
	if errBefore == nil {
		select {
		case <-ctx.Done():
		case <-time.After(p.cfg.CounterSettle):
		}
	}
	afterM, errAfter := p.scrape(ctx)
	r.Checks = append(r.Checks, p.counterCheck(before, errBefore, afterM, errAfter))
	canary, leak := p.canaryCheck(load)
	// The canary check is the headline: it goes first.
	r.Checks = append([]Check{canary}, r.Checks...)
	r.Leak = leak
	r.Requests = int(p.progress.requests.Load())
	r.Seconds = time.Since(r.Started).Seconds()
	p.progress.phase("done")
	return r, ctx.Err()
}

// discover finds the model name and the window.
func (p *prober) discover(ctx context.Context, r *Report) error {
	p.model, p.window = p.cfg.Model, p.cfg.Window
	r.WindowSrc = "--window"
	e := p.send(ctx, &exchange{key: 0, method: http.MethodGet, path: "/v1/models", desc: "GET /v1/models"})
	if e.err != nil && e.status == 0 {
		return fmt.Errorf("probe: GET %s/v1/models: %w", p.cfg.URL, e.err)
	}
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if e.status == http.StatusOK {
		_ = json.Unmarshal(e.raw, &models)
	}
	if p.model == "" {
		if len(models.Data) == 0 {
			return fmt.Errorf("probe: GET /v1/models answered %d with no model; name one with --model", e.status)
		}
		p.model = models.Data[0].ID
	}
	for _, m := range models.Data {
		if m.ID == p.model && m.MaxModelLen > 0 && p.window == 0 {
			p.window, r.WindowSrc = m.MaxModelLen, "/v1/models max_model_len"
		}
	}
	// /tokenize: vLLM's form (also SGLang's and pagewarden's), which also
	// tells max_model_len, else llama.cpp's. A server that answers a
	// form it does not speak with no tokens for a non-empty text (as
	// llama.cpp answers vLLM's) does not count as having it.
	for _, form := range []tokenizer{tokVLLM, tokLlama} {
		t := p.send(ctx, tokenizeExchange(form, p.model, "probe", false))
		if t.status != http.StatusOK {
			continue
		}
		if _, n, maxLen, err := parseTokenize(t.raw); err == nil && n > 0 {
			p.tokenize, p.tok = true, form
			if p.window == 0 && maxLen > 0 {
				p.window, r.WindowSrc = maxLen, "/tokenize max_model_len"
			}
			break
		}
	}
	// llama.cpp's server tells its context per slot in /props (and shows
	// itself there).
	pr := p.send(ctx, &exchange{key: 0, method: http.MethodGet, path: "/props", desc: "GET /props", optional: true})
	var props struct {
		Settings struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if pr.status == http.StatusOK {
		p.server = serverKind(pr.raw, e.raw)
		if p.window == 0 && json.Unmarshal(pr.raw, &props) == nil && props.Settings.NCtx > 0 {
			p.window, r.WindowSrc = props.Settings.NCtx, "/props n_ctx"
		}
	} else if e.status == http.StatusOK {
		p.server = serverKind(nil, e.raw)
	}
	if p.window == 0 {
		r.WindowSrc = "unknown (give --window)"
	}
	p.progress.printf("server %q, model %q, window %d (%s), /tokenize %q", orElse(p.server, "not recognized"), p.model, p.window, r.WindowSrc, orElse(string(p.tok), "none"))
	return nil
}

// countTokens asks /tokenize for the tokens of text (no special tokens).
func (p *prober) countTokens(ctx context.Context, text string) ([]int, *exchange, bool) {
	e := p.send(ctx, tokenizeExchange(p.tok, p.model, text, false))
	if e.status != http.StatusOK {
		return nil, e, false
	}
	ids, _, _, err := parseTokenize(e.raw)
	if err != nil {
		return nil, e, false
	}
	return ids, e, true
}

// randomToken returns n characters of a 32-letter alphabet (no 0/o, 1/l):
// 5 bits each from the system's random source.
func randomToken(n int) string {
	const alphabet = "abcdefghijkmnpqrstuvwxyz23456789"
	b := make([]byte, n)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[b[i]&31]
	}
	return string(b)
}

// progress writes one line per phase, and the request count every second
// while a phase runs, to Config.Progress.
type progress struct {
	w        io.Writer
	requests atomic.Int64
	leaks    atomic.Int64
	mu       sync.Mutex
	name     string
	start    time.Time
	quit     chan struct{}
	done     chan struct{}
}

func newProgress(w io.Writer) *progress {
	pr := &progress{w: w, start: time.Now(), quit: make(chan struct{}), done: make(chan struct{})}
	if w == nil {
		close(pr.done)
		return pr
	}
	go func() {
		defer close(pr.done)
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := int64(-1)
		for {
			select {
			case <-pr.quit:
				return
			case <-t.C:
				if n := pr.requests.Load(); n != last {
					last = n
					pr.mu.Lock()
					name := pr.name
					pr.mu.Unlock()
					pr.printf("  … %s: %d requests so far, %d foreign canaries seen", name, n, pr.leaks.Load())
				}
			}
		}
	}()
	return pr
}

func (pr *progress) phase(name string) {
	pr.mu.Lock()
	pr.name = name
	pr.mu.Unlock()
	pr.printf("%s", name)
}

func (pr *progress) printf(format string, args ...any) {
	if pr.w == nil {
		return
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	fmt.Fprintf(pr.w, "probe [%5.1fs] %s\n", time.Since(pr.start).Seconds(), fmt.Sprintf(format, args...))
}

func (pr *progress) stop() {
	select {
	case <-pr.quit:
	default:
		close(pr.quit)
	}
	<-pr.done
}
