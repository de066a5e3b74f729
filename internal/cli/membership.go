package cli

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/cluster"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// etcdFlags say whether and how a role joins a cluster whose membership
// lives in etcd (package cluster) instead of static --prefill/--decode
// lists.
type etcdFlags struct {
	endpoints        []string
	ca, cert, key    string
	prefix           string
	ttl, dialTimeout time.Duration
	advertise        string
	// drain bounds how long a node whose registration was lost lets the
	// work it holds end before it stops.
	drain time.Duration
}

func (f *etcdFlags) register(c *cobra.Command, role transfer.Role) {
	c.Flags().StringSliceVar(&f.endpoints, "etcd", nil, "etcd endpoints (comma-separated): register this node there and find the others through it, instead of --prefill/--decode")
	c.Flags().StringVar(&f.ca, "etcd-ca", "", "CA certificate (PEM) that etcd's server certificate chains to")
	c.Flags().StringVar(&f.cert, "etcd-cert", "", "client certificate (PEM) for etcd, if it requires one")
	c.Flags().StringVar(&f.key, "etcd-key", "", "client key (PEM) for etcd")
	c.Flags().StringVar(&f.prefix, "etcd-prefix", cluster.DefaultPrefix, "key prefix of this cluster in etcd")
	c.Flags().DurationVar(&f.ttl, "etcd-lease-ttl", cluster.DefaultTTL, "how long a node that stops renewing its registration stays listed (whole seconds)")
	c.Flags().DurationVar(&f.dialTimeout, "etcd-dial-timeout", 5*time.Second, "how long to wait for etcd at start-up")
	if role != transfer.RoleGateway {
		c.Flags().StringVar(&f.advertise, "advertise-addr", "", "link address registered in etcd for other nodes to dial (default: the --link-listen address)")
		c.Flags().DurationVar(&f.drain, "etcd-drain-timeout", 10*time.Second,
			"when this node loses its etcd registration it refuses new work at once, then waits this long at most for the work it holds to end (complete, or be aborted by the gateway), and exits")
	}
}

func (f *etcdFlags) enabled() bool { return len(f.endpoints) > 0 }

// check refuses --etcd together with static peer lists.
func (f *etcdFlags) check(lf *linkFlags) error {
	if !f.enabled() {
		if f.ca != "" || f.cert != "" || f.key != "" || f.advertise != "" {
			return usagef("--etcd-ca, --etcd-cert, --etcd-key and --advertise-addr need --etcd")
		}
		return nil
	}
	if len(lf.prefill) > 0 || len(lf.decode) > 0 {
		return usagef("--etcd and --prefill/--decode cannot be used together: with --etcd, nodes find each other through etcd")
	}
	if f.drain < 0 {
		return usagef("--etcd-drain-timeout %v: want 0 (stop at once) or more", f.drain)
	}
	cfg := f.config(nil)
	if err := cfg.Validate(); err != nil {
		return usagef("--etcd: %v", err)
	}
	return nil
}

func (f *etcdFlags) config(logger *slog.Logger) cluster.Config {
	return cluster.Config{
		Endpoints: f.endpoints, DialTimeout: f.dialTimeout, TTL: f.ttl, Prefix: f.prefix,
		TLS: cluster.TLSFiles{CA: f.ca, Cert: f.cert, Key: f.key}, Logger: logger,
	}
}

// advertised is the link address this node registers: --advertise-addr,
// or the address the transport listens on if other hosts can dial it.
func (f *etcdFlags) advertised(t *link.GRPC) (string, error) {
	if f.advertise != "" {
		if _, _, err := net.SplitHostPort(f.advertise); err != nil {
			return "", usagef("--advertise-addr %q: %v", f.advertise, err)
		}
		return f.advertise, nil
	}
	addr := t.Addr().String()
	host, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return "", usagef("--link-listen %s listens on every address: give --advertise-addr, the address other nodes dial", addr)
	}
	return addr, nil
}

// member is the registration of this node.
func member(name string, role transfer.Role, addr string, layout transfer.Layout, usablePages int, margin float64, tl *link.TLS) cluster.Member {
	h := transfer.NewHello(transfer.Peer(name), role, layout)
	m := cluster.Member{Name: transfer.Peer(name), Role: role, Addr: addr, LayoutHash: h.Hash, Limits: h.Limits,
		UsablePages: usablePages, SafetyMargin: margin, Started: time.Now()}
	if certs := tl.Client.Certificates; len(certs) > 0 && len(certs[0].Certificate) > 0 {
		m.CertSHA256 = sha256.Sum256(certs[0].Certificate[0])
	}
	return m
}

