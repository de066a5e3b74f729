package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestParseTokenize: both /tokenize dialects are read, and what is neither
// (llama.cpp's answer to vLLM's form, a count that contradicts the ids) is
// an error rather than a count of zero.
func TestParseTokenize(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		ids    []int
		count  int
		maxLen int
		err    string // "" none; errNoTokens by its text
	}{
		{"vLLM", `{"count":3,"max_model_len":4096,"tokens":[1,450,2]}`, []int{1, 450, 2}, 3, 4096, ""},
		{"count only", `{"count":7}`, nil, 7, 0, ""},
		{"llama.cpp", `{"tokens":[1,15043,3186]}`, []int{1, 15043, 3186}, 3, 0, ""},
		{"llama.cpp with_pieces", `{"tokens":[{"id":1,"piece":"<s>"},{"id":22172,"piece":" hello"}]}`, []int{1, 22172}, 2, 0, ""},
		{"llama.cpp answering vLLM's form", `{"tokens":[]}`, nil, 0, 0, errNoTokens.Error()},
		{"an empty object", `{}`, nil, 0, 0, errNoTokens.Error()},
		{"max_model_len alone", `{"max_model_len":2048}`, nil, 0, 2048, errNoTokens.Error()},
		{"count against ids", `{"count":2,"tokens":[5]}`, nil, 0, 0, "count 2 but 1 tokens"},
		{"negative count", `{"count":-1}`, nil, 0, 0, "count -1"},
		{"a token that is text", `{"tokens":["a"]}`, nil, 0, 0, "neither an id"},
		{"a piece without an id", `{"tokens":[{"piece":"a"}]}`, nil, 0, 0, "neither an id"},
		{"not JSON", `<html>`, nil, 0, 0, "not JSON"},
	} {
		ids, count, maxLen, err := parseTokenize([]byte(tc.body))
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: err %v, want %q", tc.name, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.err == "" && (!slices.Equal(ids, tc.ids) || count != tc.count || maxLen != tc.maxLen):
			t.Errorf("%s: %v %d %d, want %v %d %d", tc.name, ids, count, maxLen, tc.ids, tc.count, tc.maxLen)
		}
		if tc.err == errNoTokens.Error() && (!errors.Is(err, errNoTokens) || maxLen != tc.maxLen) {
			t.Errorf("%s: %v (max_model_len %d), want errNoTokens", tc.name, err, maxLen)
		}
	}
}

func TestTokenizeBody(t *testing.T) {
	for _, tc := range []struct {
		form tokenizer
		want string
	}{
		{tokVLLM, `{"add_special_tokens":true,"model":"m","prompt":"hi"}`},
		{tokNone, `{"add_special_tokens":true,"model":"m","prompt":"hi"}`},
		{tokLlama, `{"add_special":true,"content":"hi"}`},
	} {
		if got := string(tokenizeBody(tc.form, "m", "hi", true)); got != tc.want {
			t.Errorf("%q: %s, want %s", tc.form, got, tc.want)
		}
	}
}

// TestCachedTokens: the cache count comes from OpenAI's usage details, or
// from llama.cpp's timings; an answer with neither says nothing (not 0).
func TestCachedTokens(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		n      int
		source string
	}{
		{"OpenAI usage details", `{"choices":[],"usage":{"prompt_tokens":80,"prompt_tokens_details":{"cached_tokens":64}}}`, 64, "usage.prompt_tokens_details.cached_tokens"},
		{"details win over timings", `{"usage":{"prompt_tokens":80,"prompt_tokens_details":{"cached_tokens":0}},"timings":{"prompt_n":1}}`, 0, "usage.prompt_tokens_details.cached_tokens"},
		{"llama.cpp timings", `{"usage":{"prompt_tokens":73,"completion_tokens":1},"timings":{"prompt_n":1,"predicted_n":1}}`, 72, "usage.prompt_tokens − timings.prompt_n"},
		{"llama.cpp, nothing cached", `{"usage":{"prompt_tokens":73},"timings":{"prompt_n":73}}`, 0, "usage.prompt_tokens − timings.prompt_n"},
		{"timings above the prompt", `{"usage":{"prompt_tokens":3},"timings":{"prompt_n":9}}`, 0, "usage.prompt_tokens − timings.prompt_n"},
		{"timings without prompt_n", `{"usage":{"prompt_tokens":73},"timings":{"predicted_n":1}}`, 0, ""},
		{"usage alone", `{"usage":{"prompt_tokens":73}}`, 0, ""},
		{"nothing", `{"choices":[]}`, 0, ""},
	} {
		var c chunk
		if err := json.Unmarshal([]byte(tc.body), &c); err != nil {
			t.Fatal(err)
		}
		e := &exchange{}
		e.add(&c)
		if n, src := e.cachedTokens(); n != tc.n || src != tc.source {
			t.Errorf("%s: %d from %q, want %d from %q", tc.name, n, src, tc.n, tc.source)
		}
	}
}

