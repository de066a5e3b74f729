package admin

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
)

const (
	adminKey  = "pw-admin-test-key"
	tenantKey = "pw-tenant-test-key"
)

// fixedMap is a pool of 6 pages: one of each cell state, then a free one.
func fixedMap() sched.PageMap {
	id := request.ID{1, 2, 3}
	acme := request.Owner{Tenant: "acme", ID: id}
	cell := func(st kvcache.PageState, o request.Owner, seq, epoch uint64, filled, refs int, cached bool) kvcache.PageInfo {
		return kvcache.PageInfo{State: st, Owner: o, Seq: seq, Epoch: epoch, Filled: filled, Refs: refs, Cached: cached}
	}
	return sched.PageMap{
		PageSize: 4,
		Pages: []kvcache.PageInfo{
			cell(kvcache.PageOwned, acme, 7, 11, 4, 0, false),
			cell(kvcache.PageShared, request.Owner{Tenant: "acme"}, 0, 3, 4, 2, true),
			cell(kvcache.PageShared, request.Owner{Tenant: "beta"}, 0, 5, 4, 0, true),
			cell(kvcache.PageOwned, request.Owner{Tenant: "beta", ID: request.ID{9}}, 8, 12, 0, 0, false),
			cell(kvcache.PageQuarantined, acme, 7, 10, 2, 0, false),
			{},
		},
		InTransfer: []kvcache.PageID{4},
		Tenants:    []sched.TenantLoad{{Tenant: "acme", Pages: 2, Running: 1}, {Tenant: "beta", Pages: 2, Queued: 3}},
		Core:       sched.Stats{Queued: 3, Running: 1, OwnerMismatches: 1},
		Pool:       kvcache.Stats{QuarantinedPages: 1, Violations: 2},
	}
}

