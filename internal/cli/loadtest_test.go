package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/syncbuf"
)

// TestLoadtestAgainstServe runs `pagewarden serve` on builtin:tiny and then
// `pagewarden loadtest` against it, both through Main, and checks the
// report: every request succeeded and was measured.
func TestLoadtestAgainstServe(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var serveOut, serveErr syncbuf.Buffer
	served := make(chan int, 1)
	go func() {
		served <- Main(ctx, []string{"serve", "--model", "builtin:tiny", "--threads", "1", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--kv-memory", "64MiB"}, &serveOut, &serveErr)
	}()
	defer func() {
		cancel()
		if code := <-served; code != 0 {
			t.Errorf("serve exited %d: %s", code, serveErr.String())
		}
	}()
	addrRe := regexp.MustCompile(`listening on (http://\S+)`)
	keyRe := regexp.MustCompile(`API key \(shown once\): (\S+)`)
	var url, key string
	for deadline := time.Now().Add(20 * time.Second); ; {
		log := serveErr.String()
		if m := addrRe.FindStringSubmatch(log); m != nil {
			url = m[1]
			key = keyRe.FindStringSubmatch(log)[1]
			break
		}
		select {
		case code := <-served:
			served <- code
			t.Fatalf("serve exited %d before listening: %s", code, log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve not listening after 20s: %s", log)
		}
		time.Sleep(10 * time.Millisecond)
	}

	var out, errb bytes.Buffer
	code := Main(context.Background(), []string{"loadtest", "--url", url, "--key", key, "--requests", "12",
		"--concurrency", "4", "--max-tokens", "8", "--prompt-tokens", "32", "--json"}, &out, &errb)
	if code != 0 {
		t.Fatalf("loadtest exited %d: %s%s", code, out.String(), errb.String())
	}
	var r struct {
		Requests, Succeeded, OutputTokens, PromptTokens int
		Errors                                          map[string]int
		PromptCalibrated                                bool
		TTFT                                            struct{ N int }
	}
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("report %s: %v", out.String(), err)
	}
	// builtin:tiny almost never ends early; 8 tokens each, or fewer
	// only on an end-of-generation token.
	if r.Requests != 12 || r.Succeeded != 12 || len(r.Errors) != 0 || r.TTFT.N != 12 ||
		r.OutputTokens < 12 || r.OutputTokens > 12*8 || !r.PromptCalibrated ||
		r.PromptTokens < 12*28 || r.PromptTokens > 12*40 {
		t.Errorf("report: %s", out.String())
	}
}

func TestLoadtestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"loadtest"}, // no key
		{"loadtest", "--key", "k", "--url", "ftp://127.0.0.1"},
		{"loadtest", "--key", "k", "--requests", "0"},
		{"loadtest", "--key", "k", "--max-tokens", "-1"},
		{"loadtest", "--key", "k", "--request-timeout", "0s"},
		{"loadtest", "--key", " , "},
		{"loadtest", "--key", "k", "--concurrency", "100000"},
		{"loadtest", "--key", "k", "--endpoint", "embeddings"},
		{"loadtest", "--key", "k", "--max-duration", "0s"},
		{"loadtest", "--key", "k", "stray"},
	} {
		var out, errb bytes.Buffer
		if code := Main(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("%s: exit %d, want 2 (usage); stderr %s", strings.Join(args, " "), code, errb.String())
		}
	}
}
