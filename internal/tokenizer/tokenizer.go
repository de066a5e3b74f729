package tokenizer

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Sentinel errors. Every constructor error wraps one of them.
var (
	// ErrUnsupported reports a vocabulary type or pre-tokenizer this package
	// does not implement.
	ErrUnsupported = errors.New("tokenizer: unsupported")
	// ErrInvalid reports vocabulary data that is inconsistent or malformed.
	ErrInvalid = errors.New("tokenizer: invalid vocabulary")
)

// MaxVocab bounds the number of tokens a vocabulary may declare; real
// vocabularies have at most a few hundred thousand.
const MaxVocab = 1 << 22

// Token types as GGUF's tokenizer.ggml.token_type stores them.
const (
	TypeUndefined   = 0
	TypeNormal      = 1
	TypeUnknown     = 2
	TypeControl     = 3
	TypeUserDefined = 4
	TypeUnused      = 5
	TypeByte        = 6
)

// attr is llama.cpp's per-token attribute set (llama_token_attr).
type attr uint16

const (
	attrUnknown attr = 1 << iota
	attrUnused
	attrNormal
	attrControl
	attrUserDefined
	attrByte
	attrNormalized
	attrLStrip
	attrRStrip
)

type kind uint8

const (
	kindSPM kind = iota + 1
	kindBPE
	kindLlama2C
)

// Vocab is a tokenizer's data, as GGUF's tokenizer.ggml.* keys hold it. A
// nil pointer or slice means the key is absent; llama.cpp's default for the
// model type then applies.
type Vocab struct {
	Model  string    // tokenizer.ggml.model: "llama" (SPM) or "gpt2" (BPE)
	Pre    string    // tokenizer.ggml.pre; "" means "default"
	Name   string    // general.name; llama.cpp sets per-token strip flags by it (Phi-3)
	Tokens []string  // tokenizer.ggml.tokens, the id → text table
	Scores []float32 // tokenizer.ggml.scores (SPM merge priority); nil: all 0
	Types  []int32   // tokenizer.ggml.token_type (Type* constants); nil: all normal
	Merges []string  // tokenizer.ggml.merges, "left right", best first (BPE)

	BOS, EOS, UNK, PAD, EOT, EOM   *int // tokenizer.ggml.*_token_id
	FIMPre, FIMSuf, FIMMid         *int // tokenizer.ggml.fim_{pre,suf,mid}_token_id (fim.go)
	AddBOS, AddEOS, AddSpacePrefix *bool
}

// Tokenizer encodes and decodes text for one vocabulary.
type Tokenizer struct {
	kind   kind
	model  string
	tokens []string
	scores []float32
	attrs  []attr
	ids    map[string]int32
	pieces [][]byte // Piece of each id, precomputed

	bos, eos, unk int  // -1: none
	fim           FIM  // fim.go
	hasFIM        bool // fim holds a complete set
	eog           []bool
	addBOS        bool
	addEOS        bool
	spacePrefix   bool    // SPM: prefix text with a space; also: strip one space after BOS when decoding
	special       []int32 // tokens cut out of the text before tokenizing, longest first

	byteTok [256]int32 // SPM byte fallback ids (-1: none)

	// BPE
	merges       map[mergeKey]int32
	pre          []splitFunc
	ignoreMerges bool

	// llama2.c
	l2c *llama2c
}

type mergeKey struct{ left, right string }

