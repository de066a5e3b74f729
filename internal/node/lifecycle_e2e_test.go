package node_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/request"
)

// End-to-end checks of the request lifecycle through the real node:
// client disconnects at any point return every page, an aborted request is
// never answered 200, and quota breaches refuse only the tenant that
// breached them.

// e2eSeed is the seed of the randomised tests: PAGEWARDEN_E2E_SEED when
// set (to replay a failure), else fresh and logged.
func e2eSeed(t *testing.T) uint64 {
	t.Helper()
	if v := os.Getenv("PAGEWARDEN_E2E_SEED"); v != "" {
		seed, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("PAGEWARDEN_E2E_SEED=%q: %v", v, err)
		}
		return seed
	}
	seed := rand.Uint64()
	t.Logf("seed %d (replay with PAGEWARDEN_E2E_SEED=%d)", seed, seed)
	return seed
}

// disconnect is where a client gives up on its request.
type disconnect int

const (
	halfBody        disconnect = iota // mid-body: the request never completes
	beforeFirstByte                   // whole request sent, connection closed without reading
	afterHeaders                      // streaming: status line read, no event
	afterTokens                       // streaming: a few events read
	midNonStream                      // non-streaming: gone while it generates
	completes                         // a short request that runs to the end
	nDisconnects
)

func (d disconnect) String() string {
	return [...]string{"half-body", "before-first-byte", "after-headers", "after-tokens", "mid-non-stream", "completes"}[d]
}

// longTokens is max_tokens for the requests that are cut short: far more
// than any of them can generate before its client leaves.
const longTokens = 1500

// rawRequest is an HTTP/1.1 request for a raw TCP connection.
func rawRequest(key, path string, body []byte) []byte {
	return fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: loopback\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, key, len(body), body)
}

// TestE2ERandomDisconnectsFreeAllPages runs many concurrent clients from
// three tenants that each leave at a random point (before the request is
// even complete, before the first response byte, after the headers, after
// a few tokens, in the middle of a non-streamed generation), next to
// clients that finish normally. Afterwards every page is back, nothing
// runs, the must-be-zero counters are zero, exactly the finished requests
// were answered 200, and the node aborted exactly the others it admitted.
func TestE2ERandomDisconnectsFreeAllPages(t *testing.T) {
	s := startE2E(t, e2eConfig{tenants: []string{"a", "b", "c"}})
	rng := rand.New(rand.NewPCG(e2eSeed(t), 0))
	const clients = 30
	addr := s.ts.Listener.Addr().String()

	type plan struct {
		mode   disconnect
		key    string
		stream bool
		chat   bool
		wait   time.Duration // before leaving (raw and non-streaming modes)
		events int           // events read before leaving (afterTokens)
	}
	plans := make([]plan, clients)
	keys := []string{e2eKey("a"), e2eKey("b"), e2eKey("c")}
	wantOK := 0
	for i := range plans {
		p := plan{
			mode: disconnect(i % int(nDisconnects)), key: keys[rng.IntN(len(keys))],
			stream: rng.IntN(2) == 0, chat: rng.IntN(3) == 0,
			wait: time.Duration(rng.IntN(40)) * time.Millisecond, events: 1 + rng.IntN(30),
		}
		switch p.mode {
		case afterHeaders, afterTokens:
			p.stream = true
		case midNonStream:
			p.stream = false
		case completes:
			wantOK++
		}
		plans[i] = p
	}
	body := func(i int, p plan) []byte {
		m := map[string]any{"max_tokens": longTokens, "temperature": 0, "stream": p.stream}
		if p.mode == completes {
			m["max_tokens"] = 4 + rng.IntN(12)
		}
		text := fmt.Sprintf("client %d says %s", i, strings.Repeat("hello ", rng.IntN(40)))
		if p.chat {
			m["messages"] = []map[string]string{{"role": "user", "content": text}}
		} else {
			m["prompt"] = text
		}
		b, _ := json.Marshal(m)
		return b
	}
	path := func(p plan) string {
		if p.chat {
			return "/v1/chat/completions"
		}
		return "/v1/completions"
	}
	bodies := make([][]byte, clients)
	for i, p := range plans {
		bodies[i] = body(i, p)
	}

	var wg sync.WaitGroup
	errs := make(chan error, clients)
	start := make(chan struct{})
	for i, p := range plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if err := runClient(addr, s.url, path(p), p.key, bodies[i], p.mode, p.wait, p.events); err != nil {
				errs <- fmt.Errorf("client %d (%v, stream %v, chat %v): %w", i, p.mode, p.stream, p.chat, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	st := s.waitAllFree()
	s.checkMustBeZero()
	// Every client's request is accounted once; only the finished ones
	// as 200.
	counts := s.waitRequestCount(clients)
	if counts["200"] != wantOK {
		t.Errorf("%d requests answered 200, but only %d ran to the end: %v", counts["200"], wantOK, counts)
	}
	if submitted := s.rec.submits(); st.Core.Aborted != uint64(submitted-wantOK) || st.Core.Finished != uint64(wantOK) {
		t.Errorf("node: %d submitted, %d finished, %d aborted; want %d finished and the other %d aborted",
			submitted, st.Core.Finished, st.Core.Aborted, wantOK, submitted-wantOK)
	}
	t.Logf("statuses %v; node %+v", counts, st.Core)
}

// runClient performs one client of the disconnect test.
func runClient(addr, base, path, key string, body []byte, mode disconnect, wait time.Duration, events int) error {
	switch mode {
	case halfBody, beforeFirstByte:
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		req := rawRequest(key, path, body)
		if mode == halfBody {
			req = req[:len(req)-len(body)/2]
		}
		if _, err := conn.Write(req); err != nil {
			conn.Close()
			return err
		}
		time.Sleep(wait)
		return conn.Close()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "POST", base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if mode == midNonStream {
		// Leave only once the whole request is on the wire: a request
		// cancelled earlier may never reach the server at all.
		trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { time.AfterFunc(wait, cancel) }}
		req = req.WithContext(httptrace.WithClientTrace(ctx, trace))
	}
	resp, err := http.DefaultClient.Do(req)
	if mode == midNonStream {
		if err == nil {
			resp.Body.Close()
			return fmt.Errorf("a %d-token request finished before its client left after %v: status %d", longTokens, wait, resp.StatusCode)
		}
		return nil
	}
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if mode == afterHeaders {
		return nil // cancel and close
	}
	if mode == completes {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") && !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
			return fmt.Errorf("stream did not end with [DONE]: %q", b)
		}
		return nil
	}
	r := bufio.NewReader(resp.Body)
	for n := 0; n < events; {
		line, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("after %d events: %w", n, err)
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			return fmt.Errorf("a %d-token stream ended after %d events", longTokens, n)
		}
		if strings.HasPrefix(line, "data: ") {
			n++
		}
	}
	return nil
}

