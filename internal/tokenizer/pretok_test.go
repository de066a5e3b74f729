package tokenizer

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// preSplit runs a pre-tokenizer over s and returns its words.
func preSplit(name, s string) []string {
	c := cpts(s, nil)
	chunks := []int{len(c)}
	for _, f := range preTokenizers[name].split {
		chunks = f(c, chunks, nil)
	}
	var words []string
	start := 0
	for _, n := range chunks {
		words = append(words, string(c[start:start+n]))
		start += n
	}
	return words
}

// TestPreTokenizers pins the splits of the regexes that have no vocabulary
// with test vectors here (llama3, qwen2), plus the trickier corners of the
// others. Expected splits follow the regexes' leftmost-alternative
// semantics, worked out by hand.
func TestPreTokenizers(t *testing.T) {
	const s = "Hello world's 12345 !!\n\n  x"
	for _, tc := range []struct {
		pre, in string
		want    []string
	}{
		{"llama-bpe", s, []string{"Hello", " world", "'s", " ", "123", "45", " !!\n\n", " ", " x"}},
		{"qwen2", s, []string{"Hello", " world", "'s", " ", "1", "2", "3", "4", "5", " !!\n\n", " ", " x"}},
		{"gpt-2", s, []string{"Hello", " world", "'s", " 12345", " !!", "\n\n ", " x"}},
		// (?i:'m) in llama3, case-sensitive 'm in GPT-2.
		{"llama-bpe", "I'M", []string{"I", "'M"}},
		{"gpt-2", "I'M", []string{"I", "'", "M"}},
		// \s*[\r\n]+ takes whitespace up to the last newline of the run.
		{"llama-bpe", "a \n \n  b", []string{"a", " \n \n", " ", " b"}},
		// A lone space at the end of the text.
		{"llama-bpe", "a ", []string{"a", " "}},
		{"gpt-2", "a ", []string{"a", " "}},
		{"gpt-2", "a  ", []string{"a", "  "}},
		// A letter may take one leading non-letter, non-digit, non-newline
		// character in llama3; not a digit or a newline.
		{"llama-bpe", "\"quoted\" 7up\nx", []string{"\"quoted", "\"", " ", "7", "up", "\n", "x"}},
		{"deepseek-llm", "Hello, 世界 123\n", []string{"Hello", ",", " ", "世界", " ", "123", "\n"}},
		// "=" is a symbol (Sm), not punctuation: it stays in the gap.
		{"deepseek-coder", "x = 12;\n", []string{"x", " = ", "1", "2", ";", "\n"}},
		{"falcon", "a+=1234567", []string{"a", "+=", "123", "456", "7"}},
		{"default", "a+=1234567", []string{"a", "+=", "123", "456", "7"}},
		{"starcoder", "v2 = 10", []string{"v", "2", " =", " ", "1", "0"}},
		// Invalid UTF-8 becomes U+FFFD, a symbol.
		{"gpt-2", "a\xffb", []string{"a", "\uFFFD", "b"}},
	} {
		if diff := cmp.Diff(tc.want, preSplit(tc.pre, tc.in)); diff != "" {
			t.Errorf("%s %q (-want +got):\n%s", tc.pre, tc.in, diff)
		}
	}
}

// TestCpts checks the llama.cpp-compatible UTF-8 decoder on malformed input.
func TestCpts(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []rune
	}{
		{"aé你🦙", []rune("aé你🦙")},
		{"\xe4\xb8a", []rune{0xFFFD, 0xFFFD, 'a'}},
		{"\x80", []rune{0xFFFD}},
		{"\xc0\x80", []rune{0}},              // overlong: decoded, as llama.cpp does
		{"\xed\xa0\x80", []rune{0xD800}},     // surrogate: decoded likewise
		{"\xf7\xbf\xbf\xbf", []rune{0xFFFD}}, // beyond U+10FFFF
		{"\xf8", []rune{0xFFFD}},
	} {
		if diff := cmp.Diff(tc.want, cpts(tc.in, nil)); diff != "" {
			t.Errorf("cpts(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}
