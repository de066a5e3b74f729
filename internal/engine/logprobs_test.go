package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sample"
	"github.com/pagewarden/pagewarden/internal/sched"
)

// auditRecord is what the gateway's replay audit records of an answer:
// its tokens and, per position, the logprobs the engine gave.
type auditRecord struct {
	owner  request.Owner
	prompt []int
	tokens []int
	lps    []*request.Logprobs
}

// lpNode runs a scheduler node on a fresh engine for m.
func lpNode(t *testing.T, m *model.Model) (*sched.Node, *Engine) {
	t.Helper()
	return lpNodeTB(t, m)
}

func lpNodeTB(t testing.TB, m *model.Model) (*sched.Node, *Engine) {
	t.Helper()
	return stepNode(t, m, 64, false)
}

// stepNode runs a scheduler node on a fresh engine for m, with a step
// budget of batch tokens and the prefix cache on or off.
func stepNode(t testing.TB, m *model.Model, batch int, prefixCache bool) (*sched.Node, *Engine) {
	t.Helper()
	e, err := New(m, Options{Threads: 2, PageSize: 16, Pages: 256, Scrub: kvcache.ScrubPoison})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	lim, err := sched.ComputeLimits(sched.ModelShape{ContextLength: m.Config.ContextLength, Vocab: m.Config.Vocab},
		e.KV.Layout(), e.KV.TotalPages(), min(m.Config.ContextLength, 1024), 0)
	if err != nil {
		t.Fatal(err)
	}
	n, err := sched.NewNode(sched.NodeConfig{Core: sched.Config{Limits: lim, Pool: e.KV, MaxBatchTokens: batch, PrefixCache: prefixCache}, Executor: e.Executor()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- n.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	return n, e
}

// lpRun submits p and returns its tokens and their logprobs.
func lpRun(t *testing.T, n *sched.Node, p request.Params) ([]int, []*request.Logprobs) {
	t.Helper()
	ids, lps, err := lpTry(n, p)
	if err != nil {
		t.Fatal(err)
	}
	return ids, lps
}

// lpTry is lpRun for a request that may fail.
func lpTry(n *sched.Node, p request.Params) ([]int, []*request.Logprobs, error) {
	st, err := n.Submit(context.Background(), p)
	if err != nil {
		return nil, nil, err
	}
	var ids []int
	var lps []*request.Logprobs
	for {
		tok, err := st.Recv(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, err
		}
		ids = append(ids, tok.ID)
		lps = append(lps, tok.Logprobs)
	}
	if res := st.Result(); !res.Reason.Success() {
		return nil, nil, fmt.Errorf("%v: %w", res.Reason, res.Err)
	}
	return ids, lps, nil
}

// TestLogprobsTeacherForced: a request that asks for logprobs gets them
// with every token, exactly top_logprobs alternatives each, the emitted
// token's value equal to its entry among them when it is there; one that
// does not ask gets none; and a teacher-forced replay of the output (the
// audit's re-score), alone or batched with other requests, gives the same
// values bit for bit (the decode path is batch-invariant). The values are
// also those of a one-shot prefill of prompt+output (Engine.Score) within
// the prefill/decode tolerance measured here.
func TestLogprobsTeacherForced(t *testing.T) {
	for _, name := range []string{"tiny", "tiny-q8_0"} {
		t.Run(name, func(t *testing.T) {
			m := builtinModel(t, name)
			n, e := lpNode(t, m)
			prompt := m.Tokenizer.Encode("Once upon a time", true, false)
			owner := func(tenant string) request.Owner {
				return request.Owner{Tenant: request.Tenant(tenant), ID: request.NewID()}
			}
			cfg := request.Sampling{Temperature: 0.9, Seed: 7, PresencePenalty: 1, Logprobs: true, TopLogprobs: 5}
			ids, lps := lpRun(t, n, request.Params{Owner: owner("a"), Prompt: prompt, MaxTokens: 12, Sampling: cfg, IgnoreEOS: true})
			for i, lp := range lps {
				if lp == nil {
					t.Fatalf("token %d has no logprobs", i)
				}
				if err := lp.Check(5, m.Config.Vocab); err != nil {
					t.Fatalf("token %d: %v", i, err)
				}
				for _, alt := range lp.Top {
					if alt.ID == ids[i] && alt.Logprob != lp.Logprob {
						t.Errorf("token %d: logprob %v, but %v among the top", i, lp.Logprob, alt.Logprob)
					}
				}
			}
			plain, plainLP := lpRun(t, n, request.Params{Owner: owner("a"), Prompt: prompt, MaxTokens: 12,
				Sampling: request.Sampling{Temperature: 0.9, Seed: 7, PresencePenalty: 1}, IgnoreEOS: true})
			if !slicesEqual(plain, ids) {
				t.Fatalf("asking for logprobs changed the tokens: %v vs %v", plain, ids)
			}
			for _, lp := range plainLP {
				if lp != nil {
					t.Fatal("logprobs for a request that asked for none")
				}
			}
			// Replays: alone, then among other requests in the same steps.
			forced := request.Sampling{Logprobs: true, TopLogprobs: 5, Forced: ids}
			replay := func() []*request.Logprobs {
				got, lp := lpRun(t, n, request.Params{Owner: owner("_audit"), Prompt: prompt, MaxTokens: len(ids), Sampling: forced, IgnoreEOS: true})
				if !slicesEqual(got, ids) {
					t.Fatalf("forced replay emitted %v, forced %v", got, ids)
				}
				return lp
			}
			check := func(what string, got []*request.Logprobs) {
				for i := range lps {
					if got[i].Logprob != lps[i].Logprob || !slicesEqual(got[i].Top, lps[i].Top) {
						t.Errorf("%s: position %d: %+v, generated %+v", what, i, *got[i], *lps[i])
					}
				}
			}
			check("replay alone", replay())
			var wg sync.WaitGroup
			for k := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lpRun(t, n, request.Params{Owner: owner("b"), Prompt: m.Tokenizer.Encode("The cat sat on the mat and", true, false),
						MaxTokens: 20, Sampling: request.Sampling{Seed: uint64(k)}})
				}()
			}
			check("replay in a batch", replay())
			wg.Wait()
			// One prefill over prompt+output scores the same positions.
			rows, err := e.Score(owner("_score"), append(append([]int(nil), prompt...), ids[:len(ids)-1]...))
			if err != nil {
				t.Fatal(err)
			}
			worst := 0.0
			var lp request.Logprobs
			for i := range ids {
				if err := sample.Logprobs(rows[len(prompt)-1+i], ids[i], 0, &lp); err != nil {
					t.Fatal(err)
				}
				worst = math.Max(worst, math.Abs(float64(lp.Logprob-lps[i].Logprob)))
			}
			t.Logf("%s: prefill vs decode max |Δlogprob| over %d positions: %.3g", name, len(ids), worst)
			if worst > 1e-3 {
				t.Errorf("prefill and decode logprobs differ by %.3g", worst)
			}
		})
	}
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
