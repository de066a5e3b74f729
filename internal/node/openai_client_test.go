package node_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

// TestOpenAINodeClientRealNode runs the official openai npm client (the
// gateway's testdata/openai-client/client.mjs) against the real node: a
// chat request, a streamed chat request with usage, an over-long prompt
// that must surface as a typed BadRequestError, and a stream the server
// aborts after its first bytes, which the client must see as an APIError.
// It runs only when PAGEWARDEN_NODE_TESTS=1 and `npm install` has been run
// in that directory (test.sh at the repository root does both).
func TestOpenAINodeClientRealNode(t *testing.T) {
	if os.Getenv("PAGEWARDEN_NODE_TESTS") != "1" {
		t.Skip("set PAGEWARDEN_NODE_TESTS=1 (and npm install in internal/gateway/testdata/openai-client) to run")
	}
	dir := filepath.Join("..", "gateway", "testdata", "openai-client")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "openai")); err != nil {
		t.Skip("run `npm install` in internal/gateway/testdata/openai-client first")
	}
	nodeBin, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not installed")
	}
	const failTokens = 33
	s := startE2E(t, e2eConfig{abortAfter: func(p request.Params) int {
		if p.MaxTokens == failTokens {
			return 4
		}
		return 0
	}})
	w := s.node.Limits().MaxContext
	cmd := exec.Command(nodeBin, "client.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"PW_BASE_URL="+s.url+"/v1", "PW_API_KEY="+e2eKeyA, "PW_MODEL="+s.node.ModelID(),
		"PW_LONG_CHARS="+strconv.Itoa(w+100), "PW_FAIL_MAX_TOKENS="+strconv.Itoa(failTokens))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node client: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	type answer struct {
		Content string     `json:"content"`
		Finish  string     `json:"finish"`
		Usage   *usageBody `json:"usage"`
	}
	var res struct {
		OK      bool `json:"ok"`
		Results struct {
			Chat, Stream answer
			TooLong      struct {
				Status int    `json:"status"`
				Code   string `json:"code"`
			} `json:"tooLong"`
			FailedStream *struct {
				Message string `json:"message"`
			} `json:"failedStream"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("output %s: %v", out, err)
	}

	// The client's chat requests are greedy (no temperature is sent)
	// with max_tokens 64 over the ChatML-rendered "Hi".
	tok := s.node.Model().Tokenizer
	prompt := tok.Encode("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", true, true)
	ref := greedy(t, "tiny", prompt, 64)
	want := answer{Content: tok.Decode(ref), Finish: "length",
		Usage: &usageBody{PromptTokens: len(prompt), CompletionTokens: len(ref), TotalTokens: len(prompt) + len(ref)}}
	r := res.Results
	for name, got := range map[string]answer{"chat": r.Chat, "stream": r.Stream} {
		if got.Usage != nil {
			got.Usage.PromptTokensDetails = nil
		}
		if got.Content != want.Content || got.Finish != want.Finish || got.Usage == nil || *got.Usage != *want.Usage {
			t.Errorf("%s: got %+v usage %+v; want %+v usage %+v", name, got, got.Usage, want, want.Usage)
		}
	}
	if !res.OK || r.TooLong.Status != 400 || r.TooLong.Code != "context_length_exceeded" || r.FailedStream == nil || r.FailedStream.Message == "" {
		t.Errorf("node client results: %s", out)
	}
	s.waitAllFree()
	s.checkMustBeZero()
	if st := s.stats(); st.Core.Aborted != 1 {
		t.Errorf("node aborted %d requests, want exactly the one failed stream", st.Core.Aborted)
	}
}