// New builds a tokenizer from vocabulary data.
func New(v Vocab) (*Tokenizer, error) {
	n := len(v.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("%w: no tokens", ErrInvalid)
	}
	if n > MaxVocab {
		return nil, fmt.Errorf("%w: %d tokens is more than the %d allowed", ErrInvalid, n, MaxVocab)
	}
	if v.Scores != nil && len(v.Scores) < n {
		return nil, fmt.Errorf("%w: %d scores for %d tokens", ErrInvalid, len(v.Scores), n)
	}
	if v.Types != nil && len(v.Types) < n {
		return nil, fmt.Errorf("%w: %d token types for %d tokens", ErrInvalid, len(v.Types), n)
	}
	t := &Tokenizer{model: v.Model, bos: -1, eos: -1, unk: -1}
	switch v.Model {
	case "llama":
		t.kind = kindSPM
		t.bos, t.eos, t.unk = 1, 2, 0
		t.spacePrefix = true
		t.addBOS = true
	case "gpt2":
		t.kind = kindBPE
		t.bos, t.eos = 11, 11
		pre, ok := preTokenizers[v.Pre]
		if v.Pre == "" {
			pre, ok = preTokenizers["default"], true
		}
		if !ok {
			return nil, fmt.Errorf("%w: BPE pre-tokenizer type %q (tokenizer.ggml.pre); known: %s", ErrUnsupported, v.Pre, strings.Join(knownPre(), ", "))
		}
		t.pre = pre.split
		t.ignoreMerges = pre.ignoreMerges
		if pre.addBOS {
			t.addBOS = true
		}
	case "bert":
		return nil, fmt.Errorf("%w: WordPiece (tokenizer.ggml.model \"bert\") vocabularies are not implemented", ErrUnsupported)
	case "":
		return nil, fmt.Errorf("%w: no tokenizer model (tokenizer.ggml.model is empty)", ErrInvalid)
	default:
		return nil, fmt.Errorf("%w: tokenizer model %q (only \"llama\" SPM and \"gpt2\" BPE are implemented)", ErrUnsupported, v.Model)
	}
	if v.AddSpacePrefix != nil {
		t.spacePrefix = *v.AddSpacePrefix
	}

	t.tokens = make([]string, n)
	t.scores = make([]float32, n)
	t.attrs = make([]attr, n)
	t.ids = make(map[string]int32, n)
	for i, s := range v.Tokens {
		if s == "" {
			// llama.cpp renames empty tokens so that the text → id map
			// stays one-to-one.
			s = "[EMPTY_" + strconv.Itoa(i) + "]"
		}
		if j, dup := t.ids[s]; dup {
			return nil, fmt.Errorf("%w: token %q appears twice (ids %d and %d)", ErrInvalid, s, j, i)
		}
		t.ids[s] = int32(i)
		t.tokens[i] = s
		if v.Scores != nil {
			t.scores[i] = v.Scores[i]
		}
		t.attrs[i] = attrNormal
		if v.Types != nil {
			t.attrs[i] = typeAttr(v.Types[i])
		}
	}

	if t.kind == kindBPE {
		t.merges = make(map[mergeKey]int32, len(v.Merges))
		for i, m := range v.Merges {
			// llama.cpp splits at the first space after the first byte, so
			// that a left part that is itself a space still works.
			var k mergeKey
			if len(m) > 1 {
				if p := strings.IndexByte(m[1:], ' '); p >= 0 {
					k = mergeKey{m[:p+1], m[p+2:]}
				}
			}
			if _, dup := t.merges[k]; !dup {
				t.merges[k] = int32(i)
			}
		}
	}

	// Special ids from the file override the defaults; an id outside the
	// vocabulary is ignored (llama.cpp warns and keeps the default), and a
	// default outside it means "none".
	for _, d := range []*int{&t.bos, &t.eos, &t.unk} {
		if *d >= n {
			*d = -1
		}
	}
	eot, eom := -1, -1
	for _, o := range []struct {
		dst *int
		src *int
	}{{&t.bos, v.BOS}, {&t.eos, v.EOS}, {&t.unk, v.UNK}, {&eot, v.EOT}, {&eom, v.EOM}} {
		if o.src != nil && *o.src >= 0 && *o.src < n {
			*o.dst = *o.src
		}
	}
	if v.AddBOS != nil {
		t.addBOS = *v.AddBOS
	}
	if v.AddEOS != nil {
		t.addEOS = *v.AddEOS
	}
	if t.addBOS && t.bos < 0 {
		return nil, fmt.Errorf("%w: add_bos_token is set but there is no BOS token", ErrInvalid)
	}
	if t.addEOS && t.eos < 0 {
		return nil, fmt.Errorf("%w: add_eos_token is set but there is no EOS token", ErrInvalid)
	}

	t.markEOG(eot, eom)
	t.setStripFlags(v)
	t.finish()
	t.setFIM(v)
	return t, nil
}

