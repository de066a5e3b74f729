package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kernels"
)

// TestLogFlags: --log-level filters and --log-format chooses JSON or
// text, through the one helper every serving command uses.
func TestLogFlags(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		want, omit []string
	}{
		{nil, []string{`"level":"INFO","msg":"i"`, `"level":"WARN","msg":"w"`}, []string{`"msg":"d"`}},
		{[]string{"--log-level", "debug"}, []string{`"msg":"d"`, `"msg":"i"`}, nil},
		{[]string{"--log-level", "WARN", "--log-format", "text"}, []string{"level=WARN msg=w", "level=ERROR msg=e"}, []string{"msg=i", "{"}},
		{[]string{"--log-level=error"}, []string{`"msg":"e"`}, []string{`"msg":"w"`}},
	} {
		var lf logFlags
		c := serveCmd() // any command: only the log flags are parsed
		c.ResetFlags()
		lf.register(c)
		if err := c.ParseFlags(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		var buf bytes.Buffer
		l := lf.logger(&buf)
		l.Debug("d")
		l.Info("i")
		l.Warn("w")
		l.Error("e")
		for _, w := range tc.want {
			if !strings.Contains(buf.String(), w) {
				t.Errorf("%v: no %s in\n%s", tc.args, w, buf.String())
			}
		}
		for _, o := range tc.omit {
			if strings.Contains(buf.String(), o) {
				t.Errorf("%v: %s in\n%s", tc.args, o, buf.String())
			}
		}
	}
}

// TestLogFlagsOnEveryServingCommand: each serving command has both flags,
// and a bad value is a usage error (exit 2) before anything starts.
func TestLogFlagsOnEveryServingCommand(t *testing.T) {
	for _, cmd := range []string{"serve", "gateway", "prefill", "decode"} {
		for _, bad := range [][]string{{"--log-level", "loud"}, {"--log-format", "xml"}} {
			var errb bytes.Buffer
			code := Main(context.Background(), append([]string{cmd, "--model", "builtin:tiny"}, bad...), io.Discard, &errb)
			if code != 2 || !strings.Contains(errb.String(), bad[0]) {
				t.Errorf("%s %v: exit %d, stderr %q; want 2 naming the flag", cmd, bad, code, errb.String())
			}
		}
	}
}

// TestServeTextLogs: serve's own lines follow --log-format text, and the
// start-up line names the kernel tier in use.
func TestServeTextLogs(t *testing.T) {
	_, stderr := serve(t, "--log-format", "text")
	if !strings.Contains(stderr, "level=INFO msg=serving") || strings.Contains(stderr, `"msg":`) {
		t.Errorf("serve --log-format text wrote:\n%s", stderr)
	}
	if want := "kernels=" + kernels.Implementation(); !strings.Contains(stderr, want) {
		t.Errorf("serve's start-up line has no %s:\n%s", want, stderr)
	}
}

// TestAPIKey: --api-key serves one tenant with that key instead of a
// generated one, never prints it, and refuses --config or an empty key;
// PAGEWARDEN_API_KEY is the same flag.
func TestAPIKey(t *testing.T) {
	const key = "sk-operator-chosen-1234567890"
	api, stderr := serve(t, "--api-key", key)
	if strings.Contains(stderr, key) || strings.Contains(stderr, "shown once") {
		t.Errorf("serve printed a key:\n%s", stderr)
	}
	for k, want := range map[string]int{key: http.StatusOK, "pw-something-else": http.StatusUnauthorized} {
		req, _ := http.NewRequest("POST", api+"/v1/completions", strings.NewReader(`{"prompt":"hello","max_tokens":2}`))
		req.Header.Set("Authorization", "Bearer "+k)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("key %q: %d, want %d", k, resp.StatusCode, want)
		}
	}
	config := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(config, []byte("tenants: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"serve", "gateway"} {
		for _, tc := range []struct {
			env  env
			args []string
			want string
		}{
			{nil, []string{"--api-key", key, "--config", config}, "--api-key and --config"},
			{nil, []string{"--api-key="}, "--api-key is empty"},
			{env{"PAGEWARDEN_API_KEY": key}, []string{"--config", config}, "set by PAGEWARDEN_API_KEY"},
		} {
			r := pwEnv(t, tc.env, append([]string{cmd, "--model", "builtin:tiny", "--metrics-listen=", "--prefill", "p=127.0.0.1:1", "--decode", "d=127.0.0.1:2"}, tc.args...)...)
			if cmd == "serve" {
				r = pwEnv(t, tc.env, append([]string{cmd, "--model", "builtin:tiny", "--metrics-listen="}, tc.args...)...)
			}
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, key) {
				t.Errorf("%s %v: exit %d, stderr %q; want 2 with %q and no key", cmd, tc.args, r.code, r.stderr, tc.want)
			}
		}
	}
}

// TestServedModelNameAndChatTemplate: --served-model-name is the id the
// API shows and --chat-template the template it applies; a template that
// does not parse, a missing file or an empty name stop the start.
func TestServedModelNameAndChatTemplate(t *testing.T) {
	const key = "sk-served-name-test"
	dir := t.TempDir()
	tmpl := filepath.Join(dir, "chat.jinja")
	if err := os.WriteFile(tmpl, []byte("[[{{ messages[0]['content'] }}]]"), 0o600); err != nil {
		t.Fatal(err)
	}
	api, _ := serve(t, "--api-key", key, "--served-model-name", "acme/chat-1", "--chat-template", tmpl)
	call := func(method, path, body string) string {
		t.Helper()
		req, _ := http.NewRequest(method, api+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, b)
		}
		return string(b)
	}
	if b := call("GET", "/v1/models", ""); !strings.Contains(b, `"id":"acme/chat-1"`) {
		t.Errorf("/v1/models: %s", b)
	}
	if b := call("POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1}`); !strings.Contains(b, `"model":"acme/chat-1"`) {
		t.Errorf("chat completion: %s", b)
	}
	var tok struct{ Tokens []int }
	if err := json.Unmarshal([]byte(call("POST", "/tokenize", `{"messages":[{"role":"user","content":"hi"}]}`)), &tok); err != nil {
		t.Fatal(err)
	}
	ids, _ := json.Marshal(map[string]any{"tokens": tok.Tokens})
	if b := call("POST", "/detokenize", string(ids)); !strings.Contains(b, `"[[hi]]"`) {
		t.Errorf("the chat was not formatted by --chat-template: %s", b)
	}

	bad := filepath.Join(dir, "bad.jinja")
	if err := os.WriteFile(bad, []byte("{% if %}"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"serve", "gateway"} {
		for _, args := range [][]string{
			{"--chat-template", bad},
			{"--chat-template", filepath.Join(dir, "missing.jinja")},
			{"--served-model-name="},
		} {
			r := pw(t, append([]string{cmd, "--model", "builtin:tiny", "--metrics-listen=", "--prefill", "p=127.0.0.1:1", "--decode", "d=127.0.0.1:2"}, args...)...)
			if cmd == "serve" {
				r = pw(t, append([]string{cmd, "--model", "builtin:tiny", "--metrics-listen="}, args...)...)
			}
			if r.code != 2 || !strings.Contains(r.stderr, strings.TrimSuffix(args[0], "=")) {
				t.Errorf("%s %v: exit %d, stderr %q; want 2 naming the flag", cmd, args, r.code, r.stderr)
			}
		}
	}
}
