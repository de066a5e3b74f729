package tokenizer

import (
	"bufio"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/testdata"
	"pgregory.net/rapid"
)

type goldenPrompt struct {
	Name          string            `json:"name"`
	Prompt        string            `json:"prompt"`
	TokensNoBOS   []int             `json:"tokens_no_bos"`
	TokensWithBOS []int             `json:"tokens_with_bos"`
	Pieces        []json.RawMessage `json:"pieces_with_bos"`
}

func readGolden(tb testing.TB) []goldenPrompt {
	tb.Helper()
	f, err := os.Open(testdata.Path(tb, "golden", "tiny-llama-f32.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []goldenPrompt
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var g goldenPrompt
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			tb.Fatal(err)
		}
		out = append(out, g)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	if len(out) != 9 {
		tb.Fatalf("%d golden prompts, want 9", len(out))
	}
	return out
}

// TestGoldenPrompts checks the prompts llama-server tokenized for the
// goldens (its /tokenize parses special tokens), with the vocabulary file
// and with the model file itself.
func TestGoldenPrompts(t *testing.T) {
	model, err := gguf.Open(testdata.Path(t, "models", "tiny-llama-f32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer model.Close()
	fromModel, err := FromGGUF(model)
	if err != nil {
		t.Fatal(err)
	}
	for name, tok := range map[string]*Tokenizer{"vocab": loadVocab(t, "llama-spm"), "model": fromModel} {
		for _, g := range readGolden(t) {
			got := tok.Encode(g.Prompt, false, true)
			if got == nil {
				got = []int{}
			}
			if diff := cmp.Diff(g.TokensNoBOS, got); diff != "" {
				t.Errorf("%s %s: no BOS (-want +got):\n%s", name, g.Name, diff)
			}
			if diff := cmp.Diff(g.TokensWithBOS, tok.Encode(g.Prompt, true, true)); diff != "" {
				t.Errorf("%s %s: with BOS (-want +got):\n%s", name, g.Name, diff)
			}
			// With BOS, decoding gives the prompt back exactly, unless it
			// holds special-token text (control tokens render as nothing).
			if specialText(tok, g.Prompt) {
				continue
			}
			if got := tok.Decode(g.TokensWithBOS); got != g.Prompt {
				t.Errorf("%s %s: Decode = %q, want %q", name, g.Name, got, g.Prompt)
			}
		}
	}
}

// TestGoldenPieces compares Piece with the server's per-token text; the
// server shows control tokens (which Piece leaves out) and gives partial
// UTF-8 as byte arrays.
func TestGoldenPieces(t *testing.T) {
	tok := loadVocab(t, "llama-spm")
	for _, g := range readGolden(t) {
		for i, raw := range g.Pieces {
			id := g.TokensWithBOS[i]
			var want []byte
			var s string
			if err := json.Unmarshal(raw, &s); err == nil {
				want = []byte(s)
			} else {
				var bs []int
				if err := json.Unmarshal(raw, &bs); err != nil {
					t.Fatal(err)
				}
				for _, b := range bs {
					want = append(want, byte(b))
				}
			}
			if tok.IsControl(id) {
				if tok.TokenText(id) != string(want) || len(tok.Piece(id)) != 0 {
					t.Errorf("%s: control %d: text %q piece %q, server %q", g.Name, id, tok.TokenText(id), tok.Piece(id), want)
				}
				continue
			}
			if got := tok.Piece(id); string(got) != string(want) {
				t.Errorf("%s: Piece(%d) = %q, want %q", g.Name, id, got, want)
			}
		}
	}
}

func TestSPMBasics(t *testing.T) {
	tok := loadVocab(t, "llama-spm")
	if tok.BOS() != 1 || tok.EOS() != 2 || tok.VocabSize() != 32000 || tok.Model() != "llama" || !tok.AddsBOS() {
		t.Fatalf("BOS %d EOS %d size %d model %q addBOS %v", tok.BOS(), tok.EOS(), tok.VocabSize(), tok.Model(), tok.AddsBOS())
	}
	if !tok.IsEOG(2) || tok.IsEOG(1) || tok.IsEOG(-1) || tok.IsEOG(1<<20) {
		t.Error("IsEOG wrong")
	}
	for _, id := range []int{-1, 32000, 1 << 40} {
		if tok.Piece(id) != nil || tok.TokenText(id) != "" || tok.Decode([]int{id}) != "" {
			t.Errorf("id %d out of range is not empty", id)
		}
	}
	for _, tc := range []struct {
		id    int
		piece string
		text  string
	}{
		{0, "", "<unk>"}, {1, "", "<s>"}, {2, "", "</s>"},
		{3, "\x00", "<0x00>"}, {13, "\n", "<0x0A>"}, {258, "\xff", "<0xFF>"},
		{450, " The", "▁The"}, {29871, " ", "▁"},
	} {
		if got := string(tok.Piece(tc.id)); got != tc.piece {
			t.Errorf("Piece(%d) = %q, want %q", tc.id, got, tc.piece)
		}
		if got := tok.TokenText(tc.id); got != tc.text {
			t.Errorf("TokenText(%d) = %q, want %q", tc.id, got, tc.text)
		}
	}
	// Byte fallback: U+10FFFF has no token, so its four bytes are spelled
	// as byte tokens after the prefix "▁".
	if diff := cmp.Diff([]int{29871, 3 + 0xF4, 3 + 0x8F, 3 + 0xBF, 3 + 0xBF}, tok.Encode("\U0010FFFF", false, false)); diff != "" {
		t.Error(diff)
	}
}

// TestParseSpecial covers the special-token partition: control tokens only
// with parseSpecial, user-defined tokens always, Phi-3's right strip.
func TestParseSpecial(t *testing.T) {
	spm := loadVocab(t, "llama-spm")
	text := "a<s>b"
	with := spm.Encode(text, false, true)
	if !containsID(with, 1) {
		t.Errorf("parseSpecial: %v has no BOS", with)
	}
	if without := spm.Encode(text, false, false); containsID(without, 1) && len(without) == len(with) {
		t.Errorf("parseSpecial off still cut <s>: %v", without)
	}

	// mpt: runs of spaces are user-defined tokens, cut even without
	// parseSpecial; <|endoftext|> (control) only with it.
	mpt := loadVocab(t, "mpt")
	four := int(mpt.ids["    "])
	if got := mpt.Encode("a    b", false, false); !containsID(got, four) {
		t.Errorf("mpt %v lacks the user-defined 4-space token %d", got, four)
	}
	eot := int(mpt.ids["<|endoftext|>"])
	if got := mpt.Encode("x<|endoftext|>", false, false); containsID(got, eot) {
		t.Errorf("control token cut without parseSpecial: %v", got)
	}
	if got := mpt.Encode("x<|endoftext|>", false, true); !containsID(got, eot) {
		t.Errorf("control token not cut with parseSpecial: %v", got)
	}

	// Phi-3 (general.name "Phi3"): special tokens swallow the whitespace
	// after them, except <s>, <unk> and <|endoftext|>.
	phi := loadVocab(t, "phi-3")
	end := int(phi.ids["<|end|>"])
	a := phi.Encode("<|end|>  hi", false, true)
	b := phi.Encode("<|end|>hi", false, true)
	if diff := cmp.Diff(b, a); diff != "" || a[0] != end {
		t.Errorf("rstrip after <|end|>: %v vs %v", a, b)
	}
	if !phi.IsEOG(end) || !phi.IsEOG(phi.EOS()) || !phi.IsEOG(int(phi.ids["<|endoftext|>"])) {
		t.Error("phi-3 EOG set misses <|end|>, EOS or <|endoftext|>")
	}
	s := int(phi.ids["<s>"])
	if a, b := phi.Encode("<s>  hi", false, true), phi.Encode("<s>hi", false, true); cmp.Equal(a, b) || a[0] != s {
		t.Errorf("<s> must not strip: %v vs %v", a, b)
	}
}

func containsID(ids []int, id int) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// roundTripAlphabet mixes ASCII, whitespace runs, accents, CJK, Cyrillic,
// emoji with modifiers and digits; it excludes U+2581, which SPM cannot
// tell from an escaped space.
var roundTripAlphabet = []rune("aZq \t\n\r  .,;'\"!?-_()[]{}<>/\\0123456789éüßñçÅ你好世界ПриветабвΩ😀🦙👍🏽\u200d\u00a0\u3000\u0301ก")

// specialText reports whether s contains the text of a control or unknown
// token of tok: without parseSpecial that text is ordinary input, but
// llama.cpp's SPM may still merge it into the control token, which renders
// as nothing.
func specialText(tok *Tokenizer, s string) bool {
	for id, a := range tok.attrs {
		if a&(attrControl|attrUnknown) != 0 && len(tok.tokens[id]) > 1 && strings.Contains(s, tok.tokens[id]) {
			return true
		}
	}
	return false
}

// TestRoundTrip: Decode(Encode(x)) == x for valid UTF-8, up to the SPM
// prefix space, which BOS removes.
func TestRoundTrip(t *testing.T) {
	for _, name := range []string{"llama-spm", "phi-3", "gpt-2", "deepseek-llm", "deepseek-coder", "falcon", "starcoder", "mpt"} {
		tok := loadVocab(t, name)
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				x := string(rapid.SliceOfN(rapid.SampledFrom(roundTripAlphabet), 0, 48).Draw(rt, "x"))
				if specialText(tok, x) {
					rt.Skip("contains control-token text")
				}
				want := x
				if tok.Model() == "llama" && x != "" {
					want = " " + x
				}
				ids := tok.Encode(x, false, false)
				if got := tok.Decode(ids); got != want {
					rt.Fatalf("Decode(Encode(%q)) = %q (ids %v)", x, got, ids)
				}
				if tok.AddsBOS() {
					if got := tok.Decode(tok.Encode(x, true, false)); tok.Model() == "llama" && got != x {
						rt.Fatalf("with BOS: Decode(Encode(%q)) = %q", x, got)
					}
				}
				// The stream decoder, fed one id at a time, gives the same text.
				d := NewStreamDecoder(tok, -1)
				var sb strings.Builder
				for _, id := range ids {
					s := d.Add(id)
					if !utf8.ValidString(s) {
						rt.Fatalf("stream emitted invalid UTF-8 %q", s)
					}
					sb.WriteString(s)
				}
				sb.WriteString(d.Flush())
				if sb.String() != want {
					rt.Fatalf("stream = %q, want %q", sb.String(), want)
				}
			})
		})
	}
}

