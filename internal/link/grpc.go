package link

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/pagewarden/pagewarden/internal/link/linkpb"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// GRPCConfig configures a GRPC transport.
type GRPCConfig struct {
	Options
	// TLS is the node's mutual-TLS configuration (LoadTLS). Required.
	TLS *TLS
	// Hello is this node's handshake; its Node and Role must be those its
	// certificate names.
	Hello transfer.Hello
	// Peers maps the nodes this one dials to their addresses (host:port).
	// A node not listed can still reach this one, and is answered on the
	// link it opened. NewGRPC copies it; SetPeer and RemovePeer change the
	// copy at run time (cluster membership).
	Peers map[transfer.Peer]string
	// Keepalive is how often an idle connection is pinged, and how long a
	// ping may go unanswered before the connection (and its links) is
	// declared dead (default 15s); page streams use TCP keepalive at the
	// same period.
	Keepalive time.Duration
	// PagesOverGRPC sends Page frames on the gRPC stream like every other
	// message, instead of on a dedicated TLS page stream (the default; see
	// pagestream.go). For comparison in BenchmarkPages.
	PagesOverGRPC bool
}

// GRPC is the network transport: gRPC's Link.Exchange streams over mutual
// TLS 1.3, one stream per link, each message one linkpb.Frame holding one
// transfer frame; and Page frames on page streams, dedicated TLS
// connections on the same port (pagestream.go), with the same
// authentication, Hello, codec and policy.
type GRPC struct {
	*node
	cfg GRPCConfig
	srv *grpc.Server
	ln  net.Listener
	h2  *h2Listener

	// ccMu guards the address table and the connections dialled from it:
	// a connection is always to the address the table holds now.
	ccMu    sync.Mutex
	peers   map[transfer.Peer]string
	ccs     map[transfer.Peer]*grpc.ClientConn
	ccsDone bool
}

var _ Transport = (*GRPC)(nil)

// maxMessage bounds a linkpb.Frame on the wire: the largest transfer frame
// plus the protobuf field's tag and length.
const maxMessage = transfer.HeaderSize + transfer.MaxFrameBody + transfer.TrailerSize + 16

// NewGRPC returns a GRPC transport that serves links on ln, which Close
// closes (nil: this node only dials, like a gateway that listens for
// nobody).
func NewGRPC(cfg GRPCConfig, ln net.Listener) (*GRPC, error) {
	if cfg.TLS == nil || cfg.TLS.Server == nil || cfg.TLS.Client == nil {
		return nil, fmt.Errorf("%w: no TLS configuration", ErrPKI)
	}
	if self := (Identity{Name: cfg.Hello.Node, Role: cfg.Hello.Role}); self != cfg.TLS.Self {
		return nil, fmt.Errorf("%w: hello says %v, this node's certificate says %v", ErrAuth, self, cfg.TLS.Self)
	}
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = 15 * time.Second
	}
	g := &GRPC{cfg: cfg, ln: ln, peers: maps.Clone(cfg.Peers), ccs: make(map[transfer.Peer]*grpc.ClientConn)}
	if g.peers == nil {
		g.peers = make(map[transfer.Peer]string)
	}
	g.cfg.Peers = nil // the table is g.peers, under ccMu
	n, err := newNode(cfg.Hello, cfg.Options, g.dial)
	if err != nil {
		return nil, err
	}
	n.pageStreams = !cfg.PagesOverGRPC
	g.node = n
	if ln == nil {
		return g, nil
	}
	// The transport does the TLS handshake itself, to route by ALPN;
	// gRPC gets the h2 connections with their TLS state.
	serverTLS := cfg.TLS.Server.Clone()
	serverTLS.NextProtos = []string{alpnH2, alpnPages}
	g.h2 = newH2Listener(ln.Addr())
	g.srv = grpc.NewServer(
		grpc.Creds(handshaken{}),
		grpc.MaxRecvMsgSize(maxMessage),
		grpc.MaxSendMsgSize(maxMessage),
		grpc.MaxConcurrentStreams(uint32(n.opt.MaxLinksPerPeer)),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: cfg.Keepalive, Timeout: cfg.Keepalive}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: cfg.Keepalive / 2, PermitWithoutStream: true}),
		grpc.InitialWindowSize(windowSize),
		grpc.InitialConnWindowSize(connWindowSize),
		grpc.ForceServerCodecV2(frameCodec{}),
	)
	linkpb.RegisterLinkServer(g.srv, linkServer{g: g})
	g.wg.Go(func() { _ = g.srv.Serve(g.h2) })
	g.wg.Go(func() { g.acceptLoop(serverTLS) })
	return g, nil
}

