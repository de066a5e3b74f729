//go:build pw_mutants

package engine

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// rescoreDelta re-scores r as the replay audit does — one prefill over
// prompt+answer on fresh pages, as the audit tenant, alone
// (prefillRescore) — and returns the largest |Δlogprob| of the emitted tokens
// and whether any position differs at all (value bits or any of the top
// alternatives: the audit's exact comparison).
func rescoreDelta(t *testing.T, n *sched.Node, r auditRecord) (float64, bool) {
	t.Helper()
	lps, err := prefillRescore(n, r.prompt, r.tokens, 5)
	if err != nil {
		t.Fatal(err)
	}
	worst, differs := 0.0, false
	for i := range lps {
		worst = math.Max(worst, math.Abs(float64(lps[i].Logprob-r.lps[i].Logprob)))
		if math.Float32bits(lps[i].Logprob) != math.Float32bits(r.lps[i].Logprob) || !slices.Equal(lps[i].Top, r.lps[i].Top) {
			differs = true
		}
	}
	return worst, differs
}

// TestAuditCatchesSwappedPage is the replay audit's positive control on
// every test model (F32, F16, Q8_0, Q4_K_M): tenants a and b generate
// together, each answer recorded as the audit records it; clean, every
// re-score (teacher-forced, alone, on fresh pages) equals its record bit
// for bit; with one page of each of b's running sequences swapped for a
// page of a's behind the ownership check (kvcache.SwapPageForControls),
// every contaminated sequence's re-score differs — the exact comparison
// catches all of them — and a's still equal theirs. The distributions of
// the largest |Δlogprob| per answer are logged. A contaminated sequence
// whose foreign page was released (and poisoned with NaN,
// kvcache.ScrubPoison) before it ended fails instead: never answered, it
// is caught before the audit and counted apart.
func TestAuditCatchesSwappedPage(t *testing.T) {
	for _, file := range []string{"tiny-llama-f32.gguf", "tiny-llama-f16.gguf", "tiny-llama-q8_0.gguf", "tiny-llama-d256-q4_k_m.gguf"} {
		t.Run(file, func(t *testing.T) {
			m, err := model.Load(testdata.Path(t, "models", file), model.Options{})
			if err != nil {
				t.Fatal(err)
			}
			n, _ := lpNode(t, m)
			// Prompts of 40 to 60 tokens (pages of 16): every answer's
			// first page is full before it generates. Tenant a generates
			// longer, so that its pages (the ones b's sequences are handed)
			// usually outlive b's sequences.
			maxTokens := map[request.Tenant]int{"a": 40, "b": 24}
			work := func() ([]auditRecord, map[request.Owner]error) {
				var mu sync.Mutex
				var recs []auditRecord
				failed := map[request.Owner]error{}
				var wg sync.WaitGroup
				for i := range 8 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						tenant := request.Tenant([]string{"a", "b"}[i%2])
						prompt := m.Tokenizer.Encode(fmt.Sprintf("Request %d of tenant %s: %s", i, tenant,
							"once upon a time there was a little model that read only its own pages and nobody else's, every day"), true, false)
						owner := request.Owner{Tenant: tenant, ID: request.NewID()}
						ids, lps, err := lpTry(n, request.Params{Owner: owner, Prompt: prompt, MaxTokens: maxTokens[tenant], IgnoreEOS: true,
							Sampling: request.Sampling{Temperature: 0.8, Seed: uint64(i), Logprobs: true, TopLogprobs: 5}})
						mu.Lock()
						if err != nil {
							failed[owner] = err
						} else {
							recs = append(recs, auditRecord{owner: owner, prompt: prompt, tokens: ids, lps: lps})
						}
						mu.Unlock()
					}()
				}
				wg.Wait()
				return recs, failed
			}
			var clean []float64
			recs, failed := work()
			for o, err := range failed {
				t.Errorf("clean request of %v failed: %v", o, err)
			}
			for _, r := range recs {
				d, differs := rescoreDelta(t, n, r)
				clean = append(clean, d)
				if differs {
					t.Errorf("clean answer of %v: its re-score differs (max |Δ| %.3g): a false alarm", r.owner, d)
				}
			}
			// A contaminated sequence that reads its foreign page after the
			// owner released it meets the scrub's NaN and fails instead of
			// answering; on a loaded machine that can be all of them, so the
			// control is run again (up to three times) until one answered.
			var hit map[request.Owner]kvcache.SwapRecord
			for attempt := 1; ; attempt++ {
				swapped, restore := kvcache.SwapPageForControls("b")
				recs, failed = work()
				restore()
				hit = map[request.Owner]kvcache.SwapRecord{}
				for _, s := range swapped() {
					hit[s.Owner] = s
				}
				answered := slices.ContainsFunc(recs, func(r auditRecord) bool { _, ok := hit[r.owner]; return ok })
				if answered || attempt == 3 {
					break
				}
				t.Logf("attempt %d: every contaminated sequence (%d) failed on a poisoned page; running the control again", attempt, len(failed))
			}
			for o, err := range failed {
				if _, ok := hit[o]; !ok {
					t.Errorf("uncontaminated request of %v failed: %v", o, err)
				}
			}
			if len(hit) == 0 {
				t.Fatal("the control contaminated no sequence: it has no power")
			}
			var contaminated, untouched []float64
			for _, r := range recs {
				d, differs := rescoreDelta(t, n, r)
				if s, ok := hit[r.owner]; ok {
					contaminated = append(contaminated, d)
					if !differs {
						t.Errorf("contaminated answer of %v (entry %d read page %d of %v) re-scores equal: not caught", r.owner, s.Entry, s.Page, s.Foreign)
					}
					continue
				}
				untouched = append(untouched, d)
				if differs {
					t.Errorf("uncontaminated answer of %v: re-score differs (max |Δ| %.3g)", r.owner, d)
				}
			}
			sort.Float64s(clean)
			sort.Float64s(contaminated)
			if len(contaminated) == 0 {
				t.Fatalf("every contaminated sequence (%d) failed on a poisoned page: the audit was not exercised", len(failed))
			}
			t.Logf("%s: clean max|Δlogprob| per answer: max %.3g over %d answers (+%d uncontaminated under the control, max %.3g); contaminated answered (%d, all caught): min %.3g, median %.3g, max %.3g; contaminated and failed on a poisoned page (never answered): %d",
				file, clean[len(clean)-1], len(clean), len(untouched), slices.Max(append(untouched, 0)), len(contaminated),
				contaminated[0], contaminated[len(contaminated)/2], contaminated[len(contaminated)-1], len(failed))
		})
	}
}
