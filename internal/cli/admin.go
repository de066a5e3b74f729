package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	neturl "net/url"
	"os"
	"strings"
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
	// reload, set by serve, is the admin API's reload: SIGHUP's.
	reload func(ctx context.Context) ([]string, error)
	// drain and draining, set by serve, are the admin API's drain: the
	// gateway's SetDraining and Draining.
	drain    func(on bool) bool
	draining func() bool
	srv      *admin.Server // once started
}

// reloadKeys gives the admin listener the admin keys of a reloaded tenant
// config (and --admin-key's, which stays), so that a SIGHUP changes who may
// open it as it changes the tenants.
func (f *adminFlags) reloadKeys(cfg *tenants.Config, logger *slog.Logger) {
	if f.srv == nil || cfg == nil {
		return
	}
	keys := cfg.AdminKeys()
	if f.key != "" {
		keys = append(keys, sha256.Sum256([]byte(f.key)))
	}
	if err := f.srv.SetKeys(keys); err != nil {
		logger.Warn("the reloaded config names no admin key; the admin listener keeps the old ones", "err", err, admin.AuditKey, true)
		return
	}
	logger.Info("admin keys reloaded", "keys", len(keys), admin.AuditKey, true)
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
	case disagg.NodeSet:
		var out []admin.Pool
		for i, n := range b.Nodes {
			out = append(out, admin.Pool{Name: b.Names[i], Map: n.PageMap})
		}
		return out
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

// start serves the admin listener for backend (a *node.Node, a
// *disagg.Local or a disagg.NodeSet), if --admin-listen was given. Its
// keys are the config's admin_key_sha256 and --admin-key; tenant keys
// (reg) are refused with 403. The node roles have no tenants: cfg and reg
// are nil there, and name is their node's.
// Behind tlsCfg when the API is: the browser sends the admin key with
// every request. The returned stop closes it.
func (f *adminFlags) start(cmd *cobra.Command, cfg *tenants.Config, reg *tenants.Registry, backend any, tlsCfg *tls.Config, logger *slog.Logger) (stop func(), err error) {
	return f.startNamed(cmd, cfg, reg, backend, "node", tlsCfg, logger)
}

// startRole is start for the prefill and decode roles: their nodes, by
// name, and no tenants (only --admin-key opens the listener).
func (f *adminFlags) startRole(cmd *cobra.Command, set disagg.NodeSet, logger *slog.Logger) (stop func(), err error) {
	return f.startNamed(cmd, nil, nil, set, "", nil, logger)
}

func (f *adminFlags) startNamed(cmd *cobra.Command, cfg *tenants.Config, reg *tenants.Registry, backend any, name string, tlsCfg *tls.Config, logger *slog.Logger) (stop func(), err error) {
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
	isTenantKey := func(k string) bool {
		if reg == nil {
			return false
		}
		_, err := reg.Authenticate(k)
		return err == nil
	}
	if f.key != "" {
		if isTenantKey(f.key) {
			return nil, usagef("--admin-key is a tenant's API key: the admin key must be a key of its own (pagewarden keygen)")
		}
		keys = append(keys, sha256.Sum256([]byte(f.key)))
	}
	if len(keys) == 0 {
		return nil, usagef("--admin-listen needs an admin key: admin_key_sha256 in --config, or --admin-key (PAGEWARDEN_ADMIN_KEY)")
	}
	pools := adminPools(backend, name)
	if len(pools) == 0 {
		return nil, fmt.Errorf("admin: nothing to show for a %T", backend)
	}
	acfg := admin.Config{
		Pools: pools, KeySHA256: keys, Events: f.ring, Logger: logger,
		IsTenantKey: isTenantKey,
	}
	if sc, ok := backend.(quarantineScrubber); ok {
		acfg.Scrub = sc.ScrubQuarantined
	}
	if reg != nil {
		acfg.Tenants = reg.Tenants
	}
	acfg.Reload = f.reload
	acfg.Drain, acfg.Draining = f.drain, f.draining
	srv, err := admin.New(acfg)
	if err != nil {
		return nil, err
	}
	f.srv = srv
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

func init() { extraCommands = append(extraCommands, adminCmd) }

// adminCmd is `pagewarden admin`, the client of the admin listener.
func adminCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "admin",
		Short: "Ask a running server's admin listener for its page map, tenants and audit events, or scrub its quarantine",
		Long: `Call the admin API of a server started with --admin-listen and print its
JSON answer. The key is an admin key (admin_key_sha256 in the tenant config,
or the server's --admin-key), never a tenant key; pass it as --admin-key or
PAGEWARDEN_ADMIN_KEY.`,
	}
	for _, sc := range []struct{ use, short, method, path string }{
		{"pages", "every node's KV pages that are not free: state, tenant, request, sequence, epoch", "GET", "/admin/api/pages"},
		{"tenants", "each tenant's pages, queued and running requests, and the must-be-zero counters", "GET", "/admin/api/tenants"},
		{"events", "the recent isolation and audit events", "GET", "/admin/api/events"},
		{"scrub", "scrub and free every quarantined KV page (as SIGUSR1 does) and print how many", "POST", "/admin/api/scrub"},
		{"config", "the tenant configuration in force: ids, limits, how many keys (never the hashes)", "GET", "/admin/api/config"},
		{"reload", "read the tenant config file again (as SIGHUP does) and print what changed", "POST", "/admin/api/reload"},
		{"drain", "stop taking new requests (503, /readyz 503) while running ones finish; undrain takes them again", "POST", "/admin/api/drain"},
		{"undrain", "take new requests again after a drain", "POST", "/admin/api/undrain"},
	} {
		var url, key, ca, state string
		sub := &cobra.Command{
			Use:   sc.use,
			Short: sc.short,
			Args:  cobra.NoArgs,
			RunE: func(cmd *cobra.Command, _ []string) error {
				if key == "" {
					return usagef("--admin-key (or PAGEWARDEN_ADMIN_KEY) is required")
				}
				client := &http.Client{Timeout: 30 * time.Second}
				if ca != "" {
					pem, err := os.ReadFile(ca)
					if err != nil {
						return usagef("--ca %s: %v", ca, err)
					}
					pool := x509.NewCertPool()
					if !pool.AppendCertsFromPEM(pem) {
						return usagef("--ca %s: no PEM certificate in it", ca)
					}
					client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
				}
				path := sc.path
				if state != "" {
					path += "?state=" + neturl.QueryEscape(state)
				}
				req, err := http.NewRequestWithContext(cmd.Context(), sc.method, strings.TrimSuffix(url, "/")+path, nil)
				if err != nil {
					return usagef("--url %q: %v", url, err)
				}
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
				if err != nil {
					return err
				}
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("admin %s: %s: %s", sc.use, resp.Status, strings.TrimSpace(string(body)))
				}
				var out bytes.Buffer
				if err := json.Indent(&out, body, "", "  "); err != nil {
					return fmt.Errorf("admin %s: the answer is not JSON: %v", sc.use, err)
				}
				_, err = cmd.OutOrStdout().Write(out.Bytes())
				return err
			},
		}
		sub.Flags().StringVar(&url, "url", "http://127.0.0.1:9465", "the admin listener's base URL (the server's --admin-listen)")
		sub.Flags().StringVar(&key, "admin-key", "", "an admin key (PAGEWARDEN_ADMIN_KEY)")
		sub.Flags().StringVar(&ca, "ca", "", "CA certificate (PEM) to trust for an https --url (default: the system's)")
		if sc.use == "pages" {
			sub.Flags().StringVar(&state, "state", "", "only pages in these states, comma-separated: owned, shared, cached, transfer, quarantined (the quarantine list: --state quarantined)")
		}
		c.AddCommand(sub)
	}
	return c
}
