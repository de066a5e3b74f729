package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pagewarden/pagewarden/internal/gateway/chattmpl"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// DefaultMaxBodyBytes caps request bodies when Config.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = 4 << 20

// Config configures a Server. Backend and Tenants are required; every
// other zero value means the documented default.
type Config struct {
	Backend Backend
	// Tenants is the initial tenant set; see tenants.Default for the
	// no-config case. Replace it later with Server.Reload.
	Tenants *tenants.Config
	// MaxBodyBytes caps a request body (413 beyond). Default 4 MiB.
	MaxBodyBytes int64
	// MaxInFlight caps generation requests across all tenants; beyond it
	// requests get 503 overloaded. 0 means no cap.
	MaxInFlight int
	// WriteTimeout bounds each write to a client, so that a client that
	// stops reading cannot hold a request (and its pages) forever.
	// Default 30 s.
	WriteTimeout time.Duration
	// Logger receives one line per request. Default slog.Default().
	Logger *slog.Logger
	// LogPrompts adds prompt and output text to request logs. Debug only:
	// prompts are customer data.
	LogPrompts bool
	// Registry, instead of Tenants, is a registry shared with the
	// scheduler's tenant policies (node.Options.Policy): one Reload then
	// changes what the gateway admits and what the scheduler enforces at
	// the same moment, so the two can never disagree about a tenant.
	Registry *tenants.Registry
	// MetricsOnAPI also serves /metrics on the API handler. Off by
	// default: the series are labelled by tenant id, which API callers
	// must not see; operators serve MetricsHandler on a private listener.
	MetricsOnAPI bool
	// Now is the clock for quotas and timings. Default time.Now.
	Now func() time.Time
	// AuditRate is the fraction of successful answers that are generated
	// again on fresh pages and compared token for token (audit.go); 0
	// turns the replay audit off.
	AuditRate float64
	// AuditQueue bounds the replays waiting to run (default 64); beyond
	// it they are dropped and counted.
	AuditQueue int
	// AuditTolerance is the largest |Δlogprob| between an answer's
	// recorded log-probabilities and its re-score that still matches.
	// 0, the default, compares exactly (equal bits, equal top-k digests):
	// the engine is batch-invariant, so a clean answer re-scored on the
	// same kind of node is bit-identical. Set it for a cluster whose
	// nodes compute with other kernels (audit.go).
	AuditTolerance float64
}

// Server is the OpenAI-compatible HTTP gateway. It is an http.Handler; Serve
// and Shutdown run it on a listener with graceful draining.
type Server struct {
	cfg     Config
	backend Backend
	limits  Limits
	reg     *tenants.Registry
	m       *metrics
	log     *slog.Logger
	now     func() time.Time
	mux     *http.ServeMux
	tmpl    *chattmpl.Template // nil: use the fallback format
	tmplErr error              // why the model's template was not usable
	// created is the server's start time: the "created" of the served
	// model, the same on every call.
	created time.Time

	// Draining: once draining is set no new request starts; active counts
	// handlers in progress; idle is closed when draining and active is 0.
	// stop is cancelled when the drain deadline passes, which aborts every
	// request still running.
	mu       sync.Mutex
	draining bool
	active   int
	idle     chan struct{}
	stop     context.Context
	stopNow  context.CancelFunc
	inflight atomic.Int64 // generation requests submitted
	paused   atomic.Bool  // the operator's drain (SetDraining)
	audit    *auditor

	httpSrv *http.Server
	serveMu sync.Mutex
}

