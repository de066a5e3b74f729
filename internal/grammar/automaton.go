package grammar

import "encoding/binary"

// frame is one level of the automaton's stack: a value being written. Its
// meaning depends on the node's kind (see the phase constants). It is small
// and has no pointers, so a State copies cheaply and can key a cache.
type frame struct {
	node  uint16
	phase uint8
	ws    uint8  // 1 when the current gap has had its one space
	i     uint16 // object: next property; string: UTF-8 bytes still due; literal: trie node; array: items begun
	k     uint16 // object: candidate property being matched; string: low bound of the next byte
	off   uint16 // object: bytes of the key matched; string: high bound of the next byte
}

const frameBytes = 10

// Phases. pStart is every frame's first; a value frame never takes
// whitespace itself (its container does).
const (
	pStart = iota
	// objects
	pKeyOrClose // after '{'
	pKey        // inside a key (i..: candidates, k: matched one, off: bytes)
	pColon      // after a key
	pBeforeVal  // after ':'
	pAfterVal   // after a member's value
	pAfterComma // after ','
	// arrays (pAfterVal shared)
	pFirstItem  // after '['
	pBeforeItem // after ','
	// strings
	pInString
	pEscape
	pHex // i: hex digits still due
	pUTF8
	// numbers
	pMinus
	pZero
	pInt
	pDot
	pFrac
	pExp
	pExpSign
	pExpDigits
	// literals: pLit with i the trie node
	pLit
)

// State is the automaton's state: the stack of values being written. The
// zero State is not valid; use Grammar.Start. A State is a value: copying
// it forks the automaton.
type State struct {
	n int
	f [MaxDepth + 1]frame
}

// Start is the state before the first byte.
func (g *Grammar) Start() State {
	var s State
	s.n = 1
	s.f[0] = frame{node: uint16(g.root)}
	return s
}

// Done reports whether the value is finished and no byte may follow.
func (s *State) Done() bool { return s.n == 0 }

// Complete reports whether the bytes so far form a whole value (an
// end-of-generation token may come now). A top-level number is complete
// and may still go on; an object is complete only when closed.
func (g *Grammar) Complete(s *State) bool {
	if s.n == 0 {
		return true
	}
	if s.n > 1 {
		return false
	}
	f := &s.f[0]
	switch f.phase {
	case pZero, pInt, pFrac, pExpDigits:
		return true
	case pLit:
		return g.nodes[f.node].lits[f.i].end
	}
	return false
}

// key appends s's bytes as a cache key.
func (s *State) key(dst []byte) []byte {
	for i := 0; i < s.n; i++ {
		f := &s.f[i]
		dst = binary.LittleEndian.AppendUint16(dst, f.node)
		dst = append(dst, f.phase, f.ws)
		dst = binary.LittleEndian.AppendUint16(dst, f.i)
		dst = binary.LittleEndian.AppendUint16(dst, f.k)
		dst = binary.LittleEndian.AppendUint16(dst, f.off)
	}
	return dst
}

// step results of one frame.
const (
	rTaken = iota // the byte is consumed
	rNo           // the byte is refused
	rPop          // the frame is complete and the byte is not its: pop, give it to the parent
)

// Step feeds one byte; it reports false, leaving s unusable, if no value
// the grammar accepts continues with it.
func (g *Grammar) Step(s *State, b byte) bool {
	for s.n > 0 {
		switch g.stepFrame(s, b) {
		case rTaken:
			return true
		case rNo:
			return false
		}
		s.n--
	}
	return false // the value is finished: nothing may follow
}

// Feed steps every byte of p.
func (g *Grammar) Feed(s *State, p []byte) bool {
	for _, b := range p {
		if !g.Step(s, b) {
			return false
		}
	}
	return true
}

// push starts a value of node on top of the stack and gives it b.
func (g *Grammar) push(s *State, nd int, b byte) int {
	if s.n >= len(s.f) {
		return rNo
	}
	s.f[s.n] = frame{node: uint16(nd)}
	s.n++
	switch g.stepFrame(s, b) {
	case rTaken:
		return rTaken
	default:
		// A value cannot be complete before its first byte, so rPop
		// cannot happen; either way the byte is refused here.
		return rNo
	}
}

func space(f *frame, b byte) bool {
	if b == ' ' && f.ws == 0 {
		f.ws = 1
		return true
	}
	return false
}