func TestStreamDecoder(t *testing.T) {
	tok := loadVocab(t, "llama-spm")
	// "é" is 0xC3 0xA9; feed it as two byte tokens.
	d := NewStreamDecoder(tok, -1)
	if got := d.Add(3 + 0xC3); got != "" {
		t.Errorf("half a character emitted: %q", got)
	}
	if got := d.Add(3 + 0xA9); got != "é" {
		t.Errorf("completed character = %q", got)
	}
	// A lone lead byte followed by ASCII: U+FFFD, then the ASCII.
	if got := d.Add(3 + 0xE4); got != "" {
		t.Errorf("lead byte emitted: %q", got)
	}
	if got := d.Add(3 + 'a'); got != "\uFFFDa" {
		t.Errorf("broken sequence = %q", got)
	}
	// Flush replaces what is still incomplete.
	d.Add(3 + 0xF0)
	d.Add(3 + 0x9F)
	if got := d.Flush(); got != "\uFFFD\uFFFD" {
		t.Errorf("Flush = %q", got)
	}
	if got := d.Flush(); got != "" {
		t.Errorf("second Flush = %q", got)
	}
	// After BOS the prefix space goes; elsewhere it stays.
	the := int(tok.ids["▁The"])
	if got := NewStreamDecoder(tok, 1).Add(the); got != "The" {
		t.Errorf("after BOS: %q", got)
	}
	if got := NewStreamDecoder(tok, 450).Add(the); got != " The" {
		t.Errorf("mid-text: %q", got)
	}
}