// New validates cfg and builds a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Backend == nil {
		return nil, errors.New("gateway: Config.Backend is required")
	}
	reg := cfg.Registry
	switch {
	case reg != nil && cfg.Tenants != nil:
		return nil, errors.New("gateway: set Config.Tenants or Config.Registry, not both")
	case reg == nil && cfg.Tenants == nil:
		return nil, errors.New("gateway: Config.Tenants is required (see tenants.Default)")
	case reg == nil:
		var err error
		if reg, err = tenants.NewRegistry(cfg.Tenants); err != nil {
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	lim := cfg.Backend.Limits()
	if lim.MaxContext < 2 {
		return nil, fmt.Errorf("gateway: backend limits: MaxContext %d is too small", lim.MaxContext)
	}
	if lim.MaxPromptTokens <= 0 || lim.MaxPromptTokens >= lim.MaxContext {
		lim.MaxPromptTokens = lim.MaxContext - 1
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.WriteTimeout <= 0 {
		cfg.WriteTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if !(cfg.AuditRate >= 0 && cfg.AuditRate <= 1) {
		return nil, fmt.Errorf("gateway: audit rate %g: want a fraction between 0 and 1", cfg.AuditRate)
	}
	if !(cfg.AuditTolerance >= 0 && cfg.AuditTolerance <= 10) {
		return nil, fmt.Errorf("gateway: audit tolerance %g: want a log-probability difference between 0 and 10", cfg.AuditTolerance)
	}
	if cfg.AuditQueue < 0 || cfg.AuditQueue > 1<<20 {
		return nil, fmt.Errorf("gateway: audit queue %d: want 0 (the default, %d) to %d replays", cfg.AuditQueue, defaultAuditQueue, 1<<20)
	}
	s := &Server{
		cfg: cfg, backend: cfg.Backend, limits: lim, reg: reg,
		m: newMetrics(cfg.Backend), log: cfg.Logger, now: cfg.Now,
		idle: make(chan struct{}), created: cfg.Now(),
	}
	s.stop, s.stopNow = context.WithCancel(context.Background())
	if src := cfg.Backend.ChatTemplate(); src != "" {
		s.tmpl, s.tmplErr = chattmpl.Parse(src)
		if s.tmplErr != nil {
			s.log.Warn("chat template unusable; using the fallback format", "err", s.tmplErr)
		}
	}
	s.routes()
	s.audit = newAuditor(s, cfg.AuditRate, cfg.AuditTolerance, cfg.AuditQueue)
	s.m.reg.MustRegister(s.audit.replays, s.audit.mismatches)
	return s, nil
}

// endpointMethods is the method each known path takes, for the 405 that a
// known path with another method gets (the catch-all route would otherwise
// answer 404, as if the endpoint did not exist).
var endpointMethods = map[string]string{
	"/v1/chat/completions": http.MethodPost,
	"/v1/completions":      http.MethodPost,
	"/v1/models":           http.MethodGet,
	"/tokenize":            http.MethodPost,
	"/detokenize":          http.MethodPost,
	"/healthz":             http.MethodGet,
	"/readyz":              http.MethodGet,
}

// allowedMethod is the method a known path takes.
func allowedMethod(path string) (string, bool) {
	if strings.HasPrefix(path, "/v1/models/") {
		return http.MethodGet, true
	}
	m, ok := endpointMethods[path]
	return m, ok
}

func (s *Server) routes() {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", s.handle("chat", true, s.chatCompletions))
	mux.HandleFunc("POST /v1/completions", s.handle("completions", true, s.completions))
	mux.HandleFunc("GET /v1/models", s.handle("models", true, s.models))
	// Model ids may hold slashes ("org/name"): the id is the whole rest.
	mux.HandleFunc("GET /v1/models/{id...}", s.handle("models", true, s.model))
	mux.HandleFunc("POST /tokenize", s.handle("tokenize", true, s.tokenize))
	mux.HandleFunc("POST /detokenize", s.handle("detokenize", true, s.detokenize))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if s.isDraining() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "draining\n")
			return
		}
		io.WriteString(w, "ready\n")
	})
	if s.cfg.MetricsOnAPI {
		mux.Handle("GET /metrics", s.MetricsHandler())
	}
	mux.HandleFunc("/", s.handle("unknown", false, func(c *call) *apiError {
		if allow, ok := allowedMethod(c.r.URL.Path); ok {
			c.w.Header().Set("Allow", allow)
			return &apiError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed",
				Message: fmt.Sprintf("%s is not allowed on %s; use %s.", c.r.Method, c.r.URL.Path, allow)}
		}
		return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
			Message: "Unknown endpoint."}
	}))
	s.mux = mux
}

// MetricsHandler serves the Prometheus exposition of this server's
// registry (what GET /metrics serves unless SeparateMetrics is set).
func (s *Server) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{})
}

// ServeHTTP implements http.Handler. Every response, probes and the
// mux's own redirects included, carries an X-Request-Id.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mux.ServeHTTP(withRequestID(w, r), r)
}

// Metrics is the server's private Prometheus registry.
func (s *Server) Metrics() *prometheus.Registry { return s.m.reg }

