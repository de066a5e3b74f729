package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// doWithHeaders is harness.do with extra request headers; a header with
// several values is sent as repeated headers.
func (h *harness) doWithHeaders(t *testing.T, method, path, key, body string, hdr http.Header) response {
	t.Helper()
	req, err := http.NewRequest(method, h.ts.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := h.ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: data}
}

// logLines decodes the harness's JSON log lines.
func logLines(t *testing.T, h *harness) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace([]byte(h.logs.String())), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

var internalIDRe = regexp.MustCompile(`^[0-9a-f]{32}$`)

// bodyID is the internal request id in a response body: the "id" of a
// completion without its "chatcmpl-"/"cmpl-" prefix, or of the first event
// of a stream.
func bodyID(t *testing.T, r response) string {
	t.Helper()
	b := r.body
	if strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream") {
		events := sseEvents(t, b)
		if len(events) == 0 {
			t.Fatalf("empty stream")
		}
		b = []byte(events[0])
	}
	id, _ := decodeBody(t, b)["id"].(string)
	_, id, _ = strings.Cut(id, "-")
	return id
}

// Every response carries X-Request-Id, errors included: the client's
// well-formed one echoed, else our internal id, else one drawn for the
// HTTP request. The internal id is only ever ours (I9): it is in the body
// and in X-Pagewarden-Request-Id, never taken from the client. The request's
// log line carries the same values.
func TestRequestIDOnEveryResponse(t *testing.T) {
	// A frozen clock keeps beta's quota spent; near the real time, since
	// it also sets the write deadlines of streams.
	clock := &fakeClock{t: time.Now()}
	h := newHarness(t, nil, func(c *gateway.Config) {
		c.Tenants = testTenants(tenants.Limits{}, tenants.Limits{RequestsPerMinute: 1})
		c.Now = clock.Now
	})
	// Use up beta's one request a minute, so that the 429 case is one.
	if r := h.doWithHeaders(t, "POST", "/v1/completions", keyBeta, `{"prompt":"x"}`, nil); r.status != 200 {
		t.Fatalf("setup: %d %s", r.status, r.body)
	}
	const (
		chat     = `{"model":"fake-model","messages":[{"role":"user","content":"Hi"}],"max_tokens":3}`
		chatSSE  = `{"model":"fake-model","messages":[{"role":"user","content":"Hi"}],"max_tokens":3,"stream":true}`
		complete = `{"prompt":"ab","max_tokens":3}`
	)
	cases := []struct {
		name, method, path, key, body string
		status                        int
		generated                     bool // the request got an internal id
	}{
		{"chat", "POST", "/v1/chat/completions", keyAlpha, chat, 200, true},
		{"chat stream", "POST", "/v1/chat/completions", keyAlpha, chatSSE, 200, true},
		{"completions", "POST", "/v1/completions", keyAlpha, complete, 200, true},
		{"401", "POST", "/v1/chat/completions", "sk-wrong", chat, 401, false},
		{"400", "POST", "/v1/chat/completions", keyAlpha, `{"messages":`, 400, false},
		{"404 model", "POST", "/v1/chat/completions", keyAlpha, `{"model":"other","messages":[{"role":"user","content":"Hi"}]}`, 404, false},
		{"404 path", "GET", "/v1/nothing", keyAlpha, "", 404, false},
		{"429", "POST", "/v1/completions", keyBeta, complete, 429, false},
	}
	clientIDs := []struct {
		name string
		sent []string
		echo bool
	}{
		{"none", nil, false},
		{"well formed", []string{"client-req 42/abc"}, true},
		// Looks like one of ours: echoed, but never becomes our id.
		{"hex", []string{"0123456789abcdef0123456789abcdef"}, true},
		{"max length", []string{strings.Repeat("a", 128)}, true},
		{"too long", []string{strings.Repeat("a", 129)}, false},
		{"not ascii", []string{"caf\xc3\xa9"}, false},
		{"two", []string{"a", "b"}, false},
	}
	for _, tc := range cases {
		for _, ci := range clientIDs {
			t.Run(tc.name+"/"+ci.name, func(t *testing.T) {
				h.logs.Reset()
				hdr := http.Header{}
				if tc.body != "" {
					hdr.Set("Content-Type", "application/json")
				}
				for _, v := range ci.sent {
					hdr.Add("X-Request-Id", v)
				}
				r := h.doWithHeaders(t, tc.method, tc.path, tc.key, tc.body, hdr)
				if r.status != tc.status {
					t.Fatalf("status %d, want %d: %s", r.status, tc.status, r.body)
				}
				got, ours := r.header.Get("X-Request-Id"), r.header.Get("X-Pagewarden-Request-Id")
				if n := len(r.header.Values("X-Request-Id")); n != 1 {
					t.Errorf("%d X-Request-Id headers", n)
				}
				if tc.generated {
					if !internalIDRe.MatchString(ours) || bodyID(t, r) != ours {
						t.Errorf("X-Pagewarden-Request-Id %q, body id %q", ours, bodyID(t, r))
					}
				} else if ours != "" {
					t.Errorf("X-Pagewarden-Request-Id %q without an internal id", ours)
				}
				for _, v := range ci.sent {
					if ours == v {
						t.Errorf("the client chose our internal id %q", v)
					}
				}
				switch {
				case ci.echo && got != ci.sent[0]:
					t.Errorf("X-Request-Id %q, want the client's %q", got, ci.sent[0])
				case !ci.echo && tc.generated && got != ours:
					t.Errorf("X-Request-Id %q, want the internal id %q", got, ours)
				case !ci.echo && !internalIDRe.MatchString(got):
					t.Errorf("X-Request-Id %q, want a fresh id", got)
				}

				// Probes with 200 log nothing; every other case here logs
				// one line.
				logs := logLines(t, h)
				if tc.method == "GET" && tc.status == 200 {
					return
				}
				if len(logs) != 1 {
					t.Fatalf("%d log lines: %s", len(logs), h.logs)
				}
				line := logs[0]
				if ci.echo {
					if line["client_request_id"] != ci.sent[0] {
						t.Errorf("log client_request_id %v, want %q", line["client_request_id"], ci.sent[0])
					}
				} else if _, ok := line["client_request_id"]; ok {
					t.Errorf("log has client_request_id %v for an ignored header", line["client_request_id"])
				}
				switch {
				case tc.generated && line["id"] != ours:
					t.Errorf("log id %v, want %q", line["id"], ours)
				case !tc.generated && !ci.echo && line["id"] != got:
					t.Errorf("log id %v, want the X-Request-Id %q", line["id"], got)
				}
			})
		}
	}
}

