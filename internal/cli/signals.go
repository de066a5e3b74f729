package cli

import (
	"context"
	"fmt"
	"io"
	"os"
)

// ExitInterrupted is the exit code of a process stopped by a second
// interrupt (128 + SIGINT, as shells report it).
const ExitInterrupted = 130

// Interrupts handles the process's SIGINT and SIGTERM, delivered on sigs:
// the first cancels the context Main runs under, so that a server drains
// its requests; the second calls exit(ExitInterrupted) at once, for an
// operator who will not wait for the drain. It returns when sigs is closed
// or after calling exit.
func Interrupts(sigs <-chan os.Signal, cancel context.CancelFunc, exit func(code int), stderr io.Writer) {
	first := true
	for s := range sigs {
		if first {
			first = false
			cancel()
			fmt.Fprintf(stderr, "pagewarden: %v: stopping (again to exit at once)\n", s)
			continue
		}
		fmt.Fprintf(stderr, "pagewarden: %v again: exiting at once\n", s)
		exit(ExitInterrupted)
		return
	}
}
