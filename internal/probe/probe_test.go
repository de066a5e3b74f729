package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fault is a bug the fake server can be built with; each must make one
// check fail.
type fault string

const (
	faultNone        fault = ""
	faultLeak        fault = "leak"         // key 1's answers copy key 0's last prompt
	faultPromptOne   fault = "prompt-one"   // over-window prompts: 200 with prompt_tokens=1
	faultAbort200    fault = "abort-200"    // after a client leaves, the next answer is a 200 "length" after 1 token
	faultNondet      fault = "nondet"       // concurrent requests change each other's text
	faultSharedCache fault = "shared-cache" // the prefix cache is not keyed by tenant
	faultTraces      fault = "traces"       // error bodies carry a stack trace
	faultOverload200 fault = "overload-200" // over the cap: a 200 with no choices instead of a 429
	// llama.cpp's two ways with an over-window prompt: cut it and answer
	// (its default, context shift), or refuse it inside a 200 stream
	// with an "error:" line (--no-context-shift).
	faultTruncate   fault = "truncate"
	faultSelfLeak   fault = "self-leak" // key 0's answers copy key 0's previous prompt (another request)
	faultSlots      fault = "slots"     // /slots shows every tenant's prompt, not only the reader's
	faultKeys       fault = "keys"      // /props shows the server's API keys
	faultStreamDeny fault = "stream-deny"
	// The server counts an abort that still finished (the incident's
	// mutant): no client sees it, /metrics does.
	faultAbortCount fault = "abort-count"
	// Not a bug: the first "Cache probe" request of key 1 is answered
	// 503 after its prompt was cached under key 1 (a server that gave up
	// after prefill), so a retry rightly hits key 1's own cache.
	faultBusyFill fault = "busy-fill"
)

// dialect is which server the fake imitates where servers differ.
type dialect string

const (
	// pagewarden's (and vLLM's) ways: max_model_len in /v1/models,
	// /tokenize {"model", "prompt"} -> {"count", "tokens"}, cached tokens
	// in usage.prompt_tokens_details.
	dialectVLLM dialect = ""
	// llama.cpp's server: no max_model_len, the window in /props, its own
	// /tokenize {"content"} -> {"tokens"} (and {"tokens": []} for vLLM's
	// form), the cache count only as timings.prompt_n.
	dialectLlama dialect = "llama.cpp"
	// A bare OpenAI API: no /tokenize, no /props, no cache count; the
	// window must be given.
	dialectBare dialect = "bare"
)

// fakeServer is a small OpenAI-compatible server: one token per byte (or
// per id), a window of fakeWindow, a prefix cache in pages of 16 tokens,
// a cap of fakeCap requests in flight per key, and a model that copies
// its prompt (greedy) or draws letters from the seed (sampled).
type fakeServer struct {
	fault   fault
	dialect dialect
	keys    map[string]int

	mu              sync.Mutex
	inflight        map[int]int
	total           int
	last            map[int][]byte  // each tenant's last prompt
	cache           map[string]bool // prefix-cache entries
	abandoned       bool            // a client left (faultAbort200)
	completedAborts int             // pagewarden_aborted_but_completed_total (faultAbortCount)
	busyFilled      bool            // faultBusyFill answered its one 503
}

const (
	fakeWindow = 256
	fakeCap    = 6
)

func newFake(f fault) *fakeServer {
	return &fakeServer{fault: f, keys: map[string]int{"key-a": 0, "key-b": 1},
		inflight: map[int]int{}, last: map[int][]byte{}, cache: map[string]bool{}}
}

func (s *fakeServer) fail(w http.ResponseWriter, status int, msg string, hdr ...string) {
	if s.fault == faultTraces {
		msg += "\ngoroutine 7 [running]:\nmain.(*server).complete()\n\t/src/fake/server.go:42 +0x1d"
	}
	w.Header().Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		w.Header().Set(hdr[i], hdr[i+1])
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": nil}})
}

