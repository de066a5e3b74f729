package gateway_test

import (
	"context"
	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
	"github.com/pagewarden/pagewarden/internal/request"
	"testing"
	"time"
)

// closingStream is what a backend that ends a stream on its context does
// (the split's router), caught at the worst moment: by the time the
// gateway looks, the client's context has ended, the channel is closed,
// and the result — decided elsewhere, the decode node having finished
// first — is a success with the whole usage.
type closingStream struct {
	tokens chan request.Token
	res    request.Result
}

func (s *closingStream) Tokens() <-chan request.Token { return s.tokens }
func (s *closingStream) Result() request.Result       { return s.res }

// entered says that a request reached Submit: a client cancelled before
// that never reaches the handler, and is not counted.
type closingBackend struct {
	*gatewaytest.Fake
	entered chan struct{}
}

func (b closingBackend) Submit(ctx context.Context, p request.Params) (gateway.Stream, error) {
	b.entered <- struct{}{}
	<-ctx.Done()
	s := &closingStream{tokens: make(chan request.Token),
		res: request.Result{Owner: p.Owner, Reason: request.FinishLength, Usage: request.Usage{PromptTokens: len(p.Prompt), CompletionTokens: p.MaxTokens}}}
	close(s.tokens)
	return s, nil
}

// TestClientLeavesWhileStreamCloses: when a client leaves, the backend's
// stream may close before the gateway's select sees the context end; the
// tokens the client did not take are not a broken stream contract (a
// must-be-zero counter), and the request ends as client_closed, never as
// a 500 or a 200.
func TestClientLeavesWhileStreamCloses(t *testing.T) {
	entered := make(chan struct{}, 1)
	h := newHarness(t, nil, func(c *gateway.Config) { c.Backend = closingBackend{gatewaytest.NewFake(), entered} })
	for range 30 {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
			}
			cancel()
		}()
		_, _ = h.try(ctx, "POST", "/v1/completions", keyAlpha, map[string]any{"prompt": "hi", "max_tokens": 50, "stream": true})
		cancel()
	}
	eventually(t, "30 requests counted", func() bool {
		return metricValue(t, h, `pagewarden_requests_total{endpoint="completions",status="499",tenant="alpha"}`) == "30" ||
			metricValue(t, h, "pagewarden_gateway_stream_contract_violations_total") != "0"
	})
	if v := metricValue(t, h, "pagewarden_gateway_stream_contract_violations_total"); v != "0" {
		t.Fatalf("stream contract violations %s after clients left: a closed stream was taken for a broken one", v)
	}
}
