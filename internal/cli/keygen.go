package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
)

func init() { extraCommands = append(extraCommands, keygenCmd) }

func keygenCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "keygen",
		Short: "Print a new random API key and the YAML line that gives it to a tenant",
		Long: `Print a new random API key (as the generated default key: "pw-" and 256
random bits in base64url) on the first line, and on the second the line of a
tenant in the --config file that accepts it: the config holds only the key's
SHA-256, so give the key to the tenant and the line to the config.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, hash, err := tenants.GenerateKey()
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\napi_key_sha256: [%q]\n", key, hash)
			return nil
		},
	}
}
