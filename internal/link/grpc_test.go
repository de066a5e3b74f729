package link

import (
	"crypto/tls"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/pagewarden/pagewarden/internal/link/linkpb"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// impostorTLS presents cert (not one of the cluster CA's node
// certificates) but verifies servers as an honest node would, so that the
// listener's own check is what is tested.
func impostorTLS(c *cluster, claim Identity, cert NodeCert) *TLS {
	c.t.Helper()
	honest := c.pki.tls(Identity{Name: "honest-0", Role: transfer.RoleGateway})
	pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	if err != nil {
		c.t.Fatal(err)
	}
	client := honest.Client.Clone()
	client.Certificates = []tls.Certificate{pair}
	return &TLS{Self: claim, Server: honest.Server, Client: client}
}

// TestImpostorCertificates: a node whose certificate is self-signed or
// issued by another CA cannot open a link, whatever name it claims: it
// cannot reserve, send pages or abort.
func TestImpostorCertificates(t *testing.T) {
	ref := testRef()
	msgs := []transfer.Message{
		&transfer.Reserve{Owner: ref.Owner, Epoch: 1, PromptTokens: 4, MaxNewTokens: 4, Sender: pf},
		&transfer.Page{Ref: ref, Index: 0, Filled: 16, Data: pageData(64)},
		&transfer.Abort{Ref: ref, Reason: transfer.ReasonAborted},
	}
	certs := map[string]func(c *cluster, id Identity) *TLS{
		"self-signed": func(c *cluster, id Identity) *TLS { return impostorTLS(c, id, selfSigned(t, &id)) },
		"other CA": func(c *cluster, id Identity) *TLS {
			nc, err := newPKI(t).ca.Issue(id, []string{"127.0.0.1"}, time.Now(), time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return impostorTLS(c, id, nc)
		},
		"other CA, trusting it": func(c *cluster, id Identity) *TLS { return newPKI(t).tls(id) },
	}
	for name, mk := range certs {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t, "grpc")
			c.listener(dc)
			decode := c.add(helloOf(dc, transfer.RoleDecode), Options{})
			// Each claims the right role for what it sends.
			for i, m := range msgs {
				from := []transfer.Peer{gw, pf, gw}[i]
				id := Identity{Name: from, Role: roleOf(from)}
				c.nodes = map[transfer.Peer]Transport{}
				imp := c.addWith(helloOf(from, id.Role), Options{}, mk(c, id))
				if err := imp.Send(t.Context(), dc, m); err == nil {
					t.Errorf("%s's %v went through", from, m.Type())
				} else {
					t.Logf("%s's %v: %v", from, m.Type(), err)
				}
				imp.Close()
			}
			decode.Close()
			for in := range decode.Inbox() {
				t.Errorf("decode received %+v", in)
			}
			if s := stats(decode); s.LinksUp != 0 || s.Received != 0 {
				t.Errorf("decode stats %+v, want no link and nothing received", s)
			}
		})
	}
}

// TestImpostorListener: a node that dials decode-1 talks only to a
// certificate of the cluster's CA that names decode-1.
func TestImpostorListener(t *testing.T) {
	cases := map[string]func(c *cluster) *TLS{
		// A valid node certificate, but of another node.
		"another node": func(c *cluster) *TLS { return c.pki.tls(Identity{Name: dc2, Role: transfer.RoleDecode}) },
		"self-signed": func(c *cluster) *TLS {
			id := Identity{Name: dc, Role: transfer.RoleDecode}
			return impostorTLS(c, id, selfSigned(t, &id))
		},
	}
	for name, mk := range cases {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t, "grpc")
			c.listener(dc)
			tlsCfg := mk(c)
			c.lns[tlsCfg.Self.Name] = c.lns[dc]
			// Serve with the impostor's certificate at decode-1's address.
			pair := tlsCfg.Client.Certificates[0]
			srvCfg := c.pki.tls(Identity{Name: "x", Role: transfer.RoleDecode}).Server.Clone()
			srvCfg.Certificates = []tls.Certificate{pair}
			imp := c.addWith(helloOf(tlsCfg.Self.Name, transfer.RoleDecode), Options{}, &TLS{Self: tlsCfg.Self, Server: srvCfg, Client: tlsCfg.Client})
			prefill := c.add(helloOf(pf, transfer.RolePrefill), Options{})
			err := prefill.Send(t.Context(), dc, &transfer.Page{Ref: testRef(), Index: 0, Filled: 16, Data: pageData(64)})
			if err == nil {
				t.Fatal("prefill sent a page to an impostor")
			}
			t.Log(err)
			if name == "another node" && !strings.Contains(err.Error(), "dialled node decode-1, answered by decode/decode-2") {
				t.Errorf("error does not say who answered: %v", err)
			}
			if s := stats(imp); s.LinksUp != 0 {
				t.Errorf("impostor stats %+v", s)
			}
		})
	}
}

