package gateway_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/request"
)

// TestOpenAINodeClient drives the gateway with the official openai npm
// package, a client nobody here wrote. It runs only when
// PAGEWARDEN_NODE_TESTS=1 and `npm install` has been run in
// testdata/openai-client (node_modules is not committed).
func TestOpenAINodeClient(t *testing.T) {
	if os.Getenv("PAGEWARDEN_NODE_TESTS") != "1" {
		t.Skip("set PAGEWARDEN_NODE_TESTS=1 (and npm install in testdata/openai-client) to run")
	}
	dir := filepath.Join("testdata", "openai-client")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai")); err != nil {
		t.Skip("run `npm install` in testdata/openai-client first")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	const failTokens = 33
	fake := gatewaytest.NewFake()
	fake.Behave = func(p request.Params) gatewaytest.Behavior {
		if p.MaxTokens == failTokens {
			return gatewaytest.Behavior{Fault: gatewaytest.FaultError, At: 4}
		}
		return gatewaytest.Behavior{}
	}
	h := newHarness(t, fake)
	cmd := exec.Command(node, "client.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"PW_BASE_URL="+h.ts.URL+"/v1", "PW_API_KEY="+keyAlpha, "PW_MODEL=fake-model",
		"PW_LONG_CHARS=1000", "PW_FAIL_MAX_TOKENS=33")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node client: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	var res struct {
		OK      bool `json:"ok"`
		Results struct {
			Chat, Stream struct {
				Content string         `json:"content"`
				Finish  string         `json:"finish"`
				Usage   map[string]any `json:"usage"`
			}
			TooLong struct {
				Status int    `json:"status"`
				Code   string `json:"code"`
			} `json:"tooLong"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("output %s: %v", out, err)
	}
	r := res.Results
	if !res.OK || r.Chat.Content != gatewaytest.DefaultReply || r.Stream.Content != gatewaytest.DefaultReply ||
		r.Chat.Finish != "stop" || r.Stream.Finish != "stop" || r.Stream.Usage == nil ||
		r.TooLong.Status != 400 || r.TooLong.Code != "context_length_exceeded" {
		t.Errorf("node client results: %s", out)
	}
}
