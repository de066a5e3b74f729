//go:build pw_mutants

package kvcache

import (
	"slices"
	"sync"

	"github.com/pagewarden/pagewarden/internal/request"
)

// SwapRecord is one sequence the page-swap control contaminated: from
// the step it was swapped on, the view of Owner's sequence named, as its
// entry Entry, page Page (epoch Epoch) of Foreign instead of its own.
type SwapRecord struct {
	Owner   request.Owner
	Entry   int
	Page    PageID
	Epoch   uint64
	Foreign request.Owner
}

// SwapPageForControls is the replay audit's positive control: behind the
// ownership check (Begin verifies the sequence's own block table, then
// hands out a view whose first page is another tenant's), every sequence
// of tenant victim that holds a full first page while another tenant's
// sequence owns a full page reads that page, from then on, in place of its
// own first page — the incident's contamination, a page of someone else's
// KV attended over as if it were the sequence's prompt. Only read-only
// pages are swapped (the first, once full), so nothing is written to the
// foreign page. contaminated lists the sequences swapped so far.
func SwapPageForControls(victim request.Tenant) (contaminated func() []SwapRecord, restore func()) {
	var mu sync.Mutex
	bySerial := map[uint64]SwapRecord{}
	var order []uint64
	testHooks.swapPage = func(p *Pool, s *Sequence, table []entry) []entry {
		ps := p.layout.PageSize
		if s.owner.Tenant != victim || s.dropped > 0 || s.length < ps || len(table) < 2 {
			return table
		}
		mu.Lock()
		defer mu.Unlock()
		rec, ok := bySerial[s.serial]
		if !ok {
			for id := 1; id <= p.total; id++ {
				pg := &p.ledger[id]
				if pg.state == PageOwned && pg.owner.Tenant != victim && int(pg.filled) == ps {
					rec = SwapRecord{Owner: s.owner, Entry: 0, Page: PageID(id), Epoch: pg.epoch, Foreign: pg.owner}
					ok = true
					break
				}
			}
			if !ok {
				return table // no foreign page to read yet
			}
			bySerial[s.serial] = rec
			order = append(order, s.serial)
		}
		out := slices.Clone(table)
		out[rec.Entry] = entry{id: rec.Page, epoch: rec.Epoch}
		return out
	}
	contaminated = func() []SwapRecord {
		mu.Lock()
		defer mu.Unlock()
		out := make([]SwapRecord, 0, len(order))
		for _, k := range order {
			out = append(out, bySerial[k])
		}
		return out
	}
	return contaminated, func() { testHooks.swapPage = nil }
}
