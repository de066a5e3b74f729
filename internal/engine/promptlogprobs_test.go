package engine

import (
	"context"
	"fmt"
	"io"
	"math"
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// chunkNode is lpNode with a step budget of batch tokens: a prompt longer
// than it is prefilled in chunks of that many positions.
func chunkNode(t testing.TB, m *model.Model, batch int) *sched.Node {
	t.Helper()
	n, _ := stepNode(t, m, batch, true)
	return n
}

// promptRun submits p and returns its tokens, their logprobs and the
// prompt logprobs the first token carried.
func promptRun(n *sched.Node, p request.Params) ([]int, []*request.Logprobs, []request.Logprobs, error) {
	st, err := n.Submit(context.Background(), p)
	if err != nil {
		return nil, nil, nil, err
	}
	var ids []int
	var lps []*request.Logprobs
	var prompt []request.Logprobs
	for {
		tok, err := st.Recv(context.Background())
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, nil, err
		}
		if tok.Index == 0 {
			prompt = tok.Prompt
		} else if tok.Prompt != nil {
			return nil, nil, nil, fmt.Errorf("token %d carries prompt logprobs", tok.Index)
		}
		ids = append(ids, tok.ID)
		lps = append(lps, tok.Logprobs)
	}
	if res := st.Result(); !res.Reason.Success() {
		return nil, nil, nil, fmt.Errorf("%v: %w", res.Reason, res.Err)
	}
	return ids, lps, prompt, nil
}

// prefillRescore is the replay audit's re-score as one prefill: the
// prompt and the answer but its last token fed as a prompt whose
// logprobs are asked, the last token forced, so that every answer
// position's log-probabilities come from a prompt row (the last one's
// from the draw's row). It returns them in the answer's order.
func prefillRescore(n *sched.Node, prompt, answer []int, top int) ([]*request.Logprobs, error) {
	seq := append(slices.Clone(prompt), answer[:len(answer)-1]...)
	got, lps, pl, err := promptRun(n, request.Params{Owner: request.Owner{Tenant: "_audit", ID: request.NewID()}, Prompt: seq, MaxTokens: 1,
		Sampling: request.Sampling{Logprobs: true, TopLogprobs: top, PromptLogprobs: true, PromptTopLogprobs: top, Forced: answer[len(answer)-1:]}, IgnoreEOS: true})
	if err != nil {
		return nil, err
	}
	if len(got) != 1 || got[0] != answer[len(answer)-1] || len(pl) != len(seq)-1 {
		return nil, fmt.Errorf("re-score gave tokens %v and %d prompt logprobs for %d prompt tokens", got, len(pl), len(seq))
	}
	out := make([]*request.Logprobs, 0, len(answer))
	for i := len(prompt) - 1; i < len(pl); i++ {
		out = append(out, &pl[i])
	}
	return append(out, lps[0]), nil
}

// sameLogprobs reports the first position where a and b differ in any
// bit (the value or any alternative), or -1.
func sameLogprobs(a, b []*request.Logprobs) int {
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i].Logprob) != math.Float32bits(b[i].Logprob) || !slices.Equal(a[i].Top, b[i].Top) {
			return i
		}
	}
	return -1
}

// TestPromptLogprobs: a request asking for prompt logprobs gets, with its
// first token only, one entry per prompt token after the first, each with
// the alternatives asked; the same prompt prefilled in one step (budget
// 512) and in chunks of 16 (and 48, which splits pages) gives the same
// bits; asking changes no generated token; and — what the replay audit
// relies on — the prefill re-score of an answer (prompt+answer fed as a
// prompt, prompt logprobs asked) equals, bit for bit, the logprobs the
// decode steps recorded while generating it, on every test model (F32,
// F16, Q8_0, Q4_K_M weights and the builtin ones).
func TestPromptLogprobs(t *testing.T) {
	models := map[string]func(t *testing.T) *model.Model{
		"tiny":      func(t *testing.T) *model.Model { return builtinModel(t, "tiny") },
		"tiny-q8_0": func(t *testing.T) *model.Model { return builtinModel(t, "tiny-q8_0") },
	}
	for _, f := range []string{"tiny-llama-f32.gguf", "tiny-llama-f16.gguf", "tiny-llama-q8_0.gguf", "tiny-llama-d256-q4_k_m.gguf"} {
		models[f] = func(t *testing.T) *model.Model {
			m, err := model.Load(testdata.Path(t, "models", f), model.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
	names := []string{"tiny", "tiny-q8_0", "tiny-llama-f32.gguf", "tiny-llama-f16.gguf", "tiny-llama-q8_0.gguf", "tiny-llama-d256-q4_k_m.gguf"}
	if testing.Short() {
		// The race and purego runs (-short) repeat the builtin models
		// only: the GGUF ones take over a minute on the reference kernels.
		t.Log("-short: the builtin models only; the full run checks F32, F16, Q8_0 and Q4_K_M GGUF weights too")
		names = names[:2]
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			m := models[name](t)
			one, c16, c48 := chunkNode(t, m, 512), chunkNode(t, m, 16), chunkNode(t, m, 48)
			prompt := make([]int, 150)
			for i := range prompt {
				prompt[i] = (i*7919 + 13) % m.Config.Vocab
			}
			owner := func() request.Owner { return request.Owner{Tenant: "a", ID: request.NewID()} }
			cfg := request.Sampling{Temperature: 0.8, Seed: 3, Logprobs: true, TopLogprobs: 5}
			plain, lps, pl, err := promptRun(one, request.Params{Owner: owner(), Prompt: prompt, MaxTokens: 24, Sampling: cfg, IgnoreEOS: true})
			if err != nil {
				t.Fatal(err)
			}
			if pl != nil {
				t.Fatal("prompt logprobs for a request that asked for none")
			}
			cfg.PromptLogprobs, cfg.PromptTopLogprobs = true, 3
			var first []request.Logprobs
			for k, n := range []*sched.Node{one, c16, c48, one} {
				ids, _, pl, err := promptRun(n, request.Params{Owner: owner(), Prompt: prompt, MaxTokens: 24, Sampling: cfg, IgnoreEOS: true})
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(ids, plain) {
					t.Fatalf("node %d: asking for prompt logprobs changed the tokens", k)
				}
				if len(pl) != len(prompt)-1 {
					t.Fatalf("node %d: %d prompt logprobs for %d prompt tokens", k, len(pl), len(prompt))
				}
				for i := range pl {
					if err := pl[i].Check(3, m.Config.Vocab); err != nil {
						t.Fatalf("node %d: prompt token %d: %v", k, i+1, err)
					}
				}
				if k == 0 {
					first = pl
					continue
				}
				for i := range pl {
					if math.Float32bits(pl[i].Logprob) != math.Float32bits(first[i].Logprob) || !slices.Equal(pl[i].Top, first[i].Top) {
						t.Fatalf("node %d (chunked prefill): prompt token %d: %+v, one-shot %+v", k, i+1, pl[i], first[i])
					}
				}
			}
			for k, n := range []*sched.Node{one, c16, c48} {
				got, err := prefillRescore(n, prompt, plain, 5)
				if err != nil {
					t.Fatal(err)
				}
				if i := sameLogprobs(got, lps); i >= 0 {
					t.Fatalf("node %d: prefill re-score differs from decode at answer position %d: %+v, generated %+v", k, i, *got[i], *lps[i])
				}
			}
		})
	}
}