func (g *Grammar) stepFrame(s *State, b byte) int {
	f := &s.f[s.n-1]
	n := &g.nodes[f.node]
	switch n.kind {
	case kAny, kAnyOf:
		// Become the branch the first byte picks.
		var pick int = -1
		if n.kind == kAny {
			for _, k := range [...]int{g.anyObj, g.anyArr, g.anyStr, g.anyNum, g.anyLit} {
				if g.nodes[k].first[b] {
					pick = k
					break
				}
			}
			if (pick == g.anyObj || pick == g.anyArr) && s.n > MaxDepth {
				return rNo // containers nest at most MaxDepth deep
			}
		} else {
			for _, k := range n.branches {
				if g.nodes[k].first[b] {
					pick = k
					break
				}
			}
		}
		if pick < 0 {
			return rNo
		}
		*f = frame{node: uint16(pick)}
		return g.stepFrame(s, b)
	case kObject:
		return g.stepObject(s, f, n, b)
	case kArray:
		return g.stepArray(s, f, n, b)
	case kString:
		return stepString(s, f, b)
	case kNumber, kInteger:
		return stepNumber(f, b, n.kind == kInteger)
	case kCall:
		// The prefix naming the function; at its end the frame becomes
		// the closing brace, with the function's arguments above it.
		if f.phase == pStart {
			f.phase, f.i = pLit, 0
		}
		nx, ok := n.lits[f.i].next[b]
		if !ok {
			return rNo
		}
		f.i = nx
		if l := &n.lits[nx]; l.end {
			if s.n >= len(s.f) {
				return rNo
			}
			*f = frame{node: uint16(g.closeBrace)}
			s.f[s.n] = frame{node: uint16(n.branches[l.branch])}
			s.n++
		}
		return rTaken
	case kLiterals:
		if f.phase == pStart {
			f.phase, f.i = pLit, 0
		}
		nx, ok := n.lits[f.i].next[b]
		if !ok {
			if n.lits[f.i].end {
				return rPop
			}
			return rNo
		}
		f.i = nx
		if l := &n.lits[nx]; l.end && len(l.next) == 0 {
			s.n-- // nothing can follow: the value is done
		}
		return rTaken
	}
	return rNo
}

func (g *Grammar) stepObject(s *State, f *frame, n *node, b byte) int {
	switch f.phase {
	case pStart:
		if b != '{' {
			return rNo
		}
		f.phase, f.ws, f.i = pKeyOrClose, 0, 0
		return rTaken
	case pKeyOrClose, pAfterComma:
		if space(f, b) {
			return rTaken
		}
		if b == '}' && f.phase == pKeyOrClose && !g.needsMore(n, f) {
			s.n--
			return rTaken
		}
		if b != '"' {
			return rNo
		}
		f.ws = 0
		if n.generic {
			// Any key: a string frame already past its opening quote.
			f.phase = pColon
			return g.pushString(s)
		}
		if int(f.i) >= len(n.props) {
			return rNo
		}
		f.phase, f.k, f.off = pKey, f.i, 1
		return rTaken
	case pKey:
		return stepKey(s, f, n, b)
	case pColon:
		if b != ':' {
			return rNo
		}
		f.phase, f.ws = pBeforeVal, 0
		return rTaken
	case pBeforeVal:
		if space(f, b) {
			return rTaken
		}
		child := g.anyNode
		if !n.generic {
			child = n.props[f.k].node
			f.i = f.k + 1
		}
		f.phase, f.ws = pAfterVal, 0
		return g.push(s, child, b)
	case pAfterVal:
		if space(f, b) {
			return rTaken
		}
		switch b {
		case ',':
			if !n.generic && int(f.i) >= len(n.props) {
				return rNo
			}
			f.phase, f.ws = pAfterComma, 0
			return rTaken
		case '}':
			if g.needsMore(n, f) {
				return rNo
			}
			s.n--
			return rTaken
		}
	}
	return rNo
}

// needsMore reports whether a required property is still to come.
func (g *Grammar) needsMore(n *node, f *frame) bool {
	return !n.generic && n.reqAfter != nil && n.reqAfter[f.i]
}

// stepKey matches a key among the candidates: properties f.i.. up to and
// including the first required one (those after it cannot come before
// it). f.k is the first candidate that matches the f.off bytes so far;
// all candidates that do share those bytes.
func stepKey(s *State, f *frame, n *node, b byte) int {
	cur := n.props[f.k].key[:f.off]
	for c := int(f.k); c < len(n.props); c++ {
		key := n.props[c].key
		if len(key) > int(f.off) && key[f.off] == b && string(key[:f.off]) == string(cur) {
			f.k = uint16(c)
			f.off++
			if int(f.off) == len(key) { // the closing quote: the key is whole
				f.phase, f.ws = pColon, 0
			}
			return rTaken
		}
		if n.props[c].required {
			break
		}
	}
	return rNo
}

func (g *Grammar) stepArray(s *State, f *frame, n *node, b byte) int {
	switch f.phase {
	case pStart:
		if b != '[' {
			return rNo
		}
		f.phase, f.ws = pFirstItem, 0
		return rTaken
	case pFirstItem, pBeforeItem:
		if space(f, b) {
			return rTaken
		}
		if b == ']' && f.phase == pFirstItem && n.minItems == 0 {
			s.n--
			return rTaken
		}
		if n.maxItems >= 0 && int(f.i) >= n.maxItems {
			return rNo
		}
		f.phase, f.ws = pAfterVal, 0
		f.i++
		return g.push(s, n.items, b)
	case pAfterVal:
		if space(f, b) {
			return rTaken
		}
		switch b {
		case ',':
			if n.maxItems >= 0 && int(f.i) >= n.maxItems {
				return rNo
			}
			f.phase, f.ws = pBeforeItem, 0
			return rTaken
		case ']':
			if int(f.i) < n.minItems {
				return rNo
			}
			s.n--
			return rTaken
		}
	}
	return rNo
}

