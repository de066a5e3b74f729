package model_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
)

// TestLlamaSlidingWindowFromMetadata checks the Mistral path: a "llama"
// file carrying llama.attention.sliding_window loads with that window on
// every layer and computes what the windowed model computes (itself
// checked against the reference in TestSlidingWindowMatchesReference),
// which differs from full attention; 0 or no key means full attention.
func TestLlamaSlidingWindowFromMetadata(t *testing.T) {
	base := builtin(t, "tiny")
	f := parse(t, builtinImage(t, "tiny"))
	load := func(kv map[string]any) *model.Model {
		t.Helper()
		m, err := model.FromGGUF(parse(t, rewrite(t, f, ggufEdit{setKV: kv})))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	toks := tokens(5, 30, base.Config.Vocab)
	full := runChunks(t, base, kvcache.F32, 16, 0, toks)

	m := load(map[string]any{"llama.attention.sliding_window": uint32(7)})
	if m.Config.SlidingWindow != 7 || m.Config.WindowedLayers != nil {
		t.Fatalf("window %d over layers %v, want 7 over all", m.Config.SlidingWindow, m.Config.WindowedLayers)
	}
	got := runChunks(t, m, kvcache.F32, 16, 0, toks)
	want := runChunks(t, windowed(base, 7, nil), kvcache.F32, 16, 0, toks)
	if d, at := worstAt(got, want); d != 0 {
		t.Errorf("position %d: the file's window computes other logits than Config.SlidingWindow = 7 (%.3g)", at, d)
	}
	if d, _ := worstAt(got, full); d < 1e-3 {
		t.Errorf("a window of 7 over 30 positions changed the logits by only %.3g", d)
	}

	zero := load(map[string]any{"llama.attention.sliding_window": uint32(0)})
	if zero.Config.SlidingWindow != 0 {
		t.Fatalf("sliding_window 0 loaded as window %d", zero.Config.SlidingWindow)
	}
	if d, at := worstAt(runChunks(t, zero, kvcache.F32, 16, 0, toks), full); d != 0 {
		t.Errorf("sliding_window 0 changed position %d by %.3g", at, d)
	}
}

// TestLoadNamesWhatIsMissing checks that a file this engine cannot run
// correctly is refused with an error that says what is missing, rather
// than loaded with a feature silently dropped (a window ignored) or failed
// on a tensor name that explains nothing.
func TestLoadNamesWhatIsMissing(t *testing.T) {
	f := parse(t, builtinImage(t, "tiny"))
	cases := []struct {
		name string
		kv   map[string]any
		err  error
		msg  []string
	}{
		{"window is a string", map[string]any{"llama.attention.sliding_window": "4096"}, model.ErrBadConfig,
			[]string{"llama.attention.sliding_window", "not a non-negative integer"}},
		{"window is negative", map[string]any{"llama.attention.sliding_window": int32(-1)}, model.ErrBadConfig,
			[]string{"llama.attention.sliding_window"}},
		{"window is a float", map[string]any{"llama.attention.sliding_window": float32(4096)}, model.ErrBadConfig,
			[]string{"llama.attention.sliding_window"}},
		{"window 2^40", map[string]any{"llama.attention.sliding_window": uint64(1 << 40)}, model.ErrBadConfig,
			[]string{"llama.attention.sliding_window", "absurd"}},
		{"mixture of experts", map[string]any{"llama.expert_count": uint32(8), "llama.expert_used_count": uint32(2)}, model.ErrUnsupportedArch,
			[]string{"llama.expert_count = 8", "mixture-of-experts"}},
		{"rope scaling yarn", map[string]any{"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": float32(4)}, model.ErrBadConfig,
			[]string{`rope scaling "yarn"`, "not supported"}},
		{"architecture mistral3", map[string]any{"general.architecture": "mistral3"}, model.ErrUnsupportedArch,
			[]string{`"mistral3"`, "YaRN"}},
		{"architecture gemma3", map[string]any{"general.architecture": "gemma3"}, model.ErrUnsupportedArch,
			[]string{`"gemma3"`, "query/key norms"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := model.FromGGUF(parse(t, rewrite(t, f, ggufEdit{setKV: tc.kv})))
			if err == nil {
				t.Fatal("the file loaded")
			}
			if !errors.Is(err, tc.err) {
				t.Errorf("err = %v, want it to wrap %v", err, tc.err)
			}
			for _, s := range tc.msg {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
		})
	}
}
