package tokenizer

import "unicode/utf8"

func isValidUTF8(s string) bool { return utf8.ValidString(s) }