func (s *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tenant, ok := s.keys[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	if !ok {
		s.fail(w, 401, "bad key")
		return
	}
	switch r.URL.Path {
	case "/v1/models":
		w.Header().Set("Content-Type", "application/json")
		switch s.dialect {
		case dialectLlama:
			fmt.Fprintf(w, `{"object":"list","data":[{"id":"fake","object":"model","owned_by":"llamacpp","meta":{"n_ctx_train":%d}}]}`, 4*fakeWindow)
			return
		case dialectBare:
			fmt.Fprint(w, `{"object":"list","data":[{"id":"fake","object":"model"}]}`)
			return
		}
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"fake","object":"model","max_model_len":%d}]}`, fakeWindow)
	case "/props":
		if s.dialect != dialectLlama {
			s.fail(w, 404, "no such path")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		keys := ""
		if s.fault == faultKeys {
			keys = `"api_keys":["key-a","key-b"],`
		}
		fmt.Fprintf(w, `{"default_generation_settings":{"n_ctx":%d},%s"total_slots":4,"build_info":"b4748-c392e509"}`, fakeWindow, keys)
	case "/tokenize":
		if s.dialect == dialectBare {
			s.fail(w, 404, "no such path")
			return
		}
		var req struct {
			Prompt, Content string
			AddSpecial      bool `json:"add_special"`
		}
		if json.NewDecoder(r.Body).Decode(&req) != nil {
			s.fail(w, 400, "bad json")
			return
		}
		text := req.Prompt
		if s.dialect == dialectLlama {
			text = req.Content // and vLLM's "prompt" is not read: {"tokens": []}
		}
		ids := []int{}
		for _, b := range []byte(text) {
			ids = append(ids, int(b))
		}
		w.Header().Set("Content-Type", "application/json")
		if s.dialect == dialectLlama {
			json.NewEncoder(w).Encode(map[string]any{"tokens": ids})
			return
		}
		json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "tokens": ids, "max_model_len": fakeWindow})
	case "/slots":
		if s.dialect != dialectLlama {
			s.fail(w, 404, "no such path")
			return
		}
		// Like llama.cpp's --slots: each slot's prompt; but only the
		// reader's own unless the fake is broken that way.
		s.mu.Lock()
		slots := []map[string]any{}
		for t, pr := range s.last {
			if t == tenant || s.fault == faultSlots {
				slots = append(slots, map[string]any{"id": t, "prompt": string(pr)})
			}
		}
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(slots)
	case "/v1/completions", "/v1/chat/completions":
		s.complete(w, r, tenant, r.URL.Path == "/v1/chat/completions")
	case "/metrics":
		if s.dialect != dialectVLLM {
			s.fail(w, 404, "no such path")
			return
		}
		s.mu.Lock()
		n := s.completedAborts
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# HELP pagewarden_aborted_but_completed_total Requests that reached Finished after being aborted (I4). Must stay 0.\n# TYPE pagewarden_aborted_but_completed_total counter\npagewarden_aborted_but_completed_total %d\npagewarden_isolation_violations_total 0\npagewarden_requests_total{tenant=\"a\",code=\"200\"} 7\n", n)
	default:
		s.fail(w, 404, "no such path")
	}
}

func (s *fakeServer) complete(w http.ResponseWriter, r *http.Request, tenant int, chat bool) {
	var req struct {
		Model       string
		Prompt      json.RawMessage
		Messages    []chatMessage
		MaxTokens   *int `json:"max_tokens"`
		Temperature float64
		Seed        *int64
		Stream      bool
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		s.fail(w, 400, "the body is not valid JSON")
		return
	}
	if req.Model != "fake" {
		s.fail(w, 404, "no such model")
		return
	}
	var prompt []byte
	switch {
	case chat && len(req.Messages) > 0:
		prompt = []byte(req.Messages[0].Content)
	case !chat && len(req.Prompt) > 0 && req.Prompt[0] == '"':
		var t string
		json.Unmarshal(req.Prompt, &t)
		prompt = []byte(t)
	case !chat && len(req.Prompt) > 0 && req.Prompt[0] == '[':
		var ids []int
		json.Unmarshal(req.Prompt, &ids)
		for _, id := range ids {
			prompt = append(prompt, byte(id))
		}
	}
	if len(prompt) == 0 || req.MaxTokens == nil || *req.MaxTokens < 1 {
		s.fail(w, 400, "prompt and a positive max_tokens are required")
		return
	}
	n, maxTok := len(prompt), *req.MaxTokens
	promptTokens := n
	if n >= fakeWindow || maxTok > fakeWindow-n {
		switch {
		case s.fault == faultPromptOne:
			promptTokens, maxTok = 1, 1 // the incident: a placeholder
		case s.fault == faultTruncate && n >= fakeWindow:
			prompt = prompt[n-fakeWindow/2:]
			n, promptTokens = len(prompt), len(prompt)
		case s.fault == faultStreamDeny && req.Stream:
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(200)
			fmt.Fprint(w, "error: {\"code\":400,\"message\":\"the request exceeds the available context size\",\"type\":\"invalid_request_error\"}\n\ndata: [DONE]\n\n")
			return
		default:
			s.fail(w, 400, "context length exceeded")
			return
		}
	}
	s.mu.Lock()
	if s.inflight[tenant] >= fakeCap {
		s.mu.Unlock()
		if s.fault == faultOverload200 {
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"object":"text_completion","choices":[]}`))
			return
		}
		s.fail(w, 429, "too many requests", "Retry-After", "1")
		return
	}
	s.inflight[tenant]++
	s.total++
	busy := s.total > 1
	src := prompt
	if o, ok := s.last[0]; s.fault == faultLeak && tenant == 1 && ok {
		src = o
	}
	if o, ok := s.last[0]; s.fault == faultSelfLeak && tenant == 0 && ok && !bytes.Equal(o, prompt) {
		src = o
	}
	s.last[tenant] = prompt
	key := string(prompt)
	if s.fault != faultSharedCache {
		key = strconv.Itoa(tenant) + "|" + key
	}
	cached := 0
	if s.cache[key] {
		cached = n / 16 * 16
	}
	s.cache[key] = true
	if s.fault == faultBusyFill && tenant == 1 && cached == 0 && !s.busyFilled && bytes.HasPrefix(prompt, []byte("Cache probe")) {
		s.busyFilled = true
		s.mu.Unlock()
		s.fail(w, 503, "gave up after prefill", "Retry-After", "1")
		return
	}
	short := false
	if s.fault == faultAbort200 && s.abandoned {
		s.abandoned, short = false, true
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.inflight[tenant]--
		s.total--
		s.mu.Unlock()
	}()

	// The text: a copy of the record after its first "id: " (where the
	// probe puts its secret), or seeded letters.
	from := 0
	if i := bytes.Index(src, []byte("id: ")); i >= 0 {
		from = i + 4
	}
	out := make([]byte, maxTok)
	h := fnv.New64a()
	h.Write(prompt)
	var rng *rand.Rand
	if req.Temperature > 0 {
		seed := uint64(time.Now().UnixNano())
		if req.Seed != nil {
			seed = uint64(*req.Seed)
		}
		rng = rand.New(rand.NewPCG(seed, h.Sum64()))
	}
	for i := range out {
		switch {
		case rng != nil:
			out[i] = 'a' + byte(rng.IntN(26))
		default:
			out[i] = src[(from+i)%len(src)]
		}
	}
	if s.fault == faultNondet && busy {
		out[0] = '#'
	}
	finish := "length"
	if short {
		out = out[:1] // aborted, answered as a success
	}
	usage := map[string]any{"prompt_tokens": promptTokens, "completion_tokens": len(out), "total_tokens": promptTokens + len(out)}
	var timings map[string]any
	switch s.dialect {
	case dialectVLLM:
		usage["prompt_tokens_details"] = map[string]any{"cached_tokens": cached}
	case dialectLlama:
		// llama.cpp evaluates at least the prompt's last token again.
		timings = map[string]any{"prompt_n": max(promptTokens-cached, 1), "predicted_n": len(out)}
	}
	choice := func(text string, fin any) map[string]any {
		if chat {
			return map[string]any{"index": 0, "delta": map[string]any{"content": text}, "message": map[string]any{"content": text}, "finish_reason": fin}
		}
		return map[string]any{"index": 0, "text": text, "finish_reason": fin}
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"choices": []any{choice(string(out), finish)}, "usage": usage, "timings": timings})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	fl := w.(http.Flusher)
	for i := range out {
		b, _ := json.Marshal(map[string]any{"choices": []any{choice(string(out[i:i+1]), nil)}})
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
		select {
		case <-r.Context().Done():
			s.mu.Lock()
			s.abandoned = true
			if s.fault == faultAbortCount {
				s.completedAborts++
			}
			s.mu.Unlock()
			return
		case <-time.After(time.Millisecond):
		}
	}
	b, _ := json.Marshal(map[string]any{"choices": []any{choice("", finish)}})
	fmt.Fprintf(w, "data: %s\n\n", b)
	b, _ = json.Marshal(map[string]any{"choices": []any{}, "usage": usage, "timings": timings})
	fmt.Fprintf(w, "data: %s\n\ndata: [DONE]\n\n", b)
}

