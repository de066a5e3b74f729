package cli

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
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

// TestServeTextLogs: serve's own lines follow --log-format text.
func TestServeTextLogs(t *testing.T) {
	_, stderr := serve(t, "--log-format", "text")
	if !strings.Contains(stderr, "level=INFO msg=serving") || strings.Contains(stderr, `"msg":`) {
		t.Errorf("serve --log-format text wrote:\n%s", stderr)
	}
}
