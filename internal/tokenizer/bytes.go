package tokenizer

import "unicode/utf8"

// GPT-2's byte-level alphabet: every byte is shown as a printable
// character, so that BPE never sees raw control bytes or spaces. Printable
// Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the
// other 68 bytes, in order, become U+0100, U+0101, ...
var (
	byteToRune [256]rune
	byteToUTF8 [256]string
	runeToByte map[rune]byte
)

func init() {
	runeToByte = make(map[rune]byte, 256)
	n := rune(0)
	for b := 0; b < 256; b++ {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			r = 256 + n
			n++
		}
		byteToRune[b] = r
		byteToUTF8[b] = string(r)
		runeToByte[r] = byte(b)
	}
}

// decodeByteLevel maps a BPE token's text back to the bytes it stands for.
// A character outside the alphabet (only possible in a malformed
// vocabulary) is kept as its UTF-8, where llama.cpp would insert an
// "[UNK_BYTE_...]" marker.
func decodeByteLevel(text string) []byte {
	out := make([]byte, 0, len(text))
	for _, r := range text {
		if b, ok := runeToByte[r]; ok {
			out = append(out, b)
		} else {
			out = utf8.AppendRune(out, r)
		}
	}
	return out
}

// cpts decodes text into code points the way llama.cpp's
// unicode_cpts_from_utf8 does: structurally (a lead byte and the right
// number of continuation bytes), without rejecting overlong forms or
// surrogates; a byte that starts no valid sequence becomes U+FFFD.
func cpts(text string, dst []rune) []rune {
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case c < 0x80:
			dst = append(dst, rune(c))
			i++
			continue
		case c&0x40 == 0: // stray continuation byte
		case c&0x20 == 0:
			if i+1 < len(text) && text[i+1]&0xC0 == 0x80 {
				dst = append(dst, rune(c&0x1F)<<6|rune(text[i+1]&0x3F))
				i += 2
				continue
			}
		case c&0x10 == 0:
			if i+2 < len(text) && text[i+1]&0xC0 == 0x80 && text[i+2]&0xC0 == 0x80 {
				dst = append(dst, rune(c&0x0F)<<12|rune(text[i+1]&0x3F)<<6|rune(text[i+2]&0x3F))
				i += 3
				continue
			}
		case c&0x08 == 0:
			if i+3 < len(text) && text[i+1]&0xC0 == 0x80 && text[i+2]&0xC0 == 0x80 && text[i+3]&0xC0 == 0x80 {
				r := rune(c&0x07)<<18 | rune(text[i+1]&0x3F)<<12 | rune(text[i+2]&0x3F)<<6 | rune(text[i+3]&0x3F)
				if r > 0x10FFFF {
					// llama.cpp cannot re-encode these and throws; we
					// replace them.
					r = utf8.RuneError
				}
				dst = append(dst, r)
				i += 4
				continue
			}
		}
		dst = append(dst, utf8.RuneError)
		i++
	}
	return dst
}

// appendCpt is llama.cpp's unicode_cpt_to_utf8, which (unlike Go's encoder)
// writes surrogate code points as three bytes.
func appendCpt(dst []byte, r rune) []byte {
	switch {
	case r < 0x80:
		return append(dst, byte(r))
	case r < 0x800:
		return append(dst, 0xC0|byte(r>>6), 0x80|byte(r)&0x3F)
	case r < 0x10000:
		return append(dst, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
	}
	return append(dst, 0xF0|byte(r>>18), 0x80|byte(r>>12)&0x3F, 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
}
