package sample

import (
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

// must samples and fails the test on an error.
func must(t *testing.T, s *Sampler, logits []float32) int {
	t.Helper()
	tok, err := s.Sample(logits)
	if err != nil {
		t.Fatalf("Sample: %v", err)
	}
	return tok
}

func TestGreedyPicksFirstMax(t *testing.T) {
	for _, tc := range []struct {
		logits []float32
		want   int
	}{
		{[]float32{1, 3, 2}, 1},
		{[]float32{5, 5, 1}, 0},
		{[]float32{-1, -3, -0.5}, 2},
	} {
		if got := must(t, New(request.Sampling{}), append([]float32(nil), tc.logits...)); got != tc.want {
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
		x := must(t, a, append([]float32(nil), logits...))
		y := must(t, b, append([]float32(nil), logits...))
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
				got := must(t, New(cfg), append([]float32(nil), logits...))
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
	if got := must(t, s, []float32{3, 2, 1}); got != 1 {
		t.Fatalf("penalised token still chosen: got %d", got)
	}
}

// TestTinyTemperature: a temperature whose inverse overflows float32 used to
// make every tempered logit Inf-Inf = NaN and return the last candidate, the
// least likely token, with HTTP 200. Below MinTemperature the draw is
// greedy; just above it, it is the argmax as well (the runner-up is e^-1e5
// less likely).
func TestTinyTemperature(t *testing.T) {
	logits := []float32{0.5, 3, 2.9, -7, 1}
	for _, temp := range []float32{1e-38, 1e-30, 1e-8, MinTemperature / 2, MinTemperature, 1e-4} {
		for _, cfg := range []request.Sampling{
			{Temperature: temp},
			{Temperature: temp, TopP: 0.9},
			{Temperature: temp, TopK: 3},
			{Temperature: temp, MinP: 0.1},
		} {
			for seed := range uint64(20) {
				cfg.Seed = seed
				if got := must(t, New(cfg), slices.Clone(logits)); got != 1 {
					t.Fatalf("%+v sampled %d, want the argmax 1", cfg, got)
				}
			}
		}
	}
}

// TestNonFiniteLogitsAreAnError: NaN or an infinity in the logits is an
// error on every path, never a token.
func TestNonFiniteLogitsAreAnError(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, logits := range [][]float32{
		{nan, 1, 2}, {1, nan, 2}, {1, 2, nan}, {1, inf, 2}, {float32(math.Inf(-1)), 1, 2}, {},
	} {
		for _, cfg := range []request.Sampling{
			{}, {Temperature: 1}, {Temperature: 0.7, TopP: 0.9}, {Temperature: 1, TopK: 2}, {Temperature: 1, MinP: 0.5},
			{RepetitionPenalty: 1.5},
		} {
			s := New(cfg)
			s.Accept(0)
			if tok, err := s.Sample(slices.Clone(logits)); !errors.Is(err, ErrNonFinite) {
				t.Errorf("%+v on %v: token %d, err %v; want ErrNonFinite", cfg, logits, tok, err)
			}
		}
	}
}

func BenchmarkSample32000(b *testing.B) {
	flat := make([]float32, 32000)
	peaked := make([]float32, 32000)
	for i := range flat {
		x := float32((i*7919)%1000) / 1000
		flat[i] = 10 * x
		peaked[i] = 30 * x * x * x // a few dozen tokens hold most of the mass
	}
	for _, tc := range []struct {
		name   string
		logits []float32
		cfg    request.Sampling
	}{
		{"greedy", flat, request.Sampling{}},
		{"topp0.95/flat", flat, request.Sampling{Temperature: 0.8, TopP: 0.95}},
		{"topp0.95/peaked", peaked, request.Sampling{Temperature: 0.8, TopP: 0.95}},
		{"topk40", flat, request.Sampling{Temperature: 0.8, TopK: 40}},
	} {
		cfg, logits := tc.cfg, tc.logits
		s := New(cfg)
		buf := make([]float32, len(logits))
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				copy(buf, logits)
				s.Sample(buf)
			}
		})
	}
}

