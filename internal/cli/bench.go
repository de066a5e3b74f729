package cli

import (
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/engine"
	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/model"
)

func benchCmd() *cobra.Command {
	var mf modelFlags
	var threads, prompts, tiers, llamaPath, batches, cpuProfile string
	var gen, reps, batchPrompt, bwMiB int
	c := &cobra.Command{
		Use:   "bench",
		Short: "Measure prefill and decode tokens/s (like llama-bench)",
		Long: `Measure prefill (pp) and decode (tg) speed for each thread count, like
llama-bench -p 128,512 -n 64 -r 3. Compare variants within one run: machines
here are noisy. --kernels-list runs several kernel tiers side by side, their
repetitions interleaved (PAGEWARDEN_KERNELS=avx2 forces a single one):
  pagewarden bench -m builtin:135m-q8_0 --kernels-list avx2,avx512vnni
Each row gives the best of -r repetitions and, under range, the slowest and
the fastest. --llama-bench PATH runs a llama-bench you built on the same GGUF
file (a builtin model is written to a temporary one), with the same K/V type
(f16 unless --kv-type says otherwise: llama-bench has no f32 cache),
its repetitions interleaved with pagewarden's, and prints the ratios:
  pagewarden bench -m builtin:135m-q8_0 --llama-bench ~/llama.cpp/build/bin/llama-bench
Before the tests of each thread count it measures the machine's streaming
read bandwidth with that many threads (a SIMD sum over --bw-mib MiB, far
beyond the last-level cache; the best pass of 5 before the tests and 2 after
every round of a decode test, so a loaded machine's slow spells do not
inflate the shares), and every decode row gives
the bytes it read per second (weights as the kernels store them, plus the
keys and values each token attends to) and their share of that bound.
--cpuprofile FILE writes a CPU profile of the measurements (not of the
model's loading) for go tool pprof, to see where a step's time goes.
--batch measures batched decode instead of pp/tg, the workload of
llama-batched-bench -npp 128 -ntg 64 -npl 1,4,8,16: for each count B, B
sequences with prompts of --batch-prompt tokens, then -n steps that each
decode one token for all B in one forward pass; the row gives the aggregate
tokens/s (B*n / decode time, llama-batched-bench's S_TG):
  pagewarden bench -m builtin:135m-q8_0 --batch 1,4,8,16 --threads-list 1`,
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
			var bs []int
			if batches != "" {
				if bs, err = intList(batches, "--batch"); err != nil {
					return err
				}
				if llamaPath != "" {
					return usagef("--batch and --llama-bench: llama-bench has no batched decode; run llama-batched-bench -npp %d -ntg %d -npl %s beside it", batchPrompt, gen, batches)
				}
				ps = []int{batchPrompt} // for the context check below
			}
			if batchPrompt < 1 {
				return usagef("--batch-prompt must be at least 1")
			}
			if bwMiB < 0 {
				return usagef("--bw-mib must be 0 (no bandwidth measurement) or more")
			}
			// The tiers to compare, checked before the model loads; the
			// installed one is put back afterwards.
			installed := kernels.Implementation()
			tierList := []string{installed}
			if tiers != "" {
				tierList = nil
				for _, name := range strings.Split(tiers, ",") {
					name = strings.TrimSpace(name)
					if err := kernels.SetTier(name); err != nil {
						return usagef("--kernels-list: %v", err)
					}
					tierList = append(tierList, kernels.Implementation())
				}
			}
			defer kernels.SetTier(installed)
			defer kernels.SetKPrefetch(kernels.KPrefetch())
			if llamaPath != "" && mf.kvType != "f16" {
				// llama-bench's K/V types are f16 and quantised ones, not
				// f32: both sides run f16 unless told otherwise.
				if cmd.Flags().Changed("kv-type") {
					return usagef("--kv-type %s: llama-bench has no %s K/V cache; compare with --kv-type f16", mf.kvType, mf.kvType)
				}
				mf.kvType = "f16"
				fmt.Fprintln(cmd.ErrOrStderr(), "note: K/V type f16 on both sides (llama-bench's default; it has no f32 cache)")
			}
			kvType, _ := mf.kvDType()
			var llama *llamaBench
			if llamaPath != "" {
				if _, err := exec.LookPath(llamaPath); err != nil {
					return usagef("--llama-bench %s: %v", llamaPath, err)
				}
				dir, err := os.MkdirTemp("", "pagewarden-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				file, err := llamaBenchFile(&mf, dir)
				if err != nil {
					return err
				}
				llama = &llamaBench{path: llamaPath, model: file, kvType: mf.kvType}
			}
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
			// Loading timed the K-quant kernels with and without prefetch
			// on the tier installed then; whether prefetching pays
			// differs between tiers, so every other compared tier gets
			// its own timing, set again whenever its turn comes.
			loadedTier := kernels.Implementation()
			prefetch := map[string]bool{}
			var pfNotes []string
			for _, tier := range tierList {
				if err := kernels.SetTier(tier); err != nil {
					return err
				}
				if tier != loadedTier {
					kernels.CalibrateKPrefetch(m.Matrices())
				}
				prefetch[tier] = kernels.KPrefetch()
				pfNotes = append(pfNotes, fmt.Sprintf("%s %s", tier, onOff(prefetch[tier])))
			}
			setTier := func(tier string) error {
				if err := kernels.SetTier(tier); err != nil {
					return err
				}
				kernels.SetKPrefetch(prefetch[tier])
				return nil
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "kernels: %s (K-quant prefetch: %s)\n", strings.Join(tierList, ", "), strings.Join(pfNotes, ", "))
			if cpuProfile != "" {
				// Started after the model loads, so the profile is the
				// measurements (and the bandwidth passes, which are easy
				// to tell apart), not file reading or weight repacking; a
				// llama-bench child runs in its own process and is not in it.
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			// The bandwidth buffer is written, not just allocated: untouched
			// pages could all map to one zero page and be read from cache.
			var bwBuf []float32
			if bwMiB > 0 {
				bwBuf = make([]float32, bwMiB<<20/4)
				for i := range bwBuf {
					bwBuf[i] = float32(i & 1023)
				}
			}
			kvElem := kvType.Size()
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintf(tw, "model\ttype\tkernels\tthreads\ttest\ttokens/s\trange\tGB/s\tof bound\t\n")
			var bwLines []string
			var ratios []string // one line per test: pagewarden's best over llama.cpp's
			for _, t := range ts {
				opts := engine.Options{Threads: t, PageSize: mf.pageSize, KVType: kvType, PrefillChunk: maxP}
				if len(bs) > 0 {
					pageSize := cmp.Or(mf.pageSize, 16) // engine.New's default
					opts.Pages = slices.Max(bs) * ((batchPrompt + gen + pageSize - 1) / pageSize)
				}
				eng, err := engine.New(m, opts)
				if err != nil {
					return err
				}
				// bw is the best streaming read rate seen with t threads (0
				// if not measured): measured before the tests and again after
				// every round of a decode test, since a loaded machine's
				// slow spells would otherwise inflate every share of it.
				var bw float64
				sampleBW := func(passes int) {
					if bwBuf != nil {
						bw = max(bw, kernels.ReadBandwidth(eng.Compute, bwBuf, passes))
					}
				}
				sampleBW(5)
				// The rows of this thread count wait for the final bw.
				// perTok is what a token reads in pagewarden's layout (0
				// for prefill rows and for llama.cpp, whose layout differs:
				// no bandwidth columns).
				type pendingRow struct {
					tier, test     string
					lo, hi, perTok float64
				}
				var pending []pendingRow
				flush := func() {
					for _, r := range pending {
						gbs, share := "-", "-"
						if r.perTok > 0 {
							gbs = fmt.Sprintf("%.1f", r.perTok*r.hi/1e9)
							if bw > 0 {
								share = fmt.Sprintf("%.0f%%", 100*r.perTok*r.hi/bw)
							}
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%.1f\t%.1f-%.1f\t%s\t%s\t\n", m.Name, m.WeightType, r.tier, t, r.test, r.hi, r.lo, r.hi, gbs, share)
					}
					if bwBuf != nil {
						bwLines = append(bwLines, fmt.Sprintf("%d\t%.1f\t", t, bw/1e9))
					}
				}
				// Warm-up: touch every weight once.
				if _, err := eng.Bench(8, 2); err != nil {
					eng.Close()
					return err
				}
				// measure runs one test reps times per tier (and once more
				// per repetition on llama-bench, when given), interleaved so
				// that a slow spell of a shared machine hits them all, and
				// prints a row per tier.
				// perTok is the bytes a token of the test reads (0: not a
				// decode test, no bandwidth columns).
				measure := func(test string, perTok float64, run, other func() (float64, error)) error {
					rates := make([][]float64, len(tierList))
					var theirs []float64
					for r := 0; r < reps; r++ {
						for k, tier := range tierList {
							if err := setTier(tier); err != nil {
								return err
							}
							v, err := run()
							if err != nil {
								return err
							}
							rates[k] = append(rates[k], v)
						}
						if other != nil {
							v, err := other()
							if err != nil {
								return err
							}
							theirs = append(theirs, v)
						}
						if perTok > 0 {
							sampleBW(2)
						}
					}
					for k, tier := range tierList {
						pending = append(pending, pendingRow{tier, test, slices.Min(rates[k]), slices.Max(rates[k]), perTok})
					}
					if other != nil {
						lo, hi := slices.Min(theirs), slices.Max(theirs)
						pending = append(pending, pendingRow{"llama.cpp", test, lo, hi, 0})
						for k, tier := range tierList {
							ratios = append(ratios, fmt.Sprintf("%s\t%d\t%s\t%.2f\t", tier, t, test, slices.Max(rates[k])/hi))
						}
					}
					return nil
				}
				// theirs is llama-bench's run of the same test, or nil.
				theirs := func(prompt, gen int) func() (float64, error) {
					if llama == nil {
						return nil
					}
					return func() (float64, error) { return llama.rate(cmd.Context(), t, prompt, gen) }
				}
				if len(bs) > 0 {
					for _, b := range bs {
						err = measure(fmt.Sprintf("tg%d x%d (pp%d)", gen, b, batchPrompt), decodeBytes(m, b, batchPrompt, gen, kvElem), func() (float64, error) {
							res, err := eng.BenchBatch(b, batchPrompt, gen)
							return float64(b*gen) / res.Decode.Seconds(), err
						}, nil)
						if err != nil {
							eng.Close()
							return err
						}
					}
					eng.Close()
					flush()
					continue
				}
				for _, p := range ps {
					err = measure(fmt.Sprintf("pp%d", p), 0, func() (float64, error) {
						res, err := eng.Bench(p, 1)
						return float64(p) / res.Prefill.Seconds(), err
					}, theirs(p, 0))
					if err != nil {
						eng.Close()
						return err
					}
				}
				// Bench decodes after a one-token prompt: the first new token
				// sits at position 1.
				err = measure(fmt.Sprintf("tg%d", gen), decodeBytes(m, 1, 1, gen, kvElem), func() (float64, error) {
					res, err := eng.Bench(1, gen)
					return float64(gen) / res.Decode.Seconds(), err
				}, theirs(0, gen))
				eng.Close()
				if err != nil {
					return err
				}
				flush()
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if len(bwLines) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "\nstreaming read bandwidth (%d MiB, best pass before the tests and after each round of decode; \"of bound\" above is GB/s over this):\n", bwMiB)
				tw = tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', tabwriter.AlignRight)
				fmt.Fprintf(tw, "threads\tGB/s\t\n")
				for _, l := range bwLines {
					fmt.Fprintln(tw, l)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
			}
			if llama == nil {
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "\npagewarden / llama.cpp (best of %d each; %s, build %s; K/V %s; %s):\n", reps, llamaPath, cmp.Or(llama.commit, "unknown"), mf.kvType, mf.model)
			tw = tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', tabwriter.AlignRight)
			fmt.Fprintf(tw, "kernels\tthreads\ttest\tratio\t\n")
			for _, r := range ratios {
				fmt.Fprintln(tw, r)
			}
			return tw.Flush()
		},
	}
	mf.register(c)
	c.Flags().StringVar(&threads, "threads-list", "1,2", "comma-separated thread counts to measure")
	c.Flags().StringVarP(&prompts, "p", "p", "128,512", "comma-separated prompt lengths for prefill")
	c.Flags().IntVarP(&gen, "n", "n", 64, "tokens to decode")
	c.Flags().IntVarP(&reps, "r", "r", 3, "repetitions (the best is reported)")
	c.Flags().StringVar(&llamaPath, "llama-bench", "", "a llama-bench binary you built: run it on the same GGUF and K/V type, interleaved, and print pagewarden/llama.cpp ratios")
	c.Flags().StringVar(&batches, "batch", "", "comma-separated sequence counts: measure batched decode (aggregate tokens/s, like llama-batched-bench -npl) instead of pp/tg")
	c.Flags().IntVar(&batchPrompt, "batch-prompt", 128, "prompt tokens per sequence before the batched decode (llama-batched-bench -npp)")
	c.Flags().IntVar(&bwMiB, "bw-mib", 256, "MiB of memory the bandwidth measurement streams (0: skip it); keep it far above the last-level cache")
	c.Flags().StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile (go tool pprof) of the measurements to this file")
	c.Flags().StringVar(&tiers, "kernels-list", "", "comma-separated kernel tiers to compare side by side (ref, avx2, avxvnni, avx512, avx512vnni; default: the one in use)")
	return c
}

// startCPUProfile starts the process's CPU profile into path; stop ends it
// and closes the file. Go profiles one process at a time, so a second
// profile (a test binary's -cpuprofile) is refused with an error.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, usagef("--cpuprofile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
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

// decodeBytes is the mean bytes a decoded token reads when seqs sequences
// decode gen tokens together after prompts of prompt tokens (the first new
// token at position prompt): each step reads the weights once and every
// sequence's keys and values (model.StepBytes).
func decodeBytes(m *model.Model, seqs, prompt, gen, kvElem int) float64 {
	var sum int64
	pos := make([]int, seqs)
	for i := range gen {
		for j := range pos {
			pos[j] = prompt + i
		}
		sum += m.StepBytes(pos, kvElem)
	}
	return float64(sum) / float64(seqs*gen)
}

// onOff spells a setting for a status line.
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