// waitRequestCount waits until pagewarden_requests_total counts n
// generation requests (a handler is counted when it returns, a moment
// after its request ends) and returns the counts by status.
func (s *e2eServer) waitRequestCount(n int) map[string]int {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		counts := map[string]int{}
		total := 0
		for _, tn := range []string{"-", "a", "b", "c"} {
			for _, ep := range []string{"completions", "chat"} {
				for status, c := range s.requestCounts(tn, ep) {
					counts[status] += c
					total += c
				}
			}
		}
		if total >= n {
			if total > n {
				s.t.Errorf("%d requests counted, %d sent: %v", total, n, counts)
			}
			return counts
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("only %d of %d requests counted after 10s: %v; request log:\n%s", total, n, counts, s.logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestE2EServerAbortIsNeverOK aborts running requests through the node
// (Backend.Abort, as the gateway does on a disconnect and an operator
// would): a stream ends with an error event and no [DONE], a non-streamed
// request gets an error status, never 200. Another tenant cannot abort
// them: the node answers ErrNotFound and the request runs on.
func TestE2EServerAbortIsNeverOK(t *testing.T) {
	s := startE2E(t, e2eConfig{submitted: make(chan request.Owner, 4)})

	t.Run("stream", func(t *testing.T) {
		res := make(chan sseStream, 1)
		go func() {
			res <- s.stream(e2eKeyA, "/v1/completions", map[string]any{"prompt": "abort me", "max_tokens": longTokens, "temperature": 0})
		}()
		owner := <-s.rec.submitted
		s.waitStreamed(owner, 3)
		if err := s.node.Abort("b", owner.ID); !errors.Is(err, request.ErrNotFound) {
			t.Errorf("tenant b aborting a's request: %v, want ErrNotFound", err)
		}
		if err := s.node.Abort(owner.Tenant, owner.ID); err != nil {
			t.Fatalf("abort: %v", err)
		}
		st := <-res
		if st.status != 200 || st.done || st.errEv == nil {
			t.Errorf("aborted stream: status %d, [DONE] %v, error event %+v; want an error event and no [DONE]", st.status, st.done, st.errEv)
		}
	})
	t.Run("non-stream", func(t *testing.T) {
		type reply struct {
			code int
			body []byte
		}
		res := make(chan reply, 1)
		go func() {
			code, _, body := s.post(e2eKeyA, "/v1/chat/completions", map[string]any{
				"messages": []map[string]string{{"role": "user", "content": "abort me"}}, "max_tokens": longTokens})
			res <- reply{code, body}
		}()
		owner := <-s.rec.submitted
		s.waitStreamed(owner, 3)
		if err := s.node.Abort("b", owner.ID); !errors.Is(err, request.ErrNotFound) {
			t.Errorf("tenant b aborting a's request: %v, want ErrNotFound", err)
		}
		if err := s.node.Abort(owner.Tenant, owner.ID); err != nil {
			t.Fatalf("abort: %v", err)
		}
		r := <-res
		var e apiErr
		if r.code == 200 || json.Unmarshal(r.body, &e) != nil || e.Error.Code == nil || *e.Error.Code != "aborted" {
			t.Errorf("aborted request: status %d body %s; want 503 aborted", r.code, r.body)
		}
	})
	st := s.waitAllFree()
	s.checkMustBeZero()
	if st.Core.Aborted != 2 || st.Core.Finished != 0 {
		t.Errorf("node: %d aborted, %d finished; want 2 and 0", st.Core.Aborted, st.Core.Finished)
	}
	counts := s.waitRequestCount(2)
	if counts["200"] != 0 {
		t.Errorf("aborted requests answered 200: %v", counts)
	}
}

// waitStreamed waits until the node delivered n tokens for owner.
func (s *e2eServer) waitStreamed(owner request.Owner, n int) {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, _ := s.rec.streamedTokens(owner.ID.String()); got >= n {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("request %v streamed fewer than %d tokens in 10s", owner, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// offsetClock is real time plus an offset a test can advance, so that a
// quota's Retry-After can be waited out without waiting. Real time keeps
// running underneath, so the gateway's write deadlines stay in the future.
type offsetClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *offsetClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.off)
}

func (c *offsetClock) advance(d time.Duration) {
	c.mu.Lock()
	c.off += d
	c.mu.Unlock()
}

// holder keeps streaming requests open, each with its first event read.
type holder struct {
	cancels []context.CancelFunc
	bodies  []io.Closer
}

func (h *holder) hold(t *testing.T, s *e2eServer, key string, body map[string]any) {
	t.Helper()
	body["stream"] = true
	b, _ := json.Marshal(body)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/completions", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	h.cancels, h.bodies = append(h.cancels, cancel), append(h.bodies, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("held request: status %d", resp.StatusCode)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("held request: first line %q, %v", line, err)
	}
}

func (h *holder) release() {
	for i, cancel := range h.cancels {
		cancel()
		h.bodies[i].Close()
	}
	h.cancels, h.bodies = nil, nil
}

// TestE2EQuotaBreachIsPerTenant breaches each of tenant a's quotas in turn
// and checks the refusal: 429, rate_limit_error with the limit named, a
// Retry-After of at least the time the quota needs, and nothing submitted
// to the node. Tenant b, unlimited, is served in full meanwhile. Once the
// quota has room again (the clock moved on, or the held requests ended),
// a is served again.
func TestE2EQuotaBreachIsPerTenant(t *testing.T) {
	long := strings.Repeat("x", 599) // 600 tokens with BOS
	cases := []struct {
		name   string
		limits tenants.Limits
		// fill uses up the quota; the request after it is refused.
		fill     func(t *testing.T, s *e2eServer, h *holder)
		next     map[string]any
		limit    string
		minRetry int // seconds
		// recover makes room again.
		recover func(s *e2eServer, h *holder, clock *offsetClock, retry time.Duration)
	}{
		{
			name: "requests per minute", limits: tenants.Limits{RequestsPerMinute: 2},
			fill: func(t *testing.T, s *e2eServer, h *holder) {
				for range 2 {
					var c completionBody
					s.postOK(e2eKeyA, "/v1/completions", map[string]any{"prompt": "one of two", "max_tokens": 4}, &c)
				}
			},
			next:  map[string]any{"prompt": "the third", "max_tokens": 4},
			limit: "requests_per_minute", minRetry: 20, // one request refills in 30 s
			recover: func(s *e2eServer, h *holder, clock *offsetClock, retry time.Duration) { clock.advance(retry) },
		},
		{
			name: "tokens per minute", limits: tenants.Limits{TokensPerMinute: 1000},
			fill: func(t *testing.T, s *e2eServer, h *holder) {
				var c completionBody
				s.postOK(e2eKeyA, "/v1/completions", map[string]any{"prompt": long, "max_tokens": 1}, &c)
			},
			next:  map[string]any{"prompt": long, "max_tokens": 1},
			limit: "tokens_per_minute", minRetry: 5, // 200 of 1000 tokens a minute is 12 s
			recover: func(s *e2eServer, h *holder, clock *offsetClock, retry time.Duration) { clock.advance(retry) },
		},
		{
			name: "max concurrent", limits: tenants.Limits{MaxConcurrent: 2},
			fill: func(t *testing.T, s *e2eServer, h *holder) {
				for range 2 {
					h.hold(t, s, e2eKeyA, map[string]any{"prompt": "holding", "max_tokens": longTokens})
				}
			},
			next:  map[string]any{"prompt": "one too many", "max_tokens": 4},
			limit: "max_concurrent", minRetry: 1,
			recover: func(s *e2eServer, h *holder, clock *offsetClock, retry time.Duration) {
				h.release()
				s.waitAllFree()
			},
		},
		{
			name: "max kv pages", limits: tenants.Limits{MaxKVPages: 100},
			fill: func(t *testing.T, s *e2eServer, h *holder) {
				// 2 + 1500 tokens: 94 pages of 16 reserved, and long
				// enough to be decoding still when the next request
				// comes (a 158-token hold could finish first: the test
				// then failed on a 200).
				h.hold(t, s, e2eKeyA, map[string]any{"prompt": "x", "max_tokens": longTokens})
			},
			// 2 + 100 tokens: 7 more pages, 101 in all.
			next:  map[string]any{"prompt": "x", "max_tokens": 100},
			limit: "max_kv_pages", minRetry: 1,
			recover: func(s *e2eServer, h *holder, clock *offsetClock, retry time.Duration) {
				h.release()
				s.waitAllFree()
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock := &offsetClock{}
			s := startE2E(t, e2eConfig{limits: map[string]tenants.Limits{"a": tc.limits}, now: clock.now})
			h := &holder{}
			defer h.release()
			tc.fill(t, s, h)

			before := s.rec.submits()
			code, hdr, body := s.post(e2eKeyA, "/v1/completions", tc.next)
			var e apiErr
			if code != http.StatusTooManyRequests || json.Unmarshal(body, &e) != nil {
				t.Fatalf("over quota: status %d body %s; want 429", code, body)
			}
			if e.Error.Type != "rate_limit_error" || e.Error.Code == nil || *e.Error.Code != "rate_limit_exceeded" || !strings.Contains(e.Error.Message, tc.limit) {
				t.Errorf("429 body %s: want rate_limit_error, rate_limit_exceeded, naming %s", body, tc.limit)
			}
			retry, err := strconv.Atoi(hdr.Get("Retry-After"))
			if err != nil || retry < tc.minRetry {
				t.Errorf("Retry-After %q, want at least %d s", hdr.Get("Retry-After"), tc.minRetry)
			}
			if after := s.rec.submits(); after != before {
				t.Errorf("a refused request reached the node (%d submits, was %d)", after, before)
			}

			// Another tenant is not touched by a's quota.
			var c completionBody
			s.postOK(e2eKeyB, "/v1/completions", map[string]any{"prompt": tc.next["prompt"], "max_tokens": 8, "temperature": 0}, &c)
			if c.Usage.CompletionTokens != 8 {
				t.Errorf("tenant b got %d of 8 tokens", c.Usage.CompletionTokens)
			}

			tc.recover(s, h, clock, time.Duration(retry)*time.Second)
			deadline := time.Now().Add(10 * time.Second)
			for {
				// A held request's quota is returned as its handler
				// ends, a moment after its pages.
				code, _, body = s.post(e2eKeyA, "/v1/completions", tc.next)
				if code == 200 || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if code != 200 {
				t.Errorf("after the quota had room again: status %d: %s", code, body)
			}
			s.waitAllFree()
			s.checkMustBeZero()
		})
	}
}

// TestE2EDisconnectBeforeSubmitIsNotAServerError sends many requests whose
// clients hang up as soon as the request is written. Nobody is left to
// answer, so each should be logged and counted as a client disconnect
// (499), not as an internal server error that pages an operator.
func TestE2EDisconnectBeforeSubmitIsNotAServerError(t *testing.T) {
	s := startE2E(t, e2eConfig{})
	addr := s.ts.Listener.Addr().String()
	b, _ := json.Marshal(map[string]any{"prompt": strings.Repeat("hello ", 300), "max_tokens": 100})
	const n = 100
	for range n {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write(rawRequest(e2eKeyA, "/v1/completions", b)); err != nil {
			t.Fatal(err)
		}
		conn.Close()
	}
	s.waitAllFree()
	if counts := s.waitRequestCount(n); counts["499"] != n {
		t.Errorf("%d clients that hung up: statuses %v, want all 499", n, counts)
	}
}
