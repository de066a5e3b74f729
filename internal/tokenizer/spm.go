package tokenizer

// symbol is one run of bytes of the text being merged, linked to its live
// neighbours. n == 0 marks a symbol merged into its left neighbour.
type symbol struct {
	prev, next int
	start, n   int
}

// spmBigram is a candidate merge of symbols left and right (adjacent when it
// was queued) into a token of the given score and byte size.
type spmBigram struct {
	left, right int32
	score       float32
	size        int32
}

// spmBefore orders the queue: best score first, then leftmost, as
// llama.cpp's llm_bigram_spm comparator does.
func spmBefore(a, b spmBigram) bool {
	return a.score > b.score || (a.score == b.score && a.left < b.left)
}

// spmSession holds the scratch space of one SPM tokenization; its buffers
// are reused across the text fragments of one Encode call.
type spmSession struct {
	syms  []symbol
	queue minHeap[spmBigram]
}

// utf8Len is llama.cpp's unicode_len_utf8: the sequence length implied by a
// lead byte, 1 for ASCII and for stray continuation bytes.
func utf8Len(b byte) int {
	switch b >> 4 {
	case 0xC, 0xD:
		return 2
	case 0xE:
		return 3
	case 0xF:
		return 4
	}
	return 1
}

// tokenize appends the SPM tokens of text, whose spaces are already escaped
// to U+2581, to out. It is llama.cpp's llm_tokenizer_spm_session.
func (s *spmSession) tokenize(t *Tokenizer, text string, out []int) []int {
	if text == "" {
		return out
	}
	s.syms = s.syms[:0]
	for off := 0; off < len(text); {
		n := min(utf8Len(text[off]), len(text)-off)
		idx := len(s.syms)
		next := idx + 1
		if off+n == len(text) {
			next = -1
		}
		s.syms = append(s.syms, symbol{prev: idx - 1, next: next, start: off, n: n})
		off += n
	}
	s.queue.reset(spmBefore)
	for i := 1; i < len(s.syms); i++ {
		s.tryAdd(t, text, i-1, i)
	}
	for s.queue.len() > 0 {
		b := s.queue.pop()
		l, r := &s.syms[b.left], &s.syms[b.right]
		// Skip candidates made stale by an earlier merge.
		if l.n == 0 || r.n == 0 || l.n+r.n != int(b.size) {
			continue
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			s.syms[r.next].prev = int(b.left)
		}
		s.tryAdd(t, text, l.prev, int(b.left))
		s.tryAdd(t, text, int(b.left), l.next)
	}
	for i := 0; i != -1; i = s.syms[i].next {
		sym := s.syms[i]
		piece := text[sym.start : sym.start+sym.n]
		if id, ok := t.ids[piece]; ok {
			out = append(out, int(id))
			continue
		}
		// Every merged symbol is a token, so only single characters the
		// vocabulary lacks get here: spell them as byte tokens.
		for j := 0; j < len(piece); j++ {
			if id := t.byteTok[piece[j]]; id >= 0 {
				out = append(out, int(id))
			} else if t.unk >= 0 {
				out = append(out, t.unk)
			}
		}
	}
	return out
}

func (s *spmSession) tryAdd(t *Tokenizer, text string, left, right int) {
	if left < 0 || right < 0 {
		return
	}
	l, r := s.syms[left], s.syms[right]
	id, ok := t.ids[text[l.start:r.start+r.n]]
	if !ok {
		return
	}
	s.queue.push(spmBigram{left: int32(left), right: int32(right), score: t.scores[id], size: int32(l.n + r.n)})
}
