package engine

import (
	"math"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// TestAuditAcrossTiers calibrates the replay audit's tolerance for nodes
// that compute with other kernel tiers (a re-score runs on another node,
// which may have another CPU): answers generated on this machine's best
// tier are re-scored as the audit re-scores them (one prefill over
// prompt+answer, prefillRescore) on every other tier it runs, and the
// largest |Δlogprob| of each model and tier is logged. Same tier, the
// difference is exactly 0 (TestLogprobsTeacherForced); across tiers it
// must stay far below what a contaminated page makes (0.88 and more,
// TestAuditCatchesSwappedPage), or no tolerance could separate them.
// Measured on an AVX-512 VNNI EPYC (Zen 4): F32 3.3e-6 (ref, avx2), F16
// 1.4e-3 (avx2) and 8.4e-4 (ref), Q8_0 0 on every tier, Q4_K_M 0 (avx2)
// and 0.037 (ref): a cluster of mixed tiers wants --audit-tolerance 0.1.
func TestAuditAcrossTiers(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIPPED in -short: re-scores four models on every kernel tier (~10 s; the full run has it)")
	}
	tiers := kernels.Tiers()
	if len(tiers) < 2 || !kernels.Assembly() {
		t.Skipf("this machine and build run one kernel tier (%v): nothing to compare", tiers)
	}
	best := kernels.Implementation()
	t.Cleanup(func() {
		if err := kernels.SetTier(best); err != nil {
			t.Fatal(err)
		}
	})
	for _, file := range []string{"tiny-llama-f32.gguf", "tiny-llama-f16.gguf", "tiny-llama-q8_0.gguf", "tiny-llama-d256-q4_k_m.gguf"} {
		m, err := model.Load(testdata.Path(t, "models", file), model.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if err := kernels.SetTier(best); err != nil {
			t.Fatal(err)
		}
		n, _ := lpNode(t, m)
		prompt := m.Tokenizer.Encode("once upon a time there was a little model that read only its own pages", true, false)
		var recs []auditRecord
		for i := range 3 {
			ids, lps := lpRun(t, n, request.Params{Owner: request.Owner{Tenant: "a", ID: request.NewID()}, Prompt: prompt, MaxTokens: 16,
				IgnoreEOS: true, Sampling: request.Sampling{Temperature: 0.8, Seed: uint64(i), Logprobs: true, TopLogprobs: 5}})
			recs = append(recs, auditRecord{prompt: prompt, tokens: ids, lps: lps})
		}
		for _, tier := range tiers {
			if err := kernels.SetTier(tier); err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			for _, r := range recs {
				lps, err := prefillRescore(n, r.prompt, r.tokens, 5)
				if err != nil {
					t.Fatal(err)
				}
				for i := range lps {
					worst = math.Max(worst, math.Abs(float64(lps[i].Logprob-r.lps[i].Logprob)))
				}
			}
			t.Logf("%s: generated on %s, re-scored on %s: max |Δlogprob| %.3g", file, best, tier, worst)
			if tier == best && worst != 0 {
				t.Errorf("%s: the same tier re-scores %.3g off", file, worst)
			}
			if worst > 0.1 {
				t.Errorf("%s on %s: %.3g, too close to a contaminated page's difference for any tolerance", file, tier, worst)
			}
		}
	}
}
