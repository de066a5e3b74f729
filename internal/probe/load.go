package probe

import (
	"bytes"
	"context"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// canaryLen is the length of a secret: 24 letters of 32, 120 bits.
const canaryLen = 24

// ngram is the length of the pieces of a secret looked for on their own:
// 50 bits, so a chance match in a probe's worth of output is below 1e-9,
// while a third of a secret copied out of place is still found.
const ngram = 10

// canarySet holds every secret sent, by key. A secret is foreign to a
// response when the request it answers did not carry it: another key's
// secret is a leak between tenants, and another request's secret of the
// same key a leak between requests (the only kind a server without
// tenants can show, and the incident's kind all the same: the placeholder
// read pages another sequence had written).
type canarySet struct {
	mu     sync.Mutex
	owner  map[string]int    // secret -> key
	pieces map[string]string // every ngram of every secret -> the secret
}

func newCanarySet() *canarySet {
	return &canarySet{owner: map[string]int{}, pieces: map[string]string{}}
}

// mint makes and records a fresh secret for key.
func (s *canarySet) mint(key int) string {
	c := randomToken(canaryLen)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.owner[c] = key
	for i := 0; i+ngram <= len(c); i++ {
		s.pieces[c[i:i+ngram]] = c
	}
	return c
}

// hit is a foreign secret found in a response.
type hit struct {
	owner int    // the key whose secret it is
	exact bool   // the whole secret, not only an n-gram
	piece string // what matched
}

// normalize lowers letters and drops everything that is not a letter or a
// digit, so that a secret split by spaces or JSON escapes still matches.
func normalize(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for _, c := range bytes.ToLower(b) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			out = append(out, c)
		}
	}
	return out
}

// noKey is foreign's exceptKey when every secret req lacks is foreign.
const noKey = math.MinInt

// foreign returns the first secret found in b that req, the body of the
// request b answers, does not hold, and that is not exceptKey's: a side
// endpoint (/slots, /metrics) may show a key its own requests, but never
// another key's.
func (s *canarySet) foreign(req, b []byte, exceptKey int) (hit, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	theirs := func(c string) bool { return s.owner[c] != exceptKey && !bytes.Contains(req, []byte(c)) }
	for c, o := range s.owner {
		if bytes.Contains(b, []byte(c)) && theirs(c) {
			return hit{owner: o, exact: true, piece: c}, true
		}
	}
	n := normalize(b)
	for i := 0; i+ngram <= len(n); i++ {
		if c, ok := s.pieces[string(n[i:i+ngram])]; ok && theirs(c) {
			return hit{owner: s.owner[c], piece: string(n[i : i+ngram])}, true
		}
	}
	return hit{}, false
}

// foreignTo is the number of secrets minted so far that req does not hold.
func (s *canarySet) foreignTo(req []byte) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	own := map[string]bool{}
	// Secrets are letters and digits, so they stand whole in a JSON body.
	for i := 0; i+canaryLen <= len(req); i++ {
		if c, ok := s.pieces[string(req[i:i+ngram])]; ok && string(req[i:i+canaryLen]) == c {
			own[c] = true
		}
	}
	return len(s.owner) - len(own)
}

func (s *canarySet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.owner)
}

// filler is ordinary prose that pads prompts to a length.
var filler = []string{
	"The ledger lists every page with its owner and epoch.",
	"A quiet river runs past the old mill at the edge of town.",
	"Each morning the baker counts the loaves twice before opening.",
	"Numbers in the table are rounded to the nearest whole unit.",
	"The committee met on Tuesday and adjourned before noon.",
}

