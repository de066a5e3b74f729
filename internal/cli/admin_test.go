package cli

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/admin"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/syncbuf"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

func adminGet(t *testing.T, url, key string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestServeAdmin: --admin-listen serves the page map of every node of
// serve (a prefill and a decode node, or one with --colocated) to the
// admin key of the config or of --admin-key, and refuses tenant keys.
func TestServeAdmin(t *testing.T) {
	const tenantKey, adminKey, flagKey = "pw-tenant-key", "pw-admin-key", "pw-flag-admin-key"
	config := filepath.Join(t.TempDir(), "tenants.yaml")
	yaml := "admin_key_sha256: [" + tenants.HashKey(adminKey) + "]\ntenants:\n  - id: acme\n    api_key_sha256: [" + tenants.HashKey(tenantKey) + "]\n"
	if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		key   string
		pools []string
	}{
		{"config key, prefill and decode", []string{"--config", config}, adminKey, []string{"prefill-0", "decode-0"}},
		{"flag key, colocated", []string{"--config", config, "--admin-key", flagKey, "--colocated"}, flagKey, []string{"node"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api, stderr := serve(t, append([]string{"--admin-listen", "127.0.0.1:0"}, tc.args...)...)
			m := regexp.MustCompile(`admin on (http://\S+)/admin/`).FindStringSubmatch(stderr)
			if m == nil {
				t.Fatalf("no admin listener announced:\n%s", stderr)
			}
			base := m[1]
			if base == api {
				t.Fatal("admin on the API listener")
			}
			if code, _ := adminGet(t, base+"/admin/api/pages", tenantKey); code != http.StatusForbidden {
				t.Errorf("tenant key: %d, want 403", code)
			}
			if code, _ := adminGet(t, base+"/admin/api/pages", ""); code != http.StatusUnauthorized {
				t.Errorf("no key: %d, want 401", code)
			}
			if code, _ := adminGet(t, api+"/admin/api/pages", tc.key); code == http.StatusOK {
				t.Error("the admin API answers on the API listener")
			}
			code, body := adminGet(t, base+"/admin/api/pages", tc.key)
			var pages admin.PagesView
			if code != http.StatusOK || json.Unmarshal(body, &pages) != nil {
				t.Fatalf("pages: %d %s", code, body)
			}
			var names []string
			for _, n := range pages.Nodes {
				names = append(names, n.Name)
				if n.Error != "" || n.TotalPages == 0 || n.Counts["free"] != n.TotalPages {
					t.Errorf("node %s: %+v", n.Name, n)
				}
			}
			if strings.Join(names, ",") != strings.Join(tc.pools, ",") {
				t.Errorf("pools %v, want %v", names, tc.pools)
			}
			if code, body := adminGet(t, base+"/admin/", tc.key); code != http.StatusOK || !strings.Contains(string(body), "page map") {
				t.Errorf("page: %d", code)
			}
		})
	}
}

