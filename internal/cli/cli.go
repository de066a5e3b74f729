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
	"github.com/spf13/pflag"

	"github.com/pagewarden/pagewarden/internal/kernels"
)

// usageError marks errors caused by the command line itself (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// Main runs the command line args and returns the exit code: 0 on success,
// 1 on failure, 2 on a usage error. It reads no environment variables.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return MainEnv(ctx, args, stdout, stderr, nil)
}

// LookupEnv is os.LookupEnv's signature: the environment as MainEnv sees it.
type LookupEnv func(name string) (value string, ok bool)

// MainEnv is Main with flags also taken from the environment: every flag
// --some-flag of every command can be set as PAGEWARDEN_SOME_FLAG, and the
// command line wins over it. lookup is nil for no environment (only the
// process's main function passes the real one).
func MainEnv(ctx context.Context, args []string, stdout, stderr io.Writer, lookup LookupEnv) int {
	// PAGEWARDEN_KERNELS forces a kernel tier (to run or measure the AVX2
	// path on an AVX-512 machine). It is not a flag: the kernels serve the
	// whole process, and it must be set before --version reports them.
	if lookup != nil {
		if v, ok := lookup(kernelsEnv); ok {
			if err := kernels.SetTier(v); err != nil {
				fmt.Fprintf(stderr, "pagewarden: %s: %v\n", kernelsEnv, err)
				return 2
			}
		}
	}
	root := &cobra.Command{
		Use:   "pagewarden",
		Short: "Multi-tenant LLM serving where tenants can never see each other's data",
		Long: `Multi-tenant LLM serving where tenants can never see each other's data.

Every flag of every command can also be set in the environment as
PAGEWARDEN_<FLAG> (upper case, dashes as underscores: --kv-memory is
PAGEWARDEN_KV_MEMORY); a flag on the command line wins.`,
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
	withEnv(root, lookup)
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

// kernelsEnv forces the kernel tier (kernels.SetTier).
const kernelsEnv = envPrefix + "KERNELS"

// envPrefix starts the name of the environment variable of every flag.
const envPrefix = "PAGEWARDEN_"

// envName is the environment variable that sets the flag called name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// withEnv makes every command below root (and root) take its flags from
// lookup when the command line does not give them. The variables are read
// after the command line is parsed, so that a flag given there is never
// overwritten (nor, for a list, appended to). A variable that does not
// parse is a usage error naming it, and so is a value the command then
// refuses: its error names the flag, and the variable is added.
func withEnv(c *cobra.Command, lookup LookupEnv) {
	for _, sub := range c.Commands() {
		withEnv(sub, lookup)
	}
	run := c.RunE
	if run == nil || lookup == nil {
		return
	}
	c.RunE = func(cmd *cobra.Command, args []string) error {
		fromEnv := map[string]string{} // flag name -> variable
		var err error
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if err != nil || f.Changed || f.Name == "help" || f.Name == "version" {
				return
			}
			name := envName(f.Name)
			v, ok := lookup(name)
			if !ok {
				return
			}
			if e := cmd.Flags().Set(f.Name, v); e != nil {
				err = usagef("%s: %v", name, e)
				return
			}
			fromEnv[f.Name] = name
		})
		if err != nil {
			return err
		}
		err = run(cmd, args)
		var ue usageError
		if errors.As(err, &ue) {
			for flag, name := range fromEnv {
				if namesFlag(err.Error(), flag) {
					return usagef("%w (--%s is set by %s)", err, flag, name)
				}
			}
		}
		return err
	}
}

// namesFlag reports whether msg mentions --flag itself (not a longer flag
// that starts with its name).
func namesFlag(msg, flag string) bool {
	for rest := msg; ; {
		i := strings.Index(rest, "--"+flag)
		if i < 0 {
			return false
		}
		rest = rest[i+2+len(flag):]
		if rest == "" || !(rest[0] == '-' || rest[0] == '_' || 'a' <= rest[0] && rest[0] <= 'z' || '0' <= rest[0] && rest[0] <= '9') {
			return true
		}
	}
}

// extraCommands lets other files of this package register subcommands.
var extraCommands []func() *cobra.Command
