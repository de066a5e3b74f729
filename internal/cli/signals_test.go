package cli

import (
	"bytes"
	"context"
	"os"
	"syscall"
	"testing"
)

// TestInterrupts: the first signal cancels (a graceful drain), the second
// exits at once with 130.
func TestInterrupts(t *testing.T) {
	sigs := make(chan os.Signal, 2)
	ctx, cancel := context.WithCancel(context.Background())
	var exits []int
	var errb bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		Interrupts(sigs, cancel, func(code int) { exits = append(exits, code) }, &errb)
	}()
	sigs <- os.Interrupt
	<-ctx.Done() // canceled by the first signal
	sigs <- syscall.SIGTERM
	<-done // returned after the exit
	if len(exits) != 1 || exits[0] != ExitInterrupted {
		t.Errorf("exit calls %v, want one with %d; stderr:\n%s", exits, ExitInterrupted, errb.String())
	}

	// One signal only: a drain, no exit.
	sigs = make(chan os.Signal, 1)
	ctx, cancel = context.WithCancel(context.Background())
	exits = nil
	sigs <- syscall.SIGTERM
	close(sigs)
	Interrupts(sigs, cancel, func(code int) { exits = append(exits, code) }, &errb)
	if ctx.Err() == nil || len(exits) != 0 {
		t.Errorf("one signal: canceled %v, exit calls %v; want a cancel and no exit", ctx.Err() != nil, exits)
	}
}
