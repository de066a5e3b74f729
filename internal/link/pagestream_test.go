package link

import (
	"crypto/tls"
	"errors"
	"io"
	"testing"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// TestPageStreams: on GRPC, pages travel on a page stream of their own
// and everything else on the gRPC stream; PagesOverGRPC keeps them on
// one.
func TestPageStreams(t *testing.T) {
	for _, over := range []bool{false, true} {
		c := newCluster(t, "grpc")
		c.pagesOverGRPC = over
		c.standard(Options{})
		prefill, decode := c.nodes[pf], c.nodes[dc]
		send(t, prefill, dc, &transfer.Page{Ref: testRef(), Index: 0, Filled: 16, Data: pageData(1 << 16)})
		send(t, prefill, dc, &transfer.Heartbeat{Ref: testRef()})
		for range 2 {
			if in := recv(t, decode); in.Msg == nil {
				t.Fatalf("%+v", in)
			}
		}
		want := 2
		if over {
			want = 1
		}
		if s := stats(prefill); s.Links != want || s.LinksUp != uint64(want) {
			t.Errorf("PagesOverGRPC %v: prefill stats %+v, want %d links", over, s, want)
		}
	}
}

// pageConn opens a raw page stream to addr with cfg and sends what an
// honest node never would.
func pageConn(t *testing.T, cfg *tls.Config, addr string, protos ...string) (*tls.Conn, error) {
	t.Helper()
	cfg = cfg.Clone()
	cfg.NextProtos = protos
	c, err := tls.Dial("tcp", addr, cfg)
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// TestPageStreamRefuses: a page stream is authenticated as a gRPC link
// is, starts with the same Hello check, and carries only Page frames.
func TestPageStreamRefuses(t *testing.T) {
	c := newCluster(t, "grpc")
	c.listener(dc)
	decode := c.add(helloOf(dc, transfer.RoleDecode), Options{})
	honest := c.pki.tls(Identity{Name: pf, Role: transfer.RolePrefill}).ForPeer(Identity{Name: dc})

	// A control message on a page stream closes it.
	conn, err := pageConn(t, honest, c.addrs[dc], alpnPages)
	if err != nil {
		t.Fatal(err)
	}
	h := helloOf(pf, transfer.RolePrefill)
	for _, m := range []transfer.Message{&h, &transfer.Heartbeat{Ref: testRef()}} {
		if _, err := conn.Write(frameOf(t, m)); err != nil {
			t.Fatal(err)
		}
	}
	st := &connStream{c: conn}
	f, err := st.recv()
	if err != nil {
		t.Fatal(err)
	}
	if m, err := transfer.DecodeFrame(f); err != nil || m.Type() != transfer.MsgHello {
		t.Fatalf("decode answered %v, %v; want its hello", m, err)
	}
	if in := down(t, decode); !errors.Is(in.Down, ErrPolicy) {
		t.Errorf("PeerDown %v, want a policy refusal", in.Down)
	}
	if _, err := st.recv(); err == nil {
		t.Error("the page stream stayed open")
	}

	// A page stream whose hello names another node is refused before the
	// listener says anything.
	conn, err = pageConn(t, honest, c.addrs[dc], alpnPages)
	if err != nil {
		t.Fatal(err)
	}
	g := helloOf(gw, transfer.RoleGateway)
	if _, err := conn.Write(frameOf(t, &g)); err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(conn); len(b) != 0 {
		t.Errorf("decode answered a false hello with %d bytes (%v)", len(b), err)
	}

	// No ALPN, or another protocol: closed after the handshake.
	for _, protos := range [][]string{nil, {"http/1.1"}} {
		conn, err := pageConn(t, honest, c.addrs[dc], protos...)
		if err != nil {
			continue // refused in the handshake: as good
		}
		if b, err := io.ReadAll(conn); len(b) != 0 {
			t.Errorf("ALPN %v: read %d bytes (%v)", protos, len(b), err)
		}
	}

	// A certificate of another CA does not get through the handshake.
	other := newPKI(t).tls(Identity{Name: pf, Role: transfer.RolePrefill})
	imp := honest.Clone()
	imp.Certificates = other.Client.Certificates
	if conn, err := pageConn(t, imp, c.addrs[dc], alpnPages); err == nil {
		if _, err := io.ReadAll(conn); err == nil {
			t.Error("a certificate of another CA opened a page stream")
		}
	}

	decode.Close()
	for in := range decode.Inbox() {
		t.Errorf("decode received %+v", in)
	}
	if s := stats(decode); s.Received != 0 || s.Refused != 2 {
		t.Errorf("decode stats %+v, want two refusals and nothing received", s)
	}
}