// pad returns prose of about n bytes.
func pad(n int) string {
	var b strings.Builder
	for i := 0; b.Len() < n; i++ {
		b.WriteString(filler[i%len(filler)])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// canaryPrompt is a copy task around secret, about size bytes long (at
// least minCanaryPrompt: the secret twice and the instruction).
func canaryPrompt(secret string, size int) string {
	head, tail := "Copy exactly.\nid: "+secret+"\n", "\nid: "+secret+"\nCopy:\nid: "
	if size >= 200 {
		head = "Copy the record below exactly, character for character.\nRECORD id: " + secret + "\n"
		tail = "\nEND RECORD id: " + secret + "\nCopy of the record:\nRECORD id: "
	}
	n := max(size-len(head)-len(tail), 0)
	return head + pad(n) + tail
}

// minCanaryPrompt is the shortest copy task.
const minCanaryPrompt = 18 + canaryLen + 1 + 16 + canaryLen

// promptBytes is how long the probe's long prompts are: half the window
// (no tokenizer makes fewer than one byte a token, bar special tokens),
// between 64 bytes and 8 KiB.
func (p *prober) promptBytes() int {
	if p.window == 0 {
		return 2000
	}
	return min(max(p.window/2, 64), 8000)
}

// baseline is a request whose text must not change with load: greedy or
// seeded, sent first alone.
type baseline struct {
	name string
	mk   func() *exchange
	solo *exchange
}

func (b *baseline) ok() bool { return b.solo.status == http.StatusOK && b.solo.incomplete() == "" }

// baselines sends the determinism requests alone.
func (p *prober) baselines(ctx context.Context) []*baseline {
	p.progress.phase("determinism baselines, alone")
	maxTok := 24
	if p.cfg.Quick {
		maxTok = 12
	}
	size := min(p.promptBytes(), 600)
	var bs []*baseline
	for k := 0; k < min(len(p.cfg.Keys), 2); k++ {
		prompt := fmt.Sprintf("Key %d determinism prompt. %s", k, pad(size))
		seed := int64(4242 + k)
		bs = append(bs,
			&baseline{name: fmt.Sprintf("key %d greedy completion", k), mk: func() *exchange {
				return newCompletion(k, p.model, prompt, maxTok, false, nil, 0, "greedy prompt")
			}},
			&baseline{name: fmt.Sprintf("key %d seeded completion (temperature 1, seed %d), streamed", k, seed), mk: func() *exchange {
				return newCompletion(k, p.model, prompt, maxTok, true, &seed, 1, fmt.Sprintf("seeded prompt seed=%d temperature=1", seed))
			}})
		if k == 0 {
			bs = append(bs, &baseline{name: "key 0 greedy chat", mk: func() *exchange {
				return newChat(0, p.model, prompt, maxTok, false, nil, 0, "greedy chat")
			}})
		}
	}
	for _, b := range bs {
		b.solo = p.sendRetry(ctx, b.mk)
	}
	return bs
}

// replay sends every baseline request again, one after another.
func (p *prober) replay(ctx context.Context, bs []*baseline, label string) []*exchange {
	p.progress.phase("determinism replays " + label)
	out := make([]*exchange, len(bs))
	for i, b := range bs {
		out[i] = p.sendRetry(ctx, b.mk)
	}
	return out
}

// loadResult is what the concurrent phase sent.
type loadResult struct {
	trials  []*exchange   // canary requests, finished and abandoned
	replays [][]*exchange // determinism replays made inside the load
}

// load runs the canary copy tasks of every key at once, with clients that
// leave mid-stream mixed in, and replays the determinism baselines twice
// while it runs.
func (p *prober) load(ctx context.Context, bs []*baseline) *loadResult {
	p.progress.phase(fmt.Sprintf("canaries: %d keys × %d copy tasks at once, with an abort storm", len(p.cfg.Keys), p.cfg.Trials))
	maxTok := 32
	if p.cfg.Quick {
		maxTok = 12
	}
	// The copy tasks must fit the window with the leaving clients'
	// max_tokens (3×) and a margin for special tokens and a chat template.
	size := p.promptBytes()
	if p.window > 0 {
		size = min(size, p.window-3*maxTok-48)
	}
	size = max(size, minCanaryPrompt)
	// The leaving clients need the server still decoding when they go:
	// half of them send a shorter copy task with as many max_tokens as the
	// window leaves (a server that does not make a client's abort
	// terminal then decodes on for nobody, which its counters show).
	short := max(size/2, minCanaryPrompt)
	decodeTok := 256
	if p.window > 0 {
		decodeTok = max(p.window-short-48, 3*maxTok)
	}
	aborts := max(3*p.cfg.Trials, 12)
	res := &loadResult{}
	var mu sync.Mutex
	keep := func(e *exchange) {
		mu.Lock()
		res.trials = append(res.trials, e)
		mu.Unlock()
	}
	replaysDone := make(chan struct{})
	started := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for k := range p.cfg.Keys {
		// Two copy-task clients per key.
		for w := 0; w < 2; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; ; i += 2 {
					if i >= p.cfg.Trials {
						// Keep the load up until the replays are
						// done, within three times the trials.
						select {
						case <-replaysDone:
							return
						default:
						}
						if i >= 3*p.cfg.Trials || ctx.Err() != nil {
							return
						}
					}
					secret := p.canaries.mint(k)
					prompt := canaryPrompt(secret, size)
					stream := i%2 == 1
					e := p.sendRetry(ctx, func() *exchange {
						if i%4 == 3 {
							return newChat(k, p.model, prompt, maxTok, stream, nil, 0, "copy task with a secret")
						}
						return newCompletion(k, p.model, prompt, maxTok, stream, nil, 0, "copy task with a secret")
					})
					keep(e)
					once.Do(func() { close(started) })
				}
			}()
		}
		// One client per key that leaves its requests mid-way.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < aborts && ctx.Err() == nil; i++ {
				secret := p.canaries.mint(k)
				// Three in four leave a long decode: the phase where a
				// server that does not make the abort terminal is seen.
				kind := abortKinds[mrand.IntN(2)]
				if mrand.IntN(4) > 0 {
					kind = abortKinds[2+mrand.IntN(len(abortKinds)-2)]
				}
				pr := canaryPrompt(secret, size)
				if kind.decode {
					pr = canaryPrompt(secret, short)
				}
				e := p.sendRetry(ctx, func() *exchange { return kind.mk(k, p.model, pr, decodeTok, 3*maxTok) })
				keep(e)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(replaysDone)
		select {
		case <-started:
		case <-ctx.Done():
			return
		}
		for round := 0; round < 2; round++ {
			r := make([]*exchange, len(bs))
			for i, b := range bs {
				r[i] = p.sendRetry(ctx, b.mk)
			}
			res.replays = append(res.replays, r)
		}
	}()
	stopSide := make(chan struct{})
	var side sync.WaitGroup
	for k := range p.cfg.Keys {
		side.Add(1)
		go func() {
			defer side.Done()
			p.pollSide(ctx, k, stopSide)
		}()
	}
	wg.Wait()
	close(stopSide)
	side.Wait()
	return res
}

