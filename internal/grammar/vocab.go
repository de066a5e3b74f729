package grammar

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"unicode/utf8"
)

// Vocab is a tokenizer's vocabulary as bytes: a trie of every token's
// piece, and the end-of-generation tokens. Build one per model; it is
// immutable and safe for concurrent use.
type Vocab struct {
	size  int
	nodes []tnode
	edges []tedge
	toks  []int32 // token ids, grouped by the trie node their piece ends at
	ends  []int   // end-of-generation tokens
	isEnd []bool
	// pieces are the tokens' bytes, as the tokenizer holds them (not
	// copied): Accept feeds them.
	pieces [][]byte
	// plain marks the tokens a JSON string takes whole and is left as it
	// was (printable ASCII but quote and backslash, whole UTF-8
	// characters); plainNode[n] reports that every token in trie node n's
	// subtree is plain. Inside a string, the widest state, the mask is
	// then plain plus a walk of the other subtrees only.
	plain     []uint64
	plainNode []bool
}

// isPlain reports whether a string's content can be p as it is.
func isPlain(p []byte) bool {
	for _, b := range p {
		if b < 0x20 || b == '"' || b == '\\' {
			return false
		}
	}
	return utf8.Valid(p)
}

type tnode struct {
	edgeLo, edgeHi int32 // children: edges[edgeLo:edgeHi], sorted by byte
	tokLo, tokHi   int32 // tokens whose piece ends here: toks[tokLo:tokHi]
}

type tedge struct {
	b     byte
	child int32
}

// NewVocab builds the vocabulary of size tokens; piece gives a token's
// bytes (nil or empty for control tokens, which are never allowed) and
// isEnd reports the end-of-generation tokens (allowed once the value is
// complete).
func NewVocab(size int, piece func(id int) []byte, isEnd func(id int) bool) *Vocab {
	v := &Vocab{size: size, isEnd: make([]bool, size), pieces: make([][]byte, size), plain: make([]uint64, (size+63)/64)}
	// Sort the tokens by their bytes; the trie is then built in one pass
	// with children in byte order.
	type tok struct {
		id int
		p  []byte
	}
	var ts []tok
	for id := 0; id < size; id++ {
		if isEnd(id) {
			v.ends = append(v.ends, id)
			v.isEnd[id] = true
			continue
		}
		if p := piece(id); len(p) > 0 {
			v.pieces[id] = p
			if isPlain(p) {
				v.plain[id/64] |= 1 << (id % 64)
			}
			ts = append(ts, tok{id, p})
		}
	}
	slices.SortFunc(ts, func(a, b tok) int {
		if c := slices.Compare(a.p, b.p); c != 0 {
			return c
		}
		return a.id - b.id
	})
	// Build a pointer trie first, then flatten it depth-first.
	type bnode struct {
		kids  []*bnode
		bytes []byte
		ids   []int32
	}
	root := &bnode{}
	for _, t := range ts {
		at := root
		for _, b := range t.p {
			k := len(at.kids) - 1
			if k < 0 || at.bytes[k] != b {
				at.kids = append(at.kids, &bnode{})
				at.bytes = append(at.bytes, b)
				k++
			}
			at = at.kids[k]
		}
		at.ids = append(at.ids, int32(t.id))
	}
	var flatten func(b *bnode) int32
	flatten = func(b *bnode) int32 {
		i := int32(len(v.nodes))
		v.nodes = append(v.nodes, tnode{})
		v.plainNode = append(v.plainNode, false)
		lo := int32(len(v.toks))
		v.toks = append(v.toks, b.ids...)
		v.nodes[i].tokLo, v.nodes[i].tokHi = lo, int32(len(v.toks))
		elo := int32(len(v.edges))
		for j := range b.kids {
			v.edges = append(v.edges, tedge{b: b.bytes[j]})
		}
		v.nodes[i].edgeLo, v.nodes[i].edgeHi = elo, int32(len(v.edges))
		all := true
		for _, id := range b.ids {
			all = all && Allowed(v.plain, int(id))
		}
		for j, k := range b.kids {
			c := flatten(k)
			v.edges[int(elo)+j].child = c
			all = all && v.plainNode[c]
		}
		v.plainNode[i] = all
		return i
	}
	flatten(root)
	return v
}

// MaskWords is the length of a mask for v, in 64-bit words.
func (v *Vocab) MaskWords() int { return (v.size + 63) / 64 }

// Allowed reports whether token id is set in mask.
func Allowed(mask []uint64, id int) bool {
	return id >= 0 && id/64 < len(mask) && mask[id/64]&(1<<(id%64)) != 0
}

// maxCached bounds a Bound's mask cache; when full it starts afresh. The
// states a schema's outputs visit repeat (inside a string, between
// digits), so a small cache holds the hot ones.
const maxCached = 128