func TestServerKind(t *testing.T) {
	for _, tc := range []struct {
		name, props, models, want string
	}{
		{"llama.cpp /props", `{"default_generation_settings":{"n_ctx":512},"build_info":"b4748-c392e509"}`, ``, "llama.cpp server b4748-c392e509"},
		{"llama.cpp /props without build", `{"default_generation_settings":{"n_ctx":512}}`, ``, "llama.cpp server"},
		{"llama.cpp /v1/models", `not found`, `{"data":[{"id":"m","owned_by":"llamacpp"}]}`, "llama.cpp server"},
		{"vLLM", ``, `{"data":[{"id":"m","owned_by":"vllm","max_model_len":4096}]}`, "vLLM"},
		{"pagewarden", `{"error":{"message":"no such path"}}`, `{"data":[{"id":"m","owned_by":"pagewarden"}]}`, "pagewarden"},
		{"someone else", ``, `{"data":[{"id":"m","owned_by":"openai"}]}`, ""},
		{"nothing", ``, ``, ""},
	} {
		if got := serverKind([]byte(tc.props), []byte(tc.models)); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestReadStreamErrorLine: llama.cpp's "error: {…}" line inside a 200
// stream is the server owning up to a failure; other lines that are not
// data are ignored as before.
func TestReadStreamErrorLine(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stream    string
		streamErr bool
		done      bool
	}{
		{"llama.cpp refusal", "error: {\"code\":400,\"message\":\"the request exceeds the available context size\",\"type\":\"invalid_request_error\"}\n\ndata: [DONE]\n\n", true, true},
		{"error line that is not JSON", "error: oops\n\ndata: [DONE]\n\n", false, true},
		{"SSE event name", "event: error\ndata: {\"error\":{\"message\":\"m\"}}\n\n", true, false},
		{"plain stream", "data: {\"choices\":[{\"text\":\"a\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n", false, true},
	} {
		e := &exchange{stream: true, status: 200}
		e.readStream(bytes.NewReader([]byte(tc.stream)), time.Now(), func() {})
		if e.streamErr != tc.streamErr || e.done != tc.done {
			t.Errorf("%s: streamErr %v done %v, want %v %v", tc.name, e.streamErr, e.done, tc.streamErr, tc.done)
		}
	}
}

// FuzzParseTokenize: any /tokenize body is read without a panic; a count
// it returns is never negative and agrees with the ids it returns.
func FuzzParseTokenize(f *testing.F) {
	f.Add([]byte(`{"count":3,"max_model_len":4096,"tokens":[1,450,2]}`))
	f.Add([]byte(`{"tokens":[{"id":1,"piece":"<s>"}]}`))
	f.Add([]byte(`{"tokens":[]}`))
	f.Add([]byte(`{"count":-5,"tokens":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, count, _, err := parseTokenize(b)
		if err != nil {
			return
		}
		if count < 0 || ids != nil && count != len(ids) {
			t.Fatalf("count %d with %d ids", count, len(ids))
		}
	})
}

// TestRetryOnFreshConnection: a server that drops every request arriving
// on a reused keep-alive connection (as a stale connection is lost) still
// gets each request answered once: the retry dials a new connection
// instead of taking the next idle one, which the server drops too.
func TestRetryOnFreshConnection(t *testing.T) {
	type connKey struct{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Context().Value(connKey{}).(*atomic.Int32).Add(1) > 1 {
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"choices":[{"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`))
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, new(atomic.Int32))
	}
	srv.Start()
	defer srv.Close()
	c := &client{base: srv.URL, keys: []string{"a", "b"}, timeout: 5 * time.Second,
		http:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}},
		fresh: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}}
	// Two at once leave two idle connections behind.
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.do(context.Background(), newCompletion(0, "m", "hi", 1, false, nil, 0, "warm-up"))
		}()
	}
	wg.Wait()
	for i := range 3 {
		e := newCompletion(0, "m", "hi", 1, false, nil, 0, "after")
		c.do(context.Background(), e)
		if e.status != http.StatusOK || e.text != "ok" {
			t.Fatalf("request %d: status %d err %v", i, e.status, e.err)
		}
	}
}

func TestTextDiff(t *testing.T) {
	for _, tc := range []struct {
		a, b, want string
	}{
		{"abc", "abd", `the same first 2 bytes (…"ab"), then x: "c"; y: "d"`},
		{"", "z", `the same first 0 bytes (…""), then x: ""; y: "z"`},
		{"same", "same!", `the same first 4 bytes (…"same"), then x: ""; y: "!"`},
		{strings.Repeat("q", 50) + "A", strings.Repeat("q", 50) + "B", `the same first 50 bytes (…"` + strings.Repeat("q", 40) + `"), then x: "A"; y: "B"`},
	} {
		if got := string(textDiff("x", tc.a, "y", tc.b)); got != tc.want {
			t.Errorf("textDiff(%q, %q) = %s, want %s", tc.a, tc.b, got, tc.want)
		}
	}
}