// abortKind is one way a client leaves.
type abortKind struct {
	decode bool // the long-decoding copy task
	mk     func(k int, model, prompt string, decodeTok, tok int) *exchange
}

// abortKinds are the leaving clients, drawn at random for each request so
// that aborts land in every phase: while the prompt is read, right after
// the first token, a few tokens in, and in the middle of a long decode,
// streamed and not (a non-streamed request is left by closing the
// connection: the server sees the abort only through its context).
var abortKinds = []abortKind{
	{false, func(k int, model, prompt string, _, tok int) *exchange {
		ms := 1 + mrand.IntN(5)
		e := newCompletion(k, model, prompt, tok, true, nil, 0, fmt.Sprintf("copy task, client leaves after %d ms (in prefill)", ms))
		e.leaveAfter = time.Duration(ms) * time.Millisecond
		return e
	}},
	{false, func(k int, model, prompt string, _, tok int) *exchange {
		n := 1 + mrand.IntN(3)
		e := newCompletion(k, model, prompt, tok, true, nil, 0, fmt.Sprintf("copy task, client leaves after %d events", n))
		e.abortAfter = n
		return e
	}},
	{true, func(k int, model, prompt string, dt, _ int) *exchange {
		e := newCompletion(k, model, prompt, dt, true, nil, 0, fmt.Sprintf("copy task with max_tokens=%d, client leaves after the first token (in decode)", dt))
		e.abortAfter = 1
		return e
	}},
	{true, func(k int, model, prompt string, dt, _ int) *exchange {
		ms := 5 + mrand.IntN(60)
		e := newCompletion(k, model, prompt, dt, true, nil, 0, fmt.Sprintf("copy task with max_tokens=%d, client leaves after %d ms of streaming", dt, ms))
		e.leaveAfter = time.Duration(ms) * time.Millisecond
		return e
	}},
	{true, func(k int, model, prompt string, dt, _ int) *exchange {
		ms := 5 + mrand.IntN(60)
		e := newCompletion(k, model, prompt, dt, false, nil, 0, fmt.Sprintf("non-streamed copy task with max_tokens=%d, client hangs up after %d ms", dt, ms))
		e.leaveAfter = time.Duration(ms) * time.Millisecond
		return e
	}},
}

// sideEndpoints are the endpoints besides the API that servers answer
// with state of their own: llama.cpp's /slots (every slot's prompt, with
// --slots), /metrics (llama.cpp's --metrics; vLLM's), /props, /health,
// SGLang's /get_server_info. During the load each key reads them; any other
// key's secret in an answer is a leak like one in a completion.
var sideEndpoints = []string{"/slots", "/metrics", "/props", "/health", "/get_server_info"}

