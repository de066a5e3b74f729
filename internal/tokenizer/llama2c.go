package tokenizer

import (
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
)

// Llama2CMaxFileBytes bounds the tokenizer.bin files LoadLlama2C reads;
// llama2.c's 32000-token tokenizer is about 430 KiB.
const Llama2CMaxFileBytes = 256 << 20

// llama2c holds what run.c's encode needs beyond the common tables.
type llama2c struct {
	// lookup maps a token's text as a C string (cut at its first NUL, as
	// run.c's strcmp sees it) to its id; for texts shared by several ids
	// the lowest wins (run.c's bsearch would pick any).
	lookup map[string]int32
	cstr   []string // each token's C-string text
	scores []float32
	space  int32 // id of " ", the dummy prefix; -1 if the vocabulary lacks it
}

// LoadLlama2C reads a llama2.c tokenizer.bin holding vocabSize tokens.
func LoadLlama2C(path string, vocabSize int) (*Tokenizer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, Llama2CMaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tokenizer: reading %s: %w", path, err)
	}
	if len(data) > Llama2CMaxFileBytes {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalid, path, Llama2CMaxFileBytes)
	}
	t, err := FromLlama2C(data, vocabSize)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// FromLlama2C parses a llama2.c tokenizer.bin: an int32 max_token_length,
// then for each of vocabSize tokens a float32 score, an int32 byte length
// and the bytes (all little-endian). The model file, not the tokenizer
// file, says how many tokens there are, so a file holding more or fewer is
// an error. Ids 0, 1 and 2 are <unk>, BOS and EOS; 3..258 are the byte
// tokens run.c's byte fallback relies on.
func FromLlama2C(data []byte, vocabSize int) (*Tokenizer, error) {
	if vocabSize < 3+256 || vocabSize > MaxVocab {
		return nil, fmt.Errorf("%w: llama2.c vocabulary size %d outside [%d, %d] (3 specials and 256 byte tokens are required)", ErrInvalid, vocabSize, 3+256, MaxVocab)
	}
	if len(data) < 4 {
		return nil, fmt.Errorf("%w: llama2.c tokenizer: %d bytes is too short for the max_token_length header", ErrInvalid, len(data))
	}
	maxLen := int32(binary.LittleEndian.Uint32(data))
	if maxLen < 0 {
		return nil, fmt.Errorf("%w: llama2.c tokenizer: negative max_token_length %d", ErrInvalid, maxLen)
	}
	if need := 4 + 8*int64(vocabSize); int64(len(data)) < need {
		// Every token takes at least 8 bytes; checking before allocating
		// keeps a bogus size from costing memory.
		return nil, fmt.Errorf("%w: llama2.c tokenizer truncated: %d bytes cannot hold %d tokens (at least %d bytes)", ErrInvalid, len(data), vocabSize, need)
	}
	off := 4
	t := &Tokenizer{
		kind: kindLlama2C, model: "llama2.c",
		bos: 1, eos: 2, unk: 0, addBOS: true, spacePrefix: true,
		tokens: make([]string, vocabSize),
		scores: make([]float32, vocabSize),
		attrs:  make([]attr, vocabSize),
	}
	l := &llama2c{lookup: make(map[string]int32, vocabSize), cstr: make([]string, vocabSize), scores: t.scores, space: -1}
	for i := 0; i < vocabSize; i++ {
		if len(data)-off < 8 {
			return nil, fmt.Errorf("%w: llama2.c tokenizer truncated at token %d of %d (offset %d)", ErrInvalid, i, vocabSize, off)
		}
		score := math.Float32frombits(binary.LittleEndian.Uint32(data[off:]))
		n := int32(binary.LittleEndian.Uint32(data[off+4:]))
		off += 8
		switch {
		case n < 0:
			return nil, fmt.Errorf("%w: llama2.c tokenizer: token %d has negative length %d", ErrInvalid, i, n)
		case n > maxLen:
			return nil, fmt.Errorf("%w: llama2.c tokenizer: token %d is %d bytes, longer than max_token_length %d", ErrInvalid, i, n, maxLen)
		case int(n) > len(data)-off:
			return nil, fmt.Errorf("%w: llama2.c tokenizer truncated inside token %d (%d bytes declared, %d left)", ErrInvalid, i, n, len(data)-off)
		}
		s := string(data[off : off+int(n)])
		off += int(n)
		t.tokens[i], t.scores[i] = s, score
		cs := s
		if z := strings.IndexByte(cs, 0); z >= 0 {
			cs = cs[:z]
		}
		l.cstr[i] = cs
		if _, dup := l.lookup[cs]; !dup {
			l.lookup[cs] = int32(i)
		}
		switch i {
		case 0:
			t.attrs[i] = attrUnknown
		case 1, 2:
			t.attrs[i] = attrControl
		default:
			t.attrs[i] = attrNormal
		}
	}
	if off != len(data) {
		return nil, fmt.Errorf("%w: llama2.c tokenizer has %d bytes after its %d tokens: the vocabulary size does not match the file", ErrInvalid, len(data)-off, vocabSize)
	}
	if id, ok := l.lookup[" "]; ok {
		l.space = id
	}
	t.ids = l.lookup
	t.l2c = l
	t.eog = make([]bool, vocabSize)
	t.eog[t.eos] = true
	t.pieces = make([][]byte, vocabSize)
	for id := range t.tokens {
		t.pieces[id] = t.makePiece(id)
	}
	return t, nil
}

