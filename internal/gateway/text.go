package gateway

import (
	"strings"
	"unicode/utf8"
)

// textStream turns token pieces into text that is safe to send: it never
// splits a UTF-8 sequence across two chunks, and it holds back any tail
// that could be the start of a stop sequence, so a stop string is never
// shown even when it spans several tokens. Streaming and non-streaming
// responses go through the same textStream, so they produce the same text.
type textStream struct {
	pending []byte // bytes of an incomplete UTF-8 sequence
	held    string // complete text not yet released (possible stop prefix)
	stops   []string
	stopped bool
}

// push adds one token's bytes and returns the text that may be released.
// After a stop sequence is seen it reports stopped and releases only the
// text before it; further pushes return nothing.
func (t *textStream) push(piece []byte) (out string, stopped bool) {
	if t.stopped {
		return "", true
	}
	t.pending = append(t.pending, piece...)
	n := completePrefix(t.pending)
	if n > 0 {
		t.held += strings.ToValidUTF8(string(t.pending[:n]), "\uFFFD")
		t.pending = append(t.pending[:0], t.pending[n:]...)
	}
	return t.release(false)
}

// finish releases everything left at the end of generation; an incomplete
// trailing sequence becomes U+FFFD.
func (t *textStream) finish() string {
	if t.stopped {
		return ""
	}
	if len(t.pending) > 0 {
		t.held += strings.ToValidUTF8(string(t.pending), "\uFFFD")
		t.pending = nil
	}
	out, _ := t.release(true)
	return out
}

func (t *textStream) release(final bool) (string, bool) {
	cut := -1
	for _, s := range t.stops {
		if i := strings.Index(t.held, s); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut >= 0 {
		out := t.held[:cut]
		t.held, t.stopped = "", true
		return out, true
	}
	keep := 0
	if !final {
		keep = stopPrefixLen(t.held, t.stops)
	}
	out := t.held[:len(t.held)-keep]
	t.held = t.held[len(t.held)-keep:]
	return out, false
}

// stopPrefixLen is the length of the longest suffix of s that is a proper
// prefix of some stop sequence.
func stopPrefixLen(s string, stops []string) int {
	best := 0
	for _, stop := range stops {
		for k := min(len(stop)-1, len(s)); k > best; k-- {
			if strings.HasSuffix(s, stop[:k]) {
				best = k
				break
			}
		}
	}
	return best
}

// completePrefix is the length of the longest prefix of b that does not end
// inside an incomplete (but so far valid) UTF-8 sequence.
func completePrefix(b []byte) int {
	// A rune is at most 4 bytes: only the last 3 can be an incomplete start.
	for i := len(b) - 1; i >= 0 && i >= len(b)-3; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			return len(b)
		}
	}
	return len(b)
}
