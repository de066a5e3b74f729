package admin

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/sched"
)

// Pool is one node's KV pool as the admin server sees it: a name (the
// node's, as the page map labels it) and how to take its PageMap. In
// `serve` that is one node; with a prefill and a decode node in one
// process it is one entry per node.
type Pool struct {
	Name string
	Map  func(ctx context.Context) (sched.PageMap, error)
}

// Config configures a Server.
type Config struct {
	Pools []Pool
	// KeySHA256 are the SHA-256 digests of the admin keys. At least one is
	// required: the admin listener is never open.
	KeySHA256 [][32]byte
	// IsTenantKey, if set, reports whether a key that is not an admin key
	// is a tenant's API key, so that the refusal says so (403) and is
	// recorded as an audit event: a tenant key sent to the admin listener
	// is a leaked or misused credential worth a look.
	IsTenantKey func(key string) bool
	// Events is the audit ring the page and /admin/api/events show (nil:
	// a new one, which only the server's own events reach).
	Events *Ring
	// Interval is how often /admin/events sends a fresh state (default
	// 1s). Snapshots are shared by every client within one interval.
	Interval time.Duration
	// Logger receives the server's own audit lines; nil discards. They
	// are recorded in Events directly, so Logger need not feed the ring.
	Logger *slog.Logger
	// Scrub, if set, is POST /admin/api/scrub: scrub and free every
	// quarantined KV page (what SIGUSR1 does) and report how many.
	Scrub func(ctx context.Context) (int, error)
	// Tenants, if set, is GET /admin/api/config: the tenant configuration
	// in force (ids, limits, how many keys; never the key hashes).
	Tenants func() []tenants.Tenant
	// Reload, if set, is POST /admin/api/reload: read the tenant config
	// file again (what SIGHUP does) and report what changed.
	Reload func(ctx context.Context) (changes []string, err error)
	// Drain, if set, is POST /admin/api/drain (on) and
	// /admin/api/undrain (off): stop taking new work while what runs
	// goes on, or take it again. It reports whether the drain was on.
	// Draining reports it for GET /admin/api/drain.
	Drain    func(on bool) (was bool)
	Draining func() bool
}

// Server serves the admin page, its JSON API and its event stream.
type Server struct {
	cfg  Config
	keys atomic.Pointer[[][32]byte] // the admin keys' digests (SetKeys)
	log  *slog.Logger
	mux  *http.ServeMux
	mu   sync.Mutex // guards the cached state
	last *state
}

//go:embed ui
var uiFiles embed.FS

// ErrConfig reports a Config the server cannot run with.
var ErrConfig = errors.New("admin: invalid configuration")

// New checks cfg and builds the server.
func New(cfg Config) (*Server, error) {
	if len(cfg.KeySHA256) == 0 {
		return nil, fmt.Errorf("%w: no admin key", ErrConfig)
	}
	if len(cfg.Pools) == 0 {
		return nil, fmt.Errorf("%w: no pools", ErrConfig)
	}
	seen := map[string]bool{}
	for _, p := range cfg.Pools {
		if p.Name == "" || p.Map == nil || seen[p.Name] {
			return nil, fmt.Errorf("%w: pool %q unnamed, without a map or named twice", ErrConfig, p.Name)
		}
		seen[p.Name] = true
	}
	if cfg.Events == nil {
		cfg.Events = NewRing(0)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux()}
	keys := slices.Clone(cfg.KeySHA256)
	s.keys.Store(&keys)
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	ui, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		return nil, err
	}
	// Each of the page's files on its own route: nothing else is looked
	// up in the file system (a path that is not a valid name would be a
	// 500 from a file server), and a known API path asked with the wrong
	// method is a 405, not a missing file.
	files, err := fs.ReadDir(ui, ".")
	if err != nil {
		return nil, err
	}
	serve := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { http.ServeFileFS(w, r, ui, name) }
	}
	s.mux.HandleFunc("GET /admin/{$}", serve("index.html"))
	for _, f := range files {
		if f.Name() != "index.html" {
			s.mux.HandleFunc("GET /admin/"+f.Name(), serve(f.Name()))
		}
	}
	s.mux.HandleFunc("GET /admin/api/pages", s.pages)
	s.mux.HandleFunc("GET /admin/api/tenants", s.json(func(st *state) any { return st.Tenants }))
	s.mux.HandleFunc("GET /admin/api/events", s.events)
	s.mux.HandleFunc("GET /admin/events", s.stream)
	if cfg.Scrub != nil {
		s.mux.HandleFunc("POST /admin/api/scrub", s.scrub)
	}
	if cfg.Tenants != nil {
		s.mux.HandleFunc("GET /admin/api/config", s.config)
	}
	if cfg.Reload != nil {
		s.mux.HandleFunc("POST /admin/api/reload", s.reload)
	}
	if cfg.Drain != nil && cfg.Draining != nil {
		s.mux.HandleFunc("GET /admin/api/drain", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, DrainResult{Draining: cfg.Draining()})
		})
		s.mux.HandleFunc("POST /admin/api/drain", s.drain(true))
		s.mux.HandleFunc("POST /admin/api/undrain", s.drain(false))
	}
	return s, nil
}

