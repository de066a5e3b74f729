package tokenizer

import (
	"slices"
	"unicode"
)

// A splitFunc refines a segmentation of the code points c: in holds the
// lengths of the current chunks (summing to len(c)); the result, appended to
// out, splits every chunk further. Like llama.cpp's unicode_regex_split, a
// pre-tokenizer is a list of splitFuncs applied in turn, and each regex
// keeps both its matches and the unmatched text between them as chunks.
type splitFunc func(c []rune, in, out []int) []int

// preTok is one tokenizer.ggml.pre type.
type preTok struct {
	split        []splitFunc
	ignoreMerges bool // a word that is itself a token is not merged (llama3)
	addBOS       bool // llama.cpp's default add_bos for this type
}

var preTokenizers map[string]preTok

func init() {
	gpt2 := preTok{split: []splitFunc{splitGPT2}}
	llama3 := preTok{split: []splitFunc{splitLlama3(3)}, ignoreMerges: true, addBOS: true}
	digitsFirst := preTok{split: []splitFunc{splitEach(isNumber), splitGPT2}}
	preTokenizers = map[string]preTok{
		// [\p{P}\$\+<=>\^~\|]+ , the GPT-2 regex, \p{N}+ , [0-9][0-9][0-9]
		"default": {split: []splitFunc{
			splitRuns(func(r rune) bool { return unicode.IsPunct(r) || isOneOf(r, "$+<=>^~|") }),
			splitGPT2, splitRuns(isNumber), splitDigits3}},
		"gpt-2": gpt2, "gpt2": gpt2, "phi-2": gpt2, "mpt": gpt2, "olmo": gpt2,
		"jina-es": gpt2, "jina-de": gpt2, "jina-v2-es": gpt2, "jina-v2-de": gpt2,
		"llama3": llama3, "llama-v3": llama3, "llama-bpe": llama3, "falcon3": llama3,
		"dbrx":      {split: []splitFunc{splitLlama3(3)}},
		"smaug-bpe": {split: []splitFunc{splitLlama3(3)}},
		// qwen2's regex is llama3's with \p{N} instead of \p{N}{1,3}.
		"qwen2": {split: []splitFunc{splitLlama3(1)}}, "deepseek-r1-qwen": {split: []splitFunc{splitLlama3(1)}},
		"stablelm2": {split: []splitFunc{splitLlama3(1)}},
		"starcoder": digitsFirst, "refact": digitsFirst, "smollm": digitsFirst, "codeshell": digitsFirst,
		"exaone": digitsFirst, "minerva-7b": digitsFirst,
		// [\p{P}\$\+<=>\^~\|`]+ , the GPT-2 regex, [0-9][0-9][0-9]
		"falcon": {split: []splitFunc{
			splitRuns(func(r rune) bool { return unicode.IsPunct(r) || isOneOf(r, "$+<=>^~|`") }),
			splitGPT2, splitDigits3}},
		// [\r\n] , \s?\p{L}+ , \s?\p{P}+ , [一-龥ࠀ-一가-퟿]+ , \p{N}
		"deepseek-coder": {split: []splitFunc{
			splitEach(isCRLF), splitOptSpaceRuns(unicode.IsLetter), splitOptSpaceRuns(unicode.IsPunct),
			splitRuns(isCJK), splitEach(isNumber)}},
		// [\r\n] , \s?[letters]+ , \s?[punctuation]+ , \s+$ , [一-龥ࠀ-一가-퟿]+ , \p{N}+
		"deepseek-llm": {split: []splitFunc{
			splitEach(isCRLF), splitOptSpaceRuns(deepseekLetter.has), splitOptSpaceRuns(deepseekPunct.has),
			splitTrailingSpace, splitRuns(isCJK), splitRuns(isNumber)}},
	}
}