// TestProbeFakeServer: against the correct fake every check passes (none
// is skipped: the fake has a cache, a tokenizer and a cap), and each bug
// makes its check fail with evidence, without a false leak elsewhere. The
// fake speaks pagewarden's dialect, llama.cpp's, or only the OpenAI API;
// the probe must find what each offers (window, tokenizer, cache count)
// and skip, never pass, what it cannot judge.
func TestProbeFakeServer(t *testing.T) {
	for _, tc := range []struct {
		fault     fault
		check     string // the check that must fail; "" none
		dialect   dialect
		oneTenant bool
		keys      []string // default key-a, key-b
		window    int      // --window
		skip      []string // checks that must be skipped (the rest pass)
		windowSrc string   // "" means max_model_len from /v1/models
		tokenize  tokenizer
	}{
		{fault: faultNone, tokenize: tokVLLM},
		{fault: faultNone, dialect: dialectLlama, windowSrc: "/props n_ctx", tokenize: tokLlama, skip: []string{"server-counters"}},
		{fault: faultNone, dialect: dialectBare, window: fakeWindow, windowSrc: "--window", skip: []string{"prefix-cache", "server-counters"}},
		{fault: faultPromptOne, check: "boundary", dialect: dialectLlama},
		{fault: faultPromptOne, check: "boundary", dialect: dialectBare, window: fakeWindow},
		{fault: faultTruncate, check: "boundary", dialect: dialectLlama},
		{fault: faultStreamDeny, check: "boundary", dialect: dialectLlama},
		{fault: faultLeak, check: "canaries"},
		{fault: faultLeak, check: "canaries", dialect: dialectLlama, oneTenant: true},
		{fault: faultSelfLeak, check: "canaries", dialect: dialectLlama, oneTenant: true, keys: []string{"key-a"}},
		{fault: faultSlots, check: "canaries", dialect: dialectLlama},
		{fault: faultKeys, check: "canaries", dialect: dialectLlama},
		// Every prompt is the one tenant's own: /slots showing them all is
		// no leak.
		{fault: faultSlots, dialect: dialectLlama, oneTenant: true, skip: []string{"prefix-cache", "server-counters"}, windowSrc: "/props n_ctx", tokenize: tokLlama},
		{fault: faultPromptOne, check: "boundary"},
		{fault: faultAbort200, check: "abort-storm"},
		{fault: faultNondet, check: "determinism"},
		{fault: faultSharedCache, check: "prefix-cache"},
		{fault: faultSharedCache, check: "prefix-cache", dialect: dialectLlama},
		// One tenant behind both keys: a shared cache is by design, and the
		// check says so instead of passing.
		{fault: faultSharedCache, dialect: dialectLlama, oneTenant: true, skip: []string{"prefix-cache", "server-counters"}, windowSrc: "/props n_ctx", tokenize: tokLlama},
		{fault: faultTraces, check: "errors"},
		{fault: faultOverload200, check: "overload"},
		{fault: faultAbortCount, check: "server-counters"},
		// A clean server that answers key 1's first cache request 503
		// after caching it: the trial is inconclusive, not a leak.
		{fault: faultBusyFill, tokenize: tokVLLM},
	} {
		name := string(cmpOr(tc.fault, "correct")) + "/" + string(cmpOr(fault(tc.dialect), "pagewarden-like"))
		if tc.oneTenant {
			name += fmt.Sprintf("/one-tenant-%d-keys", len(cmpOrKeys(tc.keys)))
		}
		t.Run(name, func(t *testing.T) {
			fake := newFake(tc.fault)
			fake.dialect = tc.dialect
			srv := httptest.NewServer(fake)
			defer srv.Close()
			keys := cmpOrKeys(tc.keys)
			r, err := Run(context.Background(), Config{URL: srv.URL, Keys: keys, Quick: true, Timeout: 10 * time.Second, CounterSettle: time.Millisecond,
				OneTenant: tc.oneTenant, Window: tc.window})
			if err != nil {
				t.Fatal(err)
			}
			var sum bytes.Buffer
			r.WriteSummary(&sum)
			t.Log("\n" + sum.String())
			for _, c := range r.Checks {
				switch {
				case c.Name == tc.check:
					if c.Verdict != Fail || len(c.Evidence) == 0 {
						t.Errorf("%s: %s (%s) with %d evidence, want fail with evidence\n%s", c.Name, c.Verdict, c.Reason, len(c.Evidence), sum.String())
					}
				case slices.Contains(tc.skip, c.Name):
					if c.Verdict != Skip || c.Reason == "" {
						t.Errorf("%s: %s (%s), want skip with a reason\n%s", c.Name, c.Verdict, c.Reason, sum.String())
					}
				case tc.check == "":
					if c.Verdict != Pass {
						t.Errorf("%s: %s (%s), want pass\n%s", c.Name, c.Verdict, c.Reason, sum.String())
					}
				case c.Name == "canaries" && c.Verdict != Pass:
					t.Errorf("a %s server made the canary check say %s: a false leak\n%s", tc.fault, c.Verdict, sum.String())
				}
			}
			if r.Failed() != (tc.check != "") {
				t.Errorf("Failed() = %v\n%s", r.Failed(), sum.String())
			}
			if tc.check == "" {
				src := cmpOr(fault(tc.windowSrc), "/v1/models max_model_len")
				if r.Window != fakeWindow || r.WindowSrc != string(src) || r.Tokenize != (tc.tokenize != tokNone) || r.TokenizeForm != string(tc.tokenize) {
					t.Errorf("window %d from %q, tokenize %v %q; want %d from %q, %q", r.Window, r.WindowSrc, r.Tokenize, r.TokenizeForm, fakeWindow, src, tc.tokenize)
				}
			}
			if tc.dialect == dialectLlama && r.Server != "llama.cpp server b4748-c392e509" {
				t.Errorf("server %q", r.Server)
			}
			if d := r.Check("determinism"); tc.fault == faultNone && (d.Numbers["copy_tasks_replayed"].(int) < 3) {
				t.Errorf("determinism replayed %v copy tasks, want 3 or more\n%s", d.Numbers["copy_tasks_replayed"], sum.String())
			}
			if tc.fault == faultNone && (r.Leak.Trials < 20 || r.Leak.Leaks != 0 || r.Leak.Upper95 >= 0.2) {
				t.Errorf("leak stats %+v", r.Leak)
			}
			if c := r.Check("prefix-cache"); tc.fault == faultSharedCache && !tc.oneTenant && len(c.Evidence) != 2 {
				t.Errorf("prefix-cache: %d evidence, want one per direction\n%s", len(c.Evidence), sum.String())
			}
			if c := r.Check("prefix-cache"); tc.fault == faultBusyFill && c.Numbers["inconclusive_trials"] != 1 {
				t.Errorf("prefix-cache: %v inconclusive trials, want 1 (the fake's 503 after filling)\n%s", c.Numbers["inconclusive_trials"], sum.String())
			}
			if c := r.Check("server-counters"); tc.fault == faultAbortCount && (len(c.Evidence) == 0 || !strings.Contains(c.Evidence[0].What, "pagewarden_aborted_but_completed_total rose by")) {
				t.Errorf("server-counters: no evidence naming the counter\n%s", sum.String())
			}
			if tc.fault == faultKeys && !strings.Contains(sum.String(), "holds key 1's API key") {
				t.Errorf("no evidence of the exposed key\n%s", sum.String())
			}
			if tc.fault == faultSlots && !tc.oneTenant && !strings.Contains(sum.String(), "request: key 0, GET /slots") && !strings.Contains(sum.String(), "request: key 1, GET /slots") {
				t.Errorf("no /slots evidence\n%s", sum.String())
			}
			if (tc.fault == faultLeak || tc.fault == faultSelfLeak) && r.Leak.Leaks == 0 {
				t.Errorf("leak stats %+v", r.Leak)
			}
			// The report never holds a key.
			if js := r.JSON(); bytes.Contains(js, []byte("key-a")) || bytes.Contains(js, []byte("key-b")) || strings.Contains(sum.String(), "key-a") {
				t.Errorf("the report holds a key")
			}
		})
	}
}

