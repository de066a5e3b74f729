package sched

import (
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

// TestIgnoreEOS: with every token an end token, a request ends at its
// first token, one with IgnoreEOS runs to max_tokens, and its own stop
// tokens still end it.
func TestIgnoreEOS(t *testing.T) {
	every := make([]int, harnessVocab)
	for i := range every {
		every[i] = i
	}
	h := newHarness(t, harnessOpts{window: 64, pageSize: 4, pages: 64, batchTokens: 64, endTokens: every})
	const maxTokens = 12
	for _, tc := range []struct {
		name      string
		ignoreEOS bool
		stop      []int
		want      request.FinishReason
		tokens    int
	}{
		{"end token", false, nil, request.FinishStop, 1},
		{"ignore_eos", true, nil, request.FinishLength, maxTokens},
		{"ignore_eos, stop tokens", true, every, request.FinishStop, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := h.mkParams("a", 5, maxTokens)
			p.IgnoreEOS, p.StopTokens = tc.ignoreEOS, tc.stop
			if err := h.submitParams(p); err != nil {
				t.Fatal(err)
			}
			h.drain(t)
			res := h.results[p.Owner]
			if res.Reason != tc.want || len(h.tokens[p.Owner]) != tc.tokens || res.Usage.CompletionTokens != tc.tokens {
				t.Errorf("finished %v after %d tokens (usage %+v); want %v after %d", res.Reason, len(h.tokens[p.Owner]), res.Usage, tc.want, tc.tokens)
			}
			h.checkFree(t)
		})
	}
}
