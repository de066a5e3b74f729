package sched

import (
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

// TestPrefixHitsCountedOncePerStart: a request that finds its prompt in
// the prefix cache but must wait (its tenant's cap, or the watermark, is
// in the way) counts its hit pages once, when it starts, not again on
// every step it waits.
func TestPrefixHitsCountedOncePerStart(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		opts                   harnessOpts
		blocker, blockerTokens int // prompt and max_tokens of what holds pages
	}{
		{"tenant cap", harnessOpts{window: 32, pageSize: 4, pages: 32, batchTokens: 64, prefix: true,
			policy: map[request.Tenant]TenantPolicy{"a": {MaxPages: 6}}}, 8, 12},
		{"watermark", harnessOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 64, prefix: true, watermark: 8}, 24, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.opts)
			first := h.mkParams("a", 13, 2) // 3 full prompt pages to publish
			if err := h.submitParams(first); err != nil {
				t.Fatal(err)
			}
			h.drain(t)
			if hits := h.pool.Stats().PrefixHitPages; hits != 0 {
				t.Fatalf("%d hit pages before anything was published", hits)
			}
			// Something else of tenant "a" (its cap) or of another tenant
			// (the watermark) holds pages for a while.
			other := request.Tenant("a")
			if tc.opts.policy == nil {
				other = "b"
			}
			blocker := h.submit(t, other, tc.blocker, tc.blockerTokens)
			h.step(t)
			h.step(t) // one decode step in: it grows from here
			again := h.mkParams("a", 13, 2)
			copy(again.Prompt, first.Prompt)
			if err := h.submitParams(again); err != nil {
				t.Fatal(err)
			}
			waited := 0
			for {
				h.step(t)
				if st, _ := h.core.State(again.Owner); st != StateAdmitted {
					break
				}
				waited++
			}
			if waited < 3 {
				t.Fatalf("the request waited %d steps; the test needs it to wait", waited)
			}
			h.drain(t)
			if hits := h.pool.Stats().PrefixHitPages; hits != 3 {
				t.Errorf("%d prefix-cache hit pages after waiting %d steps, want 3: one count per start", hits, waited)
			}
			if r := h.results[again.Owner]; r.Reason != request.FinishLength || r.Usage.CachedTokens != 12 {
				t.Errorf("the cached request: %+v", r)
			}
			if r := h.results[blocker]; r.Reason != request.FinishLength {
				t.Errorf("blocker: %+v", r)
			}
			h.checkFree(t)
		})
	}
}