// acceptLoop accepts connections until the listener closes and
// handshakes each in a goroutine of its own.
func (g *GRPC) acceptLoop(serverTLS *tls.Config) {
	backoff := 5 * time.Millisecond
	for {
		c, err := g.ln.Accept()
		if err != nil {
			if g.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			g.opt.Logger.Warn("link: accept", "err", err)
			select {
			case <-time.After(backoff):
				backoff = min(2*backoff, time.Second)
				continue
			case <-g.ctx.Done():
				return
			}
		}
		backoff = 5 * time.Millisecond
		// This goroutine is counted in wg, so Add cannot race with Wait.
		g.wg.Go(func() { g.serveConn(c, serverTLS) })
	}
}

// serveConn does the TLS handshake (mutual, TLS 1.3, bounded by
// HandshakeTimeout) and hands the connection to gRPC or, for a page
// stream, to the node as a link.
func (g *GRPC) serveConn(c net.Conn, serverTLS *tls.Config) {
	tc := tls.Server(c, serverTLS)
	ctx, cancel := context.WithTimeout(g.ctx, g.opt.HandshakeTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		g.opt.Logger.Info("link: TLS handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	cs := tc.ConnectionState()
	switch cs.NegotiatedProtocol {
	case alpnH2:
		g.h2.deliver(tc)
	case alpnPages:
		id, err := PeerIdentity(cs)
		if err == nil {
			err = g.accept(&connStream{c: tc}, id, classPages)
		}
		if err != nil {
			tc.Close()
		}
	default:
		g.opt.Logger.Info("link: connection without ALPN refused", "remote", c.RemoteAddr().String())
		tc.Close()
	}
}

// Flow-control windows: large enough that a page or two is in flight on
// a stream, which loopback throughput needs (see BenchmarkPages); each
// link's memory stays bounded by them.
const (
	windowSize     = 1 << 20
	connWindowSize = 4 << 20
)

// Addr is the address the transport serves on, or nil.
func (g *GRPC) Addr() net.Addr {
	if g.ln == nil {
		return nil
	}
	return g.ln.Addr()
}

// Stats returns the transport's counters.
func (g *GRPC) Stats() Stats { return g.stats() }

// Close implements Transport.Close.
func (g *GRPC) Close() error {
	g.close(func() {
		if g.srv != nil {
			_ = g.ln.Close()
			_ = g.h2.Close()
			g.srv.Stop()
		}
		g.ccMu.Lock()
		g.ccsDone = true
		ccs := g.ccs
		g.ccs = nil
		g.ccMu.Unlock()
		for _, cc := range ccs {
			_ = cc.Close()
		}
	})
	return nil
}

// SetPeer sets the address node name is dialled at (host:port), as
// cluster membership learns it; safe to call while Sends run. A node that
// was already known at another address is a new process there: the
// connection and every link to the old address end (PeerDown), and the
// next Send dials the new one.
func (g *GRPC) SetPeer(name transfer.Peer, addr string) error {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("%w: %s at %q: %v", ErrNoRoute, name, addr, err)
	}
	g.ccMu.Lock()
	old, had := g.peers[name]
	g.peers[name] = addr
	moved := had && old != addr
	g.ccMu.Unlock()
	if moved {
		g.forget(name, fmt.Errorf("%s moved from %s to %s", name, old, addr))
	}
	return nil
}

// RemovePeer forgets node name's address, as when it leaves the cluster:
// later Sends to it fail with ErrNoRoute, and the links to it end now
// (PeerDown), so that nothing more is sent to a node the cluster holds
// gone. Safe to call while Sends run.
func (g *GRPC) RemovePeer(name transfer.Peer) {
	g.ccMu.Lock()
	_, had := g.peers[name]
	delete(g.peers, name)
	g.ccMu.Unlock()
	if had {
		g.forget(name, fmt.Errorf("%s left the cluster", name))
	}
}

// forget closes the connection dialled to name and ends every link with
// it.
func (g *GRPC) forget(name transfer.Peer, cause error) {
	g.ccMu.Lock()
	cc := g.ccs[name]
	delete(g.ccs, name)
	g.ccMu.Unlock()
	// The links first, so that each ends with cause rather than with the
	// connection's closing.
	g.endLinks(name, cause)
	if cc != nil {
		_ = cc.Close()
	}
}

// peerAddr is the address name is dialled at.
func (g *GRPC) peerAddr(name transfer.Peer) (string, error) {
	g.ccMu.Lock()
	defer g.ccMu.Unlock()
	addr, ok := g.peers[name]
	if !ok {
		return "", fmt.Errorf("%w: no address for %s", ErrNoRoute, name)
	}
	return addr, nil
}

// clientConn returns the connection to peer to, creating it on first use.
// gRPC reconnects it as needed; every link to to is a stream on it.
func (g *GRPC) clientConn(to transfer.Peer) (*grpc.ClientConn, error) {
	g.ccMu.Lock()
	defer g.ccMu.Unlock()
	if g.ccsDone {
		return nil, ErrClosed
	}
	addr, ok := g.peers[to]
	if !ok {
		return nil, fmt.Errorf("%w: no address for %s", ErrNoRoute, to)
	}
	if cc := g.ccs[to]; cc != nil {
		return cc, nil
	}
	cc, err := grpc.NewClient("passthrough:///"+addr,
		// ForPeer: the handshake fails unless the certificate that
		// answers chains to our CA and names node to.
		grpc.WithTransportCredentials(credentials.NewTLS(g.cfg.TLS.ForPeer(Identity{Name: to}))),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage), grpc.ForceCodecV2(frameCodec{})),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: g.cfg.Keepalive, Timeout: g.cfg.Keepalive, PermitWithoutStream: true}),
		grpc.WithInitialWindowSize(windowSize),
		grpc.WithInitialConnWindowSize(connWindowSize),
		grpc.WithDisableServiceConfig(),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: %s at %s: %v", ErrNoRoute, to, addr, err)
	}
	g.ccs[to] = cc
	return cc, nil
}

