package engine

import (
	"context"
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
)

// TestGenerateParamsStops: GenerateParams ends at p.StopTokens as at the
// model's end-of-generation tokens (neither emitted), and with IgnoreEOS
// the end-of-generation token is emitted like any other and only
// MaxTokens or a stop token ends the request — the scheduler's rules, so
// that `run` answers as the server does.
func TestGenerateParamsStops(t *testing.T) {
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e, err := New(m, Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prompt := m.Tokenizer.Encode("Once upon a time", true, false)
	eos := m.Tokenizer.EOS()
	gen := func(p request.Params) ([]int, request.FinishReason) {
		t.Helper()
		p.Owner, p.Prompt = request.Owner{Tenant: "t", ID: request.NewID()}, prompt
		var out []int
		_, reason, err := e.GenerateParams(context.Background(), p, func(tok int) error { out = append(out, tok); return nil })
		if err != nil {
			t.Fatal(err)
		}
		return out, reason
	}
	free, reason := gen(request.Params{MaxTokens: 24})
	if reason != request.FinishLength || len(free) != 24 {
		t.Fatalf("unconstrained: %d tokens, %v", len(free), reason)
	}
	// The stop token: the first that the greedy output has not produced
	// before, after at least one token.
	k := 1
	for k < len(free) && slices.Contains(free[:k], free[k]) {
		k++
	}
	if k == len(free) {
		t.Skip("no token in the greedy output appears for the first time after the first")
	}
	forceEOS := request.Sampling{LogitBias: []request.TokenBias{{Token: eos, Bias: request.MaxBias}}}
	tests := []struct {
		name   string
		p      request.Params
		want   []int
		reason request.FinishReason
	}{
		{"stop token ends, not emitted", request.Params{MaxTokens: 24, StopTokens: []int{free[k]}}, free[:k], request.FinishStop},
		{"end of generation ends, not emitted", request.Params{MaxTokens: 5, Sampling: forceEOS}, nil, request.FinishStop},
		{"ignore_eos emits it and goes on", request.Params{MaxTokens: 5, Sampling: forceEOS, IgnoreEOS: true}, []int{eos, eos, eos, eos, eos}, request.FinishLength},
		{"ignore_eos still stops at a stop token", request.Params{MaxTokens: 5, Sampling: forceEOS, IgnoreEOS: true, StopTokens: []int{eos}}, nil, request.FinishStop},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, reason := gen(tc.p)
			if !slices.Equal(got, tc.want) || reason != tc.reason {
				t.Fatalf("got %v %v, want %v %v", got, reason, tc.want, tc.reason)
			}
		})
	}
}
