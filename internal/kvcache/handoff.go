package kvcache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrHandoff: pages written from another node do not make up the sequence
// they were reserved for (a page missing, a fill count that disagrees with
// the total, too many or too few pages reserved). The caller ends the
// sequence; its pages are scrubbed on release like any others (I8).
var ErrHandoff = errors.New("kvcache: handoff does not match its reservation")

// HandoffPageBytes is the size of a page's wire form with filled positions
// (see ExportPage): for every layer, the K rows then the V rows of those
// positions, each element little-endian in the pool's dtype.
func (l Layout) HandoffPageBytes(filled int) int {
	l = l.withDefaults()
	return filled * l.KVDim() * l.DType.Size() * 2 * l.Layers
}

// ExportPage appends to dst the wire form of logical page i of s: its
// written positions only (what Commit recorded), never what was merely
// reserved (I3). s is checked against the ledger first, as Begin checks it
// (I2): on a mismatch s's pages are quarantined, s ends and the error wraps
// ErrViolation. It returns the extended dst and the page's filled count.
func (p *Pool) ExportPage(dst []byte, s *Sequence, i int) ([]byte, int, error) {
	if err := p.usable(s); err != nil {
		return dst, 0, err
	}
	ps := p.layout.PageSize
	if i < 0 || i >= len(s.table) || i*ps >= s.length {
		return dst, 0, fmt.Errorf("%w: page %d of a sequence of length %d", ErrInvalid, i, s.length)
	}
	if i < s.dropped {
		return dst, 0, fmt.Errorf("%w: page %d was given back behind the attention window", ErrInvalid, i)
	}
	if err := p.verify(s, 0); err != nil {
		return dst, 0, p.fail(s, "export", err)
	}
	dst, filled := p.exportRows(dst, s, i)
	return dst, filled, nil
}

// ExportPages is ExportPage for every written page of s, with the ledger
// check done once for the whole sequence rather than once per page.
func (p *Pool) ExportPages(s *Sequence) (pages [][]byte, filled []int, err error) {
	if err := p.usable(s); err != nil {
		return nil, nil, err
	}
	if err := p.verify(s, 0); err != nil {
		return nil, nil, p.fail(s, "export", err)
	}
	if s.dropped > 0 {
		// A handoff carries the whole prompt: the receiver commits only
		// pages 0..n of it, every one imported.
		return nil, nil, fmt.Errorf("%w: export of a sequence that gave back %d pages behind its attention window", ErrInvalid, s.dropped)
	}
	ps := p.layout.PageSize
	for i := 0; i*ps < s.length; i++ {
		data, f := p.exportRows(make([]byte, 0, p.layout.HandoffPageBytes(min(s.length-i*ps, ps))), s, i)
		pages, filled = append(pages, data), append(filled, f)
	}
	return pages, filled, nil
}

// exportRows appends the written rows of s's logical page i, which the
// caller checked exists and verified against the ledger.
func (p *Pool) exportRows(dst []byte, s *Sequence, i int) ([]byte, int) {
	ps := p.layout.PageSize
	filled := min(s.length-i*ps, ps)
	lo := (int(s.table[i].id) - 1) * p.pageElems
	hi := lo + filled*p.kvDim
	for l := range p.layout.Layers {
		if p.k32 != nil {
			dst = appendF32(dst, p.k32[l][lo:hi])
			dst = appendF32(dst, p.v32[l][lo:hi])
		} else {
			dst = appendU16(dst, p.k16[l][lo:hi])
			dst = appendU16(dst, p.v16[l][lo:hi])
		}
	}
	return dst, filled
}

