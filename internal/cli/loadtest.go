package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/loadgen"
)

func init() { extraCommands = append(extraCommands, loadtestCmd) }

func loadtestCmd() *cobra.Command {
	var (
		cfg         loadgen.Config
		keys        string
		endpoint    string
		maxDuration time.Duration
		asJSON      bool
	)
	c := &cobra.Command{
		Use:   "loadtest",
		Short: "Drive an OpenAI-compatible server with concurrent streaming requests and report latency and throughput",
		Long: `Send --requests streaming requests, --concurrency at a time, to the server at
--url (its root; /v1/... is appended), using the API keys in --key round-robin
(one key per tenant). Report requests and output tokens per second, time to
first token and inter-token latency percentiles, and failures by HTTP status.
Requests are never retried. The whole run stops after --max-duration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, k := range strings.Split(keys, ",") {
				if k = strings.TrimSpace(k); k != "" {
					cfg.Keys = append(cfg.Keys, k)
				}
			}
			switch endpoint {
			case "completions":
				cfg.Endpoint = loadgen.Completions
			case "chat":
				cfg.Endpoint = loadgen.Chat
			default:
				return usagef("--endpoint %q: want completions or chat", endpoint)
			}
			// Zero would mean "the default" to the library; on the
			// command line it is a mistake.
			for _, n := range []struct {
				flag string
				v    int
			}{{"--requests", cfg.Requests}, {"--concurrency", cfg.Concurrency}, {"--max-tokens", cfg.MaxTokens}, {"--prompt-tokens", cfg.PromptTokens}} {
				if n.v < 1 {
					return usagef("%s %d: want at least 1", n.flag, n.v)
				}
			}
			if cfg.RequestTimeout <= 0 {
				return usagef("--request-timeout %v: want a positive duration", cfg.RequestTimeout)
			}
			if maxDuration <= 0 {
				return usagef("--max-duration %v: want a positive duration", maxDuration)
			}
			if err := cfg.Validate(); err != nil {
				return usageError{err}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), maxDuration)
			defer cancel()
			r, err := loadgen.Run(ctx, cfg)
			if r == nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				r.Samples = nil // per-request detail is for library callers
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				if werr := enc.Encode(r); werr != nil {
					return werr
				}
			} else if werr := r.Write(out); werr != nil {
				return werr
			}
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				return fmt.Errorf("stopped after --max-duration %v with %d of %d requests sent", maxDuration, r.Requests, cfg.Requests)
			case err != nil:
				return err
			case r.Succeeded == 0:
				return fmt.Errorf("none of %d requests succeeded", r.Requests)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.BaseURL, "url", "http://127.0.0.1:8080", "server root URL (http or https)")
	f.StringVar(&keys, "key", "", "API keys, comma-separated; request i uses key i mod n (one key per tenant)")
	f.IntVar(&cfg.Concurrency, "concurrency", 16, fmt.Sprintf("requests in flight at once (at most %d)", loadgen.MaxConcurrency))
	f.IntVar(&cfg.Requests, "requests", 200, fmt.Sprintf("requests in all (at most %d)", loadgen.MaxRequests))
	f.IntVar(&cfg.MaxTokens, "max-tokens", 64, "max_tokens of each request")
	f.IntVar(&cfg.PromptTokens, "prompt-tokens", 64, "approximate prompt length in tokens (sized with the server's /tokenize when it has one)")
	f.StringVar(&endpoint, "endpoint", "completions", "API to drive: completions or chat")
	f.StringVar(&cfg.Model, "model", "", "model name to send (default: none, the server's)")
	f.Float64Var(&cfg.Temperature, "temperature", 0, "sampling temperature (0 is greedy)")
	f.DurationVar(&cfg.RequestTimeout, "request-timeout", 2*time.Minute, "deadline of each request")
	f.DurationVar(&maxDuration, "max-duration", 10*time.Minute, "deadline of the whole run")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	return c
}
