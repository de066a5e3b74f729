package disagg

import (
	"fmt"
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

// TestDisaggregatedKnobs: the sampling knobs the job carries on the wire
// (logit bias, presence and frequency penalties, ignore_eos, stop token
// ids) give the same tokens and finish through the split as on one node,
// where they matter on both sides of the handoff (the prefill node draws
// the first token, the decode node the rest).
func TestDisaggregatedKnobs(t *testing.T) {
	single := startSingle(t)
	l := startLocal(t, LocalConfig{})
	eos := single.EOS()
	ps := prompts(t, single)
	// Ban what the first prompt gives unbiased, so that the ban decides
	// the first token (drawn on the prefill node) and every later one.
	var ban []request.TokenBias
	for _, tok := range run(t, single, params("acme", ps[0], 16)).tokens {
		if !slices.ContainsFunc(ban, func(b request.TokenBias) bool { return b.Token == tok }) {
			ban = append(ban, request.TokenBias{Token: tok, Bias: -request.MaxBias})
		}
	}
	slices.SortFunc(ban, func(a, b request.TokenBias) int { return a.Token - b.Token })
	for i, tc := range []struct {
		name string
		edit func(p *request.Params)
	}{
		{"ban", func(p *request.Params) { p.Sampling.LogitBias = ban }}, // first: on ps[0]
		{"bias and frequency", func(p *request.Params) {
			p.Sampling.LogitBias = []request.TokenBias{{Token: 300, Bias: 100}, {Token: 301, Bias: 90}}
			p.Sampling.FrequencyPenalty = 2
		}},
		{"penalties, sampled", func(p *request.Params) {
			p.Sampling = request.Sampling{Temperature: 0.9, Seed: 11, PresencePenalty: 1.5, FrequencyPenalty: -0.5}
		}},
		{"ignore_eos", func(p *request.Params) {
			p.Sampling.LogitBias = []request.TokenBias{{Token: eos, Bias: 100}}
			p.IgnoreEOS = true
		}},
		{"eos ends it", func(p *request.Params) {
			p.Sampling.LogitBias = []request.TokenBias{{Token: eos, Bias: 100}}
		}},
		{"stop token id", func(p *request.Params) {
			p.Sampling.LogitBias = []request.TokenBias{{Token: 300, Bias: 100}, {Token: 301, Bias: 90}}
			p.Sampling.FrequencyPenalty = 2
			p.StopTokens = []int{301}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := params("acme", ps[i%len(ps)], 16)
			tc.edit(&p)
			want := run(t, single, p)
			p.Owner.ID = request.NewID()
			got := run(t, l, p)
			if !want.res.Reason.Success() || got.res.Reason != want.res.Reason || fmt.Sprint(got.tokens) != fmt.Sprint(want.tokens) || got.res.Usage != want.res.Usage {
				t.Fatalf("split: %v %v %+v (%v)\nsingle: %v %v %+v", got.res.Reason, got.tokens, got.res.Usage, got.res.Err, want.res.Reason, want.tokens, want.res.Usage)
			}
		})
	}
	checkBaseline(t, l)
}