// ImportPage writes the wire form of a page from another node (see
// ExportPage) into logical page i of s. s must be a sequence whose pages
// were reserved for the handoff and not yet committed (Len() == 0), and
// must own page i (checked against the ledger: a mismatch quarantines s
// and wraps ErrViolation). The page counts as written only once
// CommitImport accepts the whole sequence; until then nothing can read it
// (Begin sees a sequence of length 0).
func (p *Pool) ImportPage(s *Sequence, i, filled int, data []byte) error {
	if err := p.usable(s); err != nil {
		return err
	}
	ps := p.layout.PageSize
	switch {
	case s.length != 0:
		return fmt.Errorf("%w: import into a sequence that already holds %d positions", ErrInvalid, s.length)
	case i < 0 || i >= len(s.table):
		return fmt.Errorf("%w: page %d of %d reserved", ErrHandoff, i, len(s.table))
	case filled < 1 || filled > ps:
		return fmt.Errorf("%w: page %d with %d positions filled (page size %d)", ErrHandoff, i, filled, ps)
	case len(data) != p.layout.HandoffPageBytes(filled):
		return fmt.Errorf("%w: page %d holds %d bytes, %d positions need %d", ErrHandoff, i, len(data), filled, p.layout.HandoffPageBytes(filled))
	}
	if s.table[i].shared || !p.matches(s, i) {
		return p.fail(s, "import", p.describeMismatch(s, i))
	}
	if len(s.imported) < len(s.table) {
		s.imported = append(s.imported, make([]int32, len(s.table)-len(s.imported))...)
	}
	lo := (int(s.table[i].id) - 1) * p.pageElems
	hi := lo + filled*p.kvDim
	for l := range p.layout.Layers {
		if p.k32 != nil {
			data = readF32(p.k32[l][lo:hi], data)
			data = readF32(p.v32[l][lo:hi], data)
		} else {
			data = readU16(p.k16[l][lo:hi], data)
			data = readU16(p.v16[l][lo:hi], data)
		}
	}
	// Rows past filled keep the scrub pattern the page was allocated with;
	// a second import of the page with fewer rows must not leave the
	// first one's tail behind.
	if int(s.imported[i]) > filled {
		// The pattern the page was allocated with (zeros under ScrubNone).
		p.fillRows(s.table[i].id, filled, p.scrub == ScrubPoison)
	}
	s.imported[i] = int32(filled)
	return nil
}

// CommitImport makes the imported pages of s its content: tokens positions,
// every reserved page full but the last, each imported with exactly the
// positions that implies. Anything else (a page never imported, a fill
// count that disagrees, more or fewer pages reserved than tokens need: the
// incident reserved 8 pages and received 1) returns an error wrapping
// ErrHandoff and changes nothing; the caller ends s.
func (p *Pool) CommitImport(s *Sequence, tokens int) error {
	if err := p.usable(s); err != nil {
		return err
	}
	ps := p.layout.PageSize
	if s.length != 0 {
		return fmt.Errorf("%w: commit of an import into a sequence of length %d", ErrInvalid, s.length)
	}
	if testHooks.skipHandoffCheck {
		tokens = min(max(tokens, 1), len(s.table)*ps)
	} else if tokens < 1 || (tokens+ps-1)/ps != len(s.table) {
		return fmt.Errorf("%w: %d positions need %d pages, %d were reserved", ErrHandoff, tokens, (max(tokens, 0)+ps-1)/ps, len(s.table))
	}
	for i := range s.table {
		if testHooks.skipHandoffCheck {
			break
		}
		want := min(tokens-i*ps, ps)
		got := 0
		if i < len(s.imported) {
			got = int(s.imported[i])
		}
		if got != want {
			return fmt.Errorf("%w: page %d imported with %d positions, %d positions make it %d", ErrHandoff, i, got, tokens, want)
		}
	}
	for i := range s.table {
		if s.table[i].shared || !p.matches(s, i) {
			return p.fail(s, "commit import", p.describeMismatch(s, i))
		}
	}
	for i := range s.table {
		p.ledger[s.table[i].id].filled = int32(max(min(tokens-i*ps, ps), 0))
	}
	s.length = tokens
	s.imported = nil
	s.viewGen++
	return nil
}

func appendF32(dst []byte, src []float32) []byte {
	for _, x := range src {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
	}
	return dst
}

func appendU16(dst []byte, src []uint16) []byte {
	for _, x := range src {
		dst = binary.LittleEndian.AppendUint16(dst, x)
	}
	return dst
}

// readF32 fills dst from the front of data and returns the rest; the
// caller checked the length.
func readF32(dst []float32, data []byte) []byte {
	for j := range dst {
		dst[j] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*j:]))
	}
	return data[4*len(dst):]
}

func readU16(dst []uint16, data []byte) []byte {
	for j := range dst {
		dst[j] = binary.LittleEndian.Uint16(data[2*j:])
	}
	return data[2*len(dst):]
}
