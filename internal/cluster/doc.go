// Package cluster keeps pagewarden's node membership in etcd, so that a
// gateway and prefill nodes on many hosts find the nodes they send work
// to, and stop sending it to a node the moment the cluster holds it gone.
//
// # Key layout
//
// Under a prefix (default "/pagewarden"), one key per live node:
//
//	PREFIX/nodes/ROLE/NAME → {"name", "role", "addr", "layout_hash", "limits",
//	                          "usable_pages", "safety_margin", "cert_sha256",
//	                          "started"}   (JSON)
//
// ROLE is gateway, prefill or decode; NAME is the node's name (the one its
// certificate names, package link). addr is the link address other nodes
// dial (empty for a gateway, which listens for no links); layout_hash is
// the full hex transfer.LayoutHash; limits is the transfer.Limits the
// link handshake compares; usable_pages and safety_margin are the node's
// KV pool and --kv-safety-margin (a margin absent from an older record
// is unknown, and imposes nothing); cert_sha256 is the SHA-256 of the node's
// certificate (DER), so that an operator can tell which certificate a
// registration belongs to. Every key is attached to the etcd lease of the
// node's Session: etcd deletes it when the lease ends.
//
// # Promises
//
//   - A node is listed only while its lease lives: Register attaches the
//     key to a lease the Session keeps alive (etcd's KeepAlive, every
//     third of the TTL). A node that stops, crashes or is cut off from
//     etcd for a TTL leaves the set, and Watch reports that (a delete) at
//     once.
//   - A node whose Session is lost (the keep-alive ended: the lease
//     expired, was revoked, or etcd could not be reached for a TTL; or its
//     key was deleted) learns it on Session.Done, at about the time the
//     cluster stops listing it. The caller stops taking work then (the
//     node roles exit with an error): a node never serves while the
//     cluster believes it gone, so the gateway's decision to fail its
//     requests is never contradicted by tokens arriving later.
//   - A name is held by one live node across all roles (links address
//     nodes by name): Register refuses a name another node holds, in the
//     same etcd transaction that writes the key (ErrNameTaken).
//   - Every registered node agrees on the layout hash and the limits:
//     Register reads the members and refuses (ErrConfigMismatch, naming
//     both values and the other node) if one differs; the write is
//     conditional on no member having changed since the read, so two
//     nodes that disagree cannot both register by racing. This is the
//     capacity mismatch of the incident, caught for the whole cluster
//     before a link is opened, rather than link by link.
//   - Every registered decode node holds the window with every node's
//     safety margin: Register refuses (CapacityMismatch, wrapping
//     ErrConfigMismatch) a decode node whose usable_pages × page size is
//     below limits.max_context × a registered node's margin or its own,
//     and a node whose margin some registered decode node cannot hold.
//     The window is the same on every node, so the gateway's advertised
//     window (its max_model_len) is what every decode node can hold with
//     the margin; the gateway also routes only to nodes that hold it
//     (Member.Holds), for records written without a margin.
//   - Watch delivers the whole member set first, then every change, in
//     etcd revision order; after a compaction or a lost watch it lists
//     the set again and reports what changed meanwhile. A record it cannot
//     read (bounded at MaxRecordBytes, strict on names and roles) is left
//     out and logged, never guessed at.
//
// Member.Revision, the etcd revision that created a node's key, is unique
// to one registration of one process: a fencing token. Decode nodes bind
// their handoff leases to their peers' registrations by following the
// member set: when a prefill node or gateway leaves, its reservations are
// aborted at once (disagg.Decode.PeerLeft).
package cluster