// rawClient opens an Exchange stream to addr with cfg, to send what an
// honest node never would.
func rawClient(t testing.TB, cfg *tls.Config, addr string) linkpb.Link_ExchangeClient {
	t.Helper()
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ex, err := linkpb.NewLinkClient(cc).Exchange(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

func frameOf(t *testing.T, m transfer.Message) []byte {
	t.Helper()
	f, err := transfer.EncodeFrame(m)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// endStatus reads ex until the server ends it and returns the status.
func endStatus(t *testing.T, ex linkpb.Link_ExchangeClient) *status.Status {
	t.Helper()
	for {
		if _, err := ex.Recv(); err != nil {
			return status.Convert(err)
		}
	}
}

// TestListenerRefuses: what a client with a valid certificate sends on a
// new stream is checked before anything is delivered.
func TestListenerRefuses(t *testing.T) {
	hello := func(name transfer.Peer, role transfer.Role) transfer.Message {
		h := helloOf(name, role)
		return &h
	}
	flipped := frameOf(t, &transfer.Heartbeat{Ref: testRef()})
	flipped[len(flipped)-6] ^= 1
	cases := []struct {
		name   string
		frames [][]byte
		code   codes.Code
		says   string
		err    error // what decode's PeerDown wraps, when the link was up
	}{
		{"hello claims the gateway", [][]byte{frameOf(t, hello(gw, transfer.RoleGateway))}, codes.Unauthenticated, "hello says gateway/gateway-1, certificate says prefill/prefill-1", nil},
		{"hello claims another role", [][]byte{frameOf(t, hello(pf, transfer.RoleGateway))}, codes.Unauthenticated, "certificate says prefill/prefill-1", nil},
		{"no hello first", [][]byte{frameOf(t, &transfer.Heartbeat{Ref: testRef()})}, codes.FailedPrecondition, "opened with heartbeat, not hello", nil},
		{"garbage first", [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n")}, codes.FailedPrecondition, "malformed frame", nil},
		{"second hello", [][]byte{frameOf(t, hello(pf, transfer.RolePrefill)), frameOf(t, hello(pf, transfer.RolePrefill))}, codes.PermissionDenied, "may not send hello", ErrPolicy},
		{"corrupt frame", [][]byte{frameOf(t, hello(pf, transfer.RolePrefill)), flipped}, codes.FailedPrecondition, "checksum", transfer.ErrFrame},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, "grpc")
			c.listener(dc)
			decode := c.add(helloOf(dc, transfer.RoleDecode), Options{})
			ex := rawClient(t, c.pki.tls(Identity{Name: pf, Role: transfer.RolePrefill}).ForPeer(Identity{Name: dc}), c.addrs[dc])
			for _, f := range tc.frames {
				if err := ex.Send(&linkpb.Frame{Frame: f}); err != nil {
					t.Fatal(err)
				}
			}
			st := endStatus(t, ex)
			if st.Code() != tc.code || !strings.Contains(st.Message(), tc.says) {
				t.Errorf("status %v %q, want %v saying %q", st.Code(), st.Message(), tc.code, tc.says)
			}
			if tc.err != nil {
				if in := down(t, decode); !errors.Is(in.Down, tc.err) {
					t.Errorf("PeerDown %v, want %v", in.Down, tc.err)
				}
			}
			deadline := time.Now().Add(5 * time.Second)
			for stats(decode).Refused == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond) // counted by the handshake's goroutine, maybe just after the stream ended
			}
			decode.Close()
			for in := range decode.Inbox() {
				t.Errorf("decode received %+v", in)
			}
			if s := stats(decode); s.Refused != 1 || s.Received != 0 {
				t.Errorf("decode stats %+v, want one refusal, nothing received", s)
			}
		})
	}
}

// TestHandshakeTimeout: a client that opens a stream and says nothing
// does not hold it.
func TestHandshakeTimeout(t *testing.T) {
	c := newCluster(t, "grpc")
	c.listener(dc)
	decode := c.add(helloOf(dc, transfer.RoleDecode), Options{HandshakeTimeout: 50 * time.Millisecond})
	ex := rawClient(t, c.pki.tls(Identity{Name: pf, Role: transfer.RolePrefill}).ForPeer(Identity{Name: dc}), c.addrs[dc])
	st := endStatus(t, ex)
	if st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "no hello within 50ms") {
		t.Errorf("status %v %q", st.Code(), st.Message())
	}
	// The refusal is counted by the goroutine that ran the handshake,
	// which may finish just after the client saw the stream end.
	deadline := time.Now().Add(5 * time.Second)
	for stats(decode).Refused == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	decode.Close()
	if s := stats(decode); s.Refused != 1 || s.LinksUp != 0 {
		t.Errorf("decode stats %+v", s)
	}
}

