//go:build pw_mutants

package transfer

// DisableManifestChecks turns off the receiver's exact-match checks of a
// handoff (layout, page count, fills, total tokens, digests) until restore
// is called, so that other packages' positive controls (disagg) can show
// those checks are what stops a bad handoff. Built only with
// -tags pw_mutants; call it before any core runs, and restore after.
func DisableManifestChecks() (restore func()) {
	old := skipChecks
	skipChecks |= checkLayout | checkPageCount | checkFilled | checkTotalTokens | checkDigest
	return func() { skipChecks = old }
}
