//go:build !pw_mutants

package sched

// Without -tags pw_mutants the bug re-introduction hooks (mutant.go) do
// nothing and compile away.

type mutant uint8

const mutantNone mutant = 0

type mutants struct{}

// setMutant accepts only mutantNone: the mutants need the tag.
func (c *Core) setMutant(m mutant) {
	if m != mutantNone {
		panic("sched: mutants are built only with -tags pw_mutants")
	}
}

func (c *Core) mutantAbort(*req, error) bool { return false }

func (c *Core) mutantFinished(*req) {}

func trustsReservation() bool { return false }
