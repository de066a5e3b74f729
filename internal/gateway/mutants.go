//go:build pw_mutants

package gateway

import (
	"sync/atomic"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Bug re-introduction hooks for the positive controls of other packages
// (the whole-system simulation, internal/sim), built only with
// -tags pw_mutants; nomutant.go stands in without the tag, so a release
// binary cannot contain them.

// OKOnAbortForControls makes the gateway answer a request that ended
// aborted as if it had finished for length: HTTP 200 with
// finish_reason "length" (SGLang #33507, where a pending abort was
// overwritten). Restore after.
func OKOnAbortForControls() (restore func()) {
	okOnAbort.Store(true)
	return func() { okOnAbort.Store(false) }
}

var okOnAbort atomic.Bool

// mutantResult is the hook on the result of a generation.
func mutantResult(res request.Result) request.Result {
	if okOnAbort.Load() && res.Reason == request.FinishAbort {
		res.Reason, res.Err = request.FinishLength, nil
	}
	return res
}

// SaltOmitsNamespaceForControls drops the tenant's cache namespace from
// the prefix-cache salt the gateway puts on every request, so that with
// kvcache.KeyOmitsTenantForControls two tenants' identical prompts get the
// same prefix keys (a tenant missing from the key at every layer). Restore
// after.
func SaltOmitsNamespaceForControls() (restore func()) {
	saltOmitsNamespace.Store(true)
	return func() { saltOmitsNamespace.Store(false) }
}

var saltOmitsNamespace atomic.Bool

// mutantNamespace is the hook on the tenant's cache namespace in the salt.
func mutantNamespace(ns string) string {
	if saltOmitsNamespace.Load() {
		return ""
	}
	return ns
}
