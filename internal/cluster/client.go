package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Errors of the package.
var (
	ErrConfig         = errors.New("cluster: bad configuration")
	ErrUnavailable    = errors.New("cluster: etcd unavailable")
	ErrNameTaken      = errors.New("cluster: node name taken by a live node")
	ErrConfigMismatch = errors.New("cluster: configuration differs from the cluster's")
	ErrSessionLost    = errors.New("cluster: membership session lost")
	ErrRecord         = errors.New("cluster: bad member record")
)

// DefaultPrefix is where membership lives when Config.Prefix is empty.
const DefaultPrefix = "/pagewarden"

// DefaultTTL is the lease TTL when Config.TTL is zero: how long a node
// that stopped keeping its lease alive stays listed.
const DefaultTTL = 10 * time.Second

// Config says how to reach etcd. Endpoints is required; the zero value of
// every other field means its default.
type Config struct {
	// Endpoints are etcd's client URLs (http://host:port, https://host:port
	// or host:port).
	Endpoints []string
	// DialTimeout bounds the first contact with etcd and each request of
	// Register (default 5s).
	DialTimeout time.Duration
	// TTL is the lease's time to live, in whole seconds (default
	// DefaultTTL; etcd may raise a very short one to its minimum).
	TTL time.Duration
	// Prefix is the key prefix of this cluster (default DefaultPrefix):
	// clusters that share an etcd use different prefixes.
	Prefix string
	// TLS, when any file is set, is used for etcd: the CA that signs
	// etcd's server certificate, and this node's client certificate and
	// key if etcd requires them (both or neither).
	TLS TLSFiles
	// Logger receives what the package does on its own (a re-listed
	// watch, a lost session); nil discards.
	Logger *slog.Logger
}

// TLSFiles are PEM files for etcd's TLS.
type TLSFiles struct {
	CA, Cert, Key string
}

func (f TLSFiles) empty() bool { return f.CA == "" && f.Cert == "" && f.Key == "" }

// Validate reports whether c can be used, and fills in the defaults.
func (c *Config) Validate() error {
	if len(c.Endpoints) == 0 {
		return fmt.Errorf("%w: no etcd endpoint", ErrConfig)
	}
	for _, e := range c.Endpoints {
		if strings.TrimSpace(e) == "" {
			return fmt.Errorf("%w: empty etcd endpoint", ErrConfig)
		}
	}
	if (c.TLS.Cert == "") != (c.TLS.Key == "") {
		return fmt.Errorf("%w: an etcd client certificate needs its key, and a key its certificate", ErrConfig)
	}
	if c.DialTimeout < 0 || c.TTL < 0 {
		return fmt.Errorf("%w: negative timeout", ErrConfig)
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = 5 * time.Second
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.TTL < time.Second || c.TTL%time.Second != 0 {
		return fmt.Errorf("%w: lease TTL %v: want whole seconds, at least 1s", ErrConfig, c.TTL)
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	c.Prefix = strings.TrimRight(c.Prefix, "/")
	if c.Prefix == "" {
		return fmt.Errorf("%w: prefix %q", ErrConfig, "/")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Client is a connection to the etcd that holds a cluster's membership.
type Client struct {
	etcd *clientv3.Client
	cfg  Config
	log  *slog.Logger
}

// Dial connects to etcd and checks, within DialTimeout, that it answers.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	ec := clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: cfg.DialTimeout,
		// No gRPC keepalive: a lost connection shows as a keep-alive
		// that gets no answer for a TTL (the Session ends), and etcd
		// refuses pings more often than every 5s.
		// The package logs what matters through Config.Logger.
		Logger: zap.NewNop(),
	}
	if !cfg.TLS.empty() {
		tc, err := transport.TLSInfo{TrustedCAFile: cfg.TLS.CA, CertFile: cfg.TLS.Cert, KeyFile: cfg.TLS.Key}.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("%w: etcd TLS: %v", ErrConfig, err)
		}
		ec.TLS = tc
	}
	cli, err := clientv3.New(ec)
	if err != nil {
		return nil, fmt.Errorf("%w: %v: %v", ErrUnavailable, cfg.Endpoints, err)
	}
	c := &Client{etcd: cli, cfg: cfg, log: cfg.Logger}
	pctx, cancel := context.WithTimeout(ctx, cfg.DialTimeout)
	defer cancel()
	if _, err := cli.Get(pctx, c.nodesPrefix(), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
		cli.Close()
		return nil, fmt.Errorf("%w: %v did not answer within %v: %v", ErrUnavailable, cfg.Endpoints, cfg.DialTimeout, err)
	}
	return c, nil
}

// Close ends the connection; sessions on it end too (their nodes leave
// the set when their leases expire, or at once if Session.Close ran).
func (c *Client) Close() error { return c.etcd.Close() }

// Config is the client's configuration, defaults filled in.
func (c *Client) Config() Config { return c.cfg }

// nodesPrefix is the prefix every member key starts with.
func (c *Client) nodesPrefix() string { return c.cfg.Prefix + "/nodes/" }

// Members lists the registered nodes, sorted by role then name, and the
// etcd revision the list is as of. Records that cannot be read are left
// out and returned as bad.
func (c *Client) Members(ctx context.Context) (members []Member, rev int64, bad []error, err error) {
	resp, err := c.etcd.Get(ctx, c.nodesPrefix(), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, nil, fmt.Errorf("%w: listing members: %v", ErrUnavailable, err)
	}
	for _, kv := range resp.Kvs {
		m, err := c.decode(kv.Key, kv.Value, kv.Lease, kv.CreateRevision)
		if err != nil {
			bad = append(bad, err)
			continue
		}
		members = append(members, m)
	}
	sortMembers(members)
	return members, resp.Header.Revision, bad, nil
}
