package kvcache

// testHooks re-introduce, from tests only (export_test.go), the bugs the
// pool's checks exist to catch, so that each check is shown to fail when it
// should. Production code never sets them.
var testHooks struct {
	skipScrub      bool // release without scrubbing (control c)
	keyOmitsTenant bool // prefix keys without the tenant field (control d)
	// CommitImport without its page-count and fill checks (the incident
	// control of package disagg, mutants.go).
	skipHandoffCheck bool
	// swapPage, when set, may return another block table for the view
	// Begin hands out, after the check passed: the replay audit's
	// positive control (mutant_swap.go), a page of another tenant read
	// as if it were the sequence's own.
	swapPage func(p *Pool, s *Sequence, table []entry) []entry
}
