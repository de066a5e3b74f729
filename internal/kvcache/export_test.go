package kvcache

import "testing"

// Test-only hooks that re-introduce the bugs the checks must catch
// (positive controls). Each restores the pool's normal behaviour when the
// test ends.

// SkipScrub makes releases skip the scrub (control c).
func SkipScrub(t testing.TB) {
	testHooks.skipScrub = true
	t.Cleanup(func() { testHooks.skipScrub = false })
}

// KeyOmitsTenant drops the tenant from prefix-cache keys (control d).
func KeyOmitsTenant(t testing.TB) {
	testHooks.keyOmitsTenant = true
	t.Cleanup(func() { testHooks.keyOmitsTenant = false })
}

// InjectPage overwrites dst's block-table entry i with src's entry j, the
// way a scheduler bug that mixes up block tables would (control a). With
// keepEpoch the entry keeps dst's epoch, so that only the owner differs.
func InjectPage(dst *Sequence, i int, src *Sequence, j int, keepEpoch bool) {
	dst.table[i].id = src.table[j].id
	if !keepEpoch {
		dst.table[i].epoch = src.table[j].epoch
	}
}

// SetLength sets a sequence's length without writing anything, the way the
// incident took a length from what was reserved (control b).
func SetLength(s *Sequence, n int) { s.length = n }

// SetFilled marks a page's ledger filled count without writing anything
// (control b).
func SetFilled(p *Pool, id PageID, n int) { p.ledger[id].filled = int32(n) }
