package tokenizer

import "unicode/utf8"

// StreamDecoder turns generated tokens into text as they arrive. A token
// may end in the middle of a multi-byte UTF-8 character (byte tokens,
// byte-level BPE); the decoder holds those bytes back until the character
// is complete, so every string it returns is valid UTF-8. Bytes that can
// never form a valid character come out as U+FFFD.
//
// A StreamDecoder is not safe for concurrent use.
type StreamDecoder struct {
	t    *Tokenizer
	prev int
	buf  []byte
}

// NewStreamDecoder starts decoding after the token prev (the last prompt
// token, or -1): a first piece following BOS loses its leading space in
// vocabularies with a space prefix, as in Decode.
func NewStreamDecoder(t *Tokenizer, prev int) *StreamDecoder {
	return &StreamDecoder{t: t, prev: prev}
}

// Add appends the piece of id and returns the text that is now complete.
func (d *StreamDecoder) Add(id int) string {
	d.buf = append(d.buf, d.t.piece(d.prev, id)...)
	d.prev = id
	return d.take(false)
}

// Flush returns whatever is still held back, with incomplete characters
// replaced by U+FFFD, and empties the decoder.
func (d *StreamDecoder) Flush() string { return d.take(true) }

// take returns the longest valid prefix of the buffer, keeping an
// incomplete trailing character unless final is set.
func (d *StreamDecoder) take(final bool) string {
	b := d.buf
	if utf8.Valid(b) {
		d.buf = d.buf[:0]
		return string(b)
	}
	out := make([]byte, 0, len(b)+3)
	i := 0
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size <= 1 {
			if !final && !utf8.FullRune(b[i:]) {
				break // a character still being received
			}
			out = utf8.AppendRune(out, utf8.RuneError)
			i++
			continue
		}
		out = append(out, b[i:i+size]...)
		i += size
	}
	d.buf = append(d.buf[:0], b[i:]...)
	return string(out)
}
