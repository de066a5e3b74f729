package link

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// BenchmarkPages measures KV page throughput from a prefill to a decode
// node on loopback, page frames of 64 and 256 KiB:
//
//   - tls: the baseline, what a dedicated page stream would do: transfer
//     frames encoded into one reused buffer and written to a raw TLS 1.3
//     connection over TCP, read back by header (ParseHeader) into a fresh
//     buffer each (the message is handed on), decoded (DecodeFrame) and
//     passed to a consumer through a channel;
//   - grpc: the same frames through the GRPC transport with
//     PagesOverGRPC, Send to Inbox: every frame a gRPC message;
//   - pagestream: the GRPC transport as configured by default, pages on
//     its dedicated TLS page stream, Send to Inbox;
//   - inproc: the in-process transport, for reference;
//   - tls-bytes: the ceiling, the same frame's bytes written to raw TLS
//     and read into one reused buffer, with no codec and no allocation.
//
// Both network paths use the same TLS configuration (LoadTLS's), so the
// same cipher suite, which the benchmark logs. Besides MB/s (wall clock)
// each reports cpu-MB/s: bytes per second of CPU time the whole process
// (sender and receiver) spent, which a machine shared with other work
// does not blur. Run them in one run and compare:
//
//	go test -run '^$' -bench BenchmarkPages -benchtime 3s -count 5 ./internal/link/
func BenchmarkPages(b *testing.B) {
	for _, size := range []int{64 << 10, 256 << 10} {
		page := &transfer.Page{Ref: testRef(), Index: 1, Filled: 16, Data: pageData(size)}
		name := fmt.Sprintf("%dKiB", size>>10)
		b.Run(name+"/tls", func(b *testing.B) { benchRawTLS(b, page) })
		b.Run(name+"/grpc", func(b *testing.B) { benchTransport(b, "grpc", page) })
		b.Run(name+"/pagestream", func(b *testing.B) { benchTransport(b, "pagestream", page) })
		b.Run(name+"/inproc", func(b *testing.B) { benchTransport(b, "inproc", page) })
		b.Run(name+"/tls-bytes", func(b *testing.B) { benchTLSBytes(b, page) })
	}
}

