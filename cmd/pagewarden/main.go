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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// The only place that reads the environment: PAGEWARDEN_<FLAG> sets a
	// flag the command line does not give.
	code := cli.MainEnv(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	os.Exit(code)
}
