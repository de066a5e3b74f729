// Package link carries the transfer protocol between nodes: the
// authenticated node-to-node links of invariant I11 (DESIGN.md, "Across
// hosts"). It promises that a message reaches a node's driver only if
//
//   - it came over a link whose other end proved, by a certificate of the
//     operator's CA (mutual TLS 1.3), the node name and role the message
//     is delivered with (Inbound.From), never what the message says;
//   - the link began with both nodes' transfer.Hello, each naming the
//     node and role of its own certificate, and transfer.CheckPeer found
//     the two nodes agree on protocol, layout and limits (I5); a
//     difference is named in the error on both sides;
//   - it is one whole transfer frame that transfer.DecodeFrame accepted:
//     one bounded, fuzzed decoder for every message on every transport,
//     and no format that can execute on the receiver;
//   - the Policy lets the sender's role send that type to the receiver's
//     role (DefaultPolicy: only the gateway reserves, generates and asks
//     for a prefill; only prefill sends pages, manifests, commits and
//     heartbeats; only decode grants (the gateway hands a grant on to
//     prefill), confirms commits and streams tokens; every role aborts
//     another). Anything else closes the link and is counted
//     (Stats.Refused) and logged.
//
// A link that ends, for any reason but this node's Close, is reported in
// the inbox as a PeerDown (Inbound.Down) after everything it delivered,
// so that the driver aborts that peer's handoffs. Queues are bounded: a
// driver that does not read its inbox holds its senders back (flow
// control); a Send whose context ends while it waits closes the link.
//
// # Shape
//
// Transport is three methods (Send, Inbox, Close). Each implementation
// supplies only an authenticated, ordered frame stream and a way to open
// one to a named node; the handshake, codec, policy, inbox and PeerDown
// are one shared piece of code (node.go), so the in-process and network
// transports cannot diverge, and an RDMA or shared-memory transport would
// add only its stream.
//
//   - Inproc (Network.Join): nodes in one process (`pagewarden serve`,
//     tests). Identity is the Join's; every message is still framed,
//     handshaken, decoded and policed.
//   - GRPC (NewGRPC): the gRPC service linkpb.Link (schema
//     pagewarden.link.v1) over mutual TLS 1.3 for everything but pages:
//     one Exchange stream per link, one linkpb.Frame per transfer frame.
//     Page frames go on a page stream: a dedicated TLS 1.3 connection
//     carrying frames back to back, with the same certificates, Hello,
//     codec and policy (and nothing but pages after the Hellos). Both
//     share one port; the TLS handshake's ALPN ("h2" or
//     "pagewarden-pages/1") says which a connection is. A node dials the
//     peers in its address table (GRPCConfig.Peers, changed at run time
//     by SetPeer and RemovePeer as cluster membership changes; removing a
//     node ends its links); a node that dialled is answered on the
//     same stream, so a gateway need not listen (a prefill node needs the
//     decode nodes' addresses: pages are never sent on a stream the other
//     side opened).
//
// # Identities
//
// A node certificate names its node in one URI SAN,
// pagewarden://ROLE/NAME (ROLE gateway, prefill or decode; NAME 1-63
// letters, digits, '.', '_', '-'), and carries DNS and IP SANs for where
// it is reached. A dialer accepts only a certificate that chains to the
// CA and names the node it dialled (host names are not what identifies a
// node); a listener accepts only a client certificate that chains to the
// CA and names a node. `pagewarden certs` makes a development CA and node
// certificates (NewCA, CA.Issue); production loads the operator's
// (LoadTLS).
//
// # Throughput
//
// BenchmarkPages compares KV page frames (64 and 256 KiB) over gRPC, over
// the page stream and over raw TLS 1.3 on TCP (same cipher suite,
// TLS_AES_128_GCM_SHA256 where the CPU has AES instructions; same codec)
// on loopback in one run. gRPC streaming stayed under 80% of raw TLS
// (about 55-75% on a 2-core machine: HTTP/2 framing in 16 KiB DATA
// frames, zeroed pool buffers, two more goroutine hops), so pages moved
// to the page stream, which keeps about 85% or more; gRPC keeps control.
// The cost of two streams is order: a Page is ordered only among pages
// (see Transport.Send). GRPCConfig.PagesOverGRPC puts them back on gRPC.
package link
