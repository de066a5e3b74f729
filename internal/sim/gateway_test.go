package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// gatewayNode is the gateway's request logic in front of the cluster: it
// picks a decode node (the router's choice), reserves, sends the prompt to
// the prefill node, relays client aborts until every party acknowledges,
// and checks every token and result against the owner-echo model. What the
// client is answered comes from the real HTTP handler (gateway.Server),
// replayed over the cluster's outcome once the request has ended.
type gatewayNode struct {
	w     *world
	calls map[request.Owner]*call
	order []request.Owner
	ids   uint64
	http  *gateway.Server
	back  *replayBackend
	keys  map[request.Tenant]string
}

// call is the gateway's record of one request.
type call struct {
	params  request.Params
	decode  peer
	grant   *transfer.Grant
	tokens  []int
	result  *request.Result
	aborted bool // the client left (the gateway aborted it)
	// acked are the parties whose AbortAck the gateway has; it sends the
	// abort again every retry until they have all answered.
	acked   map[peer]bool
	retryAt time.Time
}

func (c *call) done() bool { return c.result != nil }

func (w *world) newGateway(tenantCount int) (*gatewayNode, error) {
	g := &gatewayNode{w: w, calls: map[request.Owner]*call{}, keys: map[request.Tenant]string{}}
	g.back = &replayBackend{g: g}
	cfg := &tenants.Config{}
	for i := range tenantCount {
		t := request.Tenant(fmt.Sprintf("t%d", i))
		key := fmt.Sprintf("sk-sim-%d-key", i)
		g.keys[t] = key
		cfg.Tenants = append(cfg.Tenants, tenants.Tenant{ID: string(t), APIKeySHA256: []string{tenants.HashKey(key)}})
	}
	srv, err := gateway.New(gateway.Config{Backend: g.back, Tenants: cfg, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now: func() time.Time { return w.now }})
	if err != nil {
		return nil, err
	}
	g.http = srv
	return g, nil
}