// TestServeAdminRefused: an admin listener with no admin key, a tenant's
// key as admin key, or an admin key with no listener, stop the start.
func TestServeAdminRefused(t *testing.T) {
	const tenantKey = "pw-tenant-key"
	config := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(config, []byte("tenants:\n  - id: acme\n    api_key_sha256: ["+tenants.HashKey(tenantKey)+"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no admin key":       {[]string{"--admin-listen", "127.0.0.1:0"}, "needs an admin key"},
		"tenant key":         {[]string{"--admin-listen", "127.0.0.1:0", "--admin-key", tenantKey}, "is a tenant's API key"},
		"key but no address": {[]string{"--admin-key", "pw-x"}, "without --admin-listen"},
	} {
		t.Run(name, func(t *testing.T) {
			var stderr syncbuf.Buffer
			args := append([]string{"serve", "--model", "builtin:tiny", "--colocated", "--listen", "127.0.0.1:0", "--metrics-listen=", "--config", config}, tc.args...)
			if code := Main(context.Background(), args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, want 2 with %q:\n%s", code, tc.want, stderr.String())
			}
		})
	}
}

// TestAdminCommand: `pagewarden admin` prints the admin API's JSON, takes
// its key from PAGEWARDEN_ADMIN_KEY, posts the scrub with a Bearer key, and
// fails with the server's refusal for a wrong key.
func TestAdminCommand(t *testing.T) {
	const key = "pw-admin-cmd"
	scrubbed := 0
	srv, err := admin.New(admin.Config{
		Pools: []admin.Pool{{Name: "node", Map: func(context.Context) (sched.PageMap, error) {
			return sched.PageMap{PageSize: 4, Pages: make([]kvcache.PageInfo, 3), Tenants: []sched.TenantLoad{{Tenant: "acme", Running: 1}}}, nil
		}}},
		KeySHA256: [][32]byte{sha256.Sum256([]byte(key))},
		Scrub:     func(context.Context) (int, error) { scrubbed++; return 2, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	env := func(k string) (string, bool) {
		if k == "PAGEWARDEN_ADMIN_KEY" {
			return key, true
		}
		return "", false
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"admin", "tenants", "--url", ts.URL}, `"tenant": "acme"`},
		{[]string{"admin", "pages", "--url", ts.URL + "/"}, `"total_pages": 3`},
		{[]string{"admin", "pages", "--url", ts.URL, "--state", "quarantined"}, `"pages": []`},
		{[]string{"admin", "events", "--url", ts.URL}, `"events": []`},
		{[]string{"admin", "scrub", "--url", ts.URL}, `"scrubbed": 2`},
	} {
		var stdout, stderr syncbuf.Buffer
		if code := MainEnv(context.Background(), tc.args, &stdout, &stderr, env); code != 0 || !strings.Contains(stdout.String(), tc.want) {
			t.Errorf("%v: exit %d, stdout %s, stderr %s", tc.args, code, stdout.String(), stderr.String())
		}
	}
	if scrubbed != 1 {
		t.Errorf("%d scrubs", scrubbed)
	}
	var stderr syncbuf.Buffer
	if code := Main(context.Background(), []string{"admin", "pages", "--url", ts.URL, "--admin-key", "pw-wrong"}, io.Discard, &stderr); code == 0 || !strings.Contains(stderr.String(), "401") {
		t.Errorf("wrong key: exit %d, %s", code, stderr.String())
	}
	stderr = syncbuf.Buffer{}
	if code := Main(context.Background(), []string{"admin", "pages", "--url", ts.URL, "--admin-key", key, "--state", "free"}, io.Discard, &stderr); code == 0 || !strings.Contains(stderr.String(), "400") {
		t.Errorf("bad state: exit %d, %s", code, stderr.String())
	}
	stderr = syncbuf.Buffer{}
	if code := Main(context.Background(), []string{"admin", "pages", "--url", ts.URL}, io.Discard, &stderr); code != 2 {
		t.Errorf("no key: exit %d, %s", code, stderr.String())
	}
}

// TestDecodeRoleAdmin: a decode node's --admin-listen shows its pool under
// its name to --admin-key.
func TestDecodeRoleAdmin(t *testing.T) {
	dir := t.TempDir()
	writeCerts(t, dir, link.Identity{Name: "d0", Role: transfer.RoleDecode})
	const key = "pw-node-admin"
	ctx, cancel := context.WithCancel(context.Background())
	errb := &watchBuffer{wrote: make(chan struct{}, 1)}
	code := make(chan int, 1)
	go func() {
		code <- Main(ctx, []string{"decode", "--model", "builtin:tiny", "--threads", "1", "--kv-memory", "16MiB",
			"--tls-ca", filepath.Join(dir, "ca.pem"), "--name", "d0", "--tls-cert", filepath.Join(dir, "d0.pem"), "--tls-key", filepath.Join(dir, "d0-key.pem"),
			"--link-listen", "127.0.0.1:0", "--metrics-listen=", "--admin-listen", "127.0.0.1:0", "--admin-key", key}, io.Discard, errb)
	}()
	defer func() { cancel(); <-code }()
	re := regexp.MustCompile(`admin on (http://\S+)/admin/`)
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	var base string
	for base == "" {
		if m := re.FindStringSubmatch(errb.String()); m != nil {
			base = m[1]
			break
		}
		select {
		case <-errb.wrote:
		case c := <-code:
			code <- c
			t.Fatalf("decode exited %d:\n%s", c, errb.String())
		case <-timeout.C:
			t.Fatalf("no admin listener after 30s:\n%s", errb.String())
		}
	}
	status, body := adminGet(t, base+"/admin/api/pages", key)
	var pages admin.PagesView
	if status != http.StatusOK || json.Unmarshal(body, &pages) != nil || len(pages.Nodes) != 1 || pages.Nodes[0].Name != "d0" || pages.Nodes[0].TotalPages == 0 {
		t.Fatalf("pages: %d %s", status, body)
	}
}

// TestServeAdminAuditsReloadAndScrub: a SIGHUP reload (with what changed)
// and a SIGUSR1 scrub are audit events on the admin listener, though they
// are INFO lines.
func TestServeAdminAuditsReloadAndScrub(t *testing.T) {
	const tenantKey, adminKey = "pw-tenant-key", "pw-admin-key"
	config := filepath.Join(t.TempDir(), "tenants.yaml")
	write := func(extra string) {
		yaml := "admin_key_sha256: [" + tenants.HashKey(adminKey) + "]\ntenants:\n  - id: acme\n    api_key_sha256: [" + tenants.HashKey(tenantKey) + "]\n" + extra
		if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	_, stderr := serve(t, "--config", config, "--admin-listen", "127.0.0.1:0", "--colocated")
	base := regexp.MustCompile(`admin on (http://\S+)/admin/`).FindStringSubmatch(stderr)[1]
	write("  - id: beta\n    api_key_sha256: [" + tenants.HashKey("pw-beta") + "]\n    limits: {max_concurrent: 3}\n")
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGUSR1} {
		if err := syscall.Kill(os.Getpid(), sig); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]func(admin.Event) bool{
		"tenant config reloaded": func(e admin.Event) bool {
			return strings.Contains(e.Attrs["changes"], "tenant beta added") && e.Attrs["tenants"] == "2"
		},
		"SIGUSR1: quarantined KV pages scrubbed and freed": func(e admin.Event) bool { return e.Attrs["pages"] == "0" },
	}
	deadline := time.After(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for len(want) > 0 {
		_, body := adminGet(t, base+"/admin/api/events", adminKey)
		var evs admin.EventList
		if err := json.Unmarshal(body, &evs); err != nil {
			t.Fatal(err)
		}
		for _, e := range evs.Events {
			if ok := want[e.Message]; ok != nil && ok(e) {
				if _, marked := e.Attrs[admin.AuditKey]; marked {
					t.Errorf("the audit mark is kept: %+v", e)
				}
				delete(want, e.Message)
			}
		}
		select {
		case <-deadline:
			t.Fatalf("audit events missing: %v; ring: %s", want, body)
		case <-tick.C:
		}
	}
}

// TestServeAdminConfigAndReload: `pagewarden admin config` shows the
// tenants in force without key hashes, and `pagewarden admin reload`
// rereads the file and prints what changed.
func TestServeAdminConfigAndReload(t *testing.T) {
	const tenantKey, adminKey = "pw-tenant-key", "pw-admin-key"
	config := filepath.Join(t.TempDir(), "tenants.yaml")
	write := func(extra string) {
		yaml := "admin_key_sha256: [" + tenants.HashKey(adminKey) + "]\ntenants:\n  - id: acme\n    api_key_sha256: [" + tenants.HashKey(tenantKey) + "]\n" + extra
		if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("")
	_, stderr := serve(t, "--config", config, "--admin-listen", "127.0.0.1:0", "--colocated")
	base := regexp.MustCompile(`admin on (http://\S+)/admin/`).FindStringSubmatch(stderr)[1]
	run := func(args ...string) (int, string, string) {
		var stdout, errb syncbuf.Buffer
		code := Main(context.Background(), append(append([]string{"admin"}, args...), "--url", base, "--admin-key", adminKey), &stdout, &errb)
		return code, stdout.String(), errb.String()
	}
	if code, out, errs := run("config"); code != 0 || !strings.Contains(out, `"id": "acme"`) || strings.Contains(out, tenants.HashKey(tenantKey)) {
		t.Errorf("config: %d %s %s", code, out, errs)
	}
	write("  - id: beta\n    api_key_sha256: [" + tenants.HashKey("pw-beta") + "]\n")
	if code, out, errs := run("reload"); code != 0 || !strings.Contains(out, "tenant beta added") {
		t.Errorf("reload: %d %s %s", code, out, errs)
	}
	if code, out, _ := run("config"); code != 0 || !strings.Contains(out, `"id": "beta"`) {
		t.Errorf("config after reload: %s", out)
	}
	if err := os.WriteFile(config, []byte("tenants: ["), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := run("reload"); code == 0 || !strings.Contains(errs, "422") {
		t.Errorf("broken file: exit %d, %s", code, errs)
	}
	if code, out, _ := run("events"); code != 0 || !strings.Contains(out, "admin: tenant config reloaded") || !strings.Contains(out, "reload failed") {
		t.Errorf("events: %s", out)
	}
}

// TestServeAdminKeysReload: a reload of the tenant config changes the
// admin keys as it changes the tenants — a key taken out stops opening the
// listener, the new one opens it, and --admin-key's stays (the listener is
// never left without a key: admin.TestSetKeys).
func TestServeAdminKeysReload(t *testing.T) {
	const tenantKey, oldKey, newKey, flagKey = "pw-tenant-key", "pw-admin-old", "pw-admin-new", "pw-admin-flag"
	config := filepath.Join(t.TempDir(), "tenants.yaml")
	write := func(adminKeys string) {
		yaml := adminKeys + "tenants:\n  - id: acme\n    api_key_sha256: [" + tenants.HashKey(tenantKey) + "]\n"
		if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("admin_key_sha256: [" + tenants.HashKey(oldKey) + "]\n")
	_, stderr := serve(t, "--config", config, "--admin-listen", "127.0.0.1:0", "--admin-key", flagKey, "--colocated")
	base := regexp.MustCompile(`admin on (http://\S+)/admin/`).FindStringSubmatch(stderr)[1]
	reload := func(key string) {
		t.Helper()
		var stdout, errb syncbuf.Buffer
		if code := Main(context.Background(), []string{"admin", "reload", "--url", base, "--admin-key", key}, &stdout, &errb); code != 0 {
			t.Fatalf("reload: %d %s", code, errb.String())
		}
	}
	status := func(key string) int {
		code, _ := adminGet(t, base+"/admin/api/tenants", key)
		return code
	}
	if status(oldKey) != 200 || status(newKey) != 401 || status(flagKey) != 200 {
		t.Fatalf("before: old %d new %d flag %d", status(oldKey), status(newKey), status(flagKey))
	}
	write("admin_key_sha256: [" + tenants.HashKey(newKey) + "]\n")
	reload(oldKey)
	if status(oldKey) != 401 || status(newKey) != 200 || status(flagKey) != 200 {
		t.Fatalf("after the reload: old %d new %d flag %d", status(oldKey), status(newKey), status(flagKey))
	}
	write("")
	reload(newKey)
	if status(newKey) != 401 || status(flagKey) != 200 {
		t.Fatalf("after a config with no admin key: new %d flag %d", status(newKey), status(flagKey))
	}
}
