package tokenizer

// bpeBigram is a candidate merge of adjacent symbols left and right whose
// texts have the given merge rank and total byte size.
type bpeBigram struct {
	left, right int
	rank        int32
	size        int
}

// bpeBefore orders the queue: lowest rank first, then leftmost, as
// llama.cpp's llm_bigram_bpe comparator does.
func bpeBefore(a, b bpeBigram) bool {
	return a.rank < b.rank || (a.rank == b.rank && a.left < b.left)
}

// bpeSession holds the scratch space of byte-level BPE tokenization,
// reused across the fragments of one Encode call.
type bpeSession struct {
	cpts   []rune
	chunks []int
	tmp    []int
	word   []byte
	syms   []symbol
	queue  minHeap[bpeBigram]
}

// tokenize appends the tokens of text to out: pre-tokenize into words, map
// each word's bytes to GPT-2's alphabet, merge by rank (llama.cpp's
// llm_tokenizer_bpe_session).
func (s *bpeSession) tokenize(t *Tokenizer, text string, out []int) []int {
	s.cpts = cpts(text, s.cpts[:0])
	s.chunks = append(s.chunks[:0], len(s.cpts))
	for _, split := range t.pre {
		s.tmp = split(s.cpts, s.chunks, s.tmp[:0])
		s.chunks, s.tmp = s.tmp, s.chunks
	}
	start := 0
	var raw []byte
	for _, n := range s.chunks {
		raw = raw[:0]
		for _, r := range s.cpts[start : start+n] {
			raw = appendCpt(raw, r)
		}
		start += n
		s.word = s.word[:0]
		for _, b := range raw {
			s.word = append(s.word, byteToUTF8[b]...)
		}
		out = s.mergeWord(t, string(s.word), out)
	}
	return out
}

func (s *bpeSession) mergeWord(t *Tokenizer, word string, out []int) []int {
	if word == "" {
		return out
	}
	if t.ignoreMerges {
		if id, ok := t.ids[word]; ok {
			return append(out, int(id))
		}
	}
	s.syms = s.syms[:0]
	for off := 0; off < len(word); {
		n := min(utf8Len(word[off]), len(word)-off)
		idx := len(s.syms)
		next := idx + 1
		if off+n == len(word) {
			next = -1
		}
		s.syms = append(s.syms, symbol{prev: idx - 1, next: next, start: off, n: n})
		off += n
	}
	s.queue.reset(bpeBefore)
	for i := 1; i < len(s.syms); i++ {
		s.tryAdd(t, word, i-1, i)
	}
	for s.queue.len() > 0 {
		b := s.queue.pop()
		l, r := &s.syms[b.left], &s.syms[b.right]
		// A candidate is stale once either side has changed; while both
		// are live and adjacent, the sizes tell (llama.cpp compares the
		// texts, which amounts to the same).
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			s.syms[r.next].prev = b.left
		}
		s.tryAdd(t, word, l.prev, b.left)
		s.tryAdd(t, word, b.left, l.next)
	}
	for i := 0; i != -1; i = s.syms[i].next {
		sym := s.syms[i]
		piece := word[sym.start : sym.start+sym.n]
		if id, ok := t.ids[piece]; ok {
			out = append(out, int(id))
			continue
		}
		// No token: llama.cpp looks each byte up as a one-byte token and
		// drops the ones that have none.
		for j := 0; j < len(piece); j++ {
			if id, ok := t.ids[piece[j:j+1]]; ok {
				out = append(out, int(id))
			}
		}
	}
	return out
}

func (s *bpeSession) tryAdd(t *Tokenizer, word string, left, right int) {
	if left < 0 || right < 0 {
		return
	}
	l, r := s.syms[left], s.syms[right]
	rank, ok := t.merges[mergeKey{word[l.start : l.start+l.n], word[r.start : r.start+r.n]}]
	if !ok {
		return
	}
	s.queue.push(bpeBigram{left: left, right: right, rank: rank, size: l.n + r.n})
}
