package cli

import (
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/admin"
	"github.com/pagewarden/pagewarden/internal/disagg"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/node"
)

// adminFlags are the admin listener's: where it listens (off unless
// given) and the key that opens it besides the config's admin_key_sha256.
// The ring collects the nodes' audit lines from the start, so the page
// shows what happened before anyone opened it.
type adminFlags struct {
	listen string
	key    string
	ring   *admin.Ring
}

func (f *adminFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.listen, "admin-listen", "",
		"address of the admin listener: the live KV page map (/admin/) and its JSON API, opened only by an admin key (empty: off)")
	c.Flags().StringVar(&f.key, "admin-key", "",
		"a key that opens the admin listener, besides the config's admin_key_sha256 (never a tenant key); prefer PAGEWARDEN_ADMIN_KEY to keep it out of ps")
}

// audit returns the logger the nodes write their audit trail to: with the
// admin listener on, its WARN and ERROR records also go to the admin
// page's event ring (admin.Ring.Handler). A handler wrapper rather than an
// event sink in each package: every audit line the scheduler and the
// handoff drivers already write reaches the page without a second call
// beside each one that could be forgotten, and the log and the page cannot
// disagree. Only the nodes' logger is wrapped, not the gateway's, whose
// per-request WARN lines (overload, drain) are traffic, not audit.
func (f *adminFlags) audit(logger *slog.Logger) *slog.Logger {
	if f.listen == "" {
		return logger
	}
	if f.ring == nil {
		f.ring = admin.NewRing(admin.DefaultRing)
	}
	return slog.New(f.ring.Handler(logger.Handler(), slog.LevelWarn))
}

// adminPools names the pools of what serves: one node ("node"), or every
// node of a cluster in one process ("prefill-0", "decode-0", ...).
func adminPools(backend any, name string) []admin.Pool {
	switch b := backend.(type) {
	case *node.Node:
		return []admin.Pool{{Name: name, Map: b.PageMap}}
	case *disagg.Local:
		var out []admin.Pool
		for i, n := range b.Prefills {
			out = append(out, admin.Pool{Name: fmt.Sprintf("prefill-%d", i), Map: n.PageMap})
		}
		for i, n := range b.Decodes {
			out = append(out, admin.Pool{Name: fmt.Sprintf("decode-%d", i), Map: n.PageMap})
		}
		return out
	}
	return nil
}

// start serves the admin listener for backend (a *node.Node or a
// *disagg.Local), if --admin-listen was given. Its keys are the config's
// admin_key_sha256 and --admin-key; tenant keys (reg) are refused with 403.
// Behind tlsCfg when the API is: the browser sends the admin key with
// every request. The returned stop closes it.
func (f *adminFlags) start(cmd *cobra.Command, cfg *tenants.Config, reg *tenants.Registry, backend any, tlsCfg *tls.Config, logger *slog.Logger) (stop func(), err error) {
	if f.listen == "" {
		if f.key != "" {
			return nil, usagef("--admin-key without --admin-listen: the key opens nothing")
		}
		return func() {}, nil
	}
	var keys [][32]byte
	if cfg != nil {
		keys = cfg.AdminKeys()
	}
	if f.key != "" {
		if _, err := reg.Authenticate(f.key); err == nil {
			return nil, usagef("--admin-key is a tenant's API key: the admin key must be a key of its own (pagewarden keygen)")
		}
		keys = append(keys, sha256.Sum256([]byte(f.key)))
	}
	if len(keys) == 0 {
		return nil, usagef("--admin-listen needs an admin key: admin_key_sha256 in --config, or --admin-key (PAGEWARDEN_ADMIN_KEY)")
	}
	pools := adminPools(backend, "node")
	if len(pools) == 0 {
		return nil, fmt.Errorf("admin: nothing to show for a %T", backend)
	}
	srv, err := admin.New(admin.Config{
		Pools: pools, KeySHA256: keys, Events: f.ring, Logger: logger,
		IsTenantKey: func(k string) bool { _, err := reg.Authenticate(k); return err == nil },
	})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return nil, fmt.Errorf("--admin-listen %s: %w", f.listen, err)
	}
	scheme := "http"
	if tlsCfg != nil {
		ln, scheme = tls.NewListener(ln, tlsCfg), "https"
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(ln)
	fmt.Fprintf(cmd.ErrOrStderr(), "admin on %s://%s/admin/\n", scheme, ln.Addr())
	return func() { hs.Close() }, nil
}
