// Package cli implements the pagewarden command line. Main is the whole
// program minus process wiring, so tests drive it with arguments and
// buffers.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
)

// usageError marks errors caused by the command line itself (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Main runs the command line args and returns the exit code: 0 on success,
// 1 on failure, 2 on a usage error.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := &cobra.Command{
		Use:           "pagewarden",
		Short:         "Multi-tenant LLM serving where tenants can never see each other's data",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetContext(ctx)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(runCmd(), convertCmd(), benchCmd())
	for _, add := range extraCommands {
		root.AddCommand(add())
	}
	// Stray arguments and unknown subcommands are usage errors too (exit
	// 2): wrap every positional-argument check, and give the root one so
	// that cobra does not report an unknown subcommand as a plain error.
	root.Args = cobra.NoArgs
	root.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	// --version prints what `pagewarden version` prints.
	var v strings.Builder
	writeVersion(&v)
	root.Version = v.String()
	root.SetVersionTemplate("{{.Version}}")
	for _, c := range append(root.Commands(), root) {
		if check := c.Args; check != nil {
			c.Args = func(cmd *cobra.Command, args []string) error {
				if err := check(cmd, args); err != nil {
					return usageError{err}
				}
				return nil
			}
		}
	}
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "pagewarden: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) {
		return 2
	}
	return 1
}

// extraCommands lets other files of this package register subcommands.
var extraCommands []func() *cobra.Command