// membership is a role's view of the cluster through etcd: the client,
// the session of its registration and the watch that keeps its transport
// (and, on the gateway, its router) in step with the members.
type membership struct {
	client  *cluster.Client
	session *cluster.Session
	cancel  context.CancelFunc
	watched chan error
	// left, once set (onPeerLeft), is told of every other node that
	// leaves the cluster, on the watch's goroutine.
	left atomic.Pointer[func(transfer.Peer) int]
	// fence, once set (fenced), stands between the node's transport and
	// its driver; drain bounds how long a lost session waits on it.
	fence atomic.Pointer[fence]
	drain time.Duration
	log   *slog.Logger
}

// fenced returns the transport the node's driver must use: t behind a
// fence that refuses new work once this node's registration is lost
// (untilLost), and counts the work it holds so that the loss can drain
// it. Without --etcd (a nil membership) it is t.
func (ms *membership) fenced(t link.Transport) link.Transport {
	if ms == nil {
		return t
	}
	f := newFence(t, ms.log)
	ms.fence.Store(f)
	return f
}

// onPeerLeft has f told of every other node that leaves the cluster from
// now on: a decode node's driver (disagg.Decode.PeerLeft), which aborts
// the reservations the node took part in. A nil membership (no --etcd)
// tells nothing.
func (ms *membership) onPeerLeft(f func(transfer.Peer) int) {
	if ms != nil {
		ms.left.Store(&f)
	}
}

// follow starts watching the members: of the roles this node sends to,
// each that joins is dialled at its registered address, each that leaves
// is forgotten (its links end); every node that leaves is reported to
// the onPeerLeft function, if one is set. onView, if set, runs after the transport
// took each View. follow returns once the first View was taken, so that
// this node knows its peers before it registers and is sent work.
func (ms *membership) follow(t *link.GRPC, roles []transfer.Role, self string, onView func(cluster.View), logger *slog.Logger) error {
	ctx, cancel := context.WithCancel(context.Background())
	ms.cancel = cancel
	ms.watched = make(chan error, 1)
	first := make(chan struct{})
	seen := false
	go func() {
		ms.watched <- ms.client.Watch(ctx, func(v cluster.View) {
			for _, ch := range v.Changes {
				m := ch.Member
				if string(m.Name) == self {
					continue
				}
				if f := ms.left.Load(); f != nil && ch.Kind == cluster.Left {
					n := (*f)(m.Name)
					logger.Info("cluster member left", "member", m.String(), "revision", m.Revision, "reservations_aborted", n)
				}
				if !slices.Contains(roles, m.Role) {
					continue
				}
				switch ch.Kind {
				case cluster.Left:
					t.RemovePeer(m.Name)
				default:
					if err := t.SetPeer(m.Name, m.Addr); err != nil {
						logger.Warn("member with a bad address left out", "member", m.String(), "err", err)
					}
				}
				logger.Info("cluster member "+ch.Kind.String(), "member", m.String(), "addr", m.Addr, "revision", m.Revision)
			}
			if onView != nil {
				onView(v)
			}
			if !seen {
				seen = true
				close(first)
			}
		})
	}()
	select {
	case <-first:
		return nil
	case err := <-ms.watched:
		return fmt.Errorf("cluster: watch: %w", err)
	case <-time.After(ms.client.Config().DialTimeout):
		return fmt.Errorf("%w: no member list within %v", cluster.ErrUnavailable, ms.client.Config().DialTimeout)
	}
}

// close leaves the cluster (the registration is revoked, so the others
// stop sending work at once) and stops the watch.
func (ms *membership) close() {
	if ms.session != nil {
		_ = ms.session.Close()
	}
	if ms.cancel != nil {
		ms.cancel()
		<-ms.watched
	}
	ms.client.Close()
}

// holding returns the decode nodes of v whose KV pools hold the window
// with margin (cluster.Member.Holds), in v's order, and logs a warning
// for each that does not: the gateway sends no request to such a node.
// Register refuses those already (its capacity check); this is the
// gateway's own check of what it routes to, for a record registered
// without a margin or by an older node.
func holding(v cluster.View, margin float64, logger *slog.Logger) []transfer.Peer {
	var out []transfer.Peer
	for _, m := range v.Members {
		if m.Role != transfer.RoleDecode {
			continue
		}
		if !m.Holds(margin) {
			logger.Warn("decode node too small for the window with the safety margin; left out of rotation", "member", m.String(),
				"usable_kv_tokens", m.UsableTokens(), "max_context", m.Limits.MaxContext, "safety_margin", margin)
			continue
		}
		out = append(out, m.Name)
	}
	return out
}