func newTestServer(t *testing.T, pools []Pool, ring *Ring) (*Server, *httptest.Server) {
	t.Helper()
	s, err := New(Config{
		Pools:       pools,
		KeySHA256:   [][32]byte{sha256.Sum256([]byte(adminKey))},
		IsTenantKey: func(k string) bool { return k == tenantKey },
		Events:      ring,
		Interval:    20 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return s, ts
}

func staticPool(name string, m sched.PageMap) Pool {
	return Pool{Name: name, Map: func(context.Context) (sched.PageMap, error) { return m, nil }}
}

func get(t *testing.T, ts *httptest.Server, path string, set func(*http.Request)) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", ts.URL+path, nil)
	if set != nil {
		set(req)
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func bearer(k string) func(*http.Request) {
	return func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+k) }
}

func TestAuth(t *testing.T) {
	ring := NewRing(8)
	_, ts := newTestServer(t, []Pool{staticPool("node", fixedMap())}, ring)
	paths := []string{"/admin/", "/admin/app.js", "/admin/api/pages", "/admin/api/tenants", "/admin/api/events", "/admin/events", "/metrics", "/"}
	cases := []struct {
		name   string
		set    func(*http.Request)
		status int
		code   string
	}{
		{"no key", nil, 401, "invalid_api_key"},
		{"wrong key", bearer("pw-guess"), 401, "invalid_api_key"},
		{"tenant key", bearer(tenantKey), 403, "permission_denied"},
		{"tenant key as basic password", func(r *http.Request) { r.SetBasicAuth("x", tenantKey) }, 403, "permission_denied"},
		{"lower-case scheme", func(r *http.Request) { r.Header.Set("Authorization", "bearer "+adminKey) }, 401, "invalid_api_key"},
		{"empty basic", func(r *http.Request) { r.SetBasicAuth("", "") }, 401, "invalid_api_key"},
	}
	for _, c := range cases {
		for _, p := range paths {
			resp, body := get(t, ts, p, c.set)
			if resp.StatusCode != c.status {
				t.Errorf("%s %s: status %d, want %d", c.name, p, resp.StatusCode, c.status)
				continue
			}
			var e struct {
				Error struct {
					Code, Message string
					Param         *string
				}
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Code != c.code || e.Error.Param == nil || *e.Error.Param != "authorization" {
				t.Errorf("%s %s: body %s", c.name, p, body)
			}
			if c.status == 401 && !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic ") {
				t.Errorf("%s %s: 401 without a Basic challenge", c.name, p)
			}
			if strings.Contains(string(body), "acme") {
				t.Errorf("%s %s: refused body names a tenant: %s", c.name, p, body)
			}
		}
	}
	// Each tenant-key refusal is an audit event, without the key.
	evs, _ := ring.Since(0)
	if len(evs) != 8 { // the ring keeps the last 8 of 16
		t.Fatalf("%d audit events, want 8", len(evs))
	}
	for _, e := range evs {
		if !strings.Contains(e.Message, "tenant API key") || strings.Contains(e.Attrs["path"]+e.Message, tenantKey) {
			t.Errorf("event %+v", e)
		}
	}
	for _, set := range []func(*http.Request){bearer(adminKey), func(r *http.Request) { r.SetBasicAuth("ops", adminKey) }} {
		for _, p := range []string{"/admin/", "/admin/style.css", "/admin/api/pages", "/admin/api/tenants", "/admin/api/events"} {
			resp, body := get(t, ts, p, set)
			if resp.StatusCode != 200 {
				t.Errorf("admin key %s: %d %s", p, resp.StatusCode, body)
			}
			if resp.Header.Get("Content-Security-Policy") == "" || resp.Header.Get("Cache-Control") != "no-store" {
				t.Errorf("%s: headers %v", p, resp.Header)
			}
		}
	}
	if resp, _ := get(t, ts, "/nope", bearer(adminKey)); resp.StatusCode != 404 {
		t.Errorf("unknown path: %d", resp.StatusCode)
	}
}

func TestPagesJSON(t *testing.T) {
	_, ts := newTestServer(t, []Pool{staticPool("node", fixedMap()),
		{Name: "down", Map: func(context.Context) (sched.PageMap, error) { return sched.PageMap{}, request.ErrShuttingDown }}}, nil)
	_, body := get(t, ts, "/admin/api/pages", bearer(adminKey))
	var got PagesView
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	req := request.ID{1, 2, 3}.String()
	want := []NodePages{{
		Name: "node", PageSize: 4, TotalPages: 6,
		Counts: map[string]int{"free": 1, "owned": 1, "shared": 1, "cached": 1, "transfer": 1, "quarantined": 1},
		Pages: []PageView{
			{ID: 1, State: "owned", Tenant: "acme", Request: req, Seq: 7, Epoch: 11, Filled: 4},
			{ID: 2, State: "shared", Tenant: "acme", Epoch: 3, Filled: 4, Refs: 2},
			{ID: 3, State: "cached", Tenant: "beta", Epoch: 5, Filled: 4},
			{ID: 4, State: "transfer", Tenant: "beta", Request: request.ID{9}.String(), Seq: 8, Epoch: 12},
			{ID: 5, State: "quarantined", Tenant: "acme", Request: req, Seq: 7, Epoch: 10, Filled: 2},
		},
	}, {
		Name: "down", Error: request.ErrShuttingDown.Error(), Pages: []PageView{},
		Counts: map[string]int{"free": 0, "owned": 0, "shared": 0, "cached": 0, "transfer": 0, "quarantined": 0},
	}}
	if diff := cmp.Diff(want, got.Nodes); diff != "" {
		t.Errorf("pages (-want +got):\n%s", diff)
	}
	if time.Since(got.Time) > time.Minute {
		t.Errorf("time %v", got.Time)
	}
	// The raw body names no prompt, token or text field.
	for _, f := range []string{"prompt", "token", "text"} {
		if strings.Contains(string(body), f) {
			t.Errorf("pages body mentions %q", f)
		}
	}
}

func TestTenantsJSON(t *testing.T) {
	_, ts := newTestServer(t, []Pool{staticPool("prefill-0", fixedMap()), staticPool("decode-0", fixedMap())}, nil)
	_, body := get(t, ts, "/admin/api/tenants", bearer(adminKey))
	var got TenantsView
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	wantTenants := []TenantLoad{{Tenant: "acme", Pages: 4, Running: 2}, {Tenant: "beta", Pages: 4, Queued: 6}}
	if diff := cmp.Diff(wantTenants, got.Tenants); diff != "" {
		t.Errorf("tenants over nodes (-want +got):\n%s", diff)
	}
	if want := (Counters{IsolationViolations: 4, OwnerMismatches: 2}); got.MustBeZero != want {
		t.Errorf("must-be-zero %+v, want %+v", got.MustBeZero, want)
	}
	if len(got.Nodes) != 2 || got.Nodes[1].Name != "decode-0" || got.Nodes[1].QuarantinedPages != 1 || got.Nodes[1].Queued != 3 ||
		len(got.Nodes[1].Tenants) != 2 {
		t.Errorf("nodes %+v", got.Nodes)
	}
}

func TestEventsJSON(t *testing.T) {
	ring := NewRing(3)
	for _, m := range []string{"a", "b", "c", "d"} {
		ring.Add(Event{Message: m, Level: "WARN"})
	}
	_, ts := newTestServer(t, []Pool{staticPool("node", fixedMap())}, ring)
	cases := []struct {
		query string
		want  []string
	}{
		{"", []string{"b", "c", "d"}},
		{"?since=2", []string{"c", "d"}},
		{"?since=4", []string{}},
	}
	for _, c := range cases {
		_, body := get(t, ts, "/admin/api/events"+c.query, bearer(adminKey))
		var got EventList
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatal(err)
		}
		msgs := []string{}
		for _, e := range got.Events {
			msgs = append(msgs, e.Message)
		}
		if !cmp.Equal(c.want, msgs) {
			t.Errorf("%q: %v, want %v", c.query, msgs, c.want)
		}
	}
	resp, body := get(t, ts, "/admin/api/events?since=x", bearer(adminKey))
	if resp.StatusCode != 400 || !strings.Contains(string(body), `"param":"since"`) {
		t.Errorf("bad since: %d %s", resp.StatusCode, body)
	}
}