// pushString starts a generic string whose opening quote was consumed.
func (g *Grammar) pushString(s *State) int {
	if s.n >= len(s.f) {
		return rNo
	}
	s.f[s.n] = frame{node: uint16(g.anyStr), phase: pInString}
	s.n++
	return rTaken
}

func isHex(b byte) bool {
	return b >= '0' && b <= '9' || b >= 'a' && b <= 'f' || b >= 'A' && b <= 'F'
}

// stepString accepts JSON string bytes: no control characters, valid
// escapes, and valid UTF-8 (no overlong forms, no surrogates, nothing above
// U+10FFFF), so that any parser reads the text back.
func stepString(s *State, f *frame, b byte) int {
	switch f.phase {
	case pStart:
		if b != '"' {
			return rNo
		}
		f.phase = pInString
		return rTaken
	case pInString:
		switch {
		case b == '"':
			s.n--
		case b == '\\':
			f.phase = pEscape
		case b < 0x20:
			return rNo
		case b < 0x80:
		case b >= 0xC2 && b <= 0xDF:
			f.phase, f.i, f.k, f.off = pUTF8, 1, 0x80, 0xBF
		case b == 0xE0:
			f.phase, f.i, f.k, f.off = pUTF8, 2, 0xA0, 0xBF
		case b == 0xED:
			f.phase, f.i, f.k, f.off = pUTF8, 2, 0x80, 0x9F
		case b >= 0xE1 && b <= 0xEF:
			f.phase, f.i, f.k, f.off = pUTF8, 2, 0x80, 0xBF
		case b == 0xF0:
			f.phase, f.i, f.k, f.off = pUTF8, 3, 0x90, 0xBF
		case b >= 0xF1 && b <= 0xF3:
			f.phase, f.i, f.k, f.off = pUTF8, 3, 0x80, 0xBF
		case b == 0xF4:
			f.phase, f.i, f.k, f.off = pUTF8, 3, 0x80, 0x8F
		default:
			return rNo
		}
		return rTaken
	case pUTF8:
		if uint16(b) < f.k || uint16(b) > f.off {
			return rNo
		}
		f.i--
		f.k, f.off = 0x80, 0xBF
		if f.i == 0 {
			f.phase, f.k, f.off = pInString, 0, 0
		}
		return rTaken
	case pEscape:
		switch b {
		case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			f.phase = pInString
		case 'u':
			f.phase, f.i = pHex, 4
		default:
			return rNo
		}
		return rTaken
	case pHex:
		if !isHex(b) {
			return rNo
		}
		f.i--
		if f.i == 0 {
			f.phase = pInString
		}
		return rTaken
	}
	return rNo
}

func isDigit(b byte) bool { return b >= '0' && b <= '9' }

// stepNumber is JSON's number grammar, -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?,
// without the fraction and exponent for integers. A byte that cannot go on
// a complete number belongs to the container (rPop).
func stepNumber(f *frame, b byte, integer bool) int {
	switch f.phase {
	case pStart:
		switch {
		case b == '-':
			f.phase = pMinus
		case b == '0':
			f.phase = pZero
		case isDigit(b):
			f.phase = pInt
		default:
			return rNo
		}
		return rTaken
	case pMinus:
		switch {
		case b == '0':
			f.phase = pZero
		case isDigit(b):
			f.phase = pInt
		default:
			return rNo
		}
		return rTaken
	case pZero, pInt:
		switch {
		case f.phase == pInt && isDigit(b):
		case b == '.' && !integer:
			f.phase = pDot
		case (b == 'e' || b == 'E') && !integer:
			f.phase = pExp
		default:
			return rPop
		}
		return rTaken
	case pDot:
		if !isDigit(b) {
			return rNo
		}
		f.phase = pFrac
		return rTaken
	case pFrac:
		switch {
		case isDigit(b):
		case b == 'e' || b == 'E':
			f.phase = pExp
		default:
			return rPop
		}
		return rTaken
	case pExp:
		switch {
		case b == '+' || b == '-':
			f.phase = pExpSign
		case isDigit(b):
			f.phase = pExpDigits
		default:
			return rNo
		}
		return rTaken
	case pExpSign:
		if !isDigit(b) {
			return rNo
		}
		f.phase = pExpDigits
		return rTaken
	case pExpDigits:
		if isDigit(b) {
			return rTaken
		}
		return rPop
	}
	return rNo
}
