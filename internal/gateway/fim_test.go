package gateway_test

import (
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/gatewaytest"
)

// TestSuffix: with a model that has fill-in-the-middle tokens, a
// completion with a suffix is sent as [BOS] PRE prompt SUF suffix MID
// (texts tokenized without special tokens, so they cannot forge a marker);
// without them, or with a prompt of token ids, or a suffix that is not a
// string, it is a 400 naming suffix. An empty or null suffix changes
// nothing.
func TestSuffix(t *testing.T) {
	const pre, suf, mid = 200, 201, 202
	fake := gatewaytest.NewFake()
	fake.FIMTokens = []int{pre, suf, mid}
	h := newHarness(t, fake)
	r := h.post("/v1/completions", keyAlpha, map[string]any{"prompt": "def f(", "suffix": "  return x", "max_tokens": 4})
	if r.status != 200 {
		t.Fatalf("status %d: %s", r.status, r.body)
	}
	text := func(s string) []int {
		ids, err := fake.Tokenize(s, false, false)
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	want := slices.Concat([]int{gatewaytest.BOS, pre}, text("def f("), []int{suf}, text("  return x"), []int{mid})
	if got := fake.LastParams().Prompt; !slices.Equal(got, want) {
		t.Fatalf("prompt %v, want %v", got, want)
	}
	for _, suffix := range []any{"", nil} {
		if r := h.post("/v1/completions", keyAlpha, map[string]any{"prompt": "def f(", "suffix": suffix, "max_tokens": 4}); r.status != 200 ||
			!slices.Equal(fake.LastParams().Prompt, append([]int{gatewaytest.BOS}, text("def f(")...)) {
			t.Errorf("suffix %v: %d, prompt %v", suffix, r.status, fake.LastParams().Prompt)
		}
	}
	for _, tc := range []struct {
		name string
		body map[string]any
	}{
		{"a suffix that is not a string", map[string]any{"prompt": "x", "suffix": 3}},
		{"token ids with a suffix", map[string]any{"prompt": []int{5, 6}, "suffix": "y"}},
	} {
		if r := h.post("/v1/completions", keyAlpha, tc.body); r.status != 400 || errorParam(t, r.body) != "suffix" {
			t.Errorf("%s: %d %s", tc.name, r.status, r.body)
		}
	}
	plain := newHarness(t, nil)
	if r := plain.post("/v1/completions", keyAlpha, map[string]any{"prompt": "x", "suffix": "y"}); r.status != 400 || errorParam(t, r.body) != "suffix" || errorCode(t, r.body) != "unsupported_parameter" {
		t.Errorf("a model without FIM tokens: %d %s", r.status, r.body)
	}
}