// Ids drawn for HTTP requests differ between requests, and probes carry
// one too.
func TestRequestIDFresh(t *testing.T) {
	h := newHarness(t, nil)
	seen := map[string]bool{}
	for _, path := range []string{"/healthz", "/readyz", "/v1/nothing", "/v1/nothing", "/v1/models"} {
		r := h.doWithHeaders(t, "GET", path, keyAlpha, "", nil)
		id := r.header.Get("X-Request-Id")
		if !internalIDRe.MatchString(id) || seen[id] {
			t.Errorf("GET %s: X-Request-Id %q (seen before: %v)", path, id, seen[id])
		}
		seen[id] = true
		if r := h.doWithHeaders(t, "GET", path, keyAlpha, "", http.Header{"X-Request-Id": {"mine"}}); r.header.Get("X-Request-Id") != "mine" {
			t.Errorf("GET %s: X-Request-Id %q, want the client's", path, r.header.Get("X-Request-Id"))
		}
	}
}

// A backend failure after submission, streamed (an SSE error event after
// the 200) or not (a 500), keeps both ids: the client's echoed, ours
// alongside, and both on the log line.
func TestRequestIDBackendError(t *testing.T) {
	fake := gatewaytest.NewFake()
	fake.Behave = func(request.Params) gatewaytest.Behavior {
		return gatewaytest.Behavior{Reply: "abcdef", Fault: gatewaytest.FaultError, At: 2}
	}
	h := newHarness(t, fake)
	for _, stream := range []bool{true, false} {
		h.logs.Reset()
		body := fmt.Sprintf(`{"prompt":"ab","max_tokens":5,"stream":%v}`, stream)
		r := h.doWithHeaders(t, "POST", "/v1/completions", keyAlpha, body,
			http.Header{"X-Request-Id": {"abc"}, "Content-Type": {"application/json"}})
		ours := r.header.Get("X-Pagewarden-Request-Id")
		if r.header.Get("X-Request-Id") != "abc" || !internalIDRe.MatchString(ours) {
			t.Errorf("stream %v: X-Request-Id %q X-Pagewarden-Request-Id %q", stream, r.header.Get("X-Request-Id"), ours)
		}
		if stream {
			if s := summarize(t, r.body); r.status != 200 || s.errObj == nil || s.done {
				t.Errorf("stream: %d %s", r.status, r.body)
			}
		} else if r.status != 500 {
			t.Errorf("%d %s", r.status, r.body)
		}
		logs := logLines(t, h)
		if len(logs) != 1 || logs[0]["client_request_id"] != "abc" || logs[0]["id"] != ours {
			t.Errorf("stream %v: logs %s", stream, h.logs)
		}
	}
}