func typeAttr(tt int32) attr {
	switch tt {
	case TypeUnknown:
		return attrUnknown
	case TypeUnused:
		return attrUnused
	case TypeNormal:
		return attrNormal
	case TypeControl:
		return attrControl
	case TypeUserDefined:
		return attrUserDefined
	case TypeByte:
		return attrByte
	}
	return 0
}

// eotTexts are the texts llama.cpp recognises as end-of-turn tokens when the
// file names none; eogTexts are all texts it treats as ending generation.
var (
	eotTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>", "<｜end▁of▁sentence｜>"}
	eogTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>"}
)

// markEOG builds the end-of-generation set: EOS, EOT, EOM and every token
// whose text is a known end-of-turn marker. Such tokens become control
// tokens even if the file says otherwise, as in llama.cpp, which also means
// their text is only cut out of prompts when parseSpecial is set.
func (t *Tokenizer) markEOG(eot, eom int) {
	t.eog = make([]bool, len(t.tokens))
	mark := func(id int) {
		if id >= 0 {
			t.eog[id] = true
			t.attrs[id] |= attrControl
		}
	}
	if eot < 0 {
		for _, s := range eotTexts {
			if id, ok := t.ids[s]; ok {
				eot = int(id)
				break
			}
		}
	}
	if eom < 0 {
		if id, ok := t.ids["<|eom_id|>"]; ok {
			eom = int(id)
		}
	}
	for _, s := range eogTexts {
		if id, ok := t.ids[s]; ok {
			mark(int(id))
		}
	}
	mark(eot)
	mark(eom)
	if t.eos >= 0 {
		t.eog[t.eos] = true
	}
}

// setStripFlags applies llama.cpp's per-model whitespace stripping around
// special tokens (the GGUF has no per-token attributes for it).
func (t *Tokenizer) setStripFlags(v Vocab) {
	name := strings.ToLower(v.Name)
	switch {
	case strings.Contains(v.Pre, "jina-v2-de") || strings.Contains(v.Pre, "jina-v2-es") || strings.Contains(v.Pre, "jina-v2-code"):
		if id, ok := t.ids["<mask>"]; ok {
			t.attrs[id] |= attrLStrip
		}
	case strings.Contains(name, "phi-3") || strings.Contains(name, "phi3"):
		for id, a := range t.attrs {
			if a&(attrControl|attrUserDefined|attrUnknown) != 0 {
				t.attrs[id] |= attrRStrip
			}
		}
		if id, ok := t.ids["</s>"]; ok {
			t.attrs[id] |= attrRStrip
		}
		for _, s := range []string{"<unk>", "<s>", "<|endoftext|>"} {
			if id, ok := t.ids[s]; ok {
				t.attrs[id] &^= attrRStrip
			}
		}
	}
}

// finish builds the derived tables: special-token list, byte fallback ids
// and the piece of every token.
func (t *Tokenizer) finish() {
	t.special = t.special[:0]
	for id, a := range t.attrs {
		if a&(attrControl|attrUserDefined|attrUnknown) != 0 {
			t.special = append(t.special, int32(id))
		}
	}
	// Longest first, so that "<|im_end|>" is cut before a shorter token
	// that is its prefix; ties by id keep the order deterministic.
	slices.SortStableFunc(t.special, func(a, b int32) int {
		return cmp.Compare(len(t.tokens[b]), len(t.tokens[a]))
	})

	for b := range t.byteTok {
		t.byteTok[b] = -1
		if id, ok := t.ids[fmt.Sprintf("<0x%02X>", b)]; ok {
			t.byteTok[b] = id
		} else if id, ok := t.ids[string([]byte{byte(b)})]; ok {
			t.byteTok[b] = id
		}
	}

	t.pieces = make([][]byte, len(t.tokens))
	for id := range t.tokens {
		t.pieces[id] = t.makePiece(id)
	}
}

