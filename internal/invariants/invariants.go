// Package invariants is the one place where broken invariants are reported.
//
// An invariant violation is a bug, never an expected condition: in tests it
// fails loudly (a panic that the test sees), and in production the caller
// aborts the affected request, quarantines what it touched and counts a
// metric. Package code reports through Failf so that the policy lives
// here and nowhere else.
package invariants

import (
	"fmt"
	"sync/atomic"
)

// Violation is the value panicked with when an invariant fails in strict
// mode. Callers that recover can match it with errors.As on the recovered
// value's error.
type Violation struct {
	Msg string
}

func (v *Violation) Error() string { return "invariant violated: " + v.Msg }

// strict is on by default so that tests and fuzzing panic at the first
// broken invariant; production binaries turn it off with SetStrict(false) and
// rely on the returned error instead.
var strict atomic.Bool

var violations atomic.Uint64

func init() { strict.Store(true) }

// SetStrict chooses between panicking (true, the default) and returning an
// error (false) when an invariant fails. It returns the previous setting.
func SetStrict(on bool) bool { return strict.Swap(on) }

// Strict reports whether violations panic.
func Strict() bool { return strict.Load() }

// Count is the number of violations reported since start-up.
func Count() uint64 { return violations.Load() }

// Failf reports a broken invariant. In strict mode it panics with a
// *Violation; otherwise it counts it and returns it as an error, which the
// caller must act on (abort, quarantine), never ignore.
func Failf(format string, args ...any) error {
	v := &Violation{Msg: fmt.Sprintf(format, args...)}
	violations.Add(1)
	if strict.Load() {
		panic(v)
	}
	return v
}