// sseEvent is one parsed server-sent event.
type sseEvent struct{ id, name, data string }

// readEvent reads one event, skipping comments; it checks the framing:
// only id, event and data fields, one data line, a blank line at the end.
func readEvent(t *testing.T, r *bufio.Reader) sseEvent {
	t.Helper()
	var e sseEvent
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream: %v", err)
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "" && e.name == "":
			continue // the end of a comment block
		case line == "":
			return e
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "id: "):
			e.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			e.name = line[7:]
		case strings.HasPrefix(line, "data: "):
			if e.data != "" {
				t.Fatalf("second data line in one event: %q", line)
			}
			e.data = line[6:]
		default:
			t.Fatalf("unexpected line %q", line)
		}
	}
}

func TestEventStream(t *testing.T) {
	ring := NewRing(16)
	ring.Add(Event{Message: "before", Level: "ERROR"})
	m := fixedMap()
	changes := make(chan sched.PageMap, 1)
	pool := Pool{Name: "node", Map: func(context.Context) (sched.PageMap, error) {
		select {
		case m = <-changes:
		default:
		}
		return m, nil
	}}
	_, ts := newTestServer(t, []Pool{pool}, ring)
	open := func(lastID string) (*bufio.Reader, func()) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL+"/admin/events", nil)
		req.Header.Set("Authorization", "Bearer "+adminKey)
		if lastID != "" {
			req.Header.Set("Last-Event-ID", lastID)
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("stream: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		return bufio.NewReader(resp.Body), func() { cancel(); resp.Body.Close() }
	}
	r, stop := open("")
	e := readEvent(t, r)
	var st StateEvent
	if e.name != "state" || e.id != "" || json.Unmarshal([]byte(e.data), &st) != nil || len(st.Pages.Nodes[0].Pages) != 5 || len(st.Tenants.Tenants) != 2 {
		t.Fatalf("first event %+v", e)
	}
	if e = readEvent(t, r); e.name != "audit" || e.id != "1" || !strings.Contains(e.data, `"message":"before"`) {
		t.Fatalf("second event %+v", e)
	}
	// A new audit event arrives at once; an unchanged state is not resent.
	ring.Add(Event{Message: "line one\nline two", Level: "WARN"})
	if e = readEvent(t, r); e.name != "audit" || e.id != "2" || !strings.Contains(e.data, `line one\nline two`) {
		t.Fatalf("event after Add: %+v", e)
	}
	// A changed pool is sent as a new state.
	m2 := fixedMap()
	m2.Pages[5] = m2.Pages[0]
	changes <- m2
	if e = readEvent(t, r); e.name != "state" || json.Unmarshal([]byte(e.data), &st) != nil || st.Pages.Nodes[0].Counts["owned"] != 2 {
		t.Fatalf("event after the change: %+v", e)
	}
	stop()
	// A reconnect with Last-Event-ID gets only later audit events.
	r, stop = open("1")
	defer stop()
	if e = readEvent(t, r); e.name != "state" {
		t.Fatalf("after reconnect: %+v", e)
	}
	if e = readEvent(t, r); e.name != "audit" || e.id != "2" {
		t.Fatalf("after reconnect: %+v", e)
	}
}