// makePiece is llama.cpp's token_to_piece with special=false: control and
// unknown tokens render as nothing, user-defined ones as their text, byte
// tokens as their byte, normal ones unescaped (SPM) or byte-decoded (BPE).
func (t *Tokenizer) makePiece(id int) []byte {
	a := t.attrs[id]
	text := t.tokens[id]
	if t.kind == kindLlama2C {
		if a&(attrControl|attrUnknown) != 0 {
			return nil
		}
		if b, ok := llama2cByte(text); ok {
			return []byte{b}
		}
		return []byte(text)
	}
	switch {
	case a&(attrControl|attrUnknown) != 0:
		return nil
	case a&attrUserDefined != 0:
		return []byte(text)
	case a&attrNormal != 0:
		if t.kind == kindSPM {
			return []byte(strings.ReplaceAll(text, "▁", " "))
		}
		return decodeByteLevel(text)
	case a&attrByte != 0:
		if len(text) >= 5 {
			if v, err := strconv.ParseUint(text[3:5], 16, 8); err == nil {
				return []byte{byte(v)}
			}
		}
		return nil
	}
	return nil
}

// Model names the tokenizer type: "llama" (SPM), "gpt2" (BPE) or "llama2.c".
func (t *Tokenizer) Model() string { return t.model }

// VocabSize is the number of token ids.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// BOS is the beginning-of-sequence id, -1 if the vocabulary has none.
func (t *Tokenizer) BOS() int { return t.bos }

// EOS is the end-of-sequence id, -1 if the vocabulary has none.
func (t *Tokenizer) EOS() int { return t.eos }

// AddsBOS reports whether Encode with addSpecial puts BOS first.
func (t *Tokenizer) AddsBOS() bool { return t.addBOS }

// IsEOG reports whether id ends generation: EOS, or an end-of-turn token
// such as <|eot_id|>, <|im_end|> or <|end|>.
func (t *Tokenizer) IsEOG(id int) bool {
	return id >= 0 && id < len(t.eog) && t.eog[id]
}

// IsControl reports whether id is a control or unknown token, one that
// contributes no text.
func (t *Tokenizer) IsControl(id int) bool {
	return id >= 0 && id < len(t.attrs) && t.attrs[id]&(attrControl|attrUnknown) != 0
}

