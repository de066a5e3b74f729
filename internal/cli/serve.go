package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/admin"
	"github.com/pagewarden/pagewarden/internal/disagg"
	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kernels"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
)

func init() { extraCommands = append(extraCommands, serveCmd, capacityCmd) }

// nodeFlags are the serving flags shared by serve and capacity.
type nodeFlags struct {
	modelFlags
	kvMemory     string
	maxContext   int
	margin       float64
	scrub        string
	allowNoScrub bool
	prefixCache  bool
	batchTokens  int
	maxRunning   int
	maxQueued    int
	maxQueuedPer int
	maxQueueWait time.Duration
}

func (f *nodeFlags) register(c *cobra.Command) {
	f.modelFlags.register(c)
	c.Flags().StringVar(&f.kvMemory, "kv-memory", "", "KV cache budget, e.g. 512MiB or 4GiB (default: a quarter of available memory, at most 16 context windows)")
	c.Flags().IntVar(&f.maxContext, "max-context", 0, "advertised context window in tokens (default: the model's)")
	c.Flags().Float64Var(&f.margin, "kv-safety-margin", sched.DefaultSafetyMargin, "refuse to start unless the KV cache holds this many full windows")
	c.Flags().StringVar(&f.scrub, "scrub", "zero", "what released KV pages are filled with: zero, poison (NaN, for testing) or none (needs --allow-no-scrub)")
	c.Flags().BoolVar(&f.allowNoScrub, "allow-no-scrub", false, "permit --scrub none (released pages keep their data)")
	c.Flags().BoolVar(&f.prefixCache, "prefix-cache", true, "share full prompt pages between requests of the same tenant")
	c.Flags().IntVar(&f.batchTokens, "max-batch-tokens", 512, "tokens per scheduler step (decode tokens plus prefill chunks)")
	c.Flags().IntVar(&f.maxRunning, "max-running", 64, "sequences running at once over all tenants")
	c.Flags().IntVar(&f.maxQueued, "max-queued", 4096, "requests waiting for KV pages over all tenants (beyond it: 503 overloaded)")
	c.Flags().IntVar(&f.maxQueuedPer, "max-queued-per-tenant", 256, "requests one tenant may have waiting (beyond it: 503 overloaded)")
	c.Flags().DurationVar(&f.maxQueueWait, "max-queue-wait", time.Minute, "how long a request may wait for its first step before it is refused with 503 overloaded (0: forever)")
}

func (f *nodeFlags) options() (node.Options, error) {
	if err := f.modelFlags.validate(); err != nil {
		return node.Options{}, err
	}
	kvType, _ := f.kvDType()
	o := node.Options{
		Threads: f.threads, PageSize: f.pageSize, KVType: kvType, MaxContext: f.maxContext,
		SafetyMargin: f.margin, AllowNoScrub: f.allowNoScrub, PrefixCache: f.prefixCache,
		MaxBatchTokens: f.batchTokens, MaxRunning: f.maxRunning,
		MaxQueued: f.maxQueued, MaxQueuedPerTenant: f.maxQueuedPer, MaxQueueWait: f.maxQueueWait,
	}
	if f.kvMemory != "" {
		b, err := kvcache.ParseBytes(f.kvMemory)
		if err != nil {
			return o, usagef("--kv-memory %q: %v", f.kvMemory, err)
		}
		o.KVMemory = b
	}
	if f.maxContext < 0 {
		return o, usagef("--max-context %d: want a positive window (0 for the model's)", f.maxContext)
	}
	if !(f.margin >= 1) {
		return o, usagef("--kv-safety-margin %g: want 1 or more", f.margin)
	}
	s, err := kvcache.ParseScrubPolicy(f.scrub)
	if err != nil {
		return o, usagef("--scrub %q: %v", f.scrub, err)
	}
	if s == kvcache.ScrubNone && !f.allowNoScrub {
		return o, usagef("--scrub none leaves other tenants' data in released pages; add --allow-no-scrub to accept that")
	}
	o.Scrub = s
	if f.batchTokens < 1 || f.maxRunning < 1 {
		return o, usagef("--max-batch-tokens and --max-running must be at least 1")
	}
	if f.maxQueued < 1 || f.maxQueuedPer < 1 || f.maxQueueWait < 0 {
		return o, usagef("--max-queued and --max-queued-per-tenant must be at least 1, --max-queue-wait 0 (forever) or positive")
	}
	return o, nil
}

