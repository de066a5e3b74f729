package cli

import (
	"bufio"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/engine"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/resources"
)

// modelFlags are the flags every command that loads a model shares.
type modelFlags struct {
	model     string
	tokenizer string
	threads   int
	kvType    string
	pageSize  int
}

func (f *modelFlags) register(c *cobra.Command) {
	c.Flags().StringVarP(&f.model, "model", "m", "builtin:tiny", "model: a GGUF file, a llama2.c .bin checkpoint (with --tokenizer), or builtin:NAME ("+strings.Join(model.BuiltinNames(), ", ")+")")
	c.Flags().StringVar(&f.tokenizer, "tokenizer", "", "llama2.c tokenizer.bin (only for .bin checkpoints)")
	c.Flags().IntVarP(&f.threads, "threads", "t", resources.Threads(), "compute threads (default: GOMAXPROCS, which follows the container's CPU quota)")
	c.Flags().StringVar(&f.kvType, "kv-type", "f32", "KV cache element type: f32 or f16")
	c.Flags().IntVar(&f.pageSize, "page-size", 16, "tokens per KV page")
}

func (f *modelFlags) kvDType() (kvcache.DType, error) {
	switch strings.ToLower(f.kvType) {
	case "f32":
		return kvcache.F32, nil
	case "f16":
		return kvcache.F16, nil
	}
	return 0, usagef("--kv-type %q: want f32 or f16", f.kvType)
}

func (f *modelFlags) validate() error {
	if f.threads < 1 || f.threads > 1024 {
		return usagef("--threads %d: want 1..1024", f.threads)
	}
	if f.pageSize < 1 || f.pageSize > 4096 {
		return usagef("--page-size %d: want 1..4096", f.pageSize)
	}
	_, err := f.kvDType()
	return err
}

func (f *modelFlags) load() (*model.Model, error) {
	return model.Load(f.model, model.Options{Tokenizer: f.tokenizer})
}

func runCmd() *cobra.Command {
	var mf modelFlags
	var (
		prompt  string
		n       int
		temp    float32
		topP    float32
		topK    int
		minP    float32
		repeat  float32
		seed    int64
		echo    bool
		special bool
		stopIDs []int
		noEOS   bool
	)
	c := &cobra.Command{
		Use:   "run",
		Short: "Generate text from a prompt, streaming it to stdout",
		Long: `Generate text from a prompt and stream it to stdout; a one-line summary
(prompt tokens, generated tokens, prefill and decode tokens/s) goes to stderr.
Without --model the built-in model (random weights, byte-level vocabulary) is used.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := mf.validate(); err != nil {
				return err
			}
			if n < 0 {
				return usagef("-n %d: want 0 or more tokens", n)
			}
			if temp < 0 || topP < 0 || topP > 1 || minP < 0 || minP > 1 || topK < 0 || repeat < 0 {
				return usagef("sampling flags out of range: --temperature ≥ 0, 0 ≤ --top-p ≤ 1, 0 ≤ --min-p ≤ 1, --top-k ≥ 0, --repeat-penalty ≥ 0")
			}
			kvType, _ := mf.kvDType()
			m, err := mf.load()
			if err != nil {
				return err
			}
			defer m.Close()
			tok := m.Tokenizer
			ids := tok.Encode(prompt, true, special)
			if len(ids) == 0 {
				return errors.New("the prompt is empty and this model adds no BOS token: give --prompt")
			}
			if w := m.Config.ContextLength; len(ids) > w {
				return fmt.Errorf("the prompt is %d tokens but the model's context window is %d: shorten it", len(ids), w)
			}
			if len(ids)+n > m.Config.ContextLength {
				n = m.Config.ContextLength - len(ids)
				fmt.Fprintf(cmd.ErrOrStderr(), "note: -n lowered to %d to fit the %d-token context window\n", n, m.Config.ContextLength)
			}
			eng, err := engine.New(m, engine.Options{Threads: mf.threads, PageSize: mf.pageSize, KVType: kvType})
			if err != nil {
				return err
			}
			defer eng.Close()
			s := request.Sampling{Temperature: temp, TopP: topP, TopK: topK, MinP: minP, RepetitionPenalty: repeat}
			if seed >= 0 {
				s.Seed = uint64(seed)
			} else {
				s.Seed = request.NewSeed()
			}
			for _, id := range stopIDs {
				if id < 0 || id >= m.Config.Vocab {
					return usagef("--stop-token-ids %d: not a token of this model (0..%d)", id, m.Config.Vocab-1)
				}
			}
			if len(stopIDs) > request.MaxStopTokens {
				return usagef("--stop-token-ids: %d tokens, at most %d", len(stopIDs), request.MaxStopTokens)
			}
			out := bufio.NewWriter(cmd.OutOrStdout())
			if echo {
				out.WriteString(prompt)
			}
			dec := newTextStream(tok, ids)
			owner := request.Owner{Tenant: "local", ID: request.NewID()}
			p := request.Params{Owner: owner, Prompt: ids, MaxTokens: n, Sampling: s, StopTokens: stopIDs, IgnoreEOS: noEOS}
			st, _, err := eng.GenerateParams(cmd.Context(), p, func(t int) error {
				out.WriteString(dec.add(t))
				return out.Flush()
			})
			out.WriteString(dec.flush())
			out.WriteString("\n")
			if ferr := out.Flush(); err == nil {
				err = ferr
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "prompt %d tokens, generated %d tokens, prefill %.1f tok/s, decode %.1f tok/s (%d threads, %s)\n",
				st.PromptTokens, st.GeneratedTokens, st.PrefillRate(), st.DecodeRate(), mf.threads, m.WeightType)
			return err
		},
	}
	mf.register(c)
	c.Flags().StringVarP(&prompt, "prompt", "p", "", "prompt text (empty: start from BOS)")
	c.Flags().IntVarP(&n, "n", "n", 128, "tokens to generate at most")
	c.Flags().Float32Var(&temp, "temperature", 0.8, "sampling temperature; 0 is greedy")
	c.Flags().Float32Var(&topP, "top-p", 0.95, "nucleus sampling threshold (1 disables)")
	c.Flags().IntVar(&topK, "top-k", 40, "sample among the k most likely tokens (0 disables)")
	c.Flags().Float32Var(&minP, "min-p", 0.05, "drop tokens less likely than min-p times the best (0 disables)")
	c.Flags().Float32Var(&repeat, "repeat-penalty", 1, "repetition penalty (1 disables)")
	c.Flags().Int64Var(&seed, "seed", -1, "random seed (-1: a fresh one)")
	c.Flags().BoolVar(&echo, "echo", false, "print the prompt before the generated text")
	c.Flags().BoolVar(&special, "special", false, "parse special-token text such as <s> in the prompt")
	c.Flags().IntSliceVar(&stopIDs, "stop-token-ids", nil, "token ids that end generation, besides the model's end-of-generation tokens (not printed)")
	c.Flags().BoolVar(&noEOS, "ignore-eos", false, "keep generating past the model's end-of-generation tokens: only -n and --stop-token-ids end it")
	return c
}