// TokenText is the vocabulary's text for id ("" if id is out of range).
func (t *Tokenizer) TokenText(id int) string {
	if id < 0 || id >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// Piece is the raw bytes id contributes to decoded text; nil for control
// tokens and ids out of range. A piece may be part of a multi-byte UTF-8
// character. The returned slice must not be modified.
func (t *Tokenizer) Piece(id int) []byte {
	if id < 0 || id >= len(t.pieces) {
		return nil
	}
	return t.pieces[id]
}

// piece is Piece with the after-BOS space rule applied.
func (t *Tokenizer) piece(prev, id int) []byte {
	p := t.Piece(id)
	if !t.spacePrefix || prev < 0 || prev != t.bos || len(p) == 0 {
		return p
	}
	if t.kind == kindLlama2C {
		// run.c strips the space from the token's text before it looks
		// for a <0xNN> byte token.
		if text := t.tokens[id]; text[0] == ' ' {
			if b, ok := llama2cByte(text[1:]); ok {
				return []byte{b}
			}
			return []byte(text[1:])
		}
		return p
	}
	if p[0] == ' ' {
		p = p[1:]
	}
	return p
}

// Decode turns ids into text: the concatenation of their pieces, where a
// piece right after BOS loses one leading space if the vocabulary adds a
// space prefix. Ids out of range are skipped. The result may hold invalid
// UTF-8 if ids end inside a multi-byte character.
func (t *Tokenizer) Decode(ids []int) string {
	var b []byte
	prev := -1
	for _, id := range ids {
		b = append(b, t.piece(prev, id)...)
		prev = id
	}
	return string(b)
}

// Encode turns text into token ids. addSpecial adds BOS and EOS as the
// vocabulary asks (add_bos_token / add_eos_token); parseSpecial lets the
// literal text of control tokens (such as "<s>" or "<|im_start|>") become
// those tokens. User-defined tokens are always matched.
func (t *Tokenizer) Encode(text string, addSpecial, parseSpecial bool) []int {
	if t.kind == kindLlama2C {
		return t.l2c.encode(text, addSpecial && t.addBOS, addSpecial && t.addEOS)
	}
	var frags []fragment
	if text != "" {
		frags = t.partition(text, parseSpecial)
	}
	out := make([]int, 0, len(text)/3+2)
	if addSpecial && t.addBOS {
		out = append(out, t.bos)
	}
	switch t.kind {
	case kindSPM:
		prevSpecial := true // the first piece of text gets the space prefix
		s := spmPool.Get().(*spmSession)
		defer spmPool.Put(s)
		for _, f := range frags {
			if f.token >= 0 {
				out = append(out, int(f.token))
				prevSpecial = true
				continue
			}
			piece := text[f.start:f.end]
			if t.spacePrefix && prevSpecial {
				piece = " " + piece
			}
			out = s.tokenize(t, strings.ReplaceAll(piece, " ", "▁"), out)
			prevSpecial = false
		}
	case kindBPE:
		s := bpePool.Get().(*bpeSession)
		defer bpePool.Put(s)
		for _, f := range frags {
			if f.token >= 0 {
				out = append(out, int(f.token))
				continue
			}
			out = s.tokenize(t, text[f.start:f.end], out)
		}
	}
	if addSpecial && t.addEOS {
		out = append(out, t.eos)
	}
	return out
}

// Sessions hold scratch buffers; pooling them keeps Encode from
// reallocating them on every call.
var (
	spmPool = sync.Pool{New: func() any { return new(spmSession) }}
	bpePool = sync.Pool{New: func() any { return new(bpeSession) }}
)

// fragment is a piece of the input: text[start:end] still to tokenize, or
// (token >= 0) a special token already recognised.
type fragment struct {
	token      int32
	start, end int
}

// partition is llama.cpp's tokenizer_st_partition: for each special token,
// longest first, every text fragment is cut at each occurrence of the
// token's text. Tokens with the lstrip/rstrip attribute swallow ASCII
// whitespace on that side.
func (t *Tokenizer) partition(text string, parseSpecial bool) []fragment {
	frags := []fragment{{token: -1, start: 0, end: len(text)}}
	var next []fragment
	// Vocabularies with thousands of special tokens (deepseek-llm has 2400)
	// would cost a scan of the text per token; first rule out every token
	// whose first two bytes never occur together in the text.
	var pairs *[1 << 16 / 64]uint64
	if len(t.special) > 32 && len(text) > 1 {
		pairs = new([1 << 16 / 64]uint64)
		for i := 0; i+1 < len(text); i++ {
			p := uint16(text[i])<<8 | uint16(text[i+1])
			pairs[p/64] |= 1 << (p % 64)
		}
	}
	for _, id := range t.special {
		a := t.attrs[id]
		if !parseSpecial && a&(attrControl|attrUnknown) != 0 {
			continue
		}
		tok := t.tokens[id]
		if pairs != nil && len(tok) > 1 {
			if p := uint16(tok[0])<<8 | uint16(tok[1]); pairs[p/64]&(1<<(p%64)) == 0 {
				continue
			}
		}
		if !strings.Contains(text, tok) {
			continue // most special tokens never occur
		}
		next = next[:0]
		changed := false
		for _, f := range frags {
			if f.token >= 0 {
				next = append(next, f)
				continue
			}
			start, end := f.start, f.end
			for start < end {
				i := strings.Index(text[start:end], tok)
				if i < 0 {
					break
				}
				changed = true
				m := start + i
				left := m
				if a&attrLStrip != 0 {
					for left > start && isCSpace(text[left-1]) {
						left--
					}
				}
				if left > start {
					next = append(next, fragment{token: -1, start: start, end: left})
				}
				next = append(next, fragment{token: id, start: m, end: m + len(tok)})
				start = m + len(tok)
				if a&attrRStrip != 0 {
					for start < end && isCSpace(text[start]) {
						start++
					}
				}
			}
			if start < end {
				next = append(next, fragment{token: -1, start: start, end: end})
			}
		}
		if changed {
			frags, next = next, frags
		}
	}
	return frags
}

// isCSpace is C's isspace in the "C" locale.
func isCSpace(c byte) bool {
	return c == ' ' || (c >= '\t' && c <= '\r')
}