func capacityCmd() *cobra.Command {
	var nf nodeFlags
	c := &cobra.Command{
		Use:   "capacity",
		Short: "Print the KV cache capacity and the served limits without starting a server",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := nf.options()
			if err != nil {
				return err
			}
			m, err := nf.load()
			if err != nil {
				return err
			}
			defer m.Close()
			capa, err := node.Plan(m, o)
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "model            %s (%s, %d layers, %d kv heads x %d, context %d)\n", m.Name, m.WeightType, m.Config.Layers, m.Config.KVHeads, m.Config.HeadDim, m.Config.ContextLength)
			// A sliding window changes what a sequence must keep: say
			// which one this file gets (a Mistral GGUF's is easy to lose).
			if w := m.Config.SlidingWindow; w > 0 && m.Config.EveryLayerWindow() > 0 {
				fmt.Fprintf(out, "attention window %d positions on every layer: a sequence gives back the pages before its last %d positions\n", w, w)
			} else if w > 0 {
				fmt.Fprintf(out, "attention window %d positions on some layers: every page is kept\n", w)
			}
			fmt.Fprintf(out, "kv memory        %d bytes (%.1f MiB; %s)\n", capa.KVMemory, float64(capa.KVMemory)/(1<<20), capa.KVMemorySource)
			fmt.Fprintf(out, "pages            %d\n", capa.Pages)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%s\n", capa.Limits)
			return nil
		},
	}
	nf.register(c)
	return c
}