func TestNewRefuses(t *testing.T) {
	key := [][32]byte{sha256.Sum256([]byte(adminKey))}
	p := staticPool("node", fixedMap())
	for name, cfg := range map[string]Config{
		"no key":     {Pools: []Pool{p}},
		"no pools":   {KeySHA256: key},
		"unnamed":    {KeySHA256: key, Pools: []Pool{{Map: p.Map}}},
		"no map":     {KeySHA256: key, Pools: []Pool{{Name: "x"}}},
		"same names": {KeySHA256: key, Pools: []Pool{p, p}},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestScrub(t *testing.T) {
	ring := NewRing(8)
	calls, fail := 0, false
	s, err := New(Config{
		Pools:     []Pool{staticPool("node", fixedMap())},
		KeySHA256: [][32]byte{sha256.Sum256([]byte(adminKey))},
		Events:    ring,
		Scrub: func(context.Context) (int, error) {
			calls++
			if fail {
				return 1, errors.New("loop stopped")
			}
			return 3, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	post := func(set func(*http.Request)) (int, string) {
		req, _ := http.NewRequest("POST", ts.URL+"/admin/api/scrub", nil)
		set(req)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post(func(r *http.Request) { r.SetBasicAuth("ops", adminKey) }); code != 403 || !strings.Contains(body, "bearer_required") || calls != 0 {
		t.Errorf("basic: %d %s, %d calls", code, body, calls)
	}
	if code, body := post(bearer(adminKey)); code != 200 || strings.TrimSpace(body) != `{"scrubbed":3}` || calls != 1 {
		t.Errorf("bearer: %d %s", code, body)
	}
	fail = true
	if code, body := post(bearer(adminKey)); code != 500 || !strings.Contains(body, "loop stopped") {
		t.Errorf("failing scrub: %d %s", code, body)
	}
	if resp, _ := get(t, ts, "/admin/api/scrub", bearer(adminKey)); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET scrub: %d", resp.StatusCode)
	}
	evs, _ := ring.Since(0)
	if len(evs) != 2 || evs[0].Level != "WARN" || evs[0].Attrs["pages"] != "3" || evs[1].Level != "ERROR" || evs[1].Attrs["err"] != "loop stopped" {
		t.Errorf("audit events %+v", evs)
	}
}

// BenchmarkState: turning a 65,536-page map, half of it owned by 16
// tenants, into the endpoints' bodies and the state event's JSON (once per
// interval, shared by every open page).
func BenchmarkState(b *testing.B) {
	m := sched.PageMap{PageSize: 16, Pages: make([]kvcache.PageInfo, 1<<16)}
	for i := range len(m.Pages) / 2 {
		m.Pages[i] = kvcache.PageInfo{State: kvcache.PageOwned, Owner: request.Owner{Tenant: request.Tenant(fmt.Sprintf("t%02d", i%16)), ID: request.ID{byte(i)}},
			Seq: uint64(i / 32), Epoch: uint64(i), Filled: 16}
	}
	b.ReportAllocs()
	for b.Loop() {
		st := build(time.Now(), []namedMap{{name: "node", m: m}})
		body, _ := st.encoded()
		b.SetBytes(int64(len(body)))
	}
}

func TestPagesStateFilter(t *testing.T) {
	_, ts := newTestServer(t, []Pool{staticPool("node", fixedMap())}, nil)
	for _, tc := range []struct {
		query string
		want  []uint32
	}{
		{"", []uint32{1, 2, 3, 4, 5}},
		{"?state=quarantined", []uint32{5}},
		{"?state=owned,transfer", []uint32{1, 4}},
		{"?state=cached", []uint32{3}},
	} {
		_, body := get(t, ts, "/admin/api/pages"+tc.query, bearer(adminKey))
		var v PagesView
		if err := json.Unmarshal(body, &v); err != nil {
			t.Fatal(err)
		}
		var ids []uint32
		for _, p := range v.Nodes[0].Pages {
			ids = append(ids, p.ID)
		}
		if !cmp.Equal(ids, tc.want) || v.Nodes[0].Counts["owned"] != 1 {
			t.Errorf("%q: pages %v, counts %v; want %v", tc.query, ids, v.Nodes[0].Counts, tc.want)
		}
	}
	// The filter does not change the shared state other clients see.
	_, body := get(t, ts, "/admin/api/pages", bearer(adminKey))
	if strings.Count(string(body), `"id"`) != 5 {
		t.Errorf("unfiltered after filtered: %s", body)
	}
	for _, bad := range []string{"?state=free", "?state=owned,nope", "?state="} {
		resp, body := get(t, ts, "/admin/api/pages"+bad, bearer(adminKey))
		if bad == "?state=" {
			if resp.StatusCode != 200 {
				t.Errorf("empty state: %d", resp.StatusCode)
			}
			continue
		}
		if resp.StatusCode != 400 || !strings.Contains(string(body), `"param":"state"`) {
			t.Errorf("%s: %d %s", bad, resp.StatusCode, body)
		}
	}
}

// FuzzHandler: whatever the path, query and Authorization header, the
// admin handler answers nothing but an auth error unless the header
// carries the admin key, and never fails with a 5xx.
func FuzzHandler(f *testing.F) {
	for _, seed := range [][3]string{
		{"/admin/", "", "Bearer " + adminKey},
		{"/admin/api/pages", "state=quarantined", "Bearer " + adminKey},
		{"/admin/api/events", "since=3", "Basic " + base64.StdEncoding.EncodeToString([]byte("ops:"+adminKey))},
		{"/admin/api/tenants", "", "Bearer " + tenantKey},
		{"/admin/events", "", "Bearer  " + adminKey},
		{"/admin/../metrics", "", "Basic !!"},
		{"/admin/api/pages", "state=%ff", "bearer " + adminKey},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	s, err := New(Config{
		Pools:       []Pool{staticPool("node", fixedMap())},
		KeySHA256:   [][32]byte{sha256.Sum256([]byte(adminKey))},
		IsTenantKey: func(k string) bool { return k == tenantKey },
	})
	if err != nil {
		f.Fatal(err)
	}
	h := s.Handler()
	f.Fuzz(func(t *testing.T, path, query, auth string) {
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		u := &url.URL{Path: path, RawQuery: query}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond) // ends an event stream
		defer cancel()
		req := httptest.NewRequestWithContext(ctx, "GET", "http://admin.test/", nil)
		req.URL = u
		req.RequestURI = u.RequestURI()
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code >= 500 {
			t.Fatalf("%q %q: %d %s", u, auth, rec.Code, rec.Body)
		}
		if rec.Code != 401 && rec.Code != 403 && !strings.Contains(auth, adminKey) {
			user, pass, _ := req.BasicAuth() // the scheme's case is free
			if !strings.Contains(user+pass, adminKey) {
				t.Fatalf("%q answered %d without the admin key (auth %q)", u, rec.Code, auth)
			}
		}
	})
}

func TestConfigAndReload(t *testing.T) {
	ring := NewRing(8)
	cfg := []tenants.Tenant{{ID: "acme", APIKeySHA256: []string{strings.Repeat("ab", 32), strings.Repeat("cd", 32)}, Limits: tenants.Limits{MaxConcurrent: 2}}}
	var reloadErr error
	s, err := New(Config{
		Pools:     []Pool{staticPool("node", fixedMap())},
		KeySHA256: [][32]byte{sha256.Sum256([]byte(adminKey))},
		Events:    ring,
		Tenants:   func() []tenants.Tenant { return cfg },
		Reload: func(context.Context) ([]string, error) {
			if reloadErr != nil {
				return nil, reloadErr
			}
			return []string{"tenant beta added"}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	resp, body := get(t, ts, "/admin/api/config", bearer(adminKey))
	want := `{"tenants":[{"id":"acme","keys":2,"limits":{"requests_per_minute":0,"tokens_per_minute":0,"max_concurrent":2,"max_kv_pages":0,"priority":0}}]}`
	if resp.StatusCode != 200 || strings.TrimSpace(string(body)) != want {
		t.Errorf("config: %d %s", resp.StatusCode, body)
	}
	if strings.Contains(string(body), "abab") {
		t.Error("config shows a key hash")
	}
	post := func(set func(*http.Request)) (int, string) {
		req, _ := http.NewRequest("POST", ts.URL+"/admin/api/reload", nil)
		set(req)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := post(func(r *http.Request) { r.SetBasicAuth("", adminKey) }); code != 403 {
		t.Errorf("basic reload: %d %s", code, body)
	}
	if code, body := post(bearer(adminKey)); code != 200 || body != `{"changes":["tenant beta added"]}` {
		t.Errorf("reload: %d %s", code, body)
	}
	reloadErr = errors.New("tenants: invalid config: tenant id \"a b\"")
	if code, body := post(bearer(adminKey)); code != 422 || !strings.Contains(body, "old configuration stays") {
		t.Errorf("bad reload: %d %s", code, body)
	}
	evs, _ := ring.Since(0)
	if len(evs) != 2 || evs[0].Attrs["changes"] != "tenant beta added" || evs[1].Level != "ERROR" || evs[1].Attrs["remote"] == "" {
		t.Errorf("audit events %+v", evs)
	}
}