func ptr[T any](v T) *T { return &v }

func TestNewErrors(t *testing.T) {
	base := func() Vocab {
		return Vocab{Model: "gpt2", Pre: "gpt-2", Tokens: []string{"a", "b", "ab"}, Merges: []string{"a b"}}
	}
	for _, tc := range []struct {
		name string
		edit func(*Vocab)
		err  error
		msg  string
	}{
		{"unknown pre", func(v *Vocab) { v.Pre = "klingon" }, ErrUnsupported, `"klingon"`},
		{"wordpiece", func(v *Vocab) { v.Model = "bert" }, ErrUnsupported, "WordPiece"},
		{"unigram", func(v *Vocab) { v.Model = "t5" }, ErrUnsupported, `"t5"`},
		{"no model", func(v *Vocab) { v.Model = "" }, ErrInvalid, "empty"},
		{"no tokens", func(v *Vocab) { v.Tokens = nil }, ErrInvalid, "no tokens"},
		{"duplicate", func(v *Vocab) { v.Tokens = []string{"a", "a"} }, ErrInvalid, "twice"},
		{"short scores", func(v *Vocab) { v.Scores = []float32{0} }, ErrInvalid, "scores"},
		{"short types", func(v *Vocab) { v.Types = []int32{1} }, ErrInvalid, "types"},
		{"add_bos without bos", func(v *Vocab) { v.AddBOS = ptr(true) }, ErrInvalid, "BOS"},
		{"add_eos without eos", func(v *Vocab) { v.AddEOS = ptr(true); v.EOS = ptr(99) }, ErrInvalid, "EOS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := base()
			tc.edit(&v)
			_, err := New(v)
			if !errors.Is(err, tc.err) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v mentioning %s", err, tc.err, tc.msg)
			}
		})
	}
	if _, err := New(base()); err != nil {
		t.Fatalf("base vocabulary: %v", err)
	}
}

