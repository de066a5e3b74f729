package model_test

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/sample"
)

// batchTol is the largest relative difference allowed between a sequence
// computed inside a batch and computed alone. Every kernel works row by
// row, so the two should agree to the last bit; the tolerance only leaves
// room for a kernel that tiles rows differently.
const batchTol = 1e-5

// TestBatchEquivalence checks the property continuous batching rests on:
// a sequence's logits do not depend on which other sequences share its
// step. Three sequences with different prompts run one step together (one
// prefill chunk and two decodes, in both orders), then a step of three
// decodes; each must match the same sequence run alone.
func TestBatchEquivalence(t *testing.T) {
	for _, name := range []string{"tiny", "tiny-q8_0", "tiny-f16"} {
		for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
			for _, prefillFirst := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/kv-%v/prefill-first=%v", name, dt, prefillFirst), func(t *testing.T) {
					t.Parallel()
					testBatchEquivalence(t, builtin(t, name), dt, prefillFirst)
				})
			}
		}
	}
}

func testBatchEquivalence(t *testing.T, m *model.Model, dt kvcache.DType, prefillFirst bool) {
	vocab := m.Config.Vocab
	promptA := tokens(1, 37, vocab) // chunk 1: 20 tokens, chunk 2 (in the batch): 17
	promptB := tokens(2, 9, vocab)
	promptC := tokens(3, 33, vocab)

	// Alone: each sequence in its own steps.
	solo := newRunner(t, m, dt, 64)
	sa, sb, sc := solo.seq("a"), solo.seq("b"), solo.seq("c")
	solo.step(part{sa, promptA[:20], model.LogitsNone})
	wantA := solo.step(part{sa, promptA[20:], model.LogitsAll})[0]
	lb := solo.step(part{sb, promptB, model.LogitsLast})[0]
	b1 := sample.Argmax(lb)
	wantB := solo.step(part{sb, []int{b1}, model.LogitsLast})[0]
	lc := solo.step(part{sc, promptC, model.LogitsLast})[0]
	c1 := sample.Argmax(lc)
	wantC := solo.step(part{sc, []int{c1}, model.LogitsLast})[0]
	// The sequences must really differ, or a mix-up between them could
	// not show.
	if d := relDiff(wantB, wantC); d <= batchTol {
		t.Fatalf("sequences B and C have the same logits (%.3g): the test has no power", d)
	}
	a2, b2, c2 := sample.Argmax(wantA[(len(promptA)-21)*vocab:]), sample.Argmax(wantB), sample.Argmax(wantC)
	want2 := [][]float32{
		solo.step(part{sa, []int{a2}, model.LogitsLast})[0],
		solo.step(part{sb, []int{b2}, model.LogitsLast})[0],
		solo.step(part{sc, []int{c2}, model.LogitsLast})[0],
	}

	// Together: the same sequences in a fresh pool, set up alone, then
	// one mixed step and one all-decode step.
	mix := newRunner(t, m, dt, 64)
	ma, mb, mc := mix.seq("a"), mix.seq("b"), mix.seq("c")
	mix.step(part{ma, promptA[:20], model.LogitsNone})
	mix.step(part{mb, promptB, model.LogitsNone})
	mix.step(part{mc, promptC, model.LogitsNone})
	pa := part{ma, promptA[20:], model.LogitsAll}
	pb := part{mb, []int{b1}, model.LogitsLast}
	pc := part{mc, []int{c1}, model.LogitsLast}
	var gotA, gotB, gotC []float32
	if prefillFirst {
		out := mix.step(pa, pb, pc)
		gotA, gotB, gotC = out[0], out[1], out[2]
	} else {
		out := mix.step(pb, pc, pa)
		gotB, gotC, gotA = out[0], out[1], out[2]
	}
	for r := 0; r < len(promptA)-20; r++ {
		if d := relDiff(gotA[r*vocab:(r+1)*vocab], wantA[r*vocab:(r+1)*vocab]); d > batchTol {
			t.Errorf("prefill chunk row %d: batched logits differ from solo by %.3g (relative) > %g", r, d, batchTol)
		}
	}
	if d := relDiff(gotB, wantB); d > batchTol {
		t.Errorf("decode B: batched logits differ from solo by %.3g > %g", d, batchTol)
	}
	if d := relDiff(gotC, wantC); d > batchTol {
		t.Errorf("decode C: batched logits differ from solo by %.3g > %g", d, batchTol)
	}
	got2 := mix.step(part{ma, []int{a2}, model.LogitsLast}, part{mb, []int{b2}, model.LogitsLast}, part{mc, []int{c2}, model.LogitsLast})
	for i := range got2 {
		if d := relDiff(got2[i], want2[i]); d > batchTol {
			t.Errorf("second step, sequence %c: batched logits differ from solo by %.3g > %g", 'A'+i, d, batchTol)
		}
	}
	if err := mix.kv.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// TestForwardReusing: logits computed into the Scratch's buffer have the
// bits of Forward's fresh ones, step after step, as the buffer's rows are
// reused by batches of other sizes (a prefill's every row, then decodes of
// two sequences, then of one), and every row returned ends at its own
// end: nothing of another row or an earlier step is reachable through it.
func TestForwardReusing(t *testing.T) {
	m := builtin(t, "tiny-q8_0")
	vocab := m.Config.Vocab
	fresh, reused := newRunner(t, m, kvcache.F16, 64), newRunner(t, m, kvcache.F16, 64)
	reused.reuse = true
	fa, fb := fresh.seq("a"), fresh.seq("b")
	ra, rb := reused.seq("a"), reused.seq("b")
	steps := [][2][]part{
		{{{fa, tokens(1, 21, vocab), model.LogitsAll}, {fb, tokens(2, 9, vocab), model.LogitsLast}},
			{{ra, tokens(1, 21, vocab), model.LogitsAll}, {rb, tokens(2, 9, vocab), model.LogitsLast}}},
		{{{fa, []int{5}, model.LogitsLast}, {fb, []int{7}, model.LogitsLast}},
			{{ra, []int{5}, model.LogitsLast}, {rb, []int{7}, model.LogitsLast}}},
		{{{fb, []int{11}, model.LogitsLast}}, {{rb, []int{11}, model.LogitsLast}}},
	}
	for k, st := range steps {
		want := fresh.step(st[0]...)
		got := reused.step(st[1]...)
		for i := range want {
			if len(got[i]) != len(want[i]) || cap(got[i]) != len(got[i]) {
				t.Fatalf("step %d, input %d: %d logits (capacity %d), want %d", k, i, len(got[i]), cap(got[i]), len(want[i]))
			}
			for j := range want[i] {
				if math.Float32bits(got[i][j]) != math.Float32bits(want[i][j]) {
					t.Fatalf("step %d, input %d, logit %d: %v, Forward gives %v", k, i, j, got[i][j], want[i][j])
				}
			}
		}
	}
	if _, err := m.ForwardReusing(nil, nil, nil); err == nil {
		t.Error("ForwardReusing without a Scratch succeeded")
	}
}

// TestChunkedPrefill checks that a prompt fed in chunks of any size,
// crossing page boundaries anywhere, gives the logits of feeding it at
// once.
func TestChunkedPrefill(t *testing.T) {
	for _, name := range []string{"tiny", "tiny-q8_0"} {
		for _, dt := range []kvcache.DType{kvcache.F32, kvcache.F16} {
			t.Run(fmt.Sprintf("%s/kv-%v", name, dt), func(t *testing.T) {
				t.Parallel()
				m := builtin(t, name)
				vocab := m.Config.Vocab
				prompt := tokens(7, 100, vocab)
				ref := newRunner(t, m, dt, 16)
				want := ref.step(part{ref.seq("t"), prompt, model.LogitsAll})[0]
				for _, chunk := range []int{1, 7, 16, 100} {
					r := newRunner(t, m, dt, 16)
					s := r.seq("t")
					var got []float32
					for lo := 0; lo < len(prompt); lo += chunk {
						hi := min(lo+chunk, len(prompt))
						got = append(got, r.step(part{s, prompt[lo:hi], model.LogitsAll})[0]...)
					}
					if len(got) != len(want) {
						t.Fatalf("chunk %d: %d logits, want %d", chunk, len(got), len(want))
					}
					worst, at := 0.0, 0
					for p := range prompt {
						if d := relDiff(got[p*vocab:(p+1)*vocab], want[p*vocab:(p+1)*vocab]); d > worst {
							worst, at = d, p
						}
					}
					if worst > batchTol {
						t.Errorf("chunk %d: position %d differs from one-shot prefill by %.3g (relative) > %g", chunk, at, worst, batchTol)
					}
				}
			})
		}
	}
}

// TestForwardRejectsBadInput checks that every malformed step is refused
// with an error before anything is computed or written, and that the pool
// and the model stay usable afterwards.
func TestForwardRejectsBadInput(t *testing.T) {
	m := builtin(t, "tiny-short") // 256-position context
	other := builtin(t, "tiny")   // a different KV layout
	vocab := m.Config.Vocab
	cases := []struct {
		name  string
		build func(r *runner) []model.Input
		err   error
		msg   string
	}{
		{"empty step", func(r *runner) []model.Input { return nil }, model.ErrEmptyStep, "empty step"},
		{"token -1", func(r *runner) []model.Input {
			return []model.Input{{Tokens: []int{1, -1}, View: begin(r, r.seq("t"), 2), Logits: model.LogitsLast}}
		}, model.ErrBadToken, "-1"},
		{"token = vocab", func(r *runner) []model.Input {
			return []model.Input{{Tokens: []int{vocab}, View: begin(r, r.seq("t"), 1), Logits: model.LogitsLast}}
		}, model.ErrBadToken, fmt.Sprint(vocab)},
		{"token huge", func(r *runner) []model.Input {
			return []model.Input{{Tokens: []int{1 << 40}, View: begin(r, r.seq("t"), 1), Logits: model.LogitsLast}}
		}, model.ErrBadToken, "out of range"},
		{"bad token in the second input", func(r *runner) []model.Input {
			return []model.Input{
				{Tokens: []int{1, 2, 3}, View: begin(r, r.seq("a"), 3), Logits: model.LogitsLast},
				{Tokens: []int{vocab + 5}, View: begin(r, r.seq("b"), 1), Logits: model.LogitsLast},
			}
		}, model.ErrBadToken, fmt.Sprint(vocab + 5)},
		{"fewer tokens than the window", func(r *runner) []model.Input {
			return []model.Input{{Tokens: []int{1, 2}, View: begin(r, r.seq("t"), 3), Logits: model.LogitsLast}}
		}, model.ErrBadInput, "2 tokens for a window of 3"},
		{"more tokens than the window", func(r *runner) []model.Input {
			return []model.Input{{Tokens: []int{1, 2, 3, 4}, View: begin(r, r.seq("t"), 3), Logits: model.LogitsLast}}
		}, model.ErrBadInput, "4 tokens for a window of 3"},
		{"no tokens", func(r *runner) []model.Input {
			return []model.Input{{Tokens: nil, View: begin(r, r.seq("t"), 1), Logits: model.LogitsLast}}
		}, model.ErrBadInput, "0 tokens"},
		{"nil view", func(r *runner) []model.Input {
			return []model.Input{{Tokens: []int{1}, Logits: model.LogitsLast}}
		}, model.ErrBadInput, "window of -1"},
		{"beyond the context length", func(r *runner) []model.Input {
			s := r.seq("t")
			// Mark the whole window written (without computing it: the
			// step below must be refused before any read).
			if err := r.kv.Commit(begin(r, s, 256)); err != nil {
				r.t.Fatal(err)
			}
			return []model.Input{{Tokens: []int{1}, View: begin(r, s, 1), Logits: model.LogitsLast}}
		}, model.ErrBadInput, "context length 256"},
		{"one prompt longer than the context", func(r *runner) []model.Input {
			return []model.Input{{Tokens: tokens(1, 300, vocab), View: begin(r, r.seq("t"), 300), Logits: model.LogitsLast}}
		}, model.ErrBadInput, "position 300"},
		{"view of a pool laid out for another model", func(r *runner) []model.Input {
			p := newPool(r.t, other, kvcache.F32, 16, 4)
			s := p.NewSequence(r.seq("x").Owner())
			if err := p.Reserve(s, 2); err != nil {
				r.t.Fatal(err)
			}
			v, err := p.Begin(s, 2)
			if err != nil {
				r.t.Fatal(err)
			}
			return []model.Input{{Tokens: []int{1, 2}, View: v, Logits: model.LogitsLast}}
		}, model.ErrKVLayout, "layout"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRunner(t, m, kvcache.F32, 40)
			in := tc.build(r)
			out, err := forwardNoPanic(m, r, in)
			if !errors.Is(err, tc.err) {
				t.Fatalf("Forward: err = %v, want %v", err, tc.err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q does not mention %q", err, tc.msg)
			}
			if out != nil {
				t.Errorf("Forward returned logits with its error")
			}
			// Nothing was committed, so the pool is consistent and a
			// good step still works.
			if err := r.kv.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
			r.step(part{r.seq("after"), []int{1, 2, 3}, model.LogitsLast})
		})
	}
}

func begin(r *runner, s *kvcache.Sequence, n int) *kvcache.View {
	r.t.Helper()
	if err := r.kv.Reserve(s, n); err != nil {
		r.t.Fatal(err)
	}
	v, err := r.kv.Begin(s, n)
	if err != nil {
		r.t.Fatal(err)
	}
	return v
}

// forwardNoPanic turns a panic into an error naming it, so that a table
// case that panics fails on its own instead of ending the run.
func forwardNoPanic(m *model.Model, r *runner, in []model.Input) (out [][]float32, err error) {
	defer func() {
		if p := recover(); p != nil {
			out, err = nil, fmt.Errorf("Forward panicked: %v", p)
		}
	}()
	return m.Forward(r.compute, in, &r.scratch)
}

// TestForwardStaleView checks that a View which went stale (its sequence
// began another step, or was released) is refused with an error in
// production mode, where invariant failures are counted rather than
// panicked on, and that the pool counts the attempt as a violation.
func TestForwardStaleView(t *testing.T) {
	prev := invariants.SetStrict(false)
	defer invariants.SetStrict(prev)
	m := builtin(t, "tiny")
	for _, tc := range []struct {
		name  string
		stale func(r *runner, s *kvcache.Sequence)
	}{
		{"begun again", func(r *runner, s *kvcache.Sequence) { begin(r, s, 2) }},
		{"released", func(r *runner, s *kvcache.Sequence) { r.kv.Release(s) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRunner(t, m, kvcache.F32, 8)
			s := r.seq("t")
			v := begin(r, s, 2)
			tc.stale(r, s)
			before := r.kv.Violations()
			out, err := forwardNoPanic(m, r, []model.Input{{Tokens: []int{1, 2}, View: v, Logits: model.LogitsLast}})
			if !errors.Is(err, model.ErrBadInput) || out != nil {
				t.Fatalf("Forward on a stale view: %v, want ErrBadInput", err)
			}
			if r.kv.Violations() == before {
				t.Error("the stale read was not counted as a violation")
			}
		})
	}
}