func (g *GRPC) dial(ctx context.Context, to transfer.Peer, class linkClass) (stream, Identity, error) {
	if class == classPages {
		addr, err := g.peerAddr(to)
		if err != nil {
			return nil, Identity{}, err
		}
		return dialPages(ctx, g.cfg.TLS, to, addr, net.Dialer{KeepAlive: g.cfg.Keepalive})
	}
	cc, err := g.clientConn(to)
	if err != nil {
		return nil, Identity{}, err
	}
	// The stream outlives the Send that opens it: it ends with the node
	// or when the link closes it.
	sctx, cancel := context.WithCancelCause(g.ctx)
	stop := context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	defer stop()
	ex, err := linkpb.NewLinkClient(cc).Exchange(sctx)
	if err != nil {
		cancel(err)
		if c := context.Cause(sctx); c != nil && !errors.Is(c, context.Canceled) {
			err = c
		}
		return nil, Identity{}, fmt.Errorf("%w: %s: %w", ErrPeerDown, to, err)
	}
	id, err := authInfo(ex.Context())
	if err != nil {
		cancel(err)
		return nil, Identity{}, err
	}
	return &clientStream{ex: ex, cancel: cancel}, id, nil
}

// authInfo is the verified identity of a stream's peer.
func authInfo(ctx context.Context) (Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return Identity{}, fmt.Errorf("%w: no peer information", ErrAuth)
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return Identity{}, fmt.Errorf("%w: not a TLS connection", ErrAuth)
	}
	return PeerIdentity(info.State)
}

// linkServer is the Link service of a GRPC transport.
type linkServer struct {
	linkpb.UnimplementedLinkServer
	g *GRPC
}

// Exchange is the Link service: a peer opens a link. Its identity is the
// one its client certificate names (verified in the TLS handshake).
func (s linkServer) Exchange(ex linkpb.Link_ExchangeServer) error {
	g := s.g
	id, err := authInfo(ex.Context())
	if err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	st := &serverStream{ex: ex, done: make(chan struct{})}
	if err := g.accept(st, id, classControl); err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	// The node's goroutines read the stream; the handler only holds it
	// open until the link ends, and reports why.
	select {
	case <-st.done:
	case <-ex.Context().Done():
		st.close(context.Cause(ex.Context()))
	}
	switch {
	case errors.Is(st.err, ErrPolicy):
		return status.Error(codes.PermissionDenied, st.err.Error())
	case errors.Is(st.err, ErrAuth):
		return status.Error(codes.Unauthenticated, st.err.Error())
	case errors.Is(st.err, transfer.ErrFrame), errors.Is(st.err, ErrHandshake):
		return status.Error(codes.FailedPrecondition, st.err.Error())
	}
	return status.Error(codes.Unavailable, st.err.Error())
}

type clientStream struct {
	ex     linkpb.Link_ExchangeClient
	cancel context.CancelCauseFunc
}

func (s *clientStream) send(frame []byte) error {
	err := s.ex.Send(&linkpb.Frame{Frame: frame})
	if errors.Is(err, io.EOF) {
		// gRPC's way of saying the server ended the stream; the reader
		// gets the status that says why.
		return errEnded
	}
	return err
}

var errEnded = errors.New("the peer ended the link")

func (s *clientStream) recv() ([]byte, error) {
	f, err := s.ex.Recv()
	if err != nil {
		return nil, err
	}
	return f.GetFrame(), nil
}

func (s *clientStream) close(cause error) { s.cancel(cause) }

type serverStream struct {
	ex   linkpb.Link_ExchangeServer
	done chan struct{}
	once sync.Once
	err  error
}

func (s *serverStream) send(frame []byte) error { return s.ex.Send(&linkpb.Frame{Frame: frame}) }

func (s *serverStream) recv() ([]byte, error) {
	f, err := s.ex.Recv()
	if err != nil {
		return nil, err
	}
	return f.GetFrame(), nil
}

// close lets the handler return, which ends the stream: gRPC then fails
// the node's blocked Send and Recv calls on it.
func (s *serverStream) close(cause error) {
	s.once.Do(func() {
		s.err = cause
		close(s.done)
	})
}
