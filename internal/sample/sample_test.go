package sample

import (
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

func TestGreedyPicksFirstMax(t *testing.T) {
	for _, tc := range []struct {
		logits []float32
		want   int
	}{
		{[]float32{1, 3, 2}, 1},
		{[]float32{5, 5, 1}, 0},
		{[]float32{-1, -3, -0.5}, 2},
	} {
		if got := New(request.Sampling{}).Sample(append([]float32(nil), tc.logits...)); got != tc.want {
			t.Errorf("greedy %v = %d, want %d", tc.logits, got, tc.want)
		}
	}
}

func TestSeedReproduces(t *testing.T) {
	cfg := request.Sampling{Temperature: 1, Seed: 42}
	logits := make([]float32, 100)
	for i := range logits {
		logits[i] = float32(i%7) * 0.3
	}
	a, b := New(cfg), New(cfg)
	for i := 0; i < 50; i++ {
		x := a.Sample(append([]float32(nil), logits...))
		y := b.Sample(append([]float32(nil), logits...))
		if x != y {
			t.Fatalf("draw %d: %d vs %d with the same seed", i, x, y)
		}
	}
}

func TestFiltersRestrictSupport(t *testing.T) {
	logits := []float32{10, 9, 1, 0, -5}
	for _, tc := range []struct {
		name    string
		cfg     request.Sampling
		allowed map[int]bool
	}{
		{"topk2", request.Sampling{Temperature: 1, TopK: 2}, map[int]bool{0: true, 1: true}},
		{"topk1", request.Sampling{Temperature: 5, TopK: 1}, map[int]bool{0: true}},
		{"topp", request.Sampling{Temperature: 1, TopP: 0.5}, map[int]bool{0: true}},
		{"minp", request.Sampling{Temperature: 1, MinP: 0.2}, map[int]bool{0: true, 1: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[int]bool{}
			for seed := uint64(0); seed < 300; seed++ {
				cfg := tc.cfg
				cfg.Seed = seed
				got := New(cfg).Sample(append([]float32(nil), logits...))
				if !tc.allowed[got] {
					t.Fatalf("seed %d sampled %d, outside %v", seed, got, tc.allowed)
				}
				seen[got] = true
			}
			if len(seen) != len(tc.allowed) {
				t.Errorf("sampled %v over 300 seeds; expected every one of %v", seen, tc.allowed)
			}
		})
	}
}

func TestRepetitionPenalty(t *testing.T) {
	s := New(request.Sampling{RepetitionPenalty: 2})
	s.Accept(0)
	if got := s.Sample([]float32{3, 2, 1}); got != 1 {
		t.Fatalf("penalised token still chosen: got %d", got)
	}
}

func BenchmarkSample32000(b *testing.B) {
	logits := make([]float32, 32000)
	for i := range logits {
		logits[i] = float32((i*7919)%1000) / 100
	}
	for _, cfg := range []request.Sampling{{}, {Temperature: 0.8, TopP: 0.95}, {Temperature: 0.8, TopK: 40}} {
		s := New(cfg)
		buf := make([]float32, len(logits))
		b.Run("", func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				copy(buf, logits)
				s.Sample(buf)
			}
		})
	}
}