// pollSide reads sideEndpoints as key every 200 ms until stop (at most 30
// rounds, 5 with Quick), and once more after it: a server keeps state of
// finished requests (llama.cpp's /slots shows each slot's last prompt).
func (p *prober) pollSide(ctx context.Context, key int, stop <-chan struct{}) {
	rounds := 30
	if p.cfg.Quick {
		rounds = 5
	}
	round := func() {
		for _, path := range sideEndpoints {
			p.send(ctx, &exchange{key: key, method: http.MethodGet, path: path, desc: "GET " + path + " during the load", optional: true, side: true})
		}
	}
	for range rounds {
		round()
		select {
		case <-stop:
			round()
			return
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
	select {
	case <-stop:
		round()
	case <-ctx.Done():
	}
}

// canaryCheck looks for foreign secrets in everything the run received:
// bodies, stream events and headers, of every phase.
func (p *prober) canaryCheck(load *loadResult) (Check, Leak) {
	c := Check{Name: "canaries", Verdict: Pass}
	p.mu.Lock()
	all := append([]*exchange(nil), p.all...)
	p.mu.Unlock()
	trials, leaks := 0, 0
	sideOK, sideLeaks := map[string]int{}, map[string]int{}
	for _, e := range all {
		if e.status == 0 && len(e.raw) == 0 {
			continue // nothing came back to look at
		}
		except := noKey
		if e.side {
			if e.status != http.StatusOK {
				continue // the server has no such endpoint
			}
			sideOK[e.path]++
			if p.cfg.OneTenant {
				continue // every secret is the reader's own tenant's
			}
			except = e.key
		}
		if e.foreign > 0 && !e.side {
			// A trial: a response that could have held another
			// key's secret. Earlier ones are scanned all the same.
			// Side reads are not trials: most (/health) cannot hold
			// a secret at all, and would only lower the bound.
			trials++
		}
		found := false
		if h, ok := p.canaries.foreign(e.body, e.raw, except); ok {
			found = true
			c.fail(e.evidence(describeHit(e, h, "body"), excerpt(e.raw, h.piece)))
		}
		for _, name := range sortedKeys(e.header) {
			line := []byte(name + ": " + strings.Join(e.header[name], ", "))
			if h, ok := p.canaries.foreign(e.body, line, except); ok {
				found = true
				c.fail(e.evidence(describeHit(e, h, "header "+name), line))
			}
		}
		if !p.cfg.OneTenant && p.keyIn(&c, e) {
			found = true
		}
		if found {
			p.progress.leaks.Add(1)
			if e.side {
				sideLeaks[e.path]++
			} else {
				leaks++
			}
		}
	}
	c.Requests = trials
	leak := Leak{Trials: trials, Leaks: leaks, Upper95: upper95(trials, leaks)}
	answered := 0
	for _, e := range load.trials {
		if e.status == http.StatusOK {
			answered++
		}
	}
	c.Numbers = map[string]any{"secrets": p.canaries.len(), "responses_scanned": trials, "leaks": leaks,
		"copy_tasks": len(load.trials), "copy_tasks_answered": answered, "leak_rate_upper95": leak.Upper95}
	sideLeaked := 0
	for path, n := range sideOK {
		c.Numbers["side_200"+strings.ReplaceAll(path, "/", "_")] = n
		c.Numbers["side_leaks"+strings.ReplaceAll(path, "/", "_")] = sideLeaks[path]
		sideLeaked += sideLeaks[path]
	}
	switch {
	case c.Verdict == Pass && 2*answered < len(load.trials):
		// Refusals hold no other tenant's data to leak: too few answers
		// under concurrent load say nothing about isolation.
		c.Verdict = Skip
		c.Reason = fmt.Sprintf("only %d of %d copy tasks were answered with a 200; no foreign secret in %d responses", answered, len(load.trials), trials)
	case c.Verdict == Pass:
		c.Reason = fmt.Sprintf("no foreign secret (another key's or another request's) in %d responses (bodies, stream events, headers) holding %d secrets; leak rate ≤ %s (95%% upper bound)",
			trials, p.canaries.len(), percent(leak.Upper95))
		var read []string
		for _, path := range sideEndpoints {
			if n := sideOK[path]; n > 0 {
				read = append(read, fmt.Sprintf("%d× %s", n, path))
			}
		}
		if len(read) > 0 && !p.cfg.OneTenant {
			c.Reason += "; no other key's secret or API key in the side endpoints read during the load (" + strings.Join(read, ", ") + ")"
		}
	default:
		c.Reason = fmt.Sprintf("%d of %d responses hold a secret (or an API key) that their request did not carry", leaks, trials)
		if leaks == 0 {
			c.Reason = fmt.Sprintf("no foreign secret in %d completion and error answers", trials)
		}
		if sideLeaked > 0 {
			var where []string
			for _, path := range sideEndpoints {
				if n := sideLeaks[path]; n > 0 {
					where = append(where, fmt.Sprintf("%d of %d reads of GET %s", n, sideOK[path], path))
				}
			}
			c.Reason += ", but another key's secret or API key in " + strings.Join(where, ", ") + " (read with one key while the others ran)"
		}
	}
	if p.cfg.OneTenant {
		c.Reason += " [the keys are one tenant to the server: this is isolation between requests, not between tenants]"
	}
	return c, leak
}

// keyIn fails c when e's body or headers hold another key's API key (a
// server that shows its configuration, or echoes credentials), with the
// key itself replaced in the evidence: the report never holds a key.
func (p *prober) keyIn(c *Check, e *exchange) bool {
	found := false
	for j, k := range p.cfg.Keys {
		if e.key >= 0 && k == p.cfg.Keys[e.key] {
			continue // its own (one key given twice is one key)
		}
		where := ""
		var at []byte
		if bytes.Contains(e.raw, []byte(k)) {
			where, at = "body", excerpt(e.raw, k)
		}
		for _, name := range sortedKeys(e.header) {
			if line := []byte(name + ": " + strings.Join(e.header[name], ", ")); where == "" && bytes.Contains(line, []byte(k)) {
				where, at = "header "+name, line
			}
		}
		if where == "" {
			continue
		}
		found = true
		redacted := bytes.ReplaceAll(at, []byte(k), []byte(fmt.Sprintf("<key %d>", j)))
		for i, other := range p.cfg.Keys {
			redacted = bytes.ReplaceAll(redacted, []byte(other), []byte(fmt.Sprintf("<key %d>", i)))
		}
		ev := e.evidence(fmt.Sprintf("%s of key %d's answer holds key %d's API key", where, e.key, j), redacted)
		c.fail(ev)
	}
	return found
}

func describeHit(e *exchange, h hit, where string) string {
	kind := "a 10-character piece of"
	if h.exact {
		kind = "the whole"
	}
	whose := fmt.Sprintf("of key %d", h.owner)
	if h.owner == e.key {
		whose = "of another request of the same key"
	}
	return fmt.Sprintf("%s of key %d's answer holds %s secret %q %s", where, e.key, kind, h.piece, whose)
}

// excerpt is the part of b around piece (or b's start).
func excerpt(b []byte, piece string) []byte {
	i := bytes.Index(b, []byte(piece))
	if i < 0 {
		return b
	}
	lo, hi := max(i-120, 0), min(i+len(piece)+120, len(b))
	return b[lo:hi]
}

func sortedKeys(h http.Header) []string {
	ks := make([]string, 0, len(h))
	for k := range h {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// stormCheck judges the answers of the loaded phase and after it: every
// answer the client did not leave is complete, nothing breaks, and the
// server answers after the storm.
func (p *prober) stormCheck(load *loadResult, bs []*baseline, after []*exchange) Check {
	c := Check{Name: "abort-storm", Verdict: Pass}
	left, finished := 0, 0
	judge := func(e *exchange, when string) {
		c.Requests++
		switch {
		case e.aborted:
			left++
		case e.status == 0:
			c.fail(e.evidence(when+": no response", nil))
		case e.status >= 500 && e.status != http.StatusServiceUnavailable:
			c.fail(e.evidence(fmt.Sprintf("%s: %d", when, e.status), nil))
		case e.status == http.StatusOK:
			if why := e.incomplete(); why != "" {
				c.fail(e.evidence(when+": "+why, nil))
			} else {
				finished++
			}
		}
	}
	for _, e := range load.trials {
		judge(e, "during the storm")
	}
	for _, r := range load.replays {
		for _, e := range r {
			judge(e, "during the storm")
		}
	}
	for i, e := range after {
		judge(e, "after the storm")
		if bs[i].ok() && e.status != http.StatusOK {
			c.fail(e.evidence(fmt.Sprintf("after the storm: %s answered %d (alone, before it: 200)", bs[i].name, e.status), nil))
		}
	}
	c.Numbers = map[string]any{"streams_left": left, "complete_answers": finished}
	switch {
	case c.Verdict == Fail:
		c.Reason = fmt.Sprintf("%d answers were broken or incomplete with %d clients leaving mid-stream", len(c.Evidence), left)
	case left == 0:
		c.Verdict = Skip
		c.Reason = "no client left a stream mid-way (every stream ended before its abort point)"
	default:
		c.Reason = fmt.Sprintf("%d clients left mid-stream; all %d other answers were complete, and the server answered as before afterwards", left, finished)
	}
	return c
}

// textDiff shows where two texts part: the length they share, a little of
// it, and what each has from there (a difference late in a long answer
// would not show in the first bytes of each).
func textDiff(nameA, a, nameB, b string) []byte {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(i-40, 0)
	tail := func(t string) string { return clip([]byte(t[i:]), 120) }
	return []byte(fmt.Sprintf("the same first %d bytes (…%q), then %s: %q; %s: %q", i, a[from:i], nameA, tail(a), nameB, tail(b)))
}

// replayCopies sends again, one after another, up to a fifth of the
// greedy copy tasks that got a complete answer inside the load (at most
// 40), and returns each with its replay.
func (p *prober) replayCopies(ctx context.Context, load *loadResult) [][2]*exchange {
	var done []*exchange
	for _, e := range load.trials {
		if e.status == http.StatusOK && !e.aborted && e.abortAfter == 0 && e.leaveAfter == 0 && e.incomplete() == "" && e.usage != nil {
			done = append(done, e)
		}
	}
	n := min(len(done)/5+1, 40, len(done))
	p.progress.phase(fmt.Sprintf("determinism: %d copy tasks of the load again, alone", n))
	var out [][2]*exchange
	for i := 0; i < n && ctx.Err() == nil; i++ {
		e := done[i*len(done)/n]
		again := p.sendRetry(ctx, func() *exchange {
			return &exchange{key: e.key, method: e.method, path: e.path, body: e.body, stream: e.stream, maxTokens: e.maxTokens,
				desc: e.desc + ", again alone after the load"}
		})
		out = append(out, [2]*exchange{e, again})
	}
	return out
}

// determinism compares each baseline's text alone with its replays
// inside the load and after the storm.
func (p *prober) determinism(bs []*baseline, during [][]*exchange, after []*exchange, copies [][2]*exchange) Check {
	c := Check{Name: "determinism", Verdict: Pass}
	compared, usable, copied := 0, 0, 0
	// Greedy copy tasks answered inside the load against the same request
	// alone afterwards: many more comparisons than the baselines, and
	// each one a request that ran beside another key's.
	for _, pair := range copies {
		loaded, alone := pair[0], pair[1]
		if alone.status != http.StatusOK || alone.incomplete() != "" {
			continue
		}
		compared++
		copied++
		c.Requests++
		if alone.text != loaded.text {
			c.fail(alone.evidence("a greedy copy task answered under load differs from the same request sent alone afterwards",
				textDiff("under load", loaded.text, "alone", alone.text)))
		}
	}
	cmp := func(b *baseline, e *exchange, when string) {
		if e.status != http.StatusOK || e.incomplete() != "" {
			return // the storm check judges broken answers
		}
		compared++
		c.Requests++
		if e.text != b.solo.text {
			c.fail(e.evidence(fmt.Sprintf("%s %s differs from its answer alone", b.name, when),
				textDiff("alone", b.solo.text, when, e.text)))
		}
	}
	for i, b := range bs {
		if !b.ok() {
			c.fail(b.solo.evidence(b.name+": the request alone did not get a complete 200", nil))
			continue
		}
		usable++
		for _, r := range during {
			cmp(b, r[i], "under load")
		}
		if i < len(after) {
			cmp(b, after[i], "after the storm")
		}
	}
	c.Numbers = map[string]any{"baselines": len(bs), "comparisons": compared, "copy_tasks_replayed": copied}
	switch {
	case c.Verdict == Fail:
		c.Reason = fmt.Sprintf("%d of %d answers differ from (or lack) their answer alone", len(c.Evidence), compared)
	case compared == 0:
		c.Verdict = Skip
		c.Reason = "no replay got a complete 200 to compare"
	default:
		c.Reason = fmt.Sprintf("%d greedy and seeded answers under load and after the storm equal their answers alone (%d baselines; %d of them greedy copy tasks replayed alone after the load)", compared, usable, copied)
	}
	return c
}