// llama2cByte parses run.c's "<0x%02hhX>": "<0x" and one or two hex
// digits (sscanf stops there, so the closing '>' is not checked).
func llama2cByte(s string) (byte, bool) {
	if !strings.HasPrefix(s, "<0x") {
		return 0, false
	}
	var v, n int
	for _, c := range []byte(s[3:]) {
		var d int
		switch {
		case c >= '0' && c <= '9':
			d = int(c - '0')
		case c >= 'a' && c <= 'f':
			d = int(c-'a') + 10
		case c >= 'A' && c <= 'F':
			d = int(c-'A') + 10
		default:
			return byte(v), n > 0
		}
		v = v*16 + d
		if n++; n == 2 {
			break
		}
	}
	return byte(v), n > 0
}

// l2cPair is a candidate merge of the adjacent tokens at left and right into
// id, valid while those positions still hold ltok and rtok.
type l2cPair struct {
	score      float32
	left       int
	right      int
	ltok, rtok int32
	id         int32
}

func l2cBefore(a, b l2cPair) bool {
	return a.score > b.score || (a.score == b.score && a.left < b.left)
}

// l2cMinScore is run.c's initial best_score: a merge must score above it.
const l2cMinScore = float32(-1e10)

// encode is run.c's encode. run.c rescans all pairs after every merge and
// takes the best score, leftmost on ties; a priority queue keyed the same
// way gives the same merges in O(n log n).
func (l *llama2c) encode(text string, bos, eos bool) []int {
	toks := make([]int32, 0, len(text)+3)
	if bos {
		toks = append(toks, 1)
	}
	if text != "" && l.space >= 0 {
		toks = append(toks, l.space)
	}
	var buf [4]byte
	n := 0
	for i := 0; i < len(text); i++ {
		c := text[i]
		if c&0xC0 != 0x80 {
			n = 0
		}
		buf[n] = c
		n++
		if i+1 < len(text) && text[i+1]&0xC0 == 0x80 && n < 4 {
			continue
		}
		if id, ok := l.lookup[string(buf[:n])]; ok {
			toks = append(toks, id)
		} else {
			for _, b := range buf[:n] {
				toks = append(toks, int32(b)+3)
			}
		}
		n = 0
	}

	next := make([]int, len(toks))
	prev := make([]int, len(toks))
	for i := range toks {
		prev[i], next[i] = i-1, i+1
	}
	if len(toks) > 0 {
		next[len(toks)-1] = -1
	}
	var q minHeap[l2cPair]
	q.reset(l2cBefore)
	var cat []byte
	add := func(a, b int) {
		if a < 0 || b < 0 {
			return
		}
		cat = append(append(cat[:0], l.cstr[toks[a]]...), l.cstr[toks[b]]...)
		id, ok := l.lookup[string(cat)]
		if !ok || !(l.scores[id] > l2cMinScore) {
			return
		}
		q.push(l2cPair{score: l.scores[id], left: a, right: b, ltok: toks[a], rtok: toks[b], id: id})
	}
	for i := 0; i+1 < len(toks); i++ {
		add(i, i+1)
	}
	alive := len(toks)
	for q.len() > 0 {
		p := q.pop()
		if next[p.left] != p.right || toks[p.left] != p.ltok || toks[p.right] != p.rtok {
			continue
		}
		toks[p.left] = p.id
		r := p.right
		next[p.left] = next[r]
		if next[r] >= 0 {
			prev[next[r]] = p.left
		}
		next[r], prev[r] = -2, -2 // dead
		alive--
		add(prev[p.left], p.left)
		add(p.left, next[p.left])
	}
	out := make([]int, 0, alive+1)
	for i := 0; i >= 0 && i < len(toks); i = next[i] {
		out = append(out, int(toks[i]))
	}
	if eos {
		out = append(out, 2)
	}
	return out
}
