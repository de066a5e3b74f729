package disagg

import (
	"context"
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/engine"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
)

// TestDisaggregatedWindowMatches runs models windowed on every layer (a
// llama file with a short sliding window, as a Mistral GGUF carries it,
// and builtin:tiny-phi3) three ways: a private engine (as `pagewarden
// run` does: its own loop, which gives back pages in step; engine's
// TestWindowedGeneration checks it against a loop that keeps every page),
// one node whose scheduler gives back the pages behind the window, and the
// prefill → decode handoff (the prefill
// node keeps and sends every prompt page; the decode node commits them all
// and then gives back what its window left behind). Prompts longer than
// the window and generations well past it must give the same greedy
// tokens all three ways, and every node must give back every page.
func TestDisaggregatedWindowMatches(t *testing.T) {
	load := func(name string, window int) *model.Model {
		m, err := model.Load(model.BuiltinPrefix+name, model.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if window > 0 {
			m.Config.SlidingWindow = window
		}
		if m.Config.EveryLayerWindow() == 0 {
			t.Fatalf("%s is not windowed on every layer", name)
		}
		return m
	}
	for _, tc := range []struct {
		name   string
		window int // 0: the model's own
	}{{"tiny", 12}, {"tiny-phi3", 0}} {
		t.Run(fmt.Sprintf("%s/window%d", tc.name, tc.window), func(t *testing.T) {
			o := node.Options{Threads: 1, KVMemory: 8 << 20, MaxContext: 256, Scrub: kvcache.ScrubPoison, PageSize: 8}
			single, err := node.Start(load(tc.name, tc.window), o)
			if err != nil {
				t.Fatal(err)
			}
			defer single.Close()
			l, err := StartLocal(load(tc.name, tc.window), LocalConfig{Node: o})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			em := load(tc.name, tc.window)
			eng, err := engine.New(em, engine.Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close()
			w := em.Config.EveryLayerWindow()
			for _, text := range []string{"Once", "Once upon a time there was a little dog who liked to run in the park every morning"} {
				prompt, _ := single.Tokenize(text, true, false)
				n := 2*w + 9
				var want []int
				if _, _, err := eng.Generate(context.Background(), request.Owner{Tenant: "solo", ID: request.NewID()}, prompt, n, request.Sampling{}, func(tok int) error {
					want = append(want, tok)
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				p := params("acme", prompt, n)
				p.IgnoreEOS = true
				one := run(t, single, p)
				p.Owner.ID = request.NewID()
				split := run(t, l, p)
				if !one.res.Reason.Success() || !split.res.Reason.Success() {
					t.Fatalf("%q: one node %v (%v), split %v (%v)", text, one.res.Reason, one.res.Err, split.res.Reason, split.res.Err)
				}
				t.Logf("%q: %d prompt tokens, %d generated (engine %d), window %d", text, len(prompt), len(one.tokens), len(want), w)
				// The engine stops at an end token; the nodes were told
				// to ignore it, so compare what the engine produced.
				if len(want) == 0 || fmt.Sprint(one.tokens[:len(want)]) != fmt.Sprint(want) || fmt.Sprint(split.tokens) != fmt.Sprint(one.tokens) {
					t.Fatalf("%q (%d tokens, window %d):\nengine %v\n  node %v\n split %v", text, len(prompt), w, want, one.tokens, split.tokens)
				}
			}
			checkBaseline(t, l)
			st, err := single.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if st.Pool.FreePages+st.Pool.CachedPages != st.Pool.TotalPages || st.Pool.Violations != 0 {
				t.Fatalf("single node after the run: %+v", st.Pool)
			}
		})
	}
}