// Handler is the admin listener's handler: every path needs the admin key.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		// The page is served to a browser: keep it from being framed,
		// cached or made to run anything but its own files.
		h.Set("Cache-Control", "no-store")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
		if !s.authorized(w, r) {
			return
		}
		if r.URL.Path == "/" || r.URL.Path == "/admin" {
			http.Redirect(w, r, "/admin/", http.StatusFound)
			return
		}
		if !strings.HasPrefix(r.URL.Path, "/admin/") {
			writeError(w, http.StatusNotFound, "not_found", "", "no such admin path: "+r.URL.Path)
			return
		}
		s.mux.ServeHTTP(w, r)
	})
}

// SetKeys replaces the admin keys' digests (a reload of the tenant config
// that changed admin_key_sha256): a key taken away stops working at once.
// An empty list is refused and the keys stay as they were: the listener is
// never open, and never shut to its operator by a config that names none.
func (s *Server) SetKeys(keys [][32]byte) error {
	if len(keys) == 0 {
		return fmt.Errorf("%w: no admin key", ErrConfig)
	}
	k := slices.Clone(keys)
	s.keys.Store(&k)
	return nil
}

// authorized checks the admin key: "Authorization: Bearer KEY" (the CLI,
// curl) or HTTP Basic with KEY as the password (a browser, which then
// sends it with the page's own fetch and EventSource requests).
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	key := ""
	if user, pass, ok := r.BasicAuth(); ok {
		key = cmp.Or(pass, user)
	} else if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		key = strings.TrimSpace(v)
	}
	if key != "" {
		d := sha256.Sum256([]byte(key))
		match := 0
		// Compare with every digest without stopping, so timing does not
		// say which matched.
		for _, h := range *s.keys.Load() {
			match |= subtle.ConstantTimeCompare(d[:], h[:])
		}
		if match == 1 {
			return true
		}
		if s.cfg.IsTenantKey != nil && s.cfg.IsTenantKey(key) {
			s.audit(slog.LevelWarn, "admin: a tenant API key was refused on the admin listener",
				map[string]string{"remote": r.RemoteAddr, "path": r.URL.Path})
			writeError(w, http.StatusForbidden, "permission_denied", "authorization", "a tenant API key cannot use the admin API; use an admin key")
			return false
		}
	}
	w.Header().Set("WWW-Authenticate", `Basic realm="pagewarden admin", charset="UTF-8"`)
	msg := "missing admin key: send Authorization: Bearer KEY"
	if key != "" {
		msg = "invalid admin key"
	}
	writeError(w, http.StatusUnauthorized, "invalid_api_key", "authorization", msg)
	return false
}

// writeError sends an OpenAI-style error body.
func writeError(w http.ResponseWriter, status int, code, param, msg string) {
	type body struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    string  `json:"code"`
	}
	b := body{Message: msg, Type: "invalid_request_error", Code: code}
	if status >= 500 {
		b.Type = "server_error"
	}
	if param != "" {
		b.Param = &param
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]body{"error": b})
}

// snapshotTimeout bounds how long a request waits for the scheduler
// loops, which answer between two steps.
const snapshotTimeout = 10 * time.Second

// current returns a state no older than half the interval, taking a new
// one (every pool's PageMap) when needed: several pages open at once cost
// the scheduler loops one snapshot per interval, not one each.
func (s *Server) current(ctx context.Context) *state {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last != nil && time.Since(s.last.taken) < s.cfg.Interval/2 {
		return s.last
	}
	// Not the asking request's context: the state is shared, and one
	// client leaving must not record a failed snapshot for the others.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), snapshotTimeout)
	defer cancel()
	maps := make([]namedMap, len(s.cfg.Pools))
	var wg sync.WaitGroup
	for i, p := range s.cfg.Pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := p.Map(ctx)
			maps[i] = namedMap{name: p.Name, m: m, err: err}
		}()
	}
	wg.Wait()
	s.last = build(time.Now(), maps)
	return s.last
}