// Reload swaps the tenant configuration atomically. Requests in flight keep
// running under the tenant and quota grant they were admitted with; on
// error the old configuration stays in force. cmd wires SIGHUP to this.
func (s *Server) Reload(cfg *tenants.Config) error {
	if err := s.reg.Reload(cfg); err != nil {
		return fmt.Errorf("gateway: reload: %w", err)
	}
	s.log.Info("tenant configuration reloaded", "tenants", len(cfg.Tenants))
	return nil
}

// Serve accepts connections on ln until Shutdown. Like http.Server.Serve
// it returns http.ErrServerClosed after a shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.serveMu.Lock()
	if s.httpSrv == nil {
		s.httpSrv = &http.Server{
			Handler:           s,
			ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout:       120 * time.Second,
			ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		}
	}
	hs := s.httpSrv
	s.serveMu.Unlock()
	return hs.Serve(ln)
}

// Start runs Serve in a goroutine and returns at once; errors other than
// the normal end after Shutdown are logged.
func (s *Server) Start(ln net.Listener) {
	go func() {
		if err := s.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("gateway: serve", "err", err)
		}
	}()
}

// Shutdown drains: /readyz turns 503 and new requests get 503, requests in
// flight run to completion until ctx is done, then the rest are aborted
// (streams end with an SSE error event, never [DONE]) and the listener is
// closed. It returns ctx's error if the deadline cut requests short.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if !s.draining {
		s.draining = true
		if s.active == 0 {
			close(s.idle)
		}
	}
	s.mu.Unlock()

	var cut error
	select {
	case <-s.idle:
	case <-ctx.Done():
		cut = ctx.Err()
		s.stopNow()
		// Aborted handlers end promptly; give them a bounded moment to
		// write their error events.
		t := time.NewTimer(5 * time.Second)
		select {
		case <-s.idle:
		case <-t.C:
		}
		t.Stop()
	}
	s.stopNow()

	s.serveMu.Lock()
	hs := s.httpSrv
	s.serveMu.Unlock()
	if hs != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := hs.Shutdown(sctx); err != nil {
			hs.Close()
		}
	}
	return cut
}

func (s *Server) isDraining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining || s.paused.Load()
}

// SetDraining turns the operator's drain on or off (the admin API's drain
// and undrain) and reports whether it was on. While it is on, /readyz
// answers 503, so that a load balancer or Kubernetes sends no new work,
// and new generation requests that still arrive get a 503 with
// Retry-After; requests in progress go on, and nothing else changes:
// undrain takes new work again at once. Shutdown's drain is separate and
// final.
func (s *Server) SetDraining(on bool) (was bool) { return s.paused.Swap(on) }

// Draining reports whether the operator's drain is on.
func (s *Server) Draining() bool { return s.paused.Load() }

// begin registers a handler as active unless the server is draining.
func (s *Server) begin() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.active++
	return true
}

func (s *Server) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if s.draining && s.active == 0 {
		close(s.idle)
	}
}

// call is one HTTP request in progress: what the handler learnt, for the
// log line and the metrics.
type call struct {
	s        *Server
	w        http.ResponseWriter
	r        *http.Request
	ctx      context.Context // cancelled on client disconnect or drain deadline
	endpoint string
	start    time.Time
	tenant   tenants.Tenant
	id       request.ID
	status   int
	code     string    // the error code sent, if any
	started  bool      // a response byte was written
	ids      *idWriter // the response writer that sets X-Request-Id

	promptTokens, completionTokens, cachedTokens int
	ttft                                         time.Duration
	finish                                       string
	err                                          error // internal cause, logged
	promptText, outputText                       string
	// The replay audit: whether this answer is audited, and the token ids
	// and logprobs it sent.
	audited bool
	sent    []int
	sentLP  []*request.Logprobs
	// sampling is what was submitted (the audit may have asked for
	// logprobs the client did not); cumLogprob sums the logprobs of the
	// tokens received (best_of ranks by it).
	sampling request.Sampling
	// prompt is the submitted prompt's tokens (the entries of prompt
	// logprobs name them).
	prompt     []int
	cumLogprob float64

	// One choice of an n > 1 answer (generateN): the shared writer
	// state, the choice's index, a hook for its first token, and the
	// choice's body object once it ended.
	fan       *fanout
	index     int
	onFirst   func()
	choiceOut any
}

