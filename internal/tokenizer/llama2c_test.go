package tokenizer

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/testdata"
	"pgregory.net/rapid"
)

func loadTok512(tb testing.TB) *Tokenizer {
	tb.Helper()
	t, err := LoadLlama2C(testdata.Path(tb, "models", "tok512.bin"), 512)
	if err != nil {
		tb.Fatal(err)
	}
	return t
}

// TestLlama2CEncode pins run.c's output on tok512.bin. The ids were derived
// by running a line-by-line transcription of run.c's encode (the O(n²)
// rescanning loop, as refLlama2CEncode below) over the file.
func TestLlama2CEncode(t *testing.T) {
	tok := loadTok512(t)
	for _, tc := range []struct {
		text string
		bos  bool
		want []int
	}{
		{"One day, Tom", true, []int{1, 385, 328, 432, 274, 287}},
		{"One day, Tom", false, []int{385, 328, 432, 274, 287}},
		{"", true, []int{1}},
		{"", false, []int{}},
		{"Once upon a time", true, []int{1, 403, 407, 261, 378}},
		// é is not a token: UTF-8 bytes 0xC3 0xA9 fall back to ids 0xC3+3, 0xA9+3.
		{"Héllo 你好 🦙!", true, []int{1, 320, 485, 306, 414, 410, 231, 192, 163, 232, 168, 192, 410, 243, 162, 169, 156, 443}},
	} {
		got := tok.Encode(tc.text, tc.bos, false)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Encode(%q, bos=%v) (-want +got):\n%s", tc.text, tc.bos, diff)
		}
	}
	if got := tok.Decode([]int{1, 385, 328, 432, 274, 287}); got != "One day, Tom" {
		t.Errorf("Decode = %q, want %q", got, "One day, Tom")
	}
	if tok.BOS() != 1 || tok.EOS() != 2 || !tok.IsEOG(2) || tok.IsEOG(1) || tok.VocabSize() != 512 || tok.Model() != "llama2.c" {
		t.Errorf("BOS %d EOS %d EOG(2) %v EOG(1) %v size %d model %q", tok.BOS(), tok.EOS(), tok.IsEOG(2), tok.IsEOG(1), tok.VocabSize(), tok.Model())
	}
}

// TestLlama2CStream replays run.c's printing of a prompt: each token's
// piece after the previous one, the space after BOS stripped, byte tokens
// as bytes.
func TestLlama2CStream(t *testing.T) {
	tok := loadTok512(t)
	text := "Héllo 你好 🦙!"
	ids := tok.Encode(text, true, false)
	d := NewStreamDecoder(tok, ids[0])
	var sb strings.Builder
	for _, id := range ids[1:] {
		s := d.Add(id)
		if !isValidUTF8(s) {
			t.Fatalf("Add(%d) returned invalid UTF-8 %q", id, s)
		}
		sb.WriteString(s)
	}
	sb.WriteString(d.Flush())
	if sb.String() != text {
		t.Errorf("streamed %q, want %q", sb.String(), text)
	}
}

// refLlama2CEncode is run.c's encode transcribed literally: rescan every
// adjacent pair after each merge.
func refLlama2CEncode(tok *Tokenizer, text string, bos bool) []int {
	l := tok.l2c
	var toks []int
	if bos {
		toks = append(toks, 1)
	}
	if text != "" && l.space >= 0 {
		toks = append(toks, int(l.space))
	}
	var buf []byte
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c&0xC0 != 0x80 {
			buf = buf[:0]
		}
		buf = append(buf, c)
		if i+1 < len(text) && text[i+1]&0xC0 == 0x80 && len(buf) < 4 {
			continue
		}
		if id, ok := l.lookup[string(buf)]; ok {
			toks = append(toks, int(id))
		} else {
			for _, b := range buf {
				toks = append(toks, int(b)+3)
			}
		}
		buf = buf[:0]
	}
	for {
		best, bestIdx, bestID := float32(-1e10), -1, -1
		for i := 0; i+1 < len(toks); i++ {
			id, ok := l.lookup[l.cstr[toks[i]]+l.cstr[toks[i+1]]]
			if ok && l.scores[id] > best {
				best, bestIdx, bestID = l.scores[id], i, int(id)
			}
		}
		if bestIdx < 0 {
			break
		}
		toks[bestIdx] = bestID
		toks = append(toks[:bestIdx+1], toks[bestIdx+2:]...)
	}
	if toks == nil {
		toks = []int{}
	}
	return toks
}

// TestLlama2CMatchesRunC checks the priority-queue encoder against the
// literal transcription on arbitrary strings, valid UTF-8 or not.
func TestLlama2CMatchesRunC(t *testing.T) {
	tok := loadTok512(t)
	alphabet := []rune("abcdeHTO ,.!'\n\té你🦙")
	rapid.Check(t, func(rt *rapid.T) {
		var text string
		if rapid.Bool().Draw(rt, "raw") {
			text = string(rapid.SliceOfN(rapid.Byte(), 0, 40).Draw(rt, "bytes"))
		} else {
			text = string(rapid.SliceOfN(rapid.SampledFrom(alphabet), 0, 60).Draw(rt, "runes"))
		}
		bos := rapid.Bool().Draw(rt, "bos")
		want := refLlama2CEncode(tok, text, bos)
		got := tok.Encode(text, bos, false)
		if diff := cmp.Diff(want, got); diff != "" {
			rt.Fatalf("Encode(%q) (-run.c +got):\n%s", text, diff)
		}
		if bos && isValidUTF8(text) && !strings.ContainsRune(text, 0) {
			if dec := tok.Decode(got); dec != text {
				rt.Fatalf("Decode(Encode(%q)) = %q", text, dec)
			}
		}
	})
}

