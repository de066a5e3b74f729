package cli

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

func init() { extraCommands = append(extraCommands, versionCmd) }

// writeVersion prints what an operator needs to say which build runs: the
// module version and commit, the Go toolchain, the kernel path this CPU
// gets, and the handoff protocol version nodes must share.
func writeVersion(w io.Writer) {
	version, commit, dirty := "(devel)", "unknown", ""
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				commit = s.Value
			case "vcs.modified":
				if s.Value == "true" {
					dirty = " (modified)"
				}
			}
		}
	}
	fmt.Fprintf(w, "pagewarden %s\ncommit     %s%s\ngo         %s %s/%s\nkernels    %s\nhandoff    protocol %d\n",
		version, commit, dirty, runtime.Version(), runtime.GOOS, runtime.GOARCH, kernelsLabel(), transfer.ProtocolVersion)
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit, Go toolchain, kernel path and handoff protocol",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			writeVersion(cmd.OutOrStdout())
			return nil
		},
	}
}

// kernelsLabel is the installed kernel tier, and whether the build has no
// assembly at all (the purego tag), for version's line.
func kernelsLabel() string {
	if !kernels.Assembly() {
		return kernels.Implementation() + " (purego build)"
	}
	return kernels.Implementation()
}