// handle wraps a handler: draining check, authentication, the single
// error adapter, metrics and the request log line.
func (s *Server) handle(endpoint string, auth bool, h func(*call) *apiError) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ids := withRequestID(w, r)
		c := &call{s: s, w: ids, r: r, endpoint: endpoint, start: s.now(), ids: ids}
		ids.internal = &c.id
		if !s.begin() {
			c.fail(errDraining)
			c.done()
			return
		}
		defer s.end()
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer context.AfterFunc(s.stop, cancel)()
		c.ctx = ctx
		defer c.done()
		if auth {
			t, err := s.authenticate(r)
			if err != nil {
				c.fail(errUnauthorized)
				return
			}
			c.tenant = t
		}
		if s.paused.Load() && (endpoint == "chat" || endpoint == "completions") {
			c.fail(errPaused)
			return
		}
		if e := h(c); e != nil {
			c.fail(e)
		}
	}
}

func (s *Server) authenticate(r *http.Request) (tenants.Tenant, error) {
	h := r.Header.Get("Authorization")
	const prefix = "Bearer "
	if len(h) <= len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return tenants.Tenant{}, tenants.ErrUnauthorized
	}
	return s.reg.Authenticate(strings.TrimSpace(h[len(prefix):]))
}

// fail sends e: as an HTTP error before the first byte, as an SSE error
// event after it.
func (c *call) fail(e *apiError) {
	if e.Err != nil && c.err == nil {
		c.err = e.Err
	}
	c.status, c.code = e.Status, e.Code
	if c.started {
		writeSSEError(c.w, e)
		return
	}
	c.started = true
	writeAPIError(c.w, e)
}

// millis is d in milliseconds, the unit of every duration in the log
// (bare nanoseconds are unreadable in a log line).
func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func (c *call) done() {
	s := c.s
	if c.status == 0 {
		c.status = http.StatusOK
	}
	tenant := c.tenant.ID
	if tenant == "" {
		tenant = "-"
	}
	s.m.requests.WithLabelValues(tenant, c.endpoint, strconv.Itoa(c.status)).Inc()
	generation := c.endpoint == "chat" || c.endpoint == "completions"
	if generation && c.tenant.ID != "" {
		s.m.duration.WithLabelValues(tenant, c.endpoint).Observe(s.now().Sub(c.start).Seconds())
		if c.finish != "" {
			s.m.finishes.WithLabelValues(tenant, c.finish).Inc()
		} else if c.status >= 400 {
			s.m.finishes.WithLabelValues(tenant, "refused").Inc()
		}
	}
	if !generation && c.status < 400 {
		return // one line per generation request or failure, not per probe
	}
	attrs := []slog.Attr{
		slog.String("tenant", tenant),
		slog.String("endpoint", c.endpoint),
		slog.Int("status", c.status),
		slog.Float64("duration_ms", millis(s.now().Sub(c.start))),
	}
	if c.ids.client != "" {
		attrs = append(attrs, slog.String("client_request_id", c.ids.client))
	}
	if c.id.IsZero() && c.ids.fresh != "" {
		// The id this response's X-Request-Id carried, so that a client
		// reporting it finds this line.
		attrs = append(attrs, slog.String("id", c.ids.fresh))
	}
	if !c.id.IsZero() {
		attrs = append(attrs, slog.String("id", c.id.String()),
			slog.Int("prompt_tokens", c.promptTokens),
			slog.Int("completion_tokens", c.completionTokens),
			slog.Int("cached_tokens", c.cachedTokens),
			slog.Float64("ttft_ms", millis(c.ttft)),
			slog.String("finish", c.finish))
	}
	if c.code != "" {
		// Why the client was refused, as it was told (the OpenAI code).
		attrs = append(attrs, slog.String("code", c.code))
	}
	if c.err != nil {
		attrs = append(attrs, slog.String("err", c.err.Error()))
	}
	if s.cfg.LogPrompts {
		attrs = append(attrs, slog.String("prompt", c.promptText), slog.String("output", c.outputText))
	}
	level := slog.LevelInfo
	switch {
	case c.code == "overloaded" || c.code == "shutting_down" || c.code == "draining":
		// Load shedding and draining work as designed: an operator
		// watches their rate, not an error log line per refusal.
		level = slog.LevelWarn
	case c.status >= 500:
		level = slog.LevelError
	}
	s.log.LogAttrs(context.Background(), level, "request", attrs...)
}