// llama2cFile builds a tokenizer.bin image.
func llama2cFile(maxLen int32, toks []string, scores []float32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(maxLen))
	for i, s := range toks {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(scores[i]))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

// smallLlama2CVocab is the minimum shape: 3 specials, 256 bytes, and merges.
func smallLlama2CVocab(extra ...string) ([]string, []float32) {
	toks := []string{"<unk>", "\n<s>\n", "\n</s>\n"}
	for b := 0; b < 256; b++ {
		toks = append(toks, "<0x"+strings.ToUpper(hex2(byte(b)))+">")
	}
	toks = append(toks, extra...)
	scores := make([]float32, len(toks))
	for i := range extra {
		scores[259+i] = -float32(i)
	}
	return toks, scores
}

func hex2(b byte) string {
	const h = "0123456789abcdef"
	return string([]byte{h[b>>4], h[b&15]})
}

func TestLlama2CErrors(t *testing.T) {
	toks, scores := smallLlama2CVocab(" ", "a", " a")
	good := llama2cFile(6, toks, scores)
	if _, err := FromLlama2C(good, len(toks)); err != nil {
		t.Fatalf("valid file: %v", err)
	}
	neg := llama2cFile(6, toks, scores)
	binary.LittleEndian.PutUint32(neg[4+4:], uint32(0xFFFFFFFF)) // token 0's length = -1
	negMax := llama2cFile(-1, toks, scores)
	long := llama2cFile(2, toks, scores)
	for _, tc := range []struct {
		name  string
		data  []byte
		vocab int
		msg   string
	}{
		{"empty", nil, len(toks), "too short"},
		{"header only", good[:4], len(toks), "cannot hold 262 tokens"},
		{"truncated inside a token", good[:len(good)-1], len(toks), "truncated inside token"},
		{"truncated between tokens", good[:len(good)-(8+2)], len(toks), "truncated at token 261"},
		{"negative length", neg, len(toks), "negative length"},
		{"negative max_token_length", negMax, len(toks), "negative max_token_length"},
		{"token longer than max", long, len(toks), "longer than max_token_length"},
		{"vocab size too large", good, len(toks) + 1, "truncated"},
		{"vocab size absurd", good, MaxVocab, "cannot hold"},
		{"vocab size too small", good, len(toks) - 1, "does not match"},
		{"no byte tokens", llama2cFile(6, toks[:10], scores[:10]), 10, "byte tokens are required"},
		{"negative vocab size", good, -5, "outside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := FromLlama2C(tc.data, tc.vocab)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want ErrInvalid mentioning %q", err, tc.msg)
			}
		})
	}
	if _, err := LoadLlama2C(filepath.Join(t.TempDir(), "missing.bin"), 512); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v", err)
	}
}

// TestLlama2CSmallVocab exercises merging, byte fallback and the dummy
// prefix on a hand-made vocabulary.
func TestLlama2CSmallVocab(t *testing.T) {
	toks, scores := smallLlama2CVocab(" ", "a", " a", "b", "ab", " ab")
	// scores: " "=0, "a"=-1, " a"=-2, "b"=-3, "ab"=-4, " ab"=-5
	tok, err := FromLlama2C(llama2cFile(6, toks, scores), len(toks))
	if err != nil {
		t.Fatal(err)
	}
	id := func(s string) int { return int(tok.l2c.lookup[s]) }
	// " ", "a", "b" → " a" (-2) beats "ab" (-4) → " a","b" → " ab" (-5).
	if diff := cmp.Diff([]int{1, id(" ab")}, tok.Encode("ab", true, false)); diff != "" {
		t.Error(diff)
	}
	// 'c' is not a token: byte fallback 'c'+3.
	if diff := cmp.Diff([]int{id(" a"), 'c' + 3}, tok.Encode("ac", false, false)); diff != "" {
		t.Error(diff)
	}
	if got := tok.Decode([]int{1, id(" a"), 'c' + 3}); got != "ac" {
		t.Errorf("Decode = %q", got)
	}
}

// FuzzLlama2C checks that no tokenizer.bin makes the parser or the encoder
// panic.
func FuzzLlama2C(f *testing.F) {
	toks, scores := smallLlama2CVocab(" ", "a", " a", "\x00b")
	f.Add(llama2cFile(6, toks, scores), len(toks), "a ab")
	f.Add(llama2cFile(6, toks, scores)[:100], len(toks), "x")
	if data, err := os.ReadFile(testdata.Path(f, "models", "tok512.bin")); err == nil {
		f.Add(data, 512, "One day, Tom")
	}
	f.Fuzz(func(t *testing.T, data []byte, vocab int, text string) {
		tok, err := FromLlama2C(data, vocab)
		if err != nil {
			return
		}
		ids := tok.Encode(text, true, true)
		for _, id := range ids {
			if id < 0 || id >= tok.VocabSize() {
				t.Fatalf("id %d out of range", id)
			}
		}
		_ = tok.Decode(ids)
	})
}