// joinCluster connects to etcd and starts following the members: prefill
// (which sends pages to decode nodes) and the gateway (which sends to
// both) dial those they send to; a decode node dials nobody but learns
// who leaves (onPeerLeft), to abort their reservations. Then it
// registers this node. The returned
// membership's session ends if the registration is lost.
func (f *etcdFlags) joinCluster(cmd *cobra.Command, lf *linkFlags, role transfer.Role, t *link.GRPC, tl *link.TLS,
	layout transfer.Layout, usablePages int, margin float64, onView func(cluster.View), logger *slog.Logger,
) (*membership, error) {
	addr := ""
	if role != transfer.RoleGateway {
		var err error
		if addr, err = f.advertised(t); err != nil {
			return nil, err
		}
	}
	c, err := cluster.Dial(cmd.Context(), f.config(logger))
	if err != nil {
		return nil, err
	}
	ms := &membership{client: c, drain: f.drain, log: logger}
	var follows []transfer.Role
	switch role {
	case transfer.RoleGateway:
		follows = []transfer.Role{transfer.RolePrefill, transfer.RoleDecode}
	case transfer.RolePrefill:
		follows = []transfer.Role{transfer.RoleDecode}
	}
	if err := ms.follow(t, follows, lf.name, onView, logger); err != nil {
		ms.close()
		return nil, err
	}
	s, err := c.Register(cmd.Context(), member(lf.name, role, addr, layout, usablePages, margin, tl))
	if err != nil {
		ms.close()
		return nil, err
	}
	ms.session = s
	m := s.Member()
	logger.Info("registered in etcd", "etcd", strings.Join(f.endpoints, ","), "prefix", f.prefix, "addr", addr, "lease", fmt.Sprintf("%x", m.Lease), "revision", m.Revision)
	fmt.Fprintf(cmd.ErrOrStderr(), "%s %s registered in etcd (%s, lease %x, TTL %v)\n", role, lf.name, f.prefix, m.Lease, f.ttl)
	return ms, nil
}

// untilLost runs work with a context that ends when parent ends (after
// the node left the cluster, so that no new work is sent to it while it
// stops) or after its registration is lost.
//
// While etcd has not confirmed the registration for two thirds of its TTL
// (cluster.Session.Stale) the fence refuses new work, so that the node
// takes none it might not finish before its lease — for all the cluster
// knows — expires; once confirmed again it takes work again (the lease
// never lapsed). A lost registration drains the node rather than stopping
// it dead: the fence (fenced) refuses new work at once — the cluster holds the node
// gone, and a gateway that has not seen it go yet must not get new work
// started here — while the work it holds goes on until it ends (the
// gateway, having failed those requests when the lease expired, aborts
// them; what it has not failed completes), within --etcd-drain-timeout;
// then work's context ends, which aborts whatever is left, and untilLost
// returns the loss. The node exits rather than registering again: the
// cluster has already reclaimed what it held (its reservations, its
// handoffs, its requests), so only a new process, with a new
// registration and a new incarnation, may take work again; its
// supervisor restarts it. A second signal during the drain (parent ends)
// stops it at once.
func (ms *membership) untilLost(parent context.Context, work func(ctx context.Context) error) error {
	if ms == nil {
		return work(parent)
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	// dctx ends the drain early: a second signal, or work ended by itself.
	dctx, dcancel := context.WithCancel(parent)
	defer dcancel()
	drained := make(chan error, 1)
	go func() {
		// Before the loss: a registration etcd has not confirmed for a
		// while may be about to expire (Session.Stale), so new work is
		// refused until it is confirmed again.
		tick := time.NewTicker(max(ms.client.Config().TTL/20, 20*time.Millisecond))
		defer tick.Stop()
		stale := false
		for {
			select {
			case <-parent.Done():
				_ = ms.session.Close()
				stop()
				return
			case <-ms.session.Done():
				lost := fmt.Errorf("%w; stopped taking work", ms.session.Err())
				if f := ms.fence.Load(); f != nil {
					start := time.Now()
					f.close()
					ms.log.Warn("etcd registration lost: refusing new work, draining what this node holds", "holding", f.holding(), "drain_timeout", ms.drain)
					held := f.drain(dctx, ms.drain)
					took := time.Since(start)
					ms.log.Warn("drain ended", "still_holding", held, "took_ms", took.Milliseconds(), "refused", f.refused.Load())
					lost = errDrained(ms.session.Err(), held, took)
				}
				drained <- lost
				stop()
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				f := ms.fence.Load()
				if f == nil || ms.session.Stale(now) == stale {
					continue
				}
				stale = !stale
				f.closed.Store(stale)
				if stale {
					ms.log.Warn("etcd has not confirmed this node's registration for two thirds of its TTL: refusing new work", "last_confirmed", ms.session.Renewed())
				} else {
					ms.log.Info("etcd confirmed this node's registration again: taking work")
				}
			}
		}
	}()
	err := work(ctx)
	dcancel()
	if f := ms.fence.Load(); f != nil {
		f.detach()
	}
	if lost := ms.session.Err(); lost != nil {
		select {
		case d := <-drained:
			return d
		case <-time.After(time.Second): // parent ended first: no drain ran
			return fmt.Errorf("%w; stopped taking work", lost)
		}
	}
	return err
}
