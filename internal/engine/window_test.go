package engine

import (
	"context"
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sample"
)

// TestWindowedGeneration: for a model windowed on every layer, the
// engine's default pool holds one window and a prefill chunk, not the
// whole context, and a generation far longer than that (prompt in several
// chunks, then decode) runs in it because step gives back the pages behind
// the window; its greedy tokens are those of a plain loop over
// model.Forward that keeps every page.
func TestWindowedGeneration(t *testing.T) {
	const window, chunk, ps = 20, 8, 4
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	m.Config.SlidingWindow = window
	e, err := New(m, Options{Threads: 1, PageSize: ps, PrefillChunk: chunk, Scrub: kvcache.ScrubPoison})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if got, want := e.KV.TotalPages(), (window-1+chunk+ps-1)/ps+1; got != want {
		t.Fatalf("default pool of %d pages, want %d", got, want)
	}
	prompt := make([]int, 3*chunk+5)
	for i := range prompt {
		prompt[i] = 3 + (i*37)%200
	}
	const n = 120
	p := request.Params{Owner: request.Owner{Tenant: "w", ID: request.NewID()}, Prompt: prompt, MaxTokens: n, IgnoreEOS: true}
	var got []int
	if _, _, err := e.GenerateParams(context.Background(), p, func(tok int) error { got = append(got, tok); return nil }); err != nil {
		t.Fatalf("generation of %d+%d positions in %d pages: %v", len(prompt), n, e.KV.TotalPages(), err)
	}

	// The reference keeps every page of a pool large enough for all.
	pool, err := kvcache.NewPool(kvcache.Config{Layout: e.KV.Layout(), Pages: (len(prompt) + n + ps - 1) / ps, Scrub: kvcache.ScrubPoison})
	if err != nil {
		t.Fatal(err)
	}
	compute := kernels.NewPool(1)
	defer compute.Close()
	seq := pool.NewSequence(p.Owner)
	var scratch model.Scratch
	var want []int
	toks := prompt
	for len(want) < n {
		if err := pool.Reserve(seq, len(toks)); err != nil {
			t.Fatal(err)
		}
		v, err := pool.Begin(seq, len(toks))
		if err != nil {
			t.Fatal(err)
		}
		out, err := m.Forward(compute, []model.Input{{Tokens: toks, View: v, Logits: model.LogitsLast}}, &scratch)
		if err != nil {
			t.Fatal(err)
		}
		if err := pool.Commit(v); err != nil {
			t.Fatal(err)
		}
		next := sample.Argmax(out[0])
		want = append(want, next)
		toks = []int{next}
	}
	if seq.DroppedPages() != 0 {
		t.Fatal("the reference gave pages back")
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("windowed engine:\n%v\nreference keeping every page:\n%v", got, want)
	}
	if free := e.KV.FreePages(); free != e.KV.TotalPages() {
		t.Fatalf("%d of %d pages free after the generation", free, e.KV.TotalPages())
	}
}