// TestNucleusMatchesFullSort: the prefix search keeps exactly the tokens a
// full sort and cumulative cut keeps, on peaked and flat distributions.
func TestNucleusMatchesFullSort(t *testing.T) {
	for _, shape := range []string{"peaked", "flat"} {
		logits := make([]float32, 5000)
		for i := range logits {
			x := float32((i*7919)%1000) / 1000
			if shape == "peaked" {
				x = x * x * x * 30
			}
			logits[i] = x
		}
		for _, tp := range []float32{0.1, 0.5, 0.9, 0.99} {
			cfg := request.Sampling{Temperature: 0.7, TopP: tp}
			allowed := map[int]bool{}
			// Reference: full sort, float64 softmax over everything, cut.
			idx := make([]int, len(logits))
			for i := range idx {
				idx[i] = i
			}
			slices.SortFunc(idx, func(a, b int) int {
				if logits[a] != logits[b] {
					if logits[a] > logits[b] {
						return -1
					}
					return 1
				}
				return a - b
			})
			var sum float64
			for _, l := range logits {
				sum += math.Exp(float64(l-logits[idx[0]]) / 0.7)
			}
			var cum float64
			for _, i := range idx {
				allowed[i] = true
				cum += math.Exp(float64(logits[i]-logits[idx[0]])/0.7) / sum
				if cum >= float64(tp) {
					break
				}
			}
			s := New(cfg)
			got := s.nucleus(logits, 1/float64(cfg.Temperature), func(a, b int) int {
				if logits[a] != logits[b] {
					if logits[a] > logits[b] {
						return -1
					}
					return 1
				}
				return a - b
			})
			if len(got) < len(allowed)-1 || len(got) > len(allowed)+1 {
				t.Errorf("%s top_p %g: nucleus of %d tokens, full sort keeps %d", shape, tp, len(got), len(allowed))
			}
			for _, i := range got[:len(got)-1] {
				if !allowed[i] {
					t.Errorf("%s top_p %g: token %d kept but outside the nucleus", shape, tp, i)
				}
			}
		}
	}
}

// TestLogitBias: a bias moves its token's logit before the draw, greedy
// included; -MaxBias bans the token on every path, and banning every token
// is an error, not a token.
func TestLogitBias(t *testing.T) {
	logits := []float32{3, 2, 1, 0}
	ban := func(toks ...int) []request.TokenBias {
		var b []request.TokenBias
		for _, tok := range toks {
			b = append(b, request.TokenBias{Token: tok, Bias: -request.MaxBias})
		}
		return b
	}
	for _, tc := range []struct {
		name string
		bias []request.TokenBias
		want int
	}{
		{"none", nil, 0},
		{"raise", []request.TokenBias{{Token: 3, Bias: 3.5}}, 3},
		{"lower", []request.TokenBias{{Token: 0, Bias: -1.5}}, 1},
		{"ban", ban(0), 1},
		{"ban two", ban(0, 1), 2},
		{"max raise", []request.TokenBias{{Token: 2, Bias: request.MaxBias}}, 2},
		{"out of range skipped", []request.TokenBias{{Token: -1, Bias: 50}, {Token: 99, Bias: 50}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := must(t, New(request.Sampling{LogitBias: tc.bias}), slices.Clone(logits)); got != tc.want {
				t.Errorf("greedy picked %d, want %d", got, tc.want)
			}
		})
	}
	// Sampled, hot and with every filter, a banned token is never drawn.
	for _, cfg := range []request.Sampling{
		{Temperature: 2}, {Temperature: 2, TopK: 2}, {Temperature: 2, TopP: 0.99}, {Temperature: 2, MinP: 0.01},
	} {
		cfg.LogitBias = ban(0, 2)
		seen := map[int]int{}
		for seed := range uint64(400) {
			cfg.Seed = seed
			seen[must(t, New(cfg), slices.Clone(logits))]++
		}
		if seen[0] != 0 || seen[2] != 0 || seen[1] == 0 {
			t.Errorf("%+v: draws %v; tokens 0 and 2 are banned", cfg, seen)
		}
	}
	// A ban is not -100 added: it holds however far ahead the token is.
	for _, cfg := range []request.Sampling{{LogitBias: ban(0)}, {Temperature: 1, LogitBias: ban(0)}, {Temperature: 1, TopK: 1, LogitBias: ban(0)}} {
		if got := must(t, New(cfg), []float32{500, 0, -60}); got != 1 {
			t.Errorf("%+v: banned token 500 logits ahead: picked %d", cfg, got)
		}
	}
	for _, cfg := range []request.Sampling{{LogitBias: ban(0, 1, 2, 3)}, {Temperature: 1, LogitBias: ban(0, 1, 2, 3)}} {
		if tok, err := New(cfg).Sample(slices.Clone(logits)); !errors.Is(err, ErrNoCandidate) {
			t.Errorf("%+v: every token banned gave %d, %v", cfg, tok, err)
		}
	}
}