// cmpOrKeys is keys, or the fake's two keys when nil.
func cmpOrKeys(keys []string) []string {
	if keys == nil {
		return []string{"key-a", "key-b"}
	}
	return keys
}

func cmpOr(f fault, d string) fault {
	if f == "" {
		return fault(d)
	}
	return f
}

func TestUpper95(t *testing.T) {
	for _, tc := range []struct {
		n, x int
		want float64
	}{
		{0, 0, 1},
		{1, 0, 0.95},
		{100, 0, 0.0295130},   // 1 - 0.05^(1/100)
		{1000, 0, 0.00299124}, // about 3/n
		{10, 10, 1},
		// Clopper-Pearson, one-sided 95%: computed apart by bisection on
		// exact binomial sums (Python's math.comb).
		{10, 1, 0.3941633},
		{100, 5, 0.1022534},
	} {
		if got := upper95(tc.n, tc.x); math.Abs(got-tc.want) > 1e-5 {
			t.Errorf("upper95(%d, %d) = %.7f, want %.7f", tc.n, tc.x, got, tc.want)
		}
	}
}

func TestCanarySet(t *testing.T) {
	s := newCanarySet()
	a, b, a2 := s.mint(0), s.mint(1), s.mint(0)
	reqA := []byte(`{"prompt": "Copy: ` + a + `"}`)
	reqB := []byte(`{"prompt": "Copy: ` + b + `"}`)
	for _, tc := range []struct {
		name  string
		req   []byte
		text  string
		owner int // -1: no hit
		exact bool
	}{
		{"own secret", reqA, "the answer is " + a, -1, false},
		{"foreign secret", reqA, "x" + b + "y", 1, true},
		{"foreign piece", reqB, "…" + a[3:3+ngram] + "…", 0, false},
		{"foreign piece split by spaces", reqB, strings.Join(strings.Split(strings.ToUpper(a[:12]), ""), " "), 0, false},
		{"short piece", reqB, a[:ngram-1], -1, false},
		{"another request's secret of the same key", reqA, "…" + a2 + "…", 0, true},
		{"a piece of another request's secret of the same key", reqA, a2[5 : 5+ngram], 0, false},
		{"nothing", reqA, "hello world", -1, false},
	} {
		h, ok := s.foreign(tc.req, []byte(tc.text), noKey)
		if ok != (tc.owner >= 0) || ok && (h.owner != tc.owner || h.exact != tc.exact) {
			t.Errorf("%s: %+v %v, want owner %d exact %v", tc.name, h, ok, tc.owner, tc.exact)
		}
	}
	for _, tc := range []struct {
		name string
		req  []byte
		want int
	}{
		{"no secret", []byte(`{"prompt": "hi"}`), 3},
		{"one of three", reqA, 2},
		{"two, one of them twice", []byte(a + " " + b + " " + a), 1},
		{"a piece is not the secret", []byte(a[:ngram+2]), 3},
	} {
		if got := s.foreignTo(tc.req); got != tc.want {
			t.Errorf("foreignTo(%s) = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"ok", Config{URL: "http://127.0.0.1:8080/v1/", Keys: []string{"a", "b"}}, true},
		{"one key", Config{URL: "http://h:1", Keys: []string{"a"}}, false},
		{"same key twice", Config{URL: "http://h:1", Keys: []string{"a", "a"}}, false},
		{"empty key", Config{URL: "http://h:1", Keys: []string{"a", ""}}, false},
		{"no scheme", Config{URL: "h:1", Keys: []string{"a", "b"}}, false},
		{"negative window", Config{URL: "http://h:1", Keys: []string{"a", "b"}, Window: -1}, false},
		{"too many trials", Config{URL: "http://h:1", Keys: []string{"a", "b"}, Trials: 10001}, false},
	} {
		err := tc.cfg.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
		if tc.ok && tc.cfg.URL != "http://127.0.0.1:8080" {
			t.Errorf("%s: URL %q", tc.name, tc.cfg.URL)
		}
	}
}

// TestSummaryShowsEvidence: a failing run's summary names the failing
// check, the request (by key index) and the offending bytes.
func TestSummaryShowsEvidence(t *testing.T) {
	srv := httptest.NewServer(newFake(faultLeak))
	defer srv.Close()
	var progress bytes.Buffer
	r, err := Run(context.Background(), Config{URL: srv.URL, Keys: []string{"key-a", "key-b"}, Quick: true, Progress: &progress})
	if err != nil {
		t.Fatal(err)
	}
	var sum bytes.Buffer
	r.WriteSummary(&sum)
	for _, want := range []string{"FAIL  canaries", "request: key 1, POST /v1/", "secret", "bytes: ", "verdict: FAIL"} {
		if !strings.Contains(sum.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, sum.String())
		}
	}
	for _, want := range []string{"canaries:", "overload:", "done"} {
		if !strings.Contains(progress.String(), want) {
			t.Errorf("progress lacks %q:\n%s", want, progress.String())
		}
	}
	var back Report
	if err := json.Unmarshal(r.JSON(), &back); err != nil || back.Check("canaries").Verdict != Fail {
		t.Errorf("JSON report does not round-trip: %v", err)
	}
}

// FuzzReadStream: any bytes a server streams are read within bounds and
// without a panic; [DONE] ends the stream and text is what the events
// carried.
func FuzzReadStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"text\":\"hi\",\"finish_reason\":null}]}\n\ndata: {\"choices\":[{\"text\":\"\",\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"))
	f.Add([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\ndata: {\"error\":{\"message\":\"m\"}}\n"))
	f.Add([]byte("data: not json\n"))
	f.Add([]byte(": comment\nevent: x\ndata:[DONE]\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e := &exchange{abortAfter: 3}
		e.readStream(bytes.NewReader(b), time.Now(), func() {})
		if len(e.raw) > len(b)+bytes.Count(b, []byte("\r"))+1 {
			t.Fatalf("read %d bytes of %d", len(e.raw), len(b))
		}
		if e.events > 3 {
			t.Fatalf("%d events past abortAfter 3", e.events)
		}
		_ = e.incomplete()
		_ = errorShape(b)
	})
}
