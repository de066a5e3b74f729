// Command pagewarden is a multi-tenant LLM server whose tenants can never
// see each other's prompts, KV pages or output. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/pagewarden/pagewarden/internal/cli"
)

func main() {
	// A first SIGINT or SIGTERM drains (it cancels ctx); a second exits.
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go cli.Interrupts(sigs, cancel, os.Exit, os.Stderr)
	// The only place that reads the environment: PAGEWARDEN_<FLAG> sets a
	// flag the command line does not give.
	code := cli.MainEnv(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	os.Exit(code)
}