func serveCmd() *cobra.Command {
	var nf nodeFlags
	var listen, configPath, metricsListen string
	var drain time.Duration
	var logPrompts, metricsOnAPI bool
	var maxBody int64
	var auditRate float64
	var auditQueue int
	var auditTolerance float64
	var reapAfter time.Duration
	var colocated bool
	var af adminFlags  // admin.go
	var tf apiTLSFlags // apitls.go
	var lg logFlags
	var apiKey string
	var sf servedFlags
	c := &cobra.Command{
		Use:   "serve",
		Short: "Serve the OpenAI-compatible API (gateway, a prefill and a decode node in one process)",
		Long: `Serve the OpenAI-compatible API on --listen. The process runs a gateway, a
prefill node and a decode node; each prompt's KV pages are handed from prefill
to decode through the same handoff protocol, checks and framing as between
hosts (pagewarden prefill/decode/gateway), so a long prompt arriving never
stalls the streams already running. --kv-memory is the budget of both nodes
together: the prefill node gets a quarter (at least the window with its
margin), the decode node the rest. --colocated runs one node instead, with one
KV pool and no handoff (less memory, a slightly faster first token, but every
prefill step stalls the running streams).

Tenants come from --config (YAML,
reloaded on SIGHUP); without it one tenant is served, with the key --api-key
(or PAGEWARDEN_API_KEY) gives, or with a generated key printed once on stderr
when the server is ready to listen.

/metrics carries every tenant's id and traffic and is not authenticated, so it
is served on its own private address (--metrics-listen, loopback by default),
never on the API listener unless --metrics-on-api asks for it.

KV pages quarantined after an isolation violation are never reused until they
are scrubbed: SIGUSR1 scrubs and frees all of them (the count is logged), and
--quarantine-reap-after does it automatically once a page has been quarantined
that long.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := nf.options()
			if err != nil {
				return err
			}
			if reapAfter < 0 {
				return usagef("--quarantine-reap-after %v: want 0 (operator only) or a positive duration", reapAfter)
			}
			o.QuarantineReapAfter = reapAfter
			if err := sf.apply(cmd, &o); err != nil {
				return err
			}
			if _, port, _ := net.SplitHostPort(listen); port != "0" && metricsListen == listen {
				return usagef("--metrics-listen %s is the API address; metrics need their own (or --metrics-on-api)", metricsListen)
			}
			logger := lg.logger(cmd.ErrOrStderr())
			tlsCfg, err := tf.load()
			if err != nil {
				return err
			}
			// In production a broken invariant aborts the request it
			// touched and is counted; it must not crash every tenant.
			invariants.SetStrict(false)
			// The generated key is printed only once the server is about
			// to listen: a key announced before a failed start is a
			// credential for nothing, printed for no reason.
			tcfg, key, err := tenantConfig(cmd, configPath, apiKey)
			if err != nil {
				return err
			}
			// One registry for the gateway's quotas and the scheduler's
			// policies: a reload changes both at once, and its
			// namespaces tell the scheduler when an id changed hands.
			policies, err := tenants.NewRegistry(tcfg)
			if err != nil {
				return err
			}
			o.Policy = func(t request.Tenant) sched.TenantPolicy {
				tn, ok := policies.Tenant(string(t))
				if !ok {
					return sched.TenantPolicy{}
				}
				return sched.TenantPolicy{MaxPages: tn.Limits.MaxKVPages, MaxRunning: tn.Limits.MaxConcurrent, Priority: tn.Limits.Priority,
					Customer: tn.CacheNamespace}
			}
			o.PolicyGeneration = policies.Generation
			o.Logger = af.audit(logger) // the nodes' audit lines also feed the admin page
			m, err := nf.load()
			if err != nil {
				return err
			}
			var (
				backend  gateway.Backend
				scrubber quarantineScrubber
				lim      sched.Limits
				register func(prometheus.Registerer) error
			)
			if !colocated {
				// A prefill and a decode node in this process, linked by
				// the same framing, handshake and checks as across hosts.
				l, err := disagg.StartLocal(m, disagg.LocalConfig{Node: o, Logger: o.Logger, ShareKV: true, Wrap: serveWrap})
				if err != nil {
					return err
				}
				defer l.Close()
				backend, scrubber, lim, register = l, l, l.Decodes[0].SchedLimits(), l.RegisterMetrics
			} else {
				n, err := node.Start(m, o)
				if err != nil {
					m.Close()
					return err
				}
				defer n.Close()
				backend, scrubber, lim = n, n, n.SchedLimits()
				register = func(r prometheus.Registerer) error { return r.Register(n.Collector()) }
			}
			srv, err := gateway.New(gateway.Config{Backend: backend, Registry: policies, Logger: logger, LogPrompts: logPrompts, MaxBodyBytes: maxBody,
				MetricsOnAPI: metricsOnAPI, AuditRate: auditRate, AuditQueue: auditQueue, AuditTolerance: auditTolerance})
			if err != nil {
				return err
			}
			if err := register(srv.Metrics()); err != nil {
				return err
			}
			stopMetrics, err := serveMetrics(cmd, metricsListen, srv.Metrics())
			if err != nil {
				return err
			}
			defer stopMetrics()
			reload := func(logger *slog.Logger) ([]string, error) {
				nc, changes, err := reloadTenantConfig(srv, configPath, logger) // the shared registry: gateway and scheduler at once
				af.reloadKeys(nc, logger)
				return changes, err
			}
			af.reload = func(context.Context) ([]string, error) { return reload(logger) }
			af.drain, af.draining = srv.SetDraining, srv.Draining
			stopAdmin, err := af.start(cmd, tcfg, policies, backend, tlsCfg, logger)
			if err != nil {
				return err
			}
			defer stopAdmin()
			if metricsOnAPI {
				logger.Warn("--metrics-on-api: /metrics on the API listener shows every tenant's id and traffic to anyone who can reach it")
			} else if metricsListen == "" {
				logger.Info("metrics are off: no --metrics-listen")
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			ln = tf.wrap(ln)
			// Signals are caught before the address is announced, so that
			// whoever waits for it may signal at once.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			usr1 := make(chan os.Signal, 1)
			signal.Notify(usr1, syscall.SIGUSR1)
			defer signal.Stop(usr1)
			announceKey(cmd, key)
			logger.Info("serving", "disaggregated", !colocated, "addr", ln.Addr().String(), "model", m.Name, "kernels", kernels.Implementation(), "k_prefetch", kernels.KPrefetch(), "max_context", lim.MaxContext,
				"kv_pages", lim.UsablePages, "page_size", lim.PageSize, "usable_kv_tokens", lim.UsableTokens, "safety_margin", lim.SafetyMargin)
			fmt.Fprintf(cmd.ErrOrStderr(), "listening on %s://%s\n", tf.scheme(), ln.Addr())
			srv.Start(ln)

			for {
				select {
				case <-hup:
					reload(af.audit(logger))
				case <-usr1:
					scrubQuarantine(cmd.Context(), scrubber, af.audit(logger))
				case <-cmd.Context().Done():
					logger.Info("draining", "deadline", drain.String())
					ctx, cancel := context.WithTimeout(context.Background(), drain)
					err := srv.Shutdown(ctx)
					cancel()
					if err != nil && !errors.Is(err, context.DeadlineExceeded) {
						return err
					}
					return nil
				}
			}
		},
	}
	nf.register(c)
	lg.register(c)
	registerAPIKey(c, &apiKey)
	sf.register(c)
	af.register(c)
	tf.register(c, "")
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address to serve on")
	c.Flags().StringVar(&configPath, "config", "", "tenant configuration (YAML); reloaded on SIGHUP")
	c.Flags().StringVar(&metricsListen, "metrics-listen", defaultMetricsListen,
		"private address that serves /metrics (every tenant's id and traffic, unauthenticated); empty turns it off")
	c.Flags().BoolVar(&metricsOnAPI, "metrics-on-api", false,
		"also serve /metrics on the API listener, unauthenticated: anyone who can reach the API sees every tenant's id and traffic")
	c.Flags().DurationVar(&drain, "drain-timeout", 30*time.Second, "how long shutdown waits for in-flight requests")
	c.Flags().BoolVar(&logPrompts, "log-prompts", false, "log prompt and output text (debug only: prompts are customer data)")
	c.Flags().Int64Var(&maxBody, "max-body-bytes", gateway.DefaultMaxBodyBytes, "largest request body accepted (413 beyond)")
	c.Flags().Float64Var(&auditRate, "audit-rate", defaultAuditRate,
		"fraction of successful answers generated again on fresh pages (as the reserved tenant _audit, at the lowest priority) and compared token for token; a difference counts pagewarden_audit_mismatches_total and logs an ERROR (0 turns it off)")
	c.Flags().IntVar(&auditQueue, "audit-queue", 64, "replays that may wait to run; beyond it they are dropped (counted in pagewarden_audit_replays_total{result=\"dropped\"})")
	c.Flags().Float64Var(&auditTolerance, "audit-tolerance", 0, "largest |difference| of a token's log-probability between an answer and its re-score that still matches; 0 compares exactly (set it only for nodes computing with other kernels)")
	c.Flags().BoolVar(&colocated, "colocated", false,
		"run one node (one engine and KV pool, no handoff) instead of a prefill and a decode node: less memory, but long prompts stall running streams")
	c.Flags().DurationVar(&reapAfter, "quarantine-reap-after", 0, "scrub and free KV pages quarantined after a violation once they have been quarantined this long (0: only on SIGUSR1)")
	return c
}

// defaultAuditRate replays one answer in a hundred: enough to notice
// contamination that recurs within minutes at any real traffic, for about
// 1% more compute (each replay costs what the answer cost).
const defaultAuditRate = 0.01

// defaultMetricsListen is loopback only: a local Prometheus or agent can
// scrape it, nothing else can reach it. 9464 is the port OpenTelemetry's
// Prometheus exporter uses.
const defaultMetricsListen = "127.0.0.1:9464"

// scrubTimeout bounds how long SIGUSR1 waits for the scheduler loop, which
// applies the scrub between two steps.
const scrubTimeout = 30 * time.Second

// quarantineScrubber is a node, or the nodes of a cluster in one process.
type quarantineScrubber interface {
	ScrubQuarantined(ctx context.Context) (int, error)
}

// scrubQuarantine is the operator's SIGUSR1: scrub and free every
// quarantined KV page, and log how many.
func scrubQuarantine(ctx context.Context, n quarantineScrubber, logger *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, scrubTimeout)
	defer cancel()
	k, err := n.ScrubQuarantined(ctx)
	if err != nil {
		logger.Error("SIGUSR1: scrubbing quarantined KV pages failed", "pages", k, "err", err, admin.AuditKey, true)
		return
	}
	logger.Info("SIGUSR1: quarantined KV pages scrubbed and freed", "pages", k, admin.AuditKey, true)
}

func loadTenants(path string) (*tenants.Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cfg, err := tenants.Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}