// GET /v1/models/{id} returns the entry /v1/models lists for the served
// id, slashes and all, and a 404 model_not_found for any other id.
func TestModelByID(t *testing.T) {
	fake := gatewaytest.NewFake()
	fake.Model = "org/fake-model"
	h := newHarness(t, fake)
	list := h.do(context.Background(), "GET", "/v1/models", keyAlpha, nil)
	if list.status != 200 {
		t.Fatalf("models: %d %s", list.status, list.body)
	}
	entry := decodeBody(t, list.body)["data"].([]any)[0]
	r := h.do(context.Background(), "GET", "/v1/models/org/fake-model", keyAlpha, nil)
	if r.status != 200 {
		t.Fatalf("model: %d %s", r.status, r.body)
	}
	if diff := cmp.Diff(entry, any(decodeBody(t, r.body))); diff != "" {
		t.Errorf("model by id (-list entry +got):\n%s", diff)
	}
	for _, path := range []string{"/v1/models/fake-model", "/v1/models/org/other", "/v1/models/org/fake-model/x", "/v1/models/"} {
		r := h.do(context.Background(), "GET", path, keyAlpha, nil)
		if r.status != 404 || errorCode(t, r.body) != "model_not_found" {
			t.Errorf("GET %s: %d %s", path, r.status, r.body)
		}
	}
	if r := h.do(context.Background(), "GET", "/v1/models/org/fake-model", "", nil); r.status != 401 {
		t.Errorf("unauthenticated: %d %s", r.status, r.body)
	}
	r = h.do(context.Background(), "POST", "/v1/models/org/fake-model", keyAlpha, nil)
	if r.status != 405 || r.header.Get("Allow") != "GET" || errorCode(t, r.body) != "method_not_allowed" {
		t.Errorf("POST: %d Allow=%q %s", r.status, r.header.Get("Allow"), r.body)
	}
}

// "created" in /v1/models is the server's start time, the same on every
// call however the clock moves.
func TestModelsCreatedStable(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1e9, 0)}
	h := newHarness(t, nil, func(c *gateway.Config) { c.Now = clock.Now })
	clock.Advance(time.Hour)
	for _, path := range []string{"/v1/models", "/v1/models", "/v1/models/fake-model"} {
		clock.Advance(90 * time.Second)
		m := decodeBody(t, h.do(context.Background(), "GET", path, keyAlpha, nil).body)
		if d, ok := m["data"].([]any); ok {
			m = d[0].(map[string]any)
		}
		if m["created"] != float64(1e9) {
			t.Errorf("GET %s: created %v, want the start time %v", path, m["created"], int64(1e9))
		}
	}
}