// readBody reads the request body under the size cap.
func (c *call) readBody() ([]byte, *apiError) {
	// The unwrapped writer: net/http closes the connection after a
	// body over the cap only if MaxBytesReader can tell its own writer.
	body, err := io.ReadAll(http.MaxBytesReader(c.ids.ResponseWriter, c.r.Body, c.s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large",
				Message: fmt.Sprintf("The request body is larger than %d bytes.", c.s.cfg.MaxBodyBytes)}
		}
		if c.ctx.Err() != nil || errors.Is(err, io.ErrUnexpectedEOF) {
			// The client went away mid-body: its mistake to abandon,
			// not a malformed request. 499 as nginx logs it.
			c.finish = "client_closed"
			return nil, &apiError{Status: statusClientClosed, Type: "invalid_request_error", Code: "client_closed",
				Message: "The client closed the connection before the request body was complete.", Err: err}
		}
		return nil, &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_body",
			Message: "The request body could not be read.", Err: err}
	}
	return body, nil
}

// checkModel accepts the served model id or no model at all.
func (c *call) checkModel(model string) *apiError {
	if model == "" || model == c.s.backend.ModelID() {
		return nil
	}
	return c.s.modelNotFound(model)
}

// modelNotFound is the 404 for a model id this server does not serve.
func (s *Server) modelNotFound(model string) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Param: "model",
		Message: fmt.Sprintf("The model %q does not exist on this server; it serves %q.", truncate(model, 64), s.backend.ModelID())}
}

// maxClientRequestID caps the X-Request-Id a client may send to be echoed.
const maxClientRequestID = 128

// clientRequestID returns the client's X-Request-Id when it is well
// formed: a single header of 1 to 128 printable ASCII bytes. Anything else
// is ignored, never echoed.
func clientRequestID(r *http.Request) string {
	v := r.Header.Values("X-Request-Id")
	if len(v) != 1 || v[0] == "" || len(v[0]) > maxClientRequestID {
		return ""
	}
	for i := 0; i < len(v[0]); i++ {
		if b := v[0][i]; b < 0x20 || b > 0x7e {
			return ""
		}
	}
	return v[0]
}

// idWriter fixes a response's request-id headers when its status is
// written, from what the request has learnt by then. X-Request-Id is the
// client's well-formed one if it sent one, else the call's internal id if
// it got one, else an id drawn for this HTTP request; whatever a handler
// set there before is overwritten. X-Pagewarden-Request-Id is the internal
// id whenever there is one: that id is drawn by the server alone (I9), a
// client id only ever travels back in X-Request-Id and the log line.
type idWriter struct {
	http.ResponseWriter
	client   string      // the client's X-Request-Id; "" if absent or malformed
	fresh    string      // drawn for this HTTP request when client is ""
	internal *request.ID // the call's id (zero until it submits); nil outside handle
	wrote    bool        // the status line is written: the headers are sent
}

var _ http.ResponseWriter = (*idWriter)(nil)

// withRequestID wraps w, once per HTTP request.
func withRequestID(w http.ResponseWriter, r *http.Request) *idWriter {
	if iw, ok := w.(*idWriter); ok {
		return iw
	}
	iw := &idWriter{ResponseWriter: w, client: clientRequestID(r)}
	if iw.client == "" {
		iw.fresh = request.NewID().String()
	}
	// Set now as well, for a response that net/http ends itself after a
	// handler that wrote nothing.
	iw.stamp()
	return iw
}

func (w *idWriter) stamp() {
	h := w.ResponseWriter.Header()
	var internal string
	if w.internal != nil && !w.internal.IsZero() {
		internal = w.internal.String()
		h.Set("X-Pagewarden-Request-Id", internal)
	}
	switch {
	case w.client != "":
		h.Set("X-Request-Id", w.client)
	case internal != "":
		h.Set("X-Request-Id", internal)
	default:
		h.Set("X-Request-Id", w.fresh)
	}
}

// WriteHeader stamps the request ids and sends the status.
func (w *idWriter) WriteHeader(status int) {
	if !w.wrote {
		w.wrote = true
		w.stamp()
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *idWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// FlushError lets http.ResponseController flush through the wrapper
// (which also sends the headers, stamped, if nothing else has).
func (w *idWriter) FlushError() error {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError for callers that assert http.Flusher.
func (w *idWriter) Flush() { _ = w.FlushError() }

// Unwrap lets http.ResponseController reach the connection's writer (for
// write deadlines).
func (w *idWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

func utf8RuneStart(b byte) bool { return b&0xC0 != 0x80 }
