package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
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
	log             logFlags // --log-level, --log-format (common.go)
}

func (f *linkFlags) register(c *cobra.Command, role transfer.Role) {
	c.Flags().StringVar(&f.name, "name", "", "this node's name; must be the one its certificate names (pagewarden certs)")
	if role != transfer.RoleGateway {
		c.Flags().StringVar(&f.listen, "link-listen", "127.0.0.1:0", "address other nodes reach this one on (gRPC over mutual TLS)")
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

// runNodeRole starts a node for a prefill or decode role and runs the
// driver run builds until the command's context ends.
func runNodeRole(cmd *cobra.Command, nf *nodeFlags, lf *linkFlags, role transfer.Role,
	run func(ctx context.Context, n *node.Node, t link.Transport, ms *membership, logger *slog.Logger) error,
) error {
	o, err := nf.options()
	if err != nil {
		return err
	}
	if err := lf.etcd.check(lf); err != nil {
		return err
	}
	peers := map[transfer.Peer]string{}
	if _, err := parsePeers("decode", lf.decode, peers); err != nil {
		return err
	}
	if role == transfer.RolePrefill && len(peers) == 0 && !lf.etcd.enabled() {
		return usagef("--decode (or --etcd) is required: the decode nodes this prefill node sends pages to")
	}
	logger := lf.log.logger(cmd.ErrOrStderr()).With("node", lf.name, "role", role.String())
	invariants.SetStrict(false)
	o.Logger = logger
	m, err := nf.load()
	if err != nil {
		return err
	}
	n, err := node.Start(m, o)
	if err != nil {
		m.Close()
		return err
	}
	defer n.Close()
	if lf.listen == "" {
		return usagef("--link-listen is required: the address other nodes reach this one on")
	}
	t, tl, err := lf.transport(role, n.HandoffLayout(), peers, logger)
	if err != nil {
		return err
	}
	defer t.Close()
	reg := prometheus.NewRegistry()
	if err := reg.Register(n.Collector()); err != nil {
		return err
	}
	for _, c := range append(gateway.PoolCollectors(n), gateway.ProcessCollectors()...) {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	stop, err := serveMetrics(cmd, lf.metricsListen, reg)
	if err != nil {
		return err
	}
	defer stop()
	lim := n.SchedLimits()
	var ms *membership
	if lf.etcd.enabled() {
		if ms, err = lf.etcd.joinCluster(cmd, lf, role, t, tl, n.HandoffLayout(), lim.UsablePages, lim.SafetyMargin, nil, logger); err != nil {
			return err
		}
		defer ms.close()
	}
	logger.Info("serving", "link", t.Addr().String(), "model", m.Name, "max_context", lim.MaxContext, "kv_pages", lim.UsablePages, "page_size", lim.PageSize)
	fmt.Fprintf(cmd.ErrOrStderr(), "%s %s linked on %s\n", role, lf.name, t.Addr())
	// With etcd, a lost registration stops the driver (every request it
	// holds ends; the gateway failed them already when the lease
	// expired) and the role exits with the loss as its error.
	return ms.untilLost(cmd.Context(), func(ctx context.Context) error { return run(ctx, n, t, ms, logger) })
}

func prefillCmd() *cobra.Command {
	var nf nodeFlags
	var lf linkFlags
	c := &cobra.Command{
		Use:   "prefill",
		Short: "Run a prefill node: compute prompts and hand their KV pages to decode nodes",
		Long: `Run a prefill node. The gateway sends it prompts (with a decode node's
reservation); it computes each prompt's KV cache and streams the pages, a
manifest and a commit to that decode node over gRPC with mutual TLS. Its
certificate must name it (--name) with the role prefill.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runNodeRole(cmd, &nf, &lf, transfer.RolePrefill, func(ctx context.Context, n *node.Node, t link.Transport, _ *membership, logger *slog.Logger) error {
				d, err := disagg.NewPrefill(disagg.PrefillConfig{Sched: n.Sched(), Layout: n.HandoffLayout(), Transport: t, Logger: logger, Load: disagg.LoadOf(n)})
				if err != nil {
					return err
				}
				return d.Run(ctx)
			})
		},
	}
	nf.register(c)
	lf.register(c, transfer.RolePrefill)
	return c
}

func decodeCmd() *cobra.Command {
	var nf nodeFlags
	var lf linkFlags
	c := &cobra.Command{
		Use:   "decode",
		Short: "Run a decode node: reserve pages, take handoffs from prefill nodes, generate",
		Long: `Run a decode node. The gateway asks it to reserve KV pages for a request;
the prefill node the gateway names sends the prompt's pages, and the request
is decoded only if they match the reservation exactly. Tokens stream back to
the gateway. Its certificate must name it (--name) with the role decode.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runNodeRole(cmd, &nf, &lf, transfer.RoleDecode, func(ctx context.Context, n *node.Node, t link.Transport, ms *membership, logger *slog.Logger) error {
				d, err := disagg.NewDecode(disagg.DecodeConfig{Sched: n.Sched(), Layout: n.HandoffLayout(), Transport: t, Logger: logger, Load: disagg.LoadOf(n)})
				if err != nil {
					return err
				}
				// With --etcd, a prefill node or gateway that leaves the
				// cluster takes its reservations here with it, at once.
				ms.onPeerLeft(d.PeerLeft)
				return d.Run(ctx)
			})
		},
	}
	nf.register(c)
	lf.register(c, transfer.RoleDecode)
	return c
}

func gatewayCmd() *cobra.Command {
	var nf nodeFlags
	var lf linkFlags
	var listen, configPath string
	var drain time.Duration
	var maxBody int64
	var apiKey string // --api-key (common.go)
	var sf servedFlags
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
			srv, err := gateway.New(gateway.Config{Backend: rt, Tenants: tcfg, Logger: logger, MaxBodyBytes: maxBody})
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
			// Caught before the address is announced, so that whoever
			// waits for it may signal at once.
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			announceKey(cmd, key)
			logger.Info("serving", "addr", ln.Addr().String(), "model", m.Name, "max_context", lim.MaxContext, "prefill", prefills, "decode", decodes)
			fmt.Fprintf(cmd.ErrOrStderr(), "listening on http://%s\n", ln.Addr())
			srv.Start(ln)
			var lostErr error
		wait:
			for {
				select {
				case <-hup:
					reloadTenants(srv, configPath, logger)
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
	c.Flags().DurationVar(&drain, "drain-timeout", 30*time.Second, "how long shutdown waits for in-flight requests")
	c.Flags().Int64Var(&maxBody, "max-body-bytes", gateway.DefaultMaxBodyBytes, "largest request body accepted (413 beyond)")
	return c
}
