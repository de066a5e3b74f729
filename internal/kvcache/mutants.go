//go:build pw_mutants

package kvcache

// Bug re-introduction hooks for other packages' positive controls (the
// disagg incident control), built only with -tags pw_mutants. Each returns
// the function that restores the pool's behaviour; set them before any
// pool is driven and restore after.

// SkipScrubForControls releases pages without scrubbing them, so a freed
// page keeps its last owner's KV (what scrub-on-release, I8, prevents).
func SkipScrubForControls() (restore func()) {
	testHooks.skipScrub = true
	return func() { testHooks.skipScrub = false }
}

// SkipHandoffCheckForControls makes CommitImport accept any import and
// mark every reserved page written up to the total it is given (what the
// incident's decode did with the pages it had reserved).
func SkipHandoffCheckForControls() (restore func()) {
	testHooks.skipHandoffCheck = true
	return func() { testHooks.skipHandoffCheck = false }
}

// KeyOmitsTenantForControls builds prefix-cache keys without the tenant
// field, so that two tenants' identical prompts share cache entries (what
// the tenant-scoped key of I9 prevents).
func KeyOmitsTenantForControls() (restore func()) {
	testHooks.keyOmitsTenant = true
	return func() { testHooks.keyOmitsTenant = false }
}
