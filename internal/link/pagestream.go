package link

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// The page stream: a dedicated TLS 1.3 connection per link that carries
// transfer frames back to back, and nothing but Page frames after the
// Hellos. It shares the GRPC transport's port: the TLS handshake's ALPN
// says which of the two a connection is. BenchmarkPages measured gRPC at
// under 80% of raw TLS for 64 KiB pages; this is raw TLS with the same
// authentication, Hello and codec.
const (
	alpnPages = "pagewarden-pages/1"
	alpnH2    = "h2"
)

// connStream is a stream over one TLS connection: each frame is read by
// its header (transfer.ParseHeader bounds the body before anything is
// allocated), then whole.
type connStream struct {
	c    *tls.Conn
	hdr  [transfer.HeaderSize]byte
	once sync.Once
}

// copiesFrames: tls.Conn.Write has encrypted frame when it returns.
func (s *connStream) copiesFrames() {}

func (s *connStream) send(frame []byte) error {
	_, err := s.c.Write(frame)
	return err
}

func (s *connStream) recv() ([]byte, error) {
	if _, err := io.ReadFull(s.c, s.hdr[:]); err != nil {
		return nil, err
	}
	h, err := transfer.ParseHeader(s.hdr[:])
	if err != nil {
		return nil, err
	}
	frame := make([]byte, h.FrameLen())
	copy(frame, s.hdr[:])
	if _, err := io.ReadFull(s.c, frame[transfer.HeaderSize:]); err != nil {
		return nil, err
	}
	return frame, nil
}

// close closes the connection, which also breaks a Write or Read in
// progress (tls.Conn.Close does not wait for a blocked Write).
func (s *connStream) close(error) { s.once.Do(func() { _ = s.c.Close() }) }

// dialPages opens a page stream to the node named to at addr.
func dialPages(ctx context.Context, cfg *TLS, to transfer.Peer, addr string, keepalive net.Dialer) (stream, Identity, error) {
	tc := cfg.ForPeer(Identity{Name: to})
	tc.NextProtos = []string{alpnPages}
	d := tls.Dialer{NetDialer: &keepalive, Config: tc}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, Identity{}, fmt.Errorf("%w: %s page stream: %w", ErrPeerDown, to, err)
	}
	conn := c.(*tls.Conn)
	cs := conn.ConnectionState()
	if cs.NegotiatedProtocol != alpnPages {
		conn.Close()
		return nil, Identity{}, fmt.Errorf("%w: %s at %s does not take page streams", ErrHandshake, to, addr)
	}
	id, err := PeerIdentity(cs)
	if err != nil {
		conn.Close()
		return nil, Identity{}, err
	}
	return &connStream{c: conn}, id, nil
}

// h2Listener hands the connections the TLS handshake assigned to gRPC
// (ALPN h2) to grpc.Server.Serve.
type h2Listener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newH2Listener(addr net.Addr) *h2Listener {
	return &h2Listener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *h2Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// deliver hands c to gRPC, or closes it once the listener is closed.
func (l *h2Listener) deliver(c net.Conn) {
	select {
	case l.conns <- c:
	case <-l.done:
		c.Close()
	}
}

func (l *h2Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *h2Listener) Addr() net.Addr { return l.addr }

// handshaken are gRPC server credentials for connections whose TLS
// handshake the transport already did (to read ALPN): they report the
// connection's state, from which Exchange takes the peer's identity.
type handshaken struct{}

func (handshaken) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil, nil, errors.New("link: not a TLS connection")
	}
	return c, credentials.TLSInfo{State: tc.ConnectionState(), CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}, nil
}

func (handshaken) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("link: server-side credentials")
}

func (handshaken) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls", SecurityVersion: "1.3"}
}

func (handshaken) Clone() credentials.TransportCredentials { return handshaken{} }

func (handshaken) OverrideServerName(string) error { return nil }