// Bound is a grammar bound to a vocabulary, with a cache of masks by
// state. Safe for concurrent use; its Matchers are not.
type Bound struct {
	g *Grammar
	v *Vocab

	mu    sync.Mutex
	cache map[string][]uint64
	// Hits and Misses count cache lookups (for tests and benchmarks).
	hits, misses uint64
}

// Bind binds g to v.
func (g *Grammar) Bind(v *Vocab) *Bound {
	return &Bound{g: g, v: v, cache: map[string][]uint64{}}
}

// CacheStats returns the mask cache's hits and misses so far.
func (b *Bound) CacheStats() (hits, misses uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hits, b.misses
}

// Mask returns the tokens allowed in state s: those whose every byte the
// automaton takes, and the end-of-generation tokens if s is Complete. The
// slice is shared (cached) and must not be modified.
func (b *Bound) Mask(s *State) []uint64 {
	var kb [64]byte
	key := s.key(kb[:0])
	b.mu.Lock()
	m, ok := b.cache[string(key)]
	if ok {
		b.hits++
	} else {
		b.misses++
	}
	b.mu.Unlock()
	if ok {
		return m
	}
	m = b.compute(s)
	b.mu.Lock()
	if len(b.cache) >= maxCached {
		clear(b.cache)
	}
	b.cache[string(key)] = m
	b.mu.Unlock()
	return m
}

// compute walks the vocabulary's trie with copies of the state, pruning
// every subtree whose prefix the automaton refuses.
func (b *Bound) compute(s *State) []uint64 {
	v := b.v
	mask := make([]uint64, v.MaskWords())
	if b.g.Complete(s) {
		for _, id := range v.ends {
			mask[id/64] |= 1 << (id % 64)
		}
	}
	if s.Done() {
		return mask
	}
	var stack []State // stack[d] is the state after d bytes of the current path
	stack = append(stack, *s)
	// Inside a string, a plain token leaves the state as it found it: all
	// plain tokens are allowed at once, and a subtree of plain tokens
	// reached without leaving the root state is skipped.
	top := s.f[s.n-1]
	inString := b.g.nodes[top.node].kind == kString && top.phase == pInString
	if inString {
		for i, w := range v.plain {
			mask[i] |= w
		}
	}
	var walk func(node int32, d int)
	walk = func(node int32, d int) {
		nd := v.nodes[node]
		for e := nd.edgeLo; e < nd.edgeHi; e++ {
			ed := v.edges[e]
			if inString && v.plainNode[ed.child] && stack[d].n == s.n && stack[d].f[s.n-1] == top {
				continue
			}
			if len(stack) <= d+1 {
				stack = append(stack, State{})
			}
			next := &stack[d+1]
			cur := &stack[d]
			next.n = cur.n
			copy(next.f[:cur.n], cur.f[:cur.n])
			if !b.g.Step(next, ed.b) {
				continue
			}
			c := v.nodes[ed.child]
			for _, id := range v.toks[c.tokLo:c.tokHi] {
				mask[id/64] |= 1 << (id % 64)
			}
			if c.edgeHi > c.edgeLo {
				walk(ed.child, d+1)
			}
		}
	}
	walk(0, 0)
	return mask
}

// ErrRefused is returned by Matcher.Accept for a token the mask did not
// allow: a sampler bug, or a replay of a history that another constraint
// produced.
var ErrRefused = errors.New("grammar: token not allowed by the constraint")

// Matcher is one sequence's constraint: the automaton's state after the
// tokens accepted so far. Not safe for concurrent use.
type Matcher struct {
	b     *Bound
	st    State
	n     int  // tokens accepted
	ended bool // an end-of-generation token was accepted
}

// NewMatcher starts a sequence's constraint.
func (b *Bound) NewMatcher() *Matcher {
	return &Matcher{b: b, st: b.g.Start()}
}

// Accepted is the number of tokens accepted so far.
func (m *Matcher) Accepted() int { return m.n }

// Complete reports whether the output so far is a whole value.
func (m *Matcher) Complete() bool { return m.ended || m.b.g.Complete(&m.st) }

// Mask returns the tokens allowed next (shared; do not modify). After an
// end token nothing is.
func (m *Matcher) Mask() []uint64 {
	if m.ended {
		return make([]uint64, m.b.v.MaskWords())
	}
	return m.b.Mask(&m.st)
}

// Accept advances past token id; it fails, changing nothing, if the
// constraint does not allow it.
func (m *Matcher) Accept(id int) error {
	v := m.b.v
	if m.ended || id < 0 || id >= v.size {
		return fmt.Errorf("%w: token %d", ErrRefused, id)
	}
	if v.isEnd[id] {
		if !m.b.g.Complete(&m.st) {
			return fmt.Errorf("%w: end token %d before the value is complete", ErrRefused, id)
		}
		m.ended = true
		m.n++
		return nil
	}
	st := m.st
	if p := v.pieces[id]; len(p) == 0 || !m.b.g.Feed(&st, p) {
		return fmt.Errorf("%w: token %d", ErrRefused, id)
	}
	m.st = st
	m.n++
	return nil
}
