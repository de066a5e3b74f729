package probe

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"time"
)

// maxBody bounds what is read of one response: a server that streams
// forever cannot make the probe hold it all.
const maxBody = 4 << 20

// exchange is one request and what came back of it.
type exchange struct {
	key    int    // index of the key in Config.Keys; -1 for a made-up key
	method string // GET or POST
	path   string
	desc   string // what was sent, for evidence (never a key)
	body   []byte // request body
	stream bool
	// abortAfter > 0: the client leaves after this many data events;
	// leaveAfter > 0: it leaves after this long, whatever came (a client
	// gone while its prompt is still being read).
	abortAfter int
	leaveAfter time.Duration
	left       atomic.Bool
	// foreign is the number of other keys' secrets that existed when the
	// request was sent: a response can only leak those.
	foreign   int
	maxTokens int
	// optional: a look at an endpoint outside the OpenAI API (/tokenize,
	// /props) that the server may not have; its error answer is held to
	// the no-trace rule but not to OpenAI's error shape.
	optional bool
	// side: a read of a side endpoint (sideEndpoints) during the load,
	// which may show the reader's own key's secrets but no other key's.
	side bool

	status int
	header http.Header
	raw    []byte // the response body as read
	err    error  // transport error (no status, or a broken body)

	// Parsed from a 200: the generated text, the last finish_reason seen,
	// the usage object if any, the number of data events, whether the
	// stream ended with [DONE], and an error object inside a stream.
	text      string
	finish    string
	usage     *usage
	timings   *timings // llama.cpp's, for its cache count
	events    int
	done      bool
	streamErr bool
	aborted   bool // the client left before the end, as asked
	ttft      time.Duration
	elapsed   time.Duration
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *usage) cached() int {
	if u == nil || u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

// chunk is the part of a completion, chat completion, or one of their
// stream events that the probe reads.
type chunk struct {
	Choices []struct {
		Text    *string `json:"text"`
		Message *struct {
			Content *string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Content *string `json:"content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage   *usage          `json:"usage"`
	Timings *timings        `json:"timings"`
	Error   json.RawMessage `json:"error"`
}

// add folds one parsed body or event into e.
func (e *exchange) add(c *chunk) {
	for _, ch := range c.Choices {
		switch {
		case ch.Text != nil:
			e.text += *ch.Text
		case ch.Message != nil && ch.Message.Content != nil:
			e.text += *ch.Message.Content
		case ch.Delta != nil && ch.Delta.Content != nil:
			e.text += *ch.Delta.Content
		}
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			e.finish = *ch.FinishReason
		}
	}
	if c.Usage != nil {
		e.usage = c.Usage
	}
	if c.Timings != nil {
		e.timings = c.Timings
	}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		e.streamErr = true
	}
}

// client sends the probe's requests.
type client struct {
	base string
	keys []string
	http *http.Client
	// fresh dials a new connection for every request: the retry of a
	// request that a stale keep-alive connection lost must not pick
	// another stale one (seen against llama.cpp's server, whose idle
	// connections close after 5 s, under 600 requests in a minute).
	fresh   *http.Client
	timeout time.Duration
}

// do sends e and fills in what came back. It never returns an error: a
// transport failure is e.err, itself evidence. A request that failed on a
// reused keep-alive connection before any response is sent once more on a
// new one: a server may close an idle connection just as the client picks
// it (llama.cpp's does), which says nothing about how it serves, and Go's
// transport retries only idempotent methods itself.
func (c *client) do(ctx context.Context, e *exchange) {
	if reused := c.try(ctx, c.http, e); reused && e.status == 0 && e.err != nil && !e.aborted && ctx.Err() == nil {
		e.err = nil
		hc := c.fresh
		if hc == nil {
			hc = c.http
		}
		c.try(ctx, hc, e)
	}
}

// try is one attempt of do with hc; it reports whether the connection was
// reused.
func (c *client) try(ctx context.Context, hc *http.Client, e *exchange) (reused bool) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	var body io.Reader
	if e.body != nil {
		body = bytes.NewReader(e.body)
	}
	req, err := http.NewRequestWithContext(ctx, e.method, c.base+e.path, body)
	if err != nil {
		e.err = err
		return
	}
	if e.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	switch {
	case e.key >= 0:
		req.Header.Set("Authorization", "Bearer "+c.keys[e.key])
	case e.key == keyInvalid:
		req.Header.Set("Authorization", "Bearer pw-probe-invalid-key-"+randomToken(12))
	}
	if e.leaveAfter > 0 {
		t := time.AfterFunc(e.leaveAfter, func() { e.left.Store(true); cancel() })
		defer t.Stop()
	}
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		e.err = err
		e.aborted = e.left.Load()
		e.elapsed = time.Since(start)
		return
	}
	defer resp.Body.Close()
	e.status, e.header = resp.StatusCode, resp.Header
	ct := resp.Header.Get("Content-Type")
	if resp.StatusCode == http.StatusOK && strings.HasPrefix(ct, "text/event-stream") {
		e.readStream(resp.Body, start, cancel)
	} else {
		e.raw, e.err = io.ReadAll(io.LimitReader(resp.Body, maxBody))
		e.ttft = time.Since(start)
		// Only a completion's answer is a chunk; the other endpoints'
		// bodies are read by whoever asked for them.
		if e.err == nil && resp.StatusCode == http.StatusOK && e.method == http.MethodPost && !e.optional {
			var c chunk
			if err := json.Unmarshal(e.raw, &c); err != nil {
				e.err = fmt.Errorf("200 body is not JSON: %w", err)
			} else {
				e.add(&c)
			}
		}
	}
	if e.left.Load() {
		e.aborted, e.err = true, nil
	}
	e.elapsed = time.Since(start)
	return reused
}

// readStream reads server-sent events until [DONE], the end of the body,
// or abortAfter events (then it leaves by cancelling the request).
func (e *exchange) readStream(r io.Reader, start time.Time, cancel func()) {
	var raw bytes.Buffer
	sc := bufio.NewScanner(io.LimitReader(r, maxBody))
	sc.Buffer(make([]byte, 64<<10), maxBody)
	for sc.Scan() {
		line := sc.Bytes()
		raw.Write(line)
		raw.WriteByte('\n')
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			// llama.cpp's server reports a failure inside a stream as a
			// line "error: {…}" of its own making (not an SSE field, so
			// a browser would drop it): read it as the error event it is
			// meant to be, so the failure counts as owned up to.
			if b, isErr := bytes.CutPrefix(line, []byte("error:")); isErr && json.Valid(bytes.TrimSpace(b)) {
				e.streamErr = true
			}
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			e.done = true
			break
		}
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			e.err = fmt.Errorf("stream event is not JSON: %w", err)
			break
		}
		if e.events == 0 {
			e.ttft = time.Since(start)
		}
		e.events++
		e.add(&c)
		if e.abortAfter > 0 && e.events >= e.abortAfter {
			e.aborted = true
			cancel()
			break
		}
	}
	if err := sc.Err(); err != nil && !e.aborted && e.err == nil {
		e.err = err
	}
	e.raw = raw.Bytes()
}

// keyInvalid in exchange.key sends a made-up key; keyNone sends none.
const (
	keyInvalid = -1
	keyNone    = -2
)

// complete is a /v1/completions request body.
type complete struct {
	Model         string          `json:"model"`
	Prompt        any             `json:"prompt"`
	MaxTokens     int             `json:"max_tokens"`
	Temperature   float64         `json:"temperature"`
	Seed          *int64          `json:"seed,omitempty"`
	Stream        bool            `json:"stream,omitempty"`
	StreamOptions json.RawMessage `json:"stream_options,omitempty"`
	IgnoreEOS     bool            `json:"ignore_eos,omitempty"`
}

type chatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatRequest struct {
	Model         string          `json:"model"`
	Messages      []chatMessage   `json:"messages"`
	MaxTokens     int             `json:"max_tokens"`
	Temperature   float64         `json:"temperature"`
	Seed          *int64          `json:"seed,omitempty"`
	Stream        bool            `json:"stream,omitempty"`
	StreamOptions json.RawMessage `json:"stream_options,omitempty"`
}

var includeUsage = json.RawMessage(`{"include_usage":true}`)

// newCompletion builds an exchange for /v1/completions.
func newCompletion(key int, model string, prompt any, maxTokens int, stream bool, seed *int64, temp float64, desc string) *exchange {
	r := complete{Model: model, Prompt: prompt, MaxTokens: maxTokens, Temperature: temp, Seed: seed, Stream: stream}
	if stream {
		r.StreamOptions = includeUsage
	}
	b, _ := json.Marshal(r)
	return &exchange{key: key, method: http.MethodPost, path: "/v1/completions", body: b, stream: stream, maxTokens: maxTokens,
		desc: fmt.Sprintf("POST /v1/completions %s max_tokens=%d stream=%v", desc, maxTokens, stream)}
}

// newChat builds an exchange for /v1/chat/completions.
func newChat(key int, model, content string, maxTokens int, stream bool, seed *int64, temp float64, desc string) *exchange {
	r := chatRequest{Model: model, Messages: []chatMessage{{Role: "user", Content: content}}, MaxTokens: maxTokens,
		Temperature: temp, Seed: seed, Stream: stream}
	if stream {
		r.StreamOptions = includeUsage
	}
	b, _ := json.Marshal(r)
	return &exchange{key: key, method: http.MethodPost, path: "/v1/chat/completions", body: b, stream: stream, maxTokens: maxTokens,
		desc: fmt.Sprintf("POST /v1/chat/completions %s max_tokens=%d stream=%v", desc, maxTokens, stream)}
}

// errorShape reports why body is not OpenAI's error object
// ({"error": {"message": "...", "type": "...", ...}}), or "" if it is.
func errorShape(body []byte) string {
	var v struct {
		Error *struct {
			Message *string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "the error body is not JSON"
	}
	if v.Error == nil || v.Error.Message == nil {
		return `the error body has no "error" object with a "message"`
	}
	return ""
}

// traceMarkers are pieces of text that only a stack trace or an internal
// error message puts in a body.
var traceMarkers = []string{"goroutine ", "panic:", "Traceback (most recent call last)", ".go:", ".py\", line", "\tat ", "runtime error", "/home/", "/usr/lib/", "/src/"}

// traceIn returns the first trace marker in body, or "".
func traceIn(body []byte) string {
	for _, m := range traceMarkers {
		if bytes.Contains(body, []byte(m)) {
			return m
		}
	}
	return ""
}

// incomplete reports why a 200 answer that the client did not leave is
// not a complete answer, or "" if it is. The #33507 tell: a request the
// server aborted, answered as finish_reason "length" with fewer tokens
// than max_tokens.
func (e *exchange) incomplete() string {
	switch {
	case e.status != http.StatusOK || e.aborted:
		return ""
	case e.err != nil:
		return "broken 200: " + e.err.Error()
	case e.streamErr:
		return "" // an error event is a failure the server owned up to
	case e.stream && !e.done:
		return "stream ended without [DONE]"
	case e.finish == "":
		return "200 without a finish_reason"
	case e.usage == nil:
		return ""
	case e.usage.CompletionTokens < 1:
		return fmt.Sprintf("200 with finish_reason %q and completion_tokens=%d", e.finish, e.usage.CompletionTokens)
	case e.finish == "length" && e.maxTokens > 0 && e.usage.CompletionTokens < e.maxTokens:
		return fmt.Sprintf("finish_reason \"length\" after %d of max_tokens=%d tokens (an abort answered as a success)", e.usage.CompletionTokens, e.maxTokens)
	}
	return ""
}

// evidence is what a report shows of e.
func (e *exchange) evidence(what string, offending []byte) Evidence {
	ev := Evidence{What: what, Request: e.desc, Key: e.key, Status: e.status}
	if e.err != nil {
		ev.Error = e.err.Error()
	}
	if offending == nil {
		offending = e.raw
	}
	ev.Bytes = clip(offending, 400)
	return ev
}

func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
