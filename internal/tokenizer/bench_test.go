package tokenizer

import (
	"strings"
	"testing"
)

// benchText is a long mixed paragraph: the golden "long" prompt plus some
// non-ASCII text, about 4 KB.
func benchText(b *testing.B) string {
	var long string
	for _, g := range readGolden(b) {
		if g.Name == "long" {
			long = g.Prompt
		}
	}
	return long + strings.Repeat(" Grüße aus Köln! 你好，世界。Привет, мир! 🦙 x = f(12345);\n", 8)
}

func BenchmarkEncode(b *testing.B) {
	text := benchText(b)
	for _, name := range []string{"llama-spm", "gpt-2", "deepseek-llm", "llama2.c"} {
		var tok *Tokenizer
		if name == "llama2.c" {
			tok = loadTok512(b)
		} else {
			tok = loadVocab(b, name)
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				tok.Encode(text, true, false)
			}
		})
	}
}

func BenchmarkStreamDecode(b *testing.B) {
	tok := loadVocab(b, "llama-spm")
	ids := tok.Encode(benchText(b), false, false)
	b.ReportAllocs()
	for b.Loop() {
		d := NewStreamDecoder(tok, -1)
		for _, id := range ids {
			d.Add(id)
		}
		d.Flush()
	}
}
