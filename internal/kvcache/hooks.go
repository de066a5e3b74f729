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
}
