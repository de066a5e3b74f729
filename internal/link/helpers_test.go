package link

import (
	"context"
	"crypto/sha256"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

const (
	gw  transfer.Peer = "gateway-1"
	pf  transfer.Peer = "prefill-1"
	dc  transfer.Peer = "decode-1"
	dc2 transfer.Peer = "decode-2"
)

func testLayout() transfer.Layout {
	return transfer.Layout{ModelDigest: sha256.Sum256([]byte("stories260K")), DType: kvcache.F16, PageSize: 16,
		Layers: 2, KVHeads: 2, HeadDim: 4, MaxContext: 1024, Protocol: transfer.ProtocolVersion}
}

func helloOf(name transfer.Peer, role transfer.Role) transfer.Hello {
	return transfer.NewHello(name, role, testLayout())
}

func roleOf(name transfer.Peer) transfer.Role {
	switch name[:len(name)-2] {
	case "gateway":
		return transfer.RoleGateway
	case "prefill":
		return transfer.RolePrefill
	}
	return transfer.RoleDecode
}

// cluster is a set of nodes on one transport kind ("inproc" or "grpc").
type cluster struct {
	t     testing.TB
	kind  string
	pki   *testPKI
	net   *Network
	nodes map[transfer.Peer]Transport
	addrs map[transfer.Peer]string
	lns   map[transfer.Peer]*trackingListener
	// pagesOverGRPC is GRPCConfig.PagesOverGRPC for the nodes added next.
	pagesOverGRPC bool
}

func newCluster(t testing.TB, kind string) *cluster {
	return &cluster{t: t, kind: kind, pki: newPKI(t), net: NewNetwork(),
		nodes: make(map[transfer.Peer]Transport), addrs: make(map[transfer.Peer]string),
		lns: make(map[transfer.Peer]*trackingListener)}
}

// listener reserves an address for a node that will listen, so that
// nodes added before it can list it as a peer.
func (c *cluster) listener(name transfer.Peer) {
	c.t.Helper()
	if c.kind != "grpc" {
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	c.lns[name] = &trackingListener{Listener: ln}
	c.addrs[name] = ln.Addr().String()
}

// add starts the node hello names, with its own certificate.
func (c *cluster) add(h transfer.Hello, opt Options) Transport {
	c.t.Helper()
	return c.addWith(h, opt, c.pki.tls(Identity{Name: h.Node, Role: h.Role}))
}

// addWith starts a node with a given TLS configuration (an impostor's).
func (c *cluster) addWith(h transfer.Hello, opt Options, tlsCfg *TLS) Transport {
	c.t.Helper()
	var (
		tr  Transport
		err error
	)
	switch c.kind {
	case "inproc":
		tr, err = c.net.Join(h, opt)
	case "grpc":
		peers := make(map[transfer.Peer]string)
		for n, a := range c.addrs {
			if n != h.Node {
				peers[n] = a
			}
		}
		var ln net.Listener
		if l := c.lns[h.Node]; l != nil {
			ln = l
		}
		tr, err = NewGRPC(GRPCConfig{Options: opt, TLS: tlsCfg, Hello: h, Peers: peers, PagesOverGRPC: c.pagesOverGRPC}, ln)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { tr.Close() })
	c.nodes[h.Node] = tr
	return tr
}

// standard starts a gateway (dial-only on gRPC), a prefill and a decode
// node, each with the same layout.
func (c *cluster) standard(opt Options) {
	c.listener(pf)
	c.listener(dc)
	c.add(helloOf(dc, transfer.RoleDecode), opt)
	c.add(helloOf(pf, transfer.RolePrefill), opt)
	c.add(helloOf(gw, transfer.RoleGateway), opt)
}

func stats(tr Transport) Stats {
	switch tr := tr.(type) {
	case *Inproc:
		return tr.Stats()
	case *GRPC:
		return tr.Stats()
	}
	panic("unknown transport")
}

// recv returns the next arrival at tr, failing the test after 10s.
func recv(t testing.TB, tr Transport) Inbound {
	t.Helper()
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	select {
	case in, ok := <-tr.Inbox():
		if !ok {
			t.Fatal("inbox closed")
		}
		return in
	case <-timer.C:
		t.Fatal("nothing arrived within 10s")
	}
	return Inbound{}
}

// down waits for a PeerDown at tr, failing on any message first.
func down(t testing.TB, tr Transport) Inbound {
	t.Helper()
	in := recv(t, tr)
	if in.Down == nil {
		t.Fatalf("got %v from %v, want a PeerDown", in.Msg.Type(), in.From)
	}
	if !errors.Is(in.Down, ErrPeerDown) {
		t.Fatalf("PeerDown error %v does not wrap ErrPeerDown", in.Down)
	}
	return in
}

// linksGone waits (at most 10s) until tr holds no link, reading the
// PeerDowns of those that end meanwhile (a link's reader reports its end
// on the inbox, so an unread inbox would hold it up). After the first
// PeerDown from a node, others may still be on their way: each side's
// dialled link is a link of its own.
func linksGone(t testing.TB, tr Transport) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for stats(tr).Links > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d links still up after 10s", stats(tr).Links)
		}
		select {
		case in := <-tr.Inbox():
			if in.Down == nil {
				t.Fatalf("got %v from %v while waiting for links to end", in.Msg.Type(), in.From)
			}
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// quiet checks that nothing is waiting in tr's inbox.
func quiet(t testing.TB, tr Transport) {
	t.Helper()
	select {
	case in := <-tr.Inbox():
		t.Fatalf("unexpected arrival %+v", in)
	default:
	}
}

func send(t testing.TB, tr Transport, to transfer.Peer, m transfer.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tr.Send(ctx, to, m); err != nil {
		t.Fatalf("send %v to %s: %v", m.Type(), to, err)
	}
}

// trackingListener remembers accepted connections so that a test can cut
// them as a crashed host or a broken network would.
type trackingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

func (l *trackingListener) cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		c.Close()
	}
	l.conns = nil
}
