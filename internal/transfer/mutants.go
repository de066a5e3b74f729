//go:build pw_mutants

package transfer

// Bug re-introduction hooks for other packages' positive controls (disagg,
// the whole-system simulation of internal/sim), built only with
// -tags pw_mutants, so a release binary cannot switch a check off. Each
// switches receiver or sender checks off until its restore is called; call
// it before any core runs, and restore after.

// DisableManifestChecks turns off the receiver's exact-match checks of a
// handoff (layout, page count, fills, total tokens, digests), so that
// other packages' positive controls can show those checks are what stops
// a bad handoff.
func DisableManifestChecks() (restore func()) {
	return skipForControls(checkLayout | checkPageCount | checkFilled | checkTotalTokens | checkDigest)
}

// DisablePageCountCheckForControls turns off the receiver's page-count
// check (announced == received == reserved) and the total-tokens check
// that would otherwise catch a handoff of fewer pages: the incident's
// decode, which took a 1-page manifest for an 8-page reservation.
func DisablePageCountCheckForControls() (restore func()) {
	return skipForControls(checkPageCount | checkTotalTokens)
}

// DisableFilledCheckForControls turns off the receiver's per-page filled
// check and the total-tokens check: a page that arrived with fewer
// positions than the reserved prompt implies is committed.
func DisableFilledCheckForControls() (restore func()) {
	return skipForControls(checkFilled | checkTotalTokens)
}

// DisableDrainCheckForControls makes the receiver release an aborted
// reservation's pages while writers are still in flight on them (the free
// without a writer fence that I7 forbids).
func DisableDrainCheckForControls() (restore func()) {
	return skipForControls(checkDrain)
}

func skipForControls(c check) (restore func()) {
	old := skipChecks
	skipChecks |= c
	return func() { skipChecks = old }
}
