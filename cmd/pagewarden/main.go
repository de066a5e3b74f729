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
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
