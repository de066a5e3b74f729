package cli

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/gguf"
	"github.com/pagewarden/pagewarden/internal/llama2c"
	"github.com/pagewarden/pagewarden/internal/model"
)

func convertCmd() *cobra.Command {
	var checkpoint, tokPath, builtin, out string
	c := &cobra.Command{
		Use:   "convert",
		Short: "Write a GGUF file from a llama2.c checkpoint or a builtin model",
		Long: `Write a GGUF file that llama.cpp and pagewarden both read:
  pagewarden convert --checkpoint stories260K.bin --tokenizer tok512.bin --out stories260K.gguf
  pagewarden convert --builtin 135m-q8_0 --out 135m-q8_0.gguf`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out FILE is required")
			}
			var w *gguf.Writer
			switch {
			case checkpoint != "" && builtin != "":
				return usagef("give either --checkpoint or --builtin, not both")
			case checkpoint != "":
				if tokPath == "" {
					return usagef("--checkpoint needs --tokenizer tokenizer.bin")
				}
				ck, err := llama2c.Read(checkpoint)
				if err != nil {
					return err
				}
				data, err := os.ReadFile(tokPath)
				if err != nil {
					return err
				}
				v, err := llama2c.ParseVocab(data, ck.Vocab)
				if err != nil {
					return fmt.Errorf("%s: %w", tokPath, err)
				}
				name := strings.TrimSuffix(filepath.Base(checkpoint), filepath.Ext(checkpoint))
				if w, err = llama2c.ToGGUF(ck, v, name); err != nil {
					return err
				}
			case builtin != "":
				spec, ok := model.Builtins[strings.TrimPrefix(builtin, model.BuiltinPrefix)]
				if !ok {
					return usagef("--builtin %q: have %s", builtin, strings.Join(model.BuiltinNames(), ", "))
				}
				var err error
				if w, err = model.BuiltinGGUF(spec); err != nil {
					return err
				}
			default:
				return usagef("give --checkpoint FILE --tokenizer FILE, or --builtin NAME")
			}
			f, err := os.Create(out)
			if err != nil {
				return err
			}
			bw := bufio.NewWriterSize(f, 1<<20)
			n, err := w.WriteTo(bw)
			if err == nil {
				err = bw.Flush()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				os.Remove(out)
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%d bytes)\n", out, n)
			return nil
		},
	}
	c.Flags().StringVar(&checkpoint, "checkpoint", "", "llama2.c checkpoint (.bin, version-0 layout)")
	c.Flags().StringVar(&tokPath, "tokenizer", "", "llama2.c tokenizer.bin")
	c.Flags().StringVar(&builtin, "builtin", "", "builtin model name ("+strings.Join(model.BuiltinNames(), ", ")+")")
	c.Flags().StringVarP(&out, "out", "o", "", "GGUF file to write")
	return c
}
