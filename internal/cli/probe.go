package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/probe"
)

func init() { extraCommands = append(extraCommands, probeCmd) }

func probeCmd() *cobra.Command {
	var (
		cfg         probe.Config
		keys        []string
		jsonPath    string
		maxDuration time.Duration
	)
	c := &cobra.Command{
		Use:   "probe",
		Short: "Probe any OpenAI-compatible server for cross-tenant leaks from outside, with two or more API keys",
		Long: `Probe the server at --url (pagewarden, vLLM, SGLang, llama.cpp's server) as a
client would, with two or more API keys (--key, repeated; ideally of different
tenants), and judge what comes back:

  canaries      secrets in copy-task prompts of every key at once: no answer,
                error or header may hold another key's secret (whole or a
                10-character piece) or another request's, nor another key's
                API key; side endpoints (/slots, /metrics, /props, /health)
                read during the load neither; the leak rate's 95% upper
                bound is given
  boundary      prompts at the window −1, 0, +1, +one page, 2×, 10×: over the
                window a 4xx with no token, streamed and not; inside it
                usage.prompt_tokens exactly the length sent (/tokenize's count)
  abort-storm   clients leaving mid-stream during that load: every other
                answer complete ("length" only after max_tokens tokens)
  determinism   greedy and seeded answers alone = under load = after the storm
  prefix-cache  a key's repeated prompt hits its cache, another key's does not
  errors        malformed requests: a 4xx with OpenAI's JSON error, no traces
  overload      a burst: complete 200s, or 429/503 with Retry-After
  server-counters  the server's must-be-zero counters (isolation violations,
                aborted-but-completed, invariant violations, owner and audit
                mismatches, and each --zero-metric) read from /metrics
                (--metrics-url) before and after the run: none may rise;
                not applicable where the server exposes none

The window is max_model_len from /v1/models or /tokenize, n_ctx from
llama.cpp's /props, or --window. /tokenize is read in vLLM's form or
llama.cpp's; without it the boundary uses text lengths.
Progress goes to stderr, the summary to stdout, the full report with evidence
to --json. Keys never appear in either (a key is named by its position).
The exit code is 1 when a check fails.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, k := range keys {
				for _, k := range strings.Split(k, ",") {
					if k = strings.TrimSpace(k); k != "" {
						cfg.Keys = append(cfg.Keys, k)
					}
				}
			}
			if maxDuration <= 0 {
				return usagef("--max-duration %v: want a positive duration", maxDuration)
			}
			if cfg.Timeout <= 0 {
				return usagef("--request-timeout %v: want a positive duration", cfg.Timeout)
			}
			if cfg.Trials < 0 {
				return usagef("--trials %d: want at least 1 (or 0 for the default)", cfg.Trials)
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			cfg.Progress = cmd.ErrOrStderr()
			ctx, cancel := context.WithTimeout(cmd.Context(), maxDuration)
			defer cancel()
			r, err := probe.Run(ctx, cfg)
			if r == nil {
				return err
			}
			r.WriteSummary(cmd.OutOrStdout())
			if jsonPath != "" {
				if werr := os.WriteFile(jsonPath, r.JSON(), 0o644); werr != nil {
					return werr
				}
			}
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				return fmt.Errorf("probe: stopped after --max-duration %v; the report is partial", maxDuration)
			case err != nil:
				return err
			case r.Failed():
				return errors.New("probe: a check failed (see the evidence above)")
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.URL, "url", "http://127.0.0.1:8080", "server root URL (http or https)")
	f.StringArrayVar(&keys, "key", nil, "an API key; give two or more, of different tenants (repeat the flag, or separate with commas)")
	f.StringVar(&cfg.Model, "model", "", "model name to send (default: the first of /v1/models)")
	f.IntVar(&cfg.Window, "window", 0, "context window in tokens (default: max_model_len from /v1/models or /tokenize)")
	f.IntVar(&cfg.PageSize, "page-size", 16, "KV page (block) size in tokens, for the window+page boundary")
	f.IntVar(&cfg.Trials, "trials", 0, "canary copy tasks per key (default 40, 6 with --quick)")
	f.BoolVar(&cfg.Quick, "quick", false, "fewer trials and a smaller burst: a smoke check in seconds")
	f.BoolVar(&cfg.OneTenant, "one-tenant", false, "the keys are one tenant to the server (llama.cpp's server: keys but no tenants), or one key is given: canaries then test isolation between requests, and prefix-cache is not applicable")
	f.StringVar(&cfg.MetricsURL, "metrics-url", "", "where the server's Prometheus metrics are read for the must-be-zero counters (default: --url + /metrics; pagewarden serves them on --metrics-listen)")
	f.StringArrayVar(&cfg.ZeroMetrics, "zero-metric", nil, "a counter that must not rise during the run, besides pagewarden's must-be-zero ones (repeatable)")
	f.StringVar(&jsonPath, "json", "", "write the full report with evidence as JSON to this file")
	f.DurationVar(&cfg.Timeout, "request-timeout", 2*time.Minute, "deadline of each request (longer than the server's own queue limit, so that it answers first)")
	f.DurationVar(&maxDuration, "max-duration", 30*time.Minute, "deadline of the whole probe")
	return c
}
