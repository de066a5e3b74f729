package sample

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/request"
)

// naiveLogprobs is the definition: log(exp(l_i) / Σ exp(l_j)), in float64,
// and every token sorted by it (ties by id).
func naiveLogprobs(logits []float32) ([]float64, []int) {
	var sum float64
	for _, l := range logits {
		sum += math.Exp(float64(l))
	}
	lp := make([]float64, len(logits))
	order := make([]int, len(logits))
	for i, l := range logits {
		lp[i] = float64(l) - math.Log(sum)
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case lp[a] > lp[b]:
			return -1
		case lp[a] < lp[b]:
			return 1
		}
		return 0
	})
	return lp, order
}

func TestLogprobs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int, scale float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = (rng.Float32()*2 - 1) * scale
		}
		return v
	}
	for _, tc := range []struct {
		name   string
		logits []float32
		tok, k int
	}{
		{"one token", []float32{3}, 0, 1},
		{"uniform", []float32{1, 1, 1, 1}, 2, 3},
		{"ties keep lower ids first", []float32{0, 5, 5, 1, 5}, 3, 2},
		{"k above vocabulary", []float32{1, 2, 3}, 0, 20},
		{"k zero", []float32{1, 2, 3}, 1, 0},
		{"random 1000", random(1000, 10), 17, 20},
		{"random large logits", random(500, 80), 3, 5},
		{"one dominant", append(random(100, 1), 200), 0, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got request.Logprobs
			if err := Logprobs(tc.logits, tc.tok, tc.k, &got); err != nil {
				t.Fatal(err)
			}
			want, order := naiveLogprobs(tc.logits)
			if d := math.Abs(float64(got.Logprob) - want[tc.tok]); d > 1e-5*math.Max(1, math.Abs(want[tc.tok])) {
				t.Errorf("logprob of %d = %v, want %v", tc.tok, got.Logprob, want[tc.tok])
			}
			k := min(tc.k, len(tc.logits))
			if len(got.Top) != k {
				t.Fatalf("%d top entries, want %d", len(got.Top), k)
			}
			for j, e := range got.Top {
				if e.ID != order[j] {
					t.Errorf("top %d is token %d, want %d", j, e.ID, order[j])
				}
				if e.Logprob > 0 || math.IsInf(float64(e.Logprob), 0) {
					t.Errorf("top %d logprob %v", j, e.Logprob)
				}
			}
			if err := got.Check(tc.k, len(tc.logits)); err != nil {
				t.Errorf("the result fails its own protocol check: %v", err)
			}
			var sum float64
			for _, l := range want {
				sum += math.Exp(l)
			}
			if math.Abs(sum-1) > 1e-9 {
				t.Fatalf("reference does not normalise: %v", sum)
			}
		})
	}
}

func TestLogprobsRefuses(t *testing.T) {
	var dst request.Logprobs
	for _, tc := range []struct {
		name   string
		logits []float32
		tok    int
		want   error
	}{
		{"NaN", []float32{1, float32(math.NaN())}, 0, ErrNonFinite},
		{"+Inf", []float32{1, float32(math.Inf(1))}, 0, ErrNonFinite},
		{"empty", nil, 0, ErrNonFinite},
		{"token outside", []float32{1, 2}, 2, ErrNoCandidate},
	} {
		if err := Logprobs(tc.logits, tc.tok, 2, &dst); !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestLogprobsExtreme: logits far apart stay finite and <= 0.
func TestLogprobsExtreme(t *testing.T) {
	logits := []float32{math.MaxFloat32, -math.MaxFloat32, 0}
	var got request.Logprobs
	if err := Logprobs(logits, 1, 3, &got); err != nil {
		t.Fatal(err)
	}
	if err := got.Check(3, 3); err != nil {
		t.Fatal(err)
	}
	if got.Logprob != -math.MaxFloat32 || got.Top[0].Logprob != 0 {
		t.Fatalf("got %+v", got)
	}
}

func BenchmarkLogprobs(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, 49152)
	for i := range logits {
		logits[i] = rng.Float32() * 20
	}
	var dst request.Logprobs
	for b.Loop() {
		_ = Logprobs(logits, 5, 20, &dst)
	}
}

// TestExp32: exp32 is within 3e-7 of e^x (relative) over the range it
// serves, 0 below it, exactly 1 at 0.
func TestExp32(t *testing.T) {
	if exp32(0) != 1 || exp32(-100) != 0 || exp32(float32(math.Inf(-1))) != 0 {
		t.Fatalf("exp32(0) = %v, exp32(-100) = %v", exp32(0), exp32(-100))
	}
	worst, at := 0.0, float32(0)
	for x := float32(0); x > -87; x -= 0.00137 {
		want := math.Exp(float64(x))
		if d := math.Abs(float64(exp32(x))-want) / want; d > worst {
			worst, at = d, x
		}
	}
	if worst > 3e-7 {
		t.Fatalf("exp32 relative error %.3g at %v", worst, at)
	}
	t.Logf("largest relative error %.3g (at %v)", worst, at)
}
