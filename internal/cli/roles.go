package cli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/cluster"
	"github.com/pagewarden/pagewarden/internal/disagg"
	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

func init() { extraCommands = append(extraCommands, prefillCmd, decodeCmd, gatewayCmd) }

// linkFlags are what every role needs to join the others: its name (the
// one its certificate names), where it listens for links, its mutual-TLS
// files and the peers it dials.
type linkFlags struct {
	name            string
	listen          string
	ca, cert, key   string
	prefill, decode []string // NAME=HOST:PORT
	metricsListen   string
	etcd            etcdFlags
	log             logFlags   // --log-level, --log-format (common.go)
	admin           adminFlags // prefill and decode: --admin-listen, --admin-key (admin.go)
}

func (f *linkFlags) register(c *cobra.Command, role transfer.Role) {
	c.Flags().StringVar(&f.name, "name", "", "this node's name; must be the one its certificate names (pagewarden certs)")
	if role != transfer.RoleGateway {
		c.Flags().StringVar(&f.listen, "link-listen", "127.0.0.1:0", "address other nodes reach this one on (gRPC over mutual TLS)")
		f.admin.register(c)
	}
	c.Flags().StringVar(&f.ca, "tls-ca", "", "CA certificate (PEM) every node's certificate must chain to")
	c.Flags().StringVar(&f.cert, "tls-cert", "", "this node's certificate (PEM)")
	c.Flags().StringVar(&f.key, "tls-key", "", "this node's private key (PEM)")
	if role == transfer.RoleGateway {
		c.Flags().StringSliceVar(&f.prefill, "prefill", nil, "prefill nodes, NAME=HOST:PORT (repeat or comma-separate)")
	}
	if role != transfer.RoleDecode {
		c.Flags().StringSliceVar(&f.decode, "decode", nil, "decode nodes, NAME=HOST:PORT (repeat or comma-separate)")
	}
	c.Flags().StringVar(&f.metricsListen, "metrics-listen", defaultMetricsListen, "private address that serves /metrics; empty turns it off")
	f.etcd.register(c, role)
	f.log.register(c)
}

// peers parses NAME=HOST:PORT lists into the transport's address table.
func parsePeers(flag string, specs []string, table map[transfer.Peer]string) ([]transfer.Peer, error) {
	var names []transfer.Peer
	for _, s := range specs {
		name, addr, ok := strings.Cut(s, "=")
		if !ok || name == "" || addr == "" {
			return nil, usagef("--%s %q: want NAME=HOST:PORT", flag, s)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, usagef("--%s %q: %v", flag, s, err)
		}
		if _, dup := table[transfer.Peer(name)]; dup {
			return nil, usagef("--%s: node %q named twice", flag, name)
		}
		table[transfer.Peer(name)] = addr
		names = append(names, transfer.Peer(name))
	}
	return names, nil
}

// transport loads the TLS files and starts the node's gRPC transport.
func (f *linkFlags) transport(role transfer.Role, layout transfer.Layout, peers map[transfer.Peer]string, logger *slog.Logger) (*link.GRPC, *link.TLS, error) {
	if f.name == "" {
		return nil, nil, usagef("--name is required: the node name its certificate carries")
	}
	if f.ca == "" || f.cert == "" || f.key == "" {
		return nil, nil, usagef("--tls-ca, --tls-cert and --tls-key are required (pagewarden certs makes a development set)")
	}
	tl, err := link.LoadTLS(f.ca, f.cert, f.key)
	if err != nil {
		return nil, nil, err
	}
	var ln net.Listener
	if f.listen != "" {
		if ln, err = net.Listen("tcp", f.listen); err != nil {
			return nil, nil, fmt.Errorf("--link-listen %s: %w", f.listen, err)
		}
	}
	t, err := link.NewGRPC(link.GRPCConfig{
		Options: link.Options{Logger: logger}, TLS: tl, Peers: peers,
		Hello: transfer.NewHello(transfer.Peer(f.name), role, layout),
	}, ln)
	if err != nil {
		if ln != nil {
			ln.Close()
		}
		return nil, nil, err
	}
	return t, tl, nil
}

