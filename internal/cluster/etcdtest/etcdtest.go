// Package etcdtest runs a real etcd server inside a test process
// (go.etcd.io/etcd/server/v3/embed): one member on 127.0.0.1 (or a host
// it is given), random ports, its data in the test's temporary directory,
// stopped by the test's cleanup. It also offers a TCP proxy in front of it that a test
// can cut, as a network partition between one node and etcd would.
//
// Only tests import it: a binary that does not gets no etcd server.
package etcdtest

import (
	"io"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// TLS makes the server serve clients over TLS with these PEM files;
// ClientCA set also requires a client certificate that chains to it.
type TLS struct {
	Cert, Key, ClientCA string
}

// Options configure a server; the zero value is a plain one.
type Options struct {
	TLS *TLS
	// Host is the address it listens on (default 127.0.0.1): another one
	// lets processes in other network namespaces reach it.
	Host string
}

// Server is a running etcd.
type Server struct {
	// Endpoint is the client URL (http:// or https://127.0.0.1:PORT).
	Endpoint string
	etcd     *embed.Etcd
}

// Start starts an etcd server for t. Its raft ticks are short (10ms), so
// that leases as short as 1s are honoured (etcd's minimum TTL is 1.5
// election timeouts) and it is ready at once.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	dir := t.TempDir()
	cfg := embed.NewConfig()
	cfg.Name = "etcdtest"
	cfg.Dir = filepath.Join(dir, "data")
	cfg.LogOutputs = []string{filepath.Join(dir, "etcd.log")}
	cfg.LogLevel = "warn"
	cfg.TickMs, cfg.ElectionMs = 10, 100
	scheme := "http"
	if o.TLS != nil {
		scheme = "https"
		cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = o.TLS.Cert, o.TLS.Key
		if o.TLS.ClientCA != "" {
			cfg.ClientTLSInfo.TrustedCAFile, cfg.ClientTLSInfo.ClientCertAuth = o.TLS.ClientCA, true
		}
	}
	host := o.Host
	if host == "" {
		host = "127.0.0.1"
	}
	client := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, "0")}
	peer := url.URL{Scheme: "http", Host: net.JoinHostPort(host, "0")}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		t.Fatalf("etcdtest: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("etcdtest: etcd not ready within 30s")
	}
	return &Server{Endpoint: scheme + "://" + e.Clients[0].Addr().String(), etcd: e}
}

// Addr is the server's client address (host:port).
func (s *Server) Addr() string { return s.etcd.Clients[0].Addr().String() }

// Proxy forwards TCP connections to an etcd server until Cut.
type Proxy struct {
	// Endpoint is the proxy's client URL, in the server's scheme.
	Endpoint string
	ln       net.Listener
	target   string
	mu       sync.Mutex
	conns    []net.Conn
	cut      bool
	wg       sync.WaitGroup
}

// NewProxy starts a proxy in front of s, closed by t's cleanup.
func (s *Server) NewProxy(t testing.TB) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(s.Endpoint)
	p := &Proxy{Endpoint: u.Scheme + "://" + ln.Addr().String(), ln: ln, target: s.Addr()}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		p.Cut()
		p.wg.Wait()
	})
	return p
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, up)
		p.wg.Add(2)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		go pipe(up, c)
		go pipe(c, up)
	}
}

// Cut ends every connection through the proxy and refuses new ones: for
// whoever uses it, etcd is gone.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut {
		return
	}
	p.cut = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.ln.Close()
}
