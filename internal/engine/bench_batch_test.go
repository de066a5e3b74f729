package engine

import (
	"errors"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// TestBenchBatch checks the batched-decode measurement: it runs every
// sequence through its prompt and genLen batched steps, gives every page
// back, refuses nonsense arguments, and reports a pool too small for the
// batch as the pool's own error rather than a partial measurement.
func TestBenchBatch(t *testing.T) {
	m := builtinModel(t, "tiny")
	const ps = 16
	pages := func(seqs, prompt, gen int) int { return seqs * ((prompt + gen + ps - 1) / ps) }
	tests := []struct {
		name              string
		seqs, prompt, gen int
		pages             int
		wantErr           bool
	}{
		{"one sequence", 1, 8, 4, pages(1, 8, 4), false},
		{"four sequences crossing pages", 4, 13, 9, pages(4, 13, 9), false},
		{"no decode", 3, 5, 0, pages(3, 5, 0), false},
		{"no sequence", 0, 8, 4, 8, true},
		{"no prompt", 2, 0, 4, 8, true},
		{"pool too small", 4, 13, 9, pages(4, 13, 9) - 1, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e, err := New(m, Options{Threads: 1, PageSize: ps, Pages: tc.pages, KVType: kvcache.F32})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			r, err := e.BenchBatch(tc.seqs, tc.prompt, tc.gen)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("BenchBatch(%d, %d, %d) on %d pages succeeded; want an error", tc.seqs, tc.prompt, tc.gen, tc.pages)
				}
				if tc.seqs > 0 && tc.prompt > 0 && !errors.Is(err, kvcache.ErrNoPages) {
					t.Errorf("pool too small: %v; want kvcache.ErrNoPages", err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if r.Prefill <= 0 || (tc.gen > 0 && r.Decode <= 0) || r.PromptLen != tc.prompt || r.Generated != tc.gen {
					t.Errorf("result %+v for %d sequences, prompt %d, %d new", r, tc.seqs, tc.prompt, tc.gen)
				}
			}
			if free := e.KV.FreePages(); free != tc.pages {
				t.Errorf("%d of %d pages free after BenchBatch", free, tc.pages)
			}
			if err := e.KV.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