// TestGRPCConfig: a node whose Hello is not its certificate's does not
// start.
func TestGRPCConfig(t *testing.T) {
	pki := newPKI(t)
	cfg := pki.tls(Identity{Name: pf, Role: transfer.RolePrefill})
	for name, h := range map[string]transfer.Hello{
		"other name": helloOf(gw, transfer.RolePrefill),
		"other role": helloOf(pf, transfer.RoleGateway),
	} {
		if _, err := NewGRPC(GRPCConfig{TLS: cfg, Hello: h}, nil); !errors.Is(err, ErrAuth) {
			t.Errorf("%s: %v, want ErrAuth", name, err)
		}
	}
	if _, err := NewGRPC(GRPCConfig{Hello: helloOf(pf, transfer.RolePrefill)}, nil); !errors.Is(err, ErrPKI) {
		t.Errorf("no TLS: %v", err)
	}
	g, err := NewGRPC(GRPCConfig{TLS: cfg, Hello: helloOf(pf, transfer.RolePrefill)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Send(t.Context(), dc, &transfer.Heartbeat{Ref: testRef()}); !errors.Is(err, ErrNoRoute) {
		t.Errorf("send to a node without an address: %v, want ErrNoRoute", err)
	}
}

// TestGRPCPeersAtRunTime: a node learns and forgets its peers' addresses
// while it runs (cluster membership): SetPeer makes a node reachable on
// control and page streams, RemovePeer ends its links at once (PeerDown)
// and refuses further Sends, and a node that comes back at another
// address is dialled there while the links to the old one end.
func TestGRPCPeersAtRunTime(t *testing.T) {
	c := newCluster(t, "grpc")
	c.listener(dc)
	decode := c.add(helloOf(dc, transfer.RoleDecode), Options{})
	addr := c.addrs[dc]
	delete(c.addrs, dc)
	prefill := c.add(helloOf(pf, transfer.RolePrefill), Options{}).(*GRPC)
	hb := &transfer.Heartbeat{Ref: testRef()}
	page := &transfer.Page{Ref: testRef(), Index: 0, Filled: 16, Data: pageData(64)}

	if err := prefill.Send(t.Context(), dc, hb); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("send before SetPeer: %v, want ErrNoRoute", err)
	}
	if err := prefill.SetPeer(dc, "no port"); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("SetPeer with a bad address: %v", err)
	}
	if err := prefill.SetPeer(dc, addr); err != nil {
		t.Fatal(err)
	}
	send(t, prefill, dc, hb)
	send(t, prefill, dc, page)
	for range 2 {
		if in := recv(t, decode); in.Msg == nil || in.From.Name != pf {
			t.Fatalf("decode got %+v", in)
		}
	}
	if err := prefill.SetPeer(dc, addr); err != nil { // unchanged: nothing happens
		t.Fatal(err)
	}
	send(t, prefill, dc, hb)
	recv(t, decode)

	prefill.RemovePeer(dc)
	// Both links (control and pages) end, and are reported.
	for range 2 {
		if in := down(t, prefill); in.From.Name != dc || !strings.Contains(in.Down.Error(), "left the cluster") {
			t.Fatalf("PeerDown %+v", in)
		}
	}
	if err := prefill.Send(t.Context(), dc, hb); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("send after RemovePeer: %v, want ErrNoRoute", err)
	}
	for range 2 {
		down(t, decode)
	}

	// decode-1 again, a new process at a new address.
	if err := prefill.SetPeer(dc, addr); err != nil {
		t.Fatal(err)
	}
	send(t, prefill, dc, hb)
	recv(t, decode)
	c.listener(dc)
	decode2 := c.add(helloOf(dc, transfer.RoleDecode), Options{})
	if err := prefill.SetPeer(dc, c.addrs[dc]); err != nil {
		t.Fatal(err)
	}
	if in := down(t, prefill); !strings.Contains(in.Down.Error(), "moved from") {
		t.Fatalf("PeerDown %+v, want the move named", in)
	}
	send(t, prefill, dc, hb)
	if in := recv(t, decode2); in.Msg == nil {
		t.Fatalf("new decode-1 got %+v", in)
	}
	down(t, decode)
	quiet(t, decode)
}

// TestGRPCPeersConcurrent: SetPeer and RemovePeer race with Sends (run
// with -race): every Send succeeds or fails with a link error, nothing
// else.
func TestGRPCPeersConcurrent(t *testing.T) {
	c := newCluster(t, "grpc")
	c.listener(dc)
	decode := c.add(helloOf(dc, transfer.RoleDecode), Options{InboxSize: 1024})
	addr := c.addrs[dc]
	delete(c.addrs, dc)
	prefill := c.add(helloOf(pf, transfer.RolePrefill), Options{InboxSize: 1024}).(*GRPC)
	go func() {
		for range decode.Inbox() {
		}
	}()
	go func() {
		for range prefill.Inbox() {
		}
	}()
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for range 50 {
				var m transfer.Message = &transfer.Heartbeat{Ref: testRef()}
				if i%2 == 1 {
					m = &transfer.Page{Ref: testRef(), Index: 0, Filled: 16, Data: pageData(64)}
				}
				err := prefill.Send(t.Context(), dc, m)
				if err != nil && !errors.Is(err, ErrNoRoute) && !errors.Is(err, ErrPeerDown) {
					t.Errorf("send: %v", err)
				}
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			if err := prefill.SetPeer(dc, addr); err != nil {
				t.Error(err)
			}
			runtime.Gosched()
			prefill.RemovePeer(dc)
		}
	})
	wg.Wait()
}