// TestPresenceFrequencyPenalty checks OpenAI's formula exactly: logit -=
// count*frequency + (count > 0)*presence, counted over generated tokens
// only (a prompt token passed to Accept is not penalised).
func TestPresenceFrequencyPenalty(t *testing.T) {
	for _, tc := range []struct {
		name                string
		presence, frequency float32
		want                []float32
	}{
		{"presence", 0.5, 0, []float32{1.5, 1.5, 2, 2}},
		{"frequency", 0, 0.25, []float32{1.25, 1.75, 2, 2}},
		{"both", 0.5, 0.25, []float32{0.75, 1.25, 2, 2}},
		{"negative", -1, -2, []float32{9, 5, 2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := New(request.Sampling{PresencePenalty: tc.presence, FrequencyPenalty: tc.frequency})
			s.Accept(2) // the prompt's: never counted
			for _, tok := range []int{0, 1, 0, 0} {
				s.AcceptGenerated(tok)
			}
			logits := []float32{2, 2, 2, 2}
			s.adjust(logits)
			if !slices.Equal(logits, tc.want) {
				t.Errorf("adjusted logits %v, want %v", logits, tc.want)
			}
		})
	}
	// Greedy stays greedy: the argmax of the penalised logits.
	s := New(request.Sampling{PresencePenalty: 2})
	s.AcceptGenerated(0)
	if got := must(t, s, []float32{3, 2, 1}); got != 1 {
		t.Errorf("greedy with token 0 penalised picked %d, want 1", got)
	}
}

// TestAdjustedSeedReproduces: with a bias and every penalty, the same
// seed and history draw the same tokens.
func TestAdjustedSeedReproduces(t *testing.T) {
	cfg := request.Sampling{Temperature: 1, Seed: 9, RepetitionPenalty: 1.3, PresencePenalty: 0.4, FrequencyPenalty: 0.3,
		LogitBias: []request.TokenBias{{Token: 3, Bias: -request.MaxBias}, {Token: 5, Bias: 2}}}
	logits := make([]float32, 64)
	for i := range logits {
		logits[i] = float32(i%9) * 0.4
	}
	draw := func() []int {
		s := New(cfg)
		var out []int
		for i := range 40 {
			s.AcceptGenerated(i % 7)
			out = append(out, must(t, s, slices.Clone(logits)))
		}
		return out
	}
	a, b := draw(), draw()
	if !slices.Equal(a, b) || slices.Contains(a, 3) {
		t.Fatalf("draws %v and %v (token 3 is banned)", a, b)
	}
}

// TestAllowedMask: a token outside the allowed mask is never drawn, greedy
// or sampled, with the logit bias on top; an empty mask leaves nothing.
func TestAllowedMask(t *testing.T) {
	logits := func() []float32 { return []float32{9, 1, 2, 3, 0.5, 8, 1, 4} }
	mask := []uint64{1<<3 | 1<<7}
	for _, tc := range []struct {
		name string
		cfg  request.Sampling
		want map[int]bool
	}{
		{"greedy", request.Sampling{}, map[int]bool{7: true}},
		{"sampled", request.Sampling{Temperature: 2}, map[int]bool{3: true, 7: true}},
		{"top-k 1", request.Sampling{Temperature: 1, TopK: 1}, map[int]bool{7: true}},
		{"bias bans 7", request.Sampling{LogitBias: []request.TokenBias{{Token: 7, Bias: -request.MaxBias}}}, map[int]bool{3: true}},
		{"bias lifts 0, masked", request.Sampling{LogitBias: []request.TokenBias{{Token: 0, Bias: request.MaxBias}}}, map[int]bool{7: true}},
	} {
		seen := map[int]bool{}
		for seed := range 200 {
			tc.cfg.Seed = uint64(seed)
			s := New(tc.cfg)
			s.SetAllowed(mask)
			tok, err := s.Sample(logits())
			if err != nil {
				t.Fatalf("%s: %v", tc.name, err)
			}
			seen[tok] = true
		}
		if !reflect.DeepEqual(seen, tc.want) {
			t.Errorf("%s: drew %v, want %v", tc.name, seen, tc.want)
		}
	}
	s := New(request.Sampling{})
	s.SetAllowed([]uint64{0})
	if _, err := s.Sample(logits()); err != ErrNoCandidate {
		t.Errorf("empty mask: err %v, want ErrNoCandidate", err)
	}
	// Reset lifts the mask.
	s.Reset(request.Sampling{})
	if tok, err := s.Sample(logits()); err != nil || tok != 0 {
		t.Errorf("after Reset: %d %v, want 0", tok, err)
	}
}