func knownPre() []string {
	var names []string
	for k := range preTokenizers {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// Character classes. llama.cpp runs the regexes that have no hand-written
// matcher through std::regex on a copy of the text in which non-ASCII
// whitespace is replaced by '\v'; that is why the explicit classes below
// never match a whitespace character even when their ranges include one
// (U+3000 in deepseek-llm's punctuation class).

// isSpace is \s: the Unicode White_Space property (which is what both
// llama.cpp's flag table and its std::regex fallback amount to).
func isSpace(r rune) bool {
	if r < 0x80 {
		return r == ' ' || r >= '\t' && r <= '\r'
	}
	return unicode.Is(unicode.White_Space, r)
}

func isNumber(r rune) bool { return unicode.IsNumber(r) }
func isCRLF(r rune) bool   { return r == '\r' || r == '\n' }

func isOneOf(r rune, set string) bool {
	for _, s := range set {
		if r == s {
			return true
		}
	}
	return false
}

// isCJK is [一-龥ࠀ-一가-퟿].
func isCJK(r rune) bool {
	return !isSpace(r) && (r >= 0x4E00 && r <= 0x9FA5 || r >= 0x0800 && r <= 0x4E00 || r >= 0xAC00 && r <= 0xD7FF)
}

// runeClass is a bracket expression written as in the regex source:
// single characters and a-b ranges.
type runeClass [][2]rune

func parseClass(s string) runeClass {
	rs := []rune(s)
	var c runeClass
	for i := 0; i < len(rs); i++ {
		if i+2 < len(rs) && rs[i+1] == '-' {
			c = append(c, [2]rune{rs[i], rs[i+2]})
			i += 2
			continue
		}
		c = append(c, [2]rune{rs[i], rs[i]})
	}
	return c
}

func (c runeClass) has(r rune) bool {
	if r > 0x7F && isSpace(r) {
		return false
	}
	for _, rg := range c {
		if r >= rg[0] && r <= rg[1] {
			return true
		}
	}
	return false
}

// deepseek-llm's letter and punctuation classes, from its tokenizer.json.
var (
	deepseekLetter = parseClass("A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃")
	deepseekPunct  = parseClass("!-/:-~！-／：-～‘-‟　-。")
)

// chunker walks the chunks of a segmentation; emit closes a piece at end.
type chunker struct {
	out     []int
	prevEnd int
}

func (k *chunker) emit(end int) {
	if end > k.prevEnd {
		k.out = append(k.out, end-k.prevEnd)
	}
	k.prevEnd = end
}

// eachChunk calls match for every chunk [ini, end) with a chunker whose
// pieces are appended to out; match must emit up to end.
func eachChunk(in, out []int, match func(k *chunker, ini, end int)) []int {
	k := chunker{out: out}
	start := 0
	for _, n := range in {
		k.prevEnd = start
		match(&k, start, start+n)
		start += n
	}
	return k.out
}

// splitRuns is the regex [set]+: maximal runs of set members.
func splitRuns(in func(rune) bool) splitFunc {
	return func(c []rune, chunks, out []int) []int {
		return eachChunk(chunks, out, func(k *chunker, ini, end int) {
			for p := ini; p < end; {
				if !in(c[p]) {
					p++
					continue
				}
				k.emit(p)
				for p < end && in(c[p]) {
					p++
				}
				k.emit(p)
			}
			k.emit(end)
		})
	}
}

// splitEach is a one-character class regex such as \p{N} or [\r\n]: every
// member is a piece of its own.
func splitEach(in func(rune) bool) splitFunc {
	return func(c []rune, chunks, out []int) []int {
		return eachChunk(chunks, out, func(k *chunker, ini, end int) {
			for p := ini; p < end; p++ {
				if in(c[p]) {
					k.emit(p)
					k.emit(p + 1)
				}
			}
			k.emit(end)
		})
	}
}

// splitOptSpaceRuns is \s?[set]+ : a run of set members, with the one
// whitespace character before it if there is one.
func splitOptSpaceRuns(in func(rune) bool) splitFunc {
	return func(c []rune, chunks, out []int) []int {
		return eachChunk(chunks, out, func(k *chunker, ini, end int) {
			for p := ini; p < end; {
				q := p
				if isSpace(c[p]) && p+1 < end && in(c[p+1]) {
					q = p + 1
				} else if !in(c[p]) {
					p++
					continue
				}
				k.emit(p)
				for q < end && in(c[q]) {
					q++
				}
				k.emit(q)
				p = q
			}
			k.emit(end)
		})
	}
}

// splitTrailingSpace is \s+$ : the whitespace that ends a chunk.
func splitTrailingSpace(c []rune, chunks, out []int) []int {
	return eachChunk(chunks, out, func(k *chunker, ini, end int) {
		p := end
		for p > ini && isSpace(c[p-1]) {
			p--
		}
		k.emit(p)
		k.emit(end)
	})
}

// splitDigits3 is [0-9][0-9][0-9]: ASCII digits in threes, left to right.
func splitDigits3(c []rune, chunks, out []int) []int {
	digit := func(r rune) bool { return r >= '0' && r <= '9' }
	return eachChunk(chunks, out, func(k *chunker, ini, end int) {
		for p := ini; p < end; {
			if p+2 < end && digit(c[p]) && digit(c[p+1]) && digit(c[p+2]) {
				k.emit(p)
				k.emit(p + 3)
				p += 3
				continue
			}
			p++
		}
		k.emit(end)
	})
}

// cls is the part of a code point's category the GPT-2-style matchers look
// at; clsNone stands for "outside the chunk".
type cls uint8

const (
	clsNone cls = iota
	clsSpace
	clsLetter
	clsNumber
	clsOther
)

func classOf(r rune) cls {
	switch {
	case isSpace(r):
		return clsSpace
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	}
	return clsOther
}

// span gives bounded access to one chunk.
type span struct {
	c        []rune
	ini, end int
}

func (s span) at(p int) rune {
	if p >= s.ini && p < s.end {
		return s.c[p]
	}
	return -1
}

func (s span) cls(p int) cls {
	if p >= s.ini && p < s.end {
		return classOf(s.c[p])
	}
	return clsNone
}

// contraction returns the length of 's 't 're 've 'm 'll 'd at p (0 if
// none), matching case-insensitively if fold is set.
func (s span) contraction(p int, fold bool) int {
	if s.at(p) != '\'' || p+1 >= s.end {
		return 0
	}
	lower := func(r rune) rune {
		if fold && r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}
	a := lower(s.at(p + 1))
	if a == 's' || a == 't' || a == 'm' || a == 'd' {
		return 2
	}
	if p+2 < s.end {
		b := lower(s.at(p + 2))
		if a == 'r' && b == 'e' || a == 'v' && b == 'e' || a == 'l' && b == 'l' {
			return 3
		}
	}
	return 0
}

// splitGPT2 is GPT-2's regex
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// matched the way llama.cpp's unicode_regex_split_custom_gpt2 does.
func splitGPT2(c []rune, chunks, out []int) []int {
	return eachChunk(chunks, out, func(k *chunker, ini, end int) {
		s := span{c, ini, end}
		for p := ini; p < end; {
			if n := s.contraction(p, false); n > 0 {
				p += n
				k.emit(p)
				continue
			}
			q := p
			if c[p] == ' ' {
				q = p + 1
			}
			if kc := s.cls(q); kc == clsLetter || kc == clsNumber || kc == clsOther {
				for s.cls(q) == kc {
					q++
				}
				p = q
				k.emit(p)
				continue
			}
			ws := 0
			for s.cls(p+ws) == clsSpace {
				ws++
			}
			switch {
			case ws > 1 && p+ws < end: // \s+(?!\S): leave the last space to the next word
				p += ws - 1
			case ws > 0:
				p += ws
			default:
				p++
			}
			k.emit(p)
		}
		k.emit(end)
	})
}

// splitLlama3 is Llama 3's regex
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// matched the way llama.cpp's unicode_regex_split_custom_llama3 does; with
// digits = 1 it is Qwen2's, whose \p{N} takes one digit at a time.
func splitLlama3(digits int) splitFunc {
	return func(c []rune, chunks, out []int) []int {
		return eachChunk(chunks, out, func(k *chunker, ini, end int) {
			s := span{c, ini, end}
			for p := ini; p < end; {
				r := c[p]
				kc := classOf(r)
				if n := s.contraction(p, true); n > 0 {
					p += n
					k.emit(p)
					continue
				}
				// [^\r\n\p{L}\p{N}]?\p{L}+
				if !isCRLF(r) && kc != clsNumber && (kc == clsLetter || s.cls(p+1) == clsLetter) {
					p++
					for s.cls(p) == clsLetter {
						p++
					}
					k.emit(p)
					continue
				}
				// \p{N}{1,3}
				if kc == clsNumber {
					first := p
					for s.cls(p) == clsNumber {
						p++
						if p-first >= digits {
							k.emit(p)
							first = p
						}
					}
					k.emit(p)
					continue
				}
				// " ?[^\s\p{L}\p{N}]+[\r\n]*"; a lone space that ends the
				// chunk also lands here, as in llama.cpp.
				q := p
				if r == ' ' {
					q = p + 1
				}
				if kq := s.cls(q); kq == clsOther || kq == clsNone {
					for s.cls(q) == clsOther {
						q++
					}
					for isCRLF(s.at(q)) {
						q++
					}
					p = q
					k.emit(p)
					continue
				}
				ws, lastNL := 0, -1
				for s.cls(p+ws) == clsSpace {
					if isCRLF(c[p+ws]) {
						lastNL = p + ws + 1
					}
					ws++
				}
				switch {
				case lastNL >= 0: // \s*[\r\n]+
					p = lastNL
				case ws > 1 && p+ws < end: // \s+(?!\S)
					p += ws - 1
				case ws > 0:
					p += ws
				default:
					p++
				}
				k.emit(p)
			}
			k.emit(end)
		})
	}
}