func (s *Server) json(part func(*state) any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, part(s.current(r.Context())))
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// pages serves every node's pages; ?state=quarantined (or a comma-separated
// list of cell states) lists only pages in those states, e.g. the
// quarantine list before a scrub. Counts stay those of the whole pool.
func (s *Server) pages(w http.ResponseWriter, r *http.Request) {
	want := map[string]bool{}
	if v := r.URL.Query().Get("state"); v != "" {
		for _, st := range strings.Split(v, ",") {
			if !slices.Contains(CellStates, st) || st == CellFree {
				writeError(w, http.StatusBadRequest, "invalid_value", "state",
					fmt.Sprintf("state %q: want one or more of %s (free pages are never listed)", st, strings.Join(CellStates[1:], ", ")))
				return
			}
			want[st] = true
		}
	}
	view := s.current(r.Context()).Pages
	if len(want) > 0 {
		nodes := make([]NodePages, len(view.Nodes))
		for i, n := range view.Nodes {
			n.Pages = slices.DeleteFunc(slices.Clone(n.Pages), func(p PageView) bool { return !want[p.State] })
			nodes[i] = n
		}
		view.Nodes = nodes
	}
	writeJSON(w, view)
}

// events serves the audit ring: ?since=SEQ gives only later events.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	var since uint64
	if v := r.URL.Query().Get("since"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "invalid_value", "since", fmt.Sprintf("since %q: want an event number", v))
			return
		}
		since = n
	}
	evs, _ := s.cfg.Events.Since(since)
	writeJSON(w, EventList{Events: nonNil(evs)})
}

// audit records one of the server's own events in the ring and the log.
func (s *Server) audit(level slog.Level, msg string, attrs map[string]string) {
	args := make([]any, 0, 2*len(attrs))
	for k, v := range attrs {
		args = append(args, k, v)
	}
	s.log.Log(context.Background(), level, msg, args...)
	s.cfg.Events.Add(Event{Time: time.Now(), Level: level.String(), Message: msg, Attrs: attrs})
}

// ScrubResult is the body of POST /admin/api/scrub.
type ScrubResult struct {
	Scrubbed int `json:"scrubbed"`
}

// requireBearer reports whether r carries its key as a Bearer token, and
// refuses it otherwise. A state change over HTTP Basic could be forged by another
// site the operator's browser visits (the browser adds Basic credentials
// to a cross-site form post by itself); an Authorization: Bearer header
// cannot be set cross-site without a CORS preflight this server never
// grants, so POSTs must use it.
func requireBearer(w http.ResponseWriter, r *http.Request) bool {
	if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		return true
	}
	writeError(w, http.StatusForbidden, "bearer_required", "authorization", "changes need the admin key as Authorization: Bearer KEY, not HTTP Basic")
	return false
}

// ConfigView is the body of /admin/api/config.
type ConfigView struct {
	Tenants []TenantConfig `json:"tenants"`
}

// TenantConfig is one tenant's configuration, without its key hashes;
// the limits carry the config file's names (0: unlimited).
type TenantConfig struct {
	ID     string `json:"id"`
	Keys   int    `json:"keys"`
	Limits struct {
		RequestsPerMinute int `json:"requests_per_minute"`
		TokensPerMinute   int `json:"tokens_per_minute"`
		MaxConcurrent     int `json:"max_concurrent"`
		MaxKVPages        int `json:"max_kv_pages"`
		Priority          int `json:"priority"`
	} `json:"limits"`
}

func (s *Server) config(w http.ResponseWriter, _ *http.Request) {
	v := ConfigView{Tenants: []TenantConfig{}}
	for _, t := range s.cfg.Tenants() {
		c := TenantConfig{ID: t.ID, Keys: len(t.APIKeySHA256)}
		l := t.Limits
		c.Limits.RequestsPerMinute, c.Limits.TokensPerMinute, c.Limits.MaxConcurrent = l.RequestsPerMinute, l.TokensPerMinute, l.MaxConcurrent
		c.Limits.MaxKVPages, c.Limits.Priority = l.MaxKVPages, l.Priority
		v.Tenants = append(v.Tenants, c)
	}
	writeJSON(w, v)
}

// ReloadResult is the body of POST /admin/api/reload.
type ReloadResult struct {
	Changes []string `json:"changes"`
}