// tenants lists the tenants in a fixed order.
func (g *gatewayNode) tenants() []request.Tenant {
	ts := make([]request.Tenant, 0, len(g.keys))
	for t := range g.keys {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// fits is the one admission rule (I5): prompt + max_tokens within W.
func (w *world) fits(p request.Params) bool {
	return len(p.Prompt) >= 1 && p.MaxTokens >= 1 && len(p.Prompt)+p.MaxTokens <= w.window
}

// submit is a client's request. One over the window (or empty) goes only
// to the HTTP handler, which must refuse it with 400 before any node sees
// it; the others enter the cluster.
func (g *gatewayNode) submit(p request.Params) error {
	if !g.w.fits(p) {
		st, body, err := g.serve(p, nil)
		if err != nil {
			return err
		}
		if st != http.StatusBadRequest {
			return violated(invAbort, "a request of %d prompt + %d max_tokens in a window of %d was answered %d: %s", len(p.Prompt), p.MaxTokens, g.w.window, st, body)
		}
		g.w.logf("gateway: refused %d+%d: %d", len(p.Prompt), p.MaxTokens, st)
		return nil
	}
	c := &call{params: p, acked: map[peer]bool{}}
	g.calls[p.Owner] = c
	g.order = append(g.order, p.Owner)
	c.decode = g.pickDecode()
	g.w.net.reliable(gwName, c.decode, reserveJob{
		Reserve: transfer.Reserve{Owner: p.Owner, Epoch: 1, PromptTokens: len(p.Prompt), MaxNewTokens: p.MaxTokens, Sender: pfName},
		params:  p,
	})
	g.w.logf("gateway: %v prompt %d max %d -> %s", p.Owner, len(p.Prompt), p.MaxTokens, c.decode)
	return nil
}

// pickDecode is the router's choice: the decode node with the most free
// pages, ties (and one time in four) at random.
func (g *gatewayNode) pickDecode() peer {
	ds := g.w.decodes
	if g.w.rng.IntN(4) == 0 {
		return ds[g.w.rng.IntN(len(ds))].name
	}
	best := ds[0]
	for _, d := range ds[1:] {
		if d.pool.FreePages() > best.pool.FreePages() {
			best = d
		}
	}
	return best.name
}

// abort is the client leaving: the gateway tells every party.
func (g *gatewayNode) abort(o request.Owner) {
	c := g.calls[o]
	if c == nil || c.done() || c.aborted {
		return
	}
	c.aborted = true
	g.w.logf("gateway: client abort of %v", o)
	g.sendAborts(c)
}

// sendAborts sends the abort to every party that has not acknowledged it.
func (g *gatewayNode) sendAborts(c *call) {
	ref := transfer.Ref{Owner: c.params.Owner, Epoch: 1}
	if c.grant != nil {
		ref.ID = c.grant.ID
	}
	parties := []peer{c.decode}
	if c.grant != nil {
		parties = append(parties, pfName)
	}
	for _, p := range parties {
		if !c.acked[p] {
			g.w.net.lossy(gwName, p, &transfer.Abort{Ref: ref, Reason: transfer.ReasonAborted})
		}
	}
	c.retryAt = g.w.now.Add(200 * time.Millisecond)
}

// tick resends unacknowledged aborts.
func (g *gatewayNode) tick() {
	for _, o := range g.order {
		if c := g.calls[o]; c.aborted && !c.done() && !g.w.now.Before(c.retryAt) {
			g.sendAborts(c)
		}
	}
}

func (g *gatewayNode) deliver(e *envelope) error {
	switch m := e.body.(type) {
	case *transfer.Grant:
		c := g.calls[m.Owner]
		switch {
		case c == nil || e.from != c.decode:
			return violated(invCore, "gateway: grant %v from %s for no request of its own", m.Ref, e.from)
		case c.grant != nil:
			return nil // a duplicate
		}
		g2 := *m
		c.grant = &g2
		if c.aborted || c.done() {
			// The client left before the grant: abort the reservation
			// now that it has a name.
			c.acked = map[peer]bool{pfName: true}
			g.sendAborts(c)
			return nil
		}
		g.w.net.reliable(gwName, pfName, prefillJob{grant: g2, params: c.params, decode: c.decode})
	case *transfer.Abort:
		// A party gave up on the handoff; the decode node's result says
		// how the request ended. Acknowledge: the gateway holds no pages.
		g.w.net.lossy(gwName, e.from, &transfer.AbortAck{Ref: m.Ref, Drained: true})
	case *transfer.AbortAck:
		if c := g.calls[m.Owner]; c != nil {
			c.acked[e.from] = true
		}
	case *transfer.Committed:
	case tokensMsg:
		for _, t := range m.toks {
			if err := g.token(e.from, t); err != nil {
				return err
			}
		}
	case resultMsg:
		return g.finish(e.from, m.res)
	default:
		return violated(invCore, "gateway got %T from %s", m, e.from)
	}
	return nil
}

// token checks one generated token: from the call's decode node, before
// its result, in order, and the owner-echo model's token over the call's
// own history.
func (g *gatewayNode) token(from peer, t request.Token) error {
	c := g.calls[t.Owner]
	switch {
	case c == nil || from != c.decode:
		return violated(invEcho, "token of %v from %s, which serves no such request", t.Owner, from)
	case c.done():
		return violated(invTerminal, "token %d of %v after its result", t.Index, t.Owner)
	case t.Index != len(c.tokens):
		return violated(invEcho, "token of %v has index %d, want %d", t.Owner, t.Index, len(c.tokens))
	}
	hist := append(slices.Clip(c.params.Prompt), c.tokens...)
	if want := echoNext(t.Owner, c.params.CacheSalt, hist, g.w.vocab); t.ID != want {
		return violated(invEcho, "token %d of %v is %d, the owner-echo model over its own history gives %d: it read KV that is not its own", t.Index, t.Owner, t.ID, want)
	}
	c.tokens = append(c.tokens, t.ID)
	return nil
}

// finish checks a request's one result and, unless the client left,
// answers it through the real HTTP handler.
func (g *gatewayNode) finish(from peer, res request.Result) error {
	c := g.calls[res.Owner]
	switch {
	case c == nil || from != c.decode:
		return violated(invTerminal, "result of %v from %s, which serves no such request", res.Owner, from)
	case c.done():
		return violated(invTerminal, "second result of %v: %v after %v", res.Owner, res.Reason, c.result.Reason)
	}
	return g.end(c, res)
}

// end records c's one result, checks it, and answers the client.
func (g *gatewayNode) end(c *call, res request.Result) error {
	c.result = &res
	g.w.logf("gateway: %v ended %v (%v) after %d tokens", res.Owner, res.Reason, res.Err, len(c.tokens))
	if res.Reason.Success() {
		for _, d := range g.w.decodes {
			if d.abortLanded[res.Owner] {
				return violated(invAbort, "%v was aborted on %s but reports success (%v)", res.Owner, d.name, res.Reason)
			}
		}
		if g.w.prefill.abortLanded[res.Owner] {
			return violated(invAbort, "%v was aborted in prefill but reports success (%v)", res.Owner, res.Reason)
		}
		if res.Reason == request.FinishLength && len(c.tokens) != c.params.MaxTokens || len(c.tokens) > c.params.MaxTokens {
			return violated(invEcho, "%v finished %v with %d of max_tokens %d", res.Owner, res.Reason, len(c.tokens), c.params.MaxTokens)
		}
	}
	if c.aborted {
		return nil // nobody to answer
	}
	st, body, err := g.serve(c.params, c)
	if err != nil {
		return err
	}
	if (st == http.StatusOK) != res.Reason.Success() {
		return violated(invHTTP, "%v ended %v (%v) and was answered HTTP %d: %s", res.Owner, res.Reason, res.Err, st, body)
	}
	if st == http.StatusOK {
		var out struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(body, &out); err != nil || out.Usage.CompletionTokens != len(c.tokens) {
			return violated(invHTTP, "%v answered with usage %s for %d tokens (%v)", res.Owner, body, len(c.tokens), err)
		}
	}
	return nil
}

// serve runs one completion request through the gateway's HTTP handler,
// with the backend replaying c's outcome (nil: the backend must not be
// called).
func (g *gatewayNode) serve(p request.Params, c *call) (int, []byte, error) {
	body := map[string]any{"model": "sim", "prompt": p.Prompt, "max_tokens": p.MaxTokens}
	if len(p.StopTokens) > 0 {
		body["stop_token_ids"] = p.StopTokens
	}
	if p.CacheSalt != "" {
		body["cache_salt"] = p.CacheSalt
	}
	if len(p.Prompt) == 0 {
		body["prompt"] = []int{}
	}
	raw, _ := json.Marshal(body)
	req := httptest.NewRequest(http.MethodPost, "/v1/completions", bytes.NewReader(raw))
	req.Header.Set("Authorization", "Bearer "+g.keys[p.Owner.Tenant])
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	g.back.want, g.back.err = c, nil
	g.http.ServeHTTP(rec, req)
	g.back.want = nil
	if g.back.err != nil {
		return 0, nil, g.back.err
	}
	return rec.Code, rec.Body.Bytes(), nil
}

// replayBackend is the gateway.Backend the HTTP handler talks to: it
// answers the one request being replayed with the tokens and the result
// the cluster produced for it.
type replayBackend struct {
	g    *gatewayNode
	want *call
	err  error
}

var _ gateway.Backend = (*replayBackend)(nil)

func (b *replayBackend) ModelID() string { return "sim" }
func (b *replayBackend) Limits() gateway.Limits {
	return gateway.Limits{MaxContext: b.g.w.window, PageSize: b.g.w.layout.PageSize}
}
func (b *replayBackend) Tokenize(string, bool, bool) ([]int, error) {
	return nil, errors.New("sim: no tokenizer")
}
func (b *replayBackend) Detokenize(ids []int) (string, error) { return fmt.Sprint(ids), nil }
func (b *replayBackend) TokenPiece(id int) []byte             { return fmt.Appendf(nil, "<%d>", id) }
func (b *replayBackend) ChatTemplate() string                 { return "" }
func (b *replayBackend) BOS() int                             { return -1 }
func (b *replayBackend) EOS() int                             { return -1 }
func (b *replayBackend) IsEOG(int) bool                       { return false }
func (b *replayBackend) Abort(request.Tenant, request.ID) error {
	return nil
}

func (b *replayBackend) Submit(_ context.Context, p request.Params) (gateway.Stream, error) {
	c := b.want
	if c == nil {
		b.err = violated(invAbort, "the gateway submitted a request of %d prompt + %d max_tokens in a window of %d", len(p.Prompt), p.MaxTokens, b.g.w.window)
		return nil, request.ErrContextLength
	}
	if !slices.Equal(p.Prompt, c.params.Prompt) || p.MaxTokens != c.params.MaxTokens ||
		!strings.HasSuffix(p.CacheSalt, "|"+c.params.CacheSalt) {
		// The gateway scopes the salt to the tenant's namespace.
		b.err = violated(invHTTP, "the gateway submitted prompt %v max %d salt %q for %v, %d, %q",
			p.Prompt, p.MaxTokens, p.CacheSalt, c.params.Prompt, c.params.MaxTokens, c.params.CacheSalt)
	}
	st := &replayStream{ch: make(chan request.Token, len(c.tokens)), res: *c.result}
	for i, t := range c.tokens {
		st.ch <- request.Token{Owner: p.Owner, Index: i, ID: t}
	}
	close(st.ch)
	st.res.Owner = p.Owner
	return st, nil
}

type replayStream struct {
	ch  chan request.Token
	res request.Result
}

func (s *replayStream) Tokens() <-chan request.Token { return s.ch }
func (s *replayStream) Result() request.Result       { return s.res }
