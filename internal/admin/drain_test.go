package admin

import (
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestDrain: POST /admin/api/drain and /admin/api/undrain switch the
// drain (Bearer only, as every change), report what it was, and are audit
// events; GET /admin/api/drain reads it.
func TestDrain(t *testing.T) {
	ring := NewRing(8)
	var on atomic.Bool
	s, err := New(Config{
		Pools:     []Pool{staticPool("node", fixedMap())},
		KeySHA256: [][32]byte{sha256.Sum256([]byte(adminKey))},
		Events:    ring,
		Drain:     func(v bool) bool { return on.Swap(v) },
		Draining:  on.Load,
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	post := func(path string, set func(*http.Request)) (int, string) {
		req, _ := http.NewRequest("POST", ts.URL+path, nil)
		set(req)
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := post("/admin/api/drain", func(r *http.Request) { r.SetBasicAuth("ops", adminKey) }); code != 403 || on.Load() {
		t.Fatalf("basic auth: %d %s, draining %v", code, body, on.Load())
	}
	if code, body := post("/admin/api/drain", bearer("nope")); code != 401 || on.Load() {
		t.Fatalf("wrong key: %d %s", code, body)
	}
	steps := []struct {
		path, want string
		draining   bool
	}{
		{"/admin/api/drain", `{"draining":true,"was":false}`, true},
		{"/admin/api/drain", `{"draining":true,"was":true}`, true},
		{"/admin/api/undrain", `{"draining":false,"was":true}`, false},
	}
	for _, st := range steps {
		if code, body := post(st.path, bearer(adminKey)); code != 200 || body != st.want || on.Load() != st.draining {
			t.Fatalf("%s: %d %s, draining %v; want %s", st.path, code, body, on.Load(), st.want)
		}
		_, b := get(t, ts, "/admin/api/drain", bearer(adminKey))
		if got := strings.TrimSpace(string(b)); got != map[bool]string{true: `{"draining":true,"was":false}`, false: `{"draining":false,"was":false}`}[st.draining] {
			t.Errorf("GET drain after %s: %s", st.path, got)
		}
	}
	evs, _ := ring.Since(0)
	if len(evs) != 3 || !strings.Contains(evs[0].Message, "draining") || !strings.Contains(evs[2].Message, "undrained") || evs[0].Attrs["remote"] == "" {
		t.Errorf("audit events %+v", evs)
	}
}

// TestSetKeys: replacing the admin keys takes effect at once, and an empty
// list is refused with the old keys kept (the listener is never open, and
// never shut to its operator by a config that names no key).
func TestSetKeys(t *testing.T) {
	s, ts := newTestServer(t, []Pool{staticPool("node", fixedMap())}, nil)
	code := func(key string) int {
		resp, _ := get(t, ts, "/admin/api/tenants", bearer(key))
		return resp.StatusCode
	}
	if err := s.SetKeys([][32]byte{sha256.Sum256([]byte("other"))}); err != nil {
		t.Fatal(err)
	}
	if code(adminKey) != 401 || code("other") != 200 {
		t.Fatalf("after SetKeys: old %d, new %d", code(adminKey), code("other"))
	}
	if err := s.SetKeys(nil); err == nil || code("other") != 200 {
		t.Fatalf("SetKeys(nil) = %v, the kept key answers %d", err, code("other"))
	}
}