// serveMetrics serves reg on the private metrics address, if any.
func serveMetrics(cmd *cobra.Command, addr string, reg *prometheus.Registry) (func(), error) {
	if addr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: %w (choose another address, or \"\" for no metrics listener)", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	fmt.Fprintf(cmd.ErrOrStderr(), "metrics on http://%s/metrics\n", ln.Addr())
	return func() { srv.Close() }, nil
}

// alsoFlags are the other role a prefill or decode process runs beside
// its own when the operator asks for it (--also-decode, --also-prefill):
// a second node on the same model in memory, with its own KV pool,
// scheduler, name, link and certificate (a certificate names one node in
// one role, so the second role has its own), paired with the others
// through the same handshake and handoff as any node.
type alsoFlags struct {
	role                    transfer.Role // the other role
	on                      bool
	name, listen, cert, key string
}

func (a *alsoFlags) register(c *cobra.Command, own transfer.Role) {
	a.role = transfer.RoleDecode
	if own == transfer.RoleDecode {
		a.role = transfer.RolePrefill
	}
	f := "also-" + a.role.String()
	c.Flags().BoolVar(&a.on, f, false, fmt.Sprintf("also run a %s node in this process: the model is loaded once, --kv-memory is split between the two nodes "+
		"(a quarter to prefill, the rest to decode, as serve does), and the %s node has its own name, link and certificate (--%s-*)", a.role, a.role, f))
	c.Flags().StringVar(&a.name, f+"-name", "", fmt.Sprintf("with --%s: the %s node's name (its certificate's)", f, a.role))
	c.Flags().StringVar(&a.listen, f+"-link-listen", "127.0.0.1:0", fmt.Sprintf("with --%s: the address other nodes reach the %s node on", f, a.role))
	c.Flags().StringVar(&a.cert, f+"-tls-cert", "", fmt.Sprintf("with --%s: the %s node's certificate (PEM; role %s, chained to --tls-ca)", f, a.role, a.role))
	c.Flags().StringVar(&a.key, f+"-tls-key", "", fmt.Sprintf("with --%s: the %s node's private key (PEM)", f, a.role))
	if own == transfer.RoleDecode {
		// The prefill half must reach the decode nodes the gateway pairs
		// it with; this process's own decode node is added by itself.
		c.Flags().StringSlice("decode", nil, "with --also-prefill: other decode nodes its prefill node sends pages to, NAME=HOST:PORT (this process's decode node is always one)")
	}
}

// check refuses half a configuration: flags of the other role without
// --also-ROLE, or --also-ROLE without its name and certificate.
func (a *alsoFlags) check(c *cobra.Command, lf *linkFlags) error {
	f := "also-" + a.role.String()
	if !a.on {
		for _, name := range []string{"-name", "-link-listen", "-tls-cert", "-tls-key"} {
			if c.Flags().Changed(f + name) {
				return usagef("--%s%s needs --%s", f, name, f)
			}
		}
		if a.role == transfer.RolePrefill && c.Flags().Changed("decode") {
			return usagef("--decode on a decode node needs --also-prefill (it lists where the prefill node sends pages)")
		}
		return nil
	}
	switch {
	case a.name == "" || a.cert == "" || a.key == "":
		return usagef("--%s needs --%s-name, --%s-tls-cert and --%s-tls-key: the %s node's identity (pagewarden certs --node NAME:%s)", f, f, f, f, a.role, a.role)
	case a.name == lf.name:
		return usagef("--%s-name %q is this node's own --name: every node needs a name of its own", f, a.name)
	case a.listen == "":
		return usagef("--%s-link-listen is required: the address other nodes reach the %s node on", f, a.role)
	}
	return nil
}

// linkFlags returns the other role's link flags: lf's CA, peers, etcd
// and logging, with the other node's name, listener and certificate.
func (a *alsoFlags) linkFlags(lf *linkFlags) *linkFlags {
	o := *lf
	o.name, o.listen, o.cert, o.key = a.name, a.listen, a.cert, a.key
	o.etcd.advertise = "" // --advertise-addr is the first node's
	return &o
}

// roleNode is one node a prefill or decode process runs.
type roleNode struct {
	role   transfer.Role
	lf     *linkFlags
	n      *node.Node
	t      *link.GRPC
	ms     *membership
	logger *slog.Logger
}

// run runs the node's driver until ctx ends or its registration is lost.
func (r *roleNode) run(ctx context.Context) error {
	return r.ms.untilLost(ctx, func(ctx context.Context) error {
		if r.role == transfer.RolePrefill {
			d, err := disagg.NewPrefill(disagg.PrefillConfig{Sched: r.n.Sched(), Layout: r.n.HandoffLayout(), Transport: r.nodeTransport(), Logger: r.logger, Load: disagg.LoadOf(r.n)})
			if err != nil {
				return err
			}
			return d.Run(ctx)
		}
		d, err := disagg.NewDecode(disagg.DecodeConfig{Sched: r.n.Sched(), Layout: r.n.HandoffLayout(), Transport: r.nodeTransport(), Logger: r.logger, Load: disagg.LoadOf(r.n)})
		if err != nil {
			return err
		}
		// With --etcd, a prefill node or gateway that leaves the cluster
		// takes its reservations here with it, at once.
		r.ms.onPeerLeft(d.PeerLeft)
		return d.Run(ctx)
	})
}

// runNodeRole runs a prefill or decode process: its node, and with
// --also-ROLE the other role's node beside it, until the command's
// context ends or either node stops (a registration lost, a link closed):
// a process is up only while both its nodes are.
func runNodeRole(cmd *cobra.Command, nf *nodeFlags, lf *linkFlags, role transfer.Role, also *alsoFlags) error {
	o, err := nf.options()
	if err != nil {
		return err
	}
	if err := lf.etcd.check(lf); err != nil {
		return err
	}
	if err := also.check(cmd, lf); err != nil {
		return err
	}
	nodes := []*roleNode{{role: role, lf: lf}}
	if also.on {
		nodes = append(nodes, &roleNode{role: also.role, lf: also.linkFlags(lf)})
	}
	var prefill *roleNode
	for _, r := range nodes {
		if r.role == transfer.RolePrefill {
			prefill = r
		}
	}
	peers := map[transfer.Peer]string{}
	decodes := lf.decode
	if role == transfer.RoleDecode && also.on {
		decodes, _ = cmd.Flags().GetStringSlice("decode")
	}
	if _, err := parsePeers("decode", decodes, peers); err != nil {
		return err
	}
	if prefill != nil && len(peers) == 0 && !lf.etcd.enabled() && !also.on {
		return usagef("--decode (or --etcd) is required: the decode nodes this prefill node sends pages to")
	}
	for _, r := range nodes {
		if r.lf.listen == "" {
			return usagef("--link-listen is required: the address other nodes reach this one on")
		}
	}
	logger := lf.log.logger(cmd.ErrOrStderr())
	invariants.SetStrict(false)
	m, err := nf.load()
	if err != nil {
		return err
	}
	// The nodes share the model; it is closed once both are.
	defer m.Close()
	budgets := []int64{o.KVMemory}
	if also.on {
		p, d, err := disagg.SplitKV(m, o, 1, 1)
		if err != nil {
			return err
		}
		budgets = []int64{d, d}
		budgets[slices.IndexFunc(nodes, func(r *roleNode) bool { return r.role == transfer.RolePrefill })] = p
	}
	var set disagg.NodeSet
	for i, r := range nodes {
		no := o
		no.KVMemory, no.KeepModel = budgets[i], true
		r.logger = logger.With("node", r.lf.name, "role", r.role.String())
		no.Logger = lf.admin.audit(r.logger) // also the admin page's audit ring
		if r.n, err = node.Start(m, no); err != nil {
			return err
		}
		defer r.n.Close()
		set.Names, set.Nodes = append(set.Names, r.lf.name), append(set.Nodes, r.n)
	}
	// Links start decode first, so that a prefill node beside a decode
	// node can send to it: it is dialled at its listener like any other.
	order := slices.Clone(nodes)
	slices.SortStableFunc(order, func(a, b *roleNode) int { return cmp.Compare(b.role, a.role) })
	for _, r := range order {
		var tp map[transfer.Peer]string
		if r.role == transfer.RolePrefill {
			tp = peers
			for _, d := range order {
				if d.role == transfer.RoleDecode {
					if _, dup := tp[transfer.Peer(d.lf.name)]; dup {
						return usagef("--decode names %s, the decode node of this process", d.lf.name)
					}
					tp[transfer.Peer(d.lf.name)] = d.t.Addr().String()
				}
			}
		}
		var tl *link.TLS
		if r.t, tl, err = r.lf.transport(r.role, r.n.HandoffLayout(), tp, r.logger); err != nil {
			return err
		}
		defer r.t.Close()
		lim := r.n.SchedLimits()
		if lf.etcd.enabled() {
			if r.ms, err = lf.etcd.joinCluster(cmd, r.lf, r.role, r.t, tl, r.n.HandoffLayout(), lim.UsablePages, lim.SafetyMargin, nil, r.logger); err != nil {
				return err
			}
			defer r.ms.close()
		}
		r.logger.Info("serving", "link", r.t.Addr().String(), "model", m.Name, "max_context", lim.MaxContext, "kv_pages", lim.UsablePages, "page_size", lim.PageSize)
	}
	reg := prometheus.NewRegistry()
	var src gateway.StatsSource = nodes[0].n
	if len(nodes) == 1 {
		err = reg.Register(nodes[0].n.Collector())
	} else {
		src, err = set, set.RegisterMetrics(reg)
	}
	if err != nil {
		return err
	}
	for _, c := range append(gateway.PoolCollectors(src), gateway.ProcessCollectors()...) {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	stop, err := serveMetrics(cmd, lf.metricsListen, reg)
	if err != nil {
		return err
	}
	defer stop()
	stopAdmin, err := lf.admin.startRole(cmd, set, logger)
	if err != nil {
		return err
	}
	defer stopAdmin()
	for _, r := range nodes {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s %s linked on %s\n", r.role, r.lf.name, r.t.Addr())
	}
	// With etcd, a lost registration stops the driver (every request it
	// holds ends; the gateway failed them already when the lease
	// expired) and the role exits with the loss as its error; the other
	// node of the process stops with it.
	ctx, cancel := context.WithCancel(cmd.Context())
	defer cancel()
	errs := make(chan error, len(nodes))
	for _, r := range nodes {
		go func() { errs <- r.run(ctx) }()
	}
	first := <-errs
	cancel()
	for range len(nodes) - 1 {
		if err := <-errs; first == nil {
			first = err
		}
	}
	return first
}

func prefillCmd() *cobra.Command {
	var nf nodeFlags
	var lf linkFlags
	var also alsoFlags
	c := &cobra.Command{
		Use:   "prefill",
		Short: "Run a prefill node: compute prompts and hand their KV pages to decode nodes",
		Long: `Run a prefill node. The gateway sends it prompts (with a decode node's
reservation); it computes each prompt's KV cache and streams the pages, a
manifest and a commit to that decode node over gRPC with mutual TLS. Its
certificate must name it (--name) with the role prefill.

With --also-decode the process runs a decode node too, on the same model in
memory (only when the operator asks: each role otherwise runs alone).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runNodeRole(cmd, &nf, &lf, transfer.RolePrefill, &also)
		},
	}
	nf.register(c)
	lf.register(c, transfer.RolePrefill)
	also.register(c, transfer.RolePrefill)
	return c
}

func decodeCmd() *cobra.Command {
	var nf nodeFlags
	var lf linkFlags
	var also alsoFlags
	c := &cobra.Command{
		Use:   "decode",
		Short: "Run a decode node: reserve pages, take handoffs from prefill nodes, generate",
		Long: `Run a decode node. The gateway asks it to reserve KV pages for a request;
the prefill node the gateway names sends the prompt's pages, and the request
is decoded only if they match the reservation exactly. Tokens stream back to
the gateway. Its certificate must name it (--name) with the role decode.

With --also-prefill the process runs a prefill node too, on the same model in
memory (only when the operator asks: each role otherwise runs alone).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runNodeRole(cmd, &nf, &lf, transfer.RoleDecode, &also)
		},
	}
	nf.register(c)
	lf.register(c, transfer.RoleDecode)
	also.register(c, transfer.RoleDecode)
	return c
}

// staleCheckEvery is how often a gateway with --etcd checks whether its
// lease has gone unconfirmed for too long (cluster.Session.Stale).
const staleCheckEvery = 200 * time.Millisecond

func gatewayCmd() *cobra.Command {
	var nf nodeFlags
	var lf linkFlags
	var listen, configPath string
	var drain time.Duration
	var maxBody int64
	var auditRate float64
	var auditQueue int
	var auditTolerance float64
	var apiKey string // --api-key (common.go)
	var sf servedFlags
	var tf apiTLSFlags // apitls.go
	c := &cobra.Command{
		Use:   "gateway",
		Short: "Run the OpenAI-compatible gateway in front of prefill and decode nodes",
		Long: `Run the gateway: authenticate tenants, check every request against the
served limits, and send it through a decode node (reservation, decoding) and a
prefill node (the prompt). The model flags must be the nodes' (the gateway
tokenizes, and its limits must equal theirs: the handshake refuses a mismatch).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o, err := nf.options()
			if err != nil {
				return err
			}
			if err := sf.apply(cmd, &o); err != nil {
				return err
			}
			if err := lf.etcd.check(&lf); err != nil {
				return err
			}
			peers := map[transfer.Peer]string{}
			prefills, err := parsePeers("prefill", lf.prefill, peers)
			if err != nil {
				return err
			}
			decodes, err := parsePeers("decode", lf.decode, peers)
			if err != nil {
				return err
			}
			if (len(prefills) == 0 || len(decodes) == 0) && !lf.etcd.enabled() {
				return usagef("--prefill and --decode each need at least one node (or --etcd, to find them there)")
			}
			logger := lf.log.logger(cmd.ErrOrStderr())
			if _, err := tf.load(); err != nil {
				return err
			}
			invariants.SetStrict(false)
			tcfg, key, err := tenantConfig(cmd, configPath, apiKey)
			if err != nil {
				return err
			}
			m, err := nf.load()
			if err != nil {
				return err
			}
			defer m.Close()
			layout, lim, err := node.PlanHandoff(m, o)
			if err != nil {
				return err
			}
			t, tl, err := lf.transport(transfer.RoleGateway, layout, peers, logger.With("node", lf.name))
			if err != nil {
				return err
			}
			defer t.Close()
			rt, err := disagg.NewRouter(disagg.RouterConfig{Vocabulary: node.NewVocab(m, lim).Serving(o), Transport: t, Prefill: prefills, Decode: decodes,
				Dynamic: lf.etcd.enabled(), Logger: logger})
			if err != nil {
				return err
			}
			var lost <-chan struct{}
			var session *cluster.Session
			if lf.etcd.enabled() {
				// The router sends only to registered nodes: one that
				// leaves (its lease expired) is out of rotation at once.
				ms, err := lf.etcd.joinCluster(cmd, &lf, transfer.RoleGateway, t, tl, layout, 0, lim.SafetyMargin, func(v cluster.View) {
					rt.SetNodes(v.Peers(transfer.RolePrefill), holding(v, lim.SafetyMargin, logger))
				}, logger.With("node", lf.name))
				if err != nil {
					return err
				}
				defer ms.close()
				session = ms.session
				lost = session.Done()
				prefills, decodes = rt.Nodes()
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			routed := make(chan error, 1)
			go func() { routed <- rt.Run(ctx) }()
			srv, err := gateway.New(gateway.Config{Backend: rt, Tenants: tcfg, Logger: logger, MaxBodyBytes: maxBody, AuditRate: auditRate, AuditQueue: auditQueue, AuditTolerance: auditTolerance})
			if err != nil {
				return err
			}
			stop, err := serveMetrics(cmd, lf.metricsListen, srv.Metrics())
			if err != nil {
				return err
			}
			defer stop()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			ln = tf.wrap(ln)
			// Caught before the address is announced, so that whoever
			// waits for it may signal at once.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			announceKey(cmd, key)
			logger.Info("serving", "addr", ln.Addr().String(), "model", m.Name, "max_context", lim.MaxContext, "prefill", prefills, "decode", decodes)
			fmt.Fprintf(cmd.ErrOrStderr(), "listening on %s://%s\n", tf.scheme(), ln.Addr())
			srv.Start(ln)
			// A gateway whose lease etcd has not confirmed for 2/3 of its
			// TTL takes no new request (503 draining, /readyz 503) until
			// etcd does again: it may be cut off from the cluster, whose
			// view it routes by, and must not serve while the cluster
			// could already hold it gone.
			var staleTick <-chan time.Time
			if session != nil {
				t := time.NewTicker(staleCheckEvery)
				defer t.Stop()
				staleTick = t.C
			}
			var lostErr error
		wait:
			for {
				select {
				case <-hup:
					reloadTenants(srv, configPath, logger)
					continue
				case now := <-staleTick:
					if stale := session.Stale(now); stale != srv.Draining() {
						srv.SetDraining(stale)
						if stale {
							logger.Warn("etcd has not confirmed this gateway's lease for 2/3 of its TTL: refusing new requests until it does")
						} else {
							logger.Info("etcd confirmed the gateway's lease again: taking requests")
						}
					}
					continue
				case <-cmd.Context().Done():
				case err := <-routed:
					return fmt.Errorf("gateway: router stopped: %v", err)
				case <-lost:
					// Out of the cluster: stop taking requests, let those in
					// flight finish (drain-timeout), and exit with the loss.
					lostErr = fmt.Errorf("%w; stopped taking requests", session.Err())
				}
				break wait
			}
			sctx, scancel := context.WithTimeout(context.Background(), drain)
			defer scancel()
			if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return err
			}
			return lostErr
		},
	}
	nf.register(c)
	lf.register(c, transfer.RoleGateway)
	c.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address the API is served on")
	c.Flags().StringVar(&configPath, "config", "", "tenant configuration (YAML)")
	registerAPIKey(c, &apiKey)
	sf.register(c)
	tf.register(c, "api-")
	c.Flags().DurationVar(&drain, "drain-timeout", 30*time.Second, "how long shutdown waits for in-flight requests")
	c.Flags().Int64Var(&maxBody, "max-body-bytes", gateway.DefaultMaxBodyBytes, "largest request body accepted (413 beyond)")
	c.Flags().Float64Var(&auditRate, "audit-rate", defaultAuditRate,
		"fraction of successful answers generated again on fresh pages (as the reserved tenant _audit, at the lowest priority) and compared token for token; a difference counts pagewarden_audit_mismatches_total and logs an ERROR (0 turns it off)")
	c.Flags().IntVar(&auditQueue, "audit-queue", 64, "replays that may wait to run; beyond it they are dropped (counted in pagewarden_audit_replays_total{result=\"dropped\"})")
	c.Flags().Float64Var(&auditTolerance, "audit-tolerance", 0, "largest |difference| of a token's log-probability between an answer and its re-score that still matches; 0 compares exactly (set it only for nodes computing with other kernels)")
	return c
}
