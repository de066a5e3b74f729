package cli

import (
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/engine"
	"github.com/pagewarden/pagewarden/internal/kernels"
)

func benchCmd() *cobra.Command {
	var mf modelFlags
	var threads, prompts string
	var gen, reps int
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure prefill and decode tokens/s (like llama-bench)",
		Long: `Measure prefill (pp) and decode (tg) speed for each thread count, like
llama-bench -p 128,512 -n 64 -r 3. Compare variants within one run: machines
here are noisy.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := mf.validate(); err != nil {
				return err
			}
			ts, err := intList(threads, "--threads-list")
			if err != nil {
				return err
			}
			ps, err := intList(prompts, "-p")
			if err != nil {
				return err
			}
			if gen < 1 || reps < 1 {
				return usagef("-n and -r must be at least 1")
			}
			kvType, _ := mf.kvDType()
			m, err := mf.load()
			if err != nil {
				return err
			}
			defer m.Close()
			maxP := 0
			for _, p := range ps {
				maxP = max(maxP, p)
			}
			if maxP+gen > m.Config.ContextLength {
				return usagef("-p %d plus -n %d exceed the model's context of %d", maxP, gen, m.Config.ContextLength)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "kernels: %s\n", kernels.Implementation())
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintf(tw, "model\ttype\tthreads\ttest\ttokens/s\t\n")
			for _, t := range ts {
				eng, err := engine.New(m, engine.Options{Threads: t, PageSize: mf.pageSize, KVType: kvType, PrefillChunk: maxP})
				if err != nil {
					return err
				}
				// Warm-up: touch every weight once.
				if _, err := eng.Bench(8, 2); err != nil {
					eng.Close()
					return err
				}
				for _, p := range ps {
					best := 0.0
					for r := 0; r < reps; r++ {
						res, err := eng.Bench(p, 1)
						if err != nil {
							eng.Close()
							return err
						}
						best = max(best, float64(p)/res.Prefill.Seconds())
					}
					fmt.Fprintf(tw, "%s\t%s\t%d\tpp%d\t%.1f\t\n", m.Name, m.WeightType, t, p, best)
				}
				best := 0.0
				for r := 0; r < reps; r++ {
					res, err := eng.Bench(1, gen)
					if err != nil {
						eng.Close()
						return err
					}
					best = max(best, float64(gen)/res.Decode.Seconds())
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\ttg%d\t%.1f\t\n", m.Name, m.WeightType, t, gen, best)
				eng.Close()
			}
			return tw.Flush()
		},
	}
	mf.register(c)
	c.Flags().StringVar(&threads, "threads-list", "1,2", "comma-separated thread counts to measure")
	c.Flags().StringVarP(&prompts, "p", "p", "128,512", "comma-separated prompt lengths for prefill")
	c.Flags().IntVarP(&gen, "n", "n", 64, "tokens to decode")
	c.Flags().IntVarP(&reps, "r", "r", 3, "repetitions (the best is reported)")
	return c
}

func intList(s, flag string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 {
			return nil, usagef("%s %q: want comma-separated positive integers", flag, s)
		}
		out = append(out, v)
	}
	return out, nil
}