func benchTransport(b *testing.B, kind string, page *transfer.Page) {
	c := newCluster(b, kind)
	if kind != "inproc" {
		c = newCluster(b, "grpc")
		c.pagesOverGRPC = kind == "grpc"
	}
	c.listener(dc)
	decode := c.add(helloOf(dc, transfer.RoleDecode), Options{})
	prefill := c.add(helloOf(pf, transfer.RolePrefill), Options{})
	if kind != "inproc" {
		logGRPCSuite(b, c)
	}
	if kind == "pagestream" {
		probe := c.pki.tls(Identity{Name: "probe-1", Role: transfer.RolePrefill})
		st, _, err := dialPages(b.Context(), probe, dc, c.addrs[dc], net.Dialer{})
		if err != nil {
			b.Fatal(err)
		}
		cs := st.(*connStream).c.ConnectionState()
		b.Logf("page stream: %s, %s", tls.VersionName(cs.Version), tls.CipherSuiteName(cs.CipherSuite))
		st.close(nil)
	}
	ctx := b.Context()
	// Open the link outside the timing.
	if err := prefill.Send(ctx, dc, page); err != nil {
		b.Fatal(err)
	}
	<-decode.Inbox()
	done := make(chan error, 1)
	b.SetBytes(int64(len(page.Data)))
	b.ReportAllocs()
	defer reportCPU(b, len(page.Data))()
	b.ResetTimer()
	go func() {
		for range b.N {
			in := <-decode.Inbox()
			if in.Down != nil {
				done <- in.Down
				return
			}
		}
		done <- nil
	}()
	for range b.N {
		if err := prefill.Send(ctx, dc, page); err != nil {
			b.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
}

// logGRPCSuite logs the cipher suite a gRPC stream to decode negotiates.
func logGRPCSuite(b *testing.B, c *cluster) {
	cfg := c.pki.tls(Identity{Name: "probe-1", Role: transfer.RolePrefill}).ForPeer(Identity{Name: dc})
	ex := rawClient(b, cfg, c.addrs[dc])
	p, ok := peer.FromContext(ex.Context())
	if !ok {
		b.Fatal("no peer")
	}
	st := p.AuthInfo.(credentials.TLSInfo).State
	b.Logf("grpc: %s, %s", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite))
}

func benchRawTLS(b *testing.B, page *transfer.Page) {
	pki := newPKI(b)
	srv := pki.tls(Identity{Name: dc, Role: transfer.RoleDecode})
	cli := pki.tls(Identity{Name: pf, Role: transfer.RolePrefill})
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv.Server)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	inbox := make(chan transfer.Message, 64)
	readErr := make(chan error, 1)
	go func() {
		defer close(inbox)
		conn, err := ln.Accept()
		if err != nil {
			readErr <- err
			return
		}
		defer conn.Close()
		hdr := make([]byte, transfer.HeaderSize)
		for {
			if _, err := io.ReadFull(conn, hdr); err != nil {
				readErr <- err
				return
			}
			h, err := transfer.ParseHeader(hdr)
			if err != nil {
				readErr <- err
				return
			}
			frame := make([]byte, h.FrameLen())
			copy(frame, hdr)
			if _, err := io.ReadFull(conn, frame[transfer.HeaderSize:]); err != nil {
				readErr <- err
				return
			}
			m, err := transfer.DecodeFrame(frame)
			if err != nil {
				readErr <- err
				return
			}
			inbox <- m
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), cli.ForPeer(Identity{Name: dc}))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	st := conn.ConnectionState()
	b.Logf("raw: %s, %s", tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite))

	done := make(chan int, 1)
	b.SetBytes(int64(len(page.Data)))
	b.ReportAllocs()
	defer reportCPU(b, len(page.Data))()
	b.ResetTimer()
	go func() {
		n := 0
		for n < b.N {
			if _, ok := <-inbox; !ok {
				break
			}
			n++
		}
		done <- n
	}()
	// A dedicated stream would encode into one buffer per connection: a
	// tls.Conn's Write does not retain it.
	var frame []byte
	for range b.N {
		if frame, err = transfer.AppendFrame(frame[:0], page); err != nil {
			b.Fatal(err)
		}
		if _, err := conn.Write(frame); err != nil {
			b.Fatal(err)
		}
	}
	if n := <-done; n != b.N {
		b.Fatalf("%d of %d frames arrived: %v", n, b.N, <-readErr)
	}
	b.StopTimer()
}

func benchTLSBytes(b *testing.B, page *transfer.Page) {
	pki := newPKI(b)
	srv := pki.tls(Identity{Name: dc, Role: transfer.RoleDecode})
	cli := pki.tls(Identity{Name: pf, Role: transfer.RolePrefill})
	ln, err := tls.Listen("tcp", "127.0.0.1:0", srv.Server)
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	frame, err := transfer.EncodeFrame(page)
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		n := 0
		defer func() { done <- n }()
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		buf := make([]byte, len(frame))
		for {
			if _, err := io.ReadFull(conn, buf); err != nil {
				return
			}
			n++
		}
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), cli.ForPeer(Identity{Name: dc}))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(page.Data)))
	b.ReportAllocs()
	defer reportCPU(b, len(page.Data))()
	b.ResetTimer()
	for range b.N {
		if _, err := conn.Write(frame); err != nil {
			b.Fatal(err)
		}
	}
	conn.Close()
	if n := <-done; n != b.N {
		b.Fatalf("%d of %d frames arrived", n, b.N)
	}
	b.StopTimer()
}

// reportCPU starts measuring the process's CPU time; the function it
// returns reports page bytes per CPU-second as cpu-MB/s.
func reportCPU(b *testing.B, pageBytes int) func() {
	start := cpuTime()
	return func() {
		if used := cpuTime() - start; used > 0 {
			b.ReportMetric(float64(pageBytes)*float64(b.N)/used.Seconds()/1e6, "cpu-MB/s")
		}
	}
}