// reload reads the tenant config again; a file that does not parse or
// validate keeps the old one and is a 422 with the reason.
func (s *Server) reload(w http.ResponseWriter, r *http.Request) {
	if !requireBearer(w, r) {
		return
	}
	changes, err := s.cfg.Reload(r.Context())
	attrs := map[string]string{"remote": r.RemoteAddr, "changes": strings.Join(changes, "; ")}
	if err != nil {
		attrs["err"] = err.Error()
		s.audit(slog.LevelError, "admin: tenant config reload failed; keeping the old one", attrs)
		writeError(w, http.StatusUnprocessableEntity, "reload_failed", "", "reload failed, the old configuration stays in force: "+err.Error())
		return
	}
	s.audit(slog.LevelWarn, "admin: tenant config reloaded", attrs)
	if changes == nil {
		changes = []string{}
	}
	writeJSON(w, ReloadResult{Changes: changes})
}

// scrub frees the quarantine (Bearer only: see requireBearer).
func (s *Server) scrub(w http.ResponseWriter, r *http.Request) {
	if !requireBearer(w, r) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), snapshotTimeout)
	defer cancel()
	n, err := s.cfg.Scrub(ctx)
	attrs := map[string]string{"pages": strconv.Itoa(n), "remote": r.RemoteAddr}
	if err != nil {
		attrs["err"] = err.Error()
		s.audit(slog.LevelError, "admin: scrubbing quarantined KV pages failed", attrs)
		writeError(w, http.StatusInternalServerError, "scrub_failed", "", "scrubbing the quarantine failed: "+err.Error())
		return
	}
	s.audit(slog.LevelWarn, "admin: quarantined KV pages scrubbed and freed", attrs)
	s.mu.Lock()
	s.last = nil // the next state shows the freed pages
	s.mu.Unlock()
	writeJSON(w, ScrubResult{Scrubbed: n})
}

// DrainResult is the body of /admin/api/drain and /admin/api/undrain.
type DrainResult struct {
	Draining bool `json:"draining"`
	Was      bool `json:"was"`
}

// drain is POST /admin/api/drain (on) or /admin/api/undrain: a change, so
// Bearer only, and an audit event with the caller's address.
func (s *Server) drain(on bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !requireBearer(w, r) {
			return
		}
		was := s.cfg.Drain(on)
		msg := "admin: draining: new requests are refused, running ones go on"
		if !on {
			msg = "admin: undrained: new requests are taken again"
		}
		s.audit(slog.LevelWarn, msg, map[string]string{"was": strconv.FormatBool(was), "remote": r.RemoteAddr})
		writeJSON(w, DrainResult{Draining: on, Was: was})
	}
}

// EventList is the body of /admin/api/events.
type EventList struct {
	Events []Event `json:"events"`
}

func nonNil(e []Event) []Event {
	if e == nil {
		return []Event{}
	}
	return e
}

// keepAlive is how often an idle event stream sends a comment, so that
// proxies do not close it.
const keepAlive = 15 * time.Second

// stream is /admin/events, server-sent events: "state" (the pages and
// tenants, as /admin/api/pages and /admin/api/tenants) whenever it
// changed, checked every interval, and "audit" for each new audit event,
// with its Seq as the event id (a reconnecting EventSource sends it back
// as Last-Event-ID and gets only what it missed).
func (s *Server) stream(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	var since uint64
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		since, _ = strconv.ParseUint(v, 10, 64) // a bad id: resend the ring
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	tick := time.NewTicker(s.cfg.Interval)
	defer tick.Stop()
	var sent []byte
	lastWrite := time.Now()
	for {
		if st := s.current(r.Context()); r.Context().Err() == nil {
			body, key := st.encoded()
			if !bytes.Equal(key, sent) {
				if writeEvent(w, "state", "", body) != nil {
					return
				}
				sent, lastWrite = key, time.Now()
			}
		}
		evs, changed := s.cfg.Events.Since(since)
		for _, e := range evs {
			body, _ := json.Marshal(e)
			if writeEvent(w, "audit", strconv.FormatUint(e.Seq, 10), body) != nil {
				return
			}
			since, lastWrite = e.Seq, time.Now()
		}
		if time.Since(lastWrite) >= keepAlive {
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			lastWrite = time.Now()
		}
		if rc.Flush() != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		case <-changed:
		}
	}
}

// StateEvent is the data of a "state" event.
type StateEvent struct {
	Pages   PagesView   `json:"pages"`
	Tenants TenantsView `json:"tenants"`
}

// writeEvent writes one SSE event. data is JSON, so it holds no newline
// (encoding/json escapes them inside strings) and fits one data: line.
func writeEvent(w http.ResponseWriter, name, id string, data []byte) error {
	var b bytes.Buffer
	if id != "" {
		b.WriteString("id: " + id + "\n")
	}
	b.WriteString("event: " + name + "\n")
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	_, err := w.Write(b.Bytes())
	return err
}
