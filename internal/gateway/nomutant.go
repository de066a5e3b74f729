//go:build !pw_mutants

package gateway

import "github.com/pagewarden/pagewarden/internal/request"

// mutantResult passes a result through unchanged: the bug re-introduction
// hooks (mutants.go) are built only with -tags pw_mutants.
func mutantResult(res request.Result) request.Result { return res }

// mutantNamespace returns the tenant's cache namespace unchanged.
func mutantNamespace(ns string) string { return ns }
