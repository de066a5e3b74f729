package tokenizer

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/gguf"
)

// ggufWith writes a vocab-only GGUF holding kvs and parses it back.
func ggufWith(t *testing.T, kvs ...any) *gguf.File {
	t.Helper()
	w := gguf.NewWriter()
	for i := 0; i < len(kvs); i += 2 {
		if err := w.SetKV(kvs[i].(string), kvs[i+1]); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestFromGGUFErrors(t *testing.T) {
	toks := []string{"<unk>", "<s>", "</s>", "a"}
	for _, tc := range []struct {
		name string
		kvs  []any
		err  error
		msg  string
	}{
		{"no model", []any{"tokenizer.ggml.tokens", toks}, ErrInvalid, "tokenizer.ggml.model"},
		{"model not a string", []any{"tokenizer.ggml.model", uint32(1), "tokenizer.ggml.tokens", toks}, ErrInvalid, "not a string"},
		{"no tokens", []any{"tokenizer.ggml.model", "llama"}, ErrInvalid, "tokenizer.ggml.tokens"},
		{"tokens not strings", []any{"tokenizer.ggml.model", "llama", "tokenizer.ggml.tokens", []float32{1}}, ErrInvalid, "not a string array"},
		{"scores wrong type", []any{"tokenizer.ggml.model", "llama", "tokenizer.ggml.tokens", toks, "tokenizer.ggml.scores", "x"}, ErrInvalid, "scores"},
		{"types wrong type", []any{"tokenizer.ggml.model", "llama", "tokenizer.ggml.tokens", toks, "tokenizer.ggml.token_type", []float32{1, 1, 1, 1}}, ErrInvalid, "token_type"},
		{"bos not an integer", []any{"tokenizer.ggml.model", "llama", "tokenizer.ggml.tokens", toks, "tokenizer.ggml.bos_token_id", "one"}, ErrInvalid, "bos_token_id"},
		{"flag not a bool", []any{"tokenizer.ggml.model", "llama", "tokenizer.ggml.tokens", toks, "tokenizer.ggml.add_bos_token", uint8(1)}, ErrInvalid, "add_bos_token"},
		{"bpe without merges", []any{"tokenizer.ggml.model", "gpt2", "tokenizer.ggml.tokens", toks}, ErrInvalid, "merges"},
		{"unknown pre", []any{"tokenizer.ggml.model", "gpt2", "tokenizer.ggml.pre", "tekken-9", "tokenizer.ggml.tokens", toks, "tokenizer.ggml.merges", []string{"a a"}}, ErrUnsupported, `"tekken-9"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromGGUF(ggufWith(t, tc.kvs...))
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v mentioning %s", err, tc.err, tc.msg)
			}
		})
	}
}

// TestFromGGUFDefaults checks llama.cpp's defaults for absent keys and the
// effect of add_space_prefix and an out-of-range special id.
func TestFromGGUFDefaults(t *testing.T) {
	toks := []string{"<unk>", "<s>", "</s>", "▁", "a", "▁a"}
	scores := []float32{0, 0, 0, -1, -2, -3}
	types := []int32{TypeUnknown, TypeControl, TypeControl, TypeNormal, TypeNormal, TypeNormal}
	base := []any{"tokenizer.ggml.model", "llama", "tokenizer.ggml.tokens", toks, "tokenizer.ggml.scores", scores, "tokenizer.ggml.token_type", types}
	tok, err := FromGGUF(ggufWith(t, base...))
	if err != nil {
		t.Fatal(err)
	}
	if tok.BOS() != 1 || tok.EOS() != 2 || !tok.AddsBOS() {
		t.Errorf("SPM defaults: BOS %d EOS %d addBOS %v", tok.BOS(), tok.EOS(), tok.AddsBOS())
	}
	if diff := cmp.Diff([]int{1, 5}, tok.Encode("a", true, false)); diff != "" {
		t.Errorf("space prefix on: %s", diff)
	}
	tok, err = FromGGUF(ggufWith(t, append(base, "tokenizer.ggml.add_space_prefix", false, "tokenizer.ggml.bos_token_id", uint32(99), "tokenizer.ggml.add_bos_token", false)...))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int{4}, tok.Encode("a", true, false)); diff != "" {
		t.Errorf("space prefix off, no BOS: %s", diff)
	}
	if tok.BOS() != 1 {
		t.Errorf("out-of-range bos_token_id should keep the default, got %d", tok.BOS())
	}
}

// TestConcurrentEncode runs Encode from several goroutines (meaningful
// under -race): a Tokenizer is shared by all requests.
func TestConcurrentEncode(t *testing.T) {
	toks := []*Tokenizer{loadVocab(t, "llama-spm"), loadVocab(t, "gpt-2"), loadTok512(t)}
	text := "Concurrent requests share one tokenizer: 你好 🦙 x=1234;"
	want := make([][]int, len(toks))
	for i, tok := range toks {
		want[i] = tok.Encode(text, true, true)
	}
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; n < 20; n++ {
				for i, tok := range toks {
					if got := tok.Encode(text, true, true); !cmp.Equal(got, want[i]) {
						errs <- tok.Model()
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for m := range errs {
		t.Errorf("%s: concurrent Encode differs", m)
	}
}

// FuzzNew builds tokenizers from arbitrary vocabulary data and encodes with
// them: nothing may panic and every id must be in range.
func FuzzNew(f *testing.F) {
	f.Add("<unk>\x00<s>\x00</s>\x00▁\x00a\x00▁a", []byte{2, 3, 3, 1, 1, 1}, "a b\x00▁ a", false, "a a")
	f.Add("a\x00b\x00ab\x00Ġ\x00<|eot_id|>", []byte{1, 1, 1, 1, 4}, "a b\x00Ġ a", true, "ab ab <|eot_id|>")
	f.Fuzz(func(t *testing.T, tokens string, types []byte, merges string, bpe bool, text string) {
		v := Vocab{Model: "llama", Tokens: strings.Split(tokens, "\x00"), Merges: strings.Split(merges, "\x00")}
		if bpe {
			v.Model, v.Pre = "gpt2", "llama3"
		}
		if len(types) >= len(v.Tokens) {
			v.Types = make([]int32, len(v.Tokens))
			v.Scores = make([]float32, len(v.Tokens))
			for i := range v.Types {
				v.Types[i] = int32(types[i] % 8)
				v.Scores[i] = -float32(types[i])
			}
		}
		tok, err := New(v)
		if err != nil {
			return
		}
		for _, special := range []bool{false, true} {
			ids := tok.Encode(text, special, special)
			for _, id := range ids {
				if id < 0 || id >= tok.VocabSize() {
					t.Fatalf("id %d out of range", id)
				}
			}
			_ = tok.Decode(ids)
		}
	})
}