// TestLlama3Synthetic runs the llama3 pre-tokenizer path (merges ignored
// for whole-word tokens, BOS added by default) on a small byte-level
// vocabulary.
func TestLlama3Synthetic(t *testing.T) {
	var toks []string
	for b := 0; b < 256; b++ {
		toks = append(toks, byteToUTF8[b])
	}
	toks = append(toks, "Ġworld", "he", "hell", "<|begin_of_text|>", "<|eot_id|>")
	types := make([]int32, len(toks))
	for i := range types {
		types[i] = TypeNormal
	}
	types[len(toks)-2], types[len(toks)-1] = TypeControl, TypeNormal // <|eot_id|> mislabelled: becomes control
	tok, err := New(Vocab{
		Model: "gpt2", Pre: "llama-bpe", Tokens: toks, Types: types,
		Merges: []string{"h e", "l l", "he ll"},
		BOS:    ptr(len(toks) - 2), EOS: ptr(len(toks) - 2),
	})
	if err != nil {
		t.Fatal(err)
	}
	id := func(s string) int { return int(tok.ids[s]) }
	// "Ġworld" is a token although no merge builds it: llama3 ignores
	// merges for words that are tokens. "hello" merges h+e, l+l, he+ll.
	want := []int{id("<|begin_of_text|>"), id("hell"), id("o"), id("Ġworld")}
	if diff := cmp.Diff(want, tok.Encode("hello world", true, false)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	eot := id("<|eot_id|>")
	if !tok.IsEOG(eot) || !tok.IsControl(eot) {
		t.Error("<|eot_id|> is not an EOG control token")
	}
	if got := tok.Encode("hi<|eot_id|>", false, true); got[len(got)-1] != eot {
		t.Errorf("parseSpecial: %v", got)
	}
	if got := tok.Decode(tok.Encode("hello world\n\tÿ€", false, false)); got != "hello world\n\tÿ€" {
		t.Errorf("round trip = %q", got)
	}
}

// FuzzEncode checks that no text makes Encode or Decode panic or produce an
// id outside the vocabulary, for each tokenizer family, and that the stream
// decoder only ever returns valid UTF-8.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", " ", "Hello <s> world", "\xff\xfe\xc3", "a\u2581b", "日本語 🦙", "  \n\n\t x", "<|endoftext|>  ", "'s'LL 123456"} {
		f.Add(s, true)
	}
	toks := []*Tokenizer{loadVocab(f, "llama-spm"), loadVocab(f, "phi-3"), loadVocab(f, "gpt-2"), loadVocab(f, "deepseek-llm"), loadVocab(f, "falcon"), loadTok512(f)}
	f.Fuzz(func(t *testing.T, text string, special bool) {
		for _, tok := range toks {
			ids := tok.Encode(text, special, special)
			for _, id := range ids {
				if id < 0 || id >= tok.VocabSize() {
					t.Fatalf("%s: id %d out of range", tok.Model(), id)
				}
			}
			_ = tok.Decode(ids)
			d := NewStreamDecoder(tok, -1)
			for _, id := range ids {
				if s := d.Add(id); !utf8.ValidString(s) {
					t.Fatalf("%s: invalid UTF-8 %q", tok.Model(), s)
				}
			}
			if s := d.Flush(); !utf8.ValidString(s) {
				t.Fatalf("%s: invalid UTF-8 %q", tok.Model(), s)
			}
		}
	})
}
