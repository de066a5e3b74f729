// Package transfer is the protocol core of the prefill → decode KV handoff
// (DESIGN.md, "The handoff"): reservations, manifests, page digests,
// leases and the abort handshake. It enforces invariants I6 and I7 and the
// framing half of I11; the transports (in-process, TCP with mutual TLS)
// and the drivers that connect it to kvcache and sched are not here.
//
// # Promises
//
//   - I6 A handoff commits only on an exact match. A Receiver delivers a
//     reservation to decode (the Deliver effect) only when the sender's
//     Manifest and the pages that actually arrived agree with what was
//     reserved on every point: tenant, request and epoch of every message,
//     the layout hash (model digest, dtype, page size, layer and head
//     shape, window, protocol version), the page count (announced ==
//     reserved == received, each logical index exactly once), each page's
//     filled count (every page full except the last, as the reserved
//     prompt implies, in the page and in the manifest), the total tokens
//     (== the reserved prompt) and, for each logical index, the digest of
//     the bytes received there (PageDigest covers the index, so swapped
//     pages do not match). Anything else aborts the reservation with a
//     typed Reason that goes to the gateway and the sender; nothing is
//     "logged and continued". The incident's handoff (8 pages reserved, a
//     1-page manifest) fails three of these checks.
//   - I7 Writers before free. A page the receiver granted a write on is
//     released only after the driver reports the write done (WriteDone).
//     An aborted reservation waits DrainTimeout for its writers; then it
//     fences them (Fence) and quarantines its pages, never frees them. A
//     fenced writer's late completion is void. Nothing is written into a
//     reservation that ended: late pages are refused, and a page after
//     the commit never reaches decode's KV.
//   - Abort is acknowledged. Whoever aborts (the receiver on a failed
//     check or an expired lease, the sender, the gateway) sends Abort to
//     every other party and sends it again until each answers AbortAck;
//     a party acknowledges only once it holds nothing writable for the
//     handoff (Drained: pages released; or not drained: quarantined). A
//     party that knows nothing of a handoff acknowledges at once.
//   - Leases. A reservation lives LeaseTTL past its grant or its sender's
//     last heartbeat, never past MaxLease, and is not renewed after the
//     commit (whatever has not arrived by then never will). The reaper
//     runs on Tick in deadline order.
//   - Every reservation ends exactly once (Ended: committed, aborted or
//     reaped), and its pages are delivered, released or quarantined:
//     never lost, never two of those.
//   - Only a reservation's parties act on it. Pages, manifest, commit and
//     heartbeats are accepted only from the sender the gateway named in
//     Reserve, aborts from that sender or the gateway (Peer is the
//     authenticated node name); a stranger is refused and told to stop,
//     but cannot abort someone else's reservation. A message from the
//     right sender that names another owner or epoch aborts: a sender
//     that crossed two handoffs cannot be trusted with either.
//
// # Shape
//
// Receiver (decode) and Sender (prefill) are deterministic state machines
// after etcd raft's RawNode, like sched.Core: no goroutines, clock, IO or
// randomness (a test forbids the imports). Inputs are method calls; time
// is an input (Tick); effects come out of Ready as an ordered list of
// values (Send, Deliver, Release, Quarantine, Fence, Ended, SendPage,
// ReleaseSource, ...) that the driver carries out in order before the
// next input. There is no Advance: every effect that completes later has
// its own completion input (WritePage → WriteDone, SendPage → Sent).
//
// The driver allocates the pages. Reserve takes the page ids the driver
// just got from kvcache.Pool.Reserve (PagesNeeded says how many): the pool
// stays the one place that hands out KV memory and allocation is
// synchronous in the driver's goroutine, so an "allocate" effect would
// only add a state with nothing to wait for. The receiver checks the ids
// (non-zero, distinct, held by no other reservation) and never looks
// inside them.
//
// The core never sees page bytes. The driver digests what arrived
// (PageDigest) and passes the digest with the header (PageArrived); the
// answer says where to write (WritePage, a return value because only the
// caller holds the bytes). On the prefill side the driver digests each
// page when its KV is final (PageReady); that digest is the sender's
// truth and goes in the manifest.
//
// # Frames
//
// Every message travels in one frame (AppendFrame, DecodeFrame); a stream
// transport reads HeaderSize bytes, checks them with ParseHeader, then
// reads BodyLen+TrailerSize more. Integers are big-endian. Nothing in a
// frame executes or names a type to instantiate (I11).
//
//	 0       4       6    7     8            12                 12+n     16+n
//	 +-------+-------+----+-----+------------+------------------+--------+
//	 | magic |version|type|flags| body len n |       body       | CRC-32C|
//	 |"PWXF" | u16   | u8 | u8=0|  u32 ≤ Max |    n bytes       |  u32   |
//	 +-------+-------+----+-----+------------+------------------+--------+
//	 the CRC (Castagnoli) covers bytes [0, 12+n)
//
//	ref      := incarnation:u64 seq:u64 tenant:str id:[16] epoch:u64
//	str      := len:u8 bytes                       (≤ MaxNameLen)
//	int      := u32 within the field's bound       (≤ 2^31-1)
//
//	Hello     := node:str role:u8 layout hash:[32] maxContext:int maxPrompt:int pageSize:int pageBytes:u64
//	layout    := modelDigest:[32] dtype:u8 pageSize:int layers:int kvHeads:int headDim:int window:int protocol:u16
//	Reserve   := tenant:str id:[16] epoch:u64 promptTokens:int maxNewTokens:int sender:str
//	Grant     := ref pageCount:int promptTokens:int maxNewTokens:int leaseTTL:u64
//	Page      := ref index:int filled:int len:u32 data:[len]        (len ≤ MaxPageBytes)
//	Manifest  := ref layout:[32] pageCount:int totalTokens:int firstToken:int
//	             filled:int × pageCount  digest:[32] × pageCount    (pageCount ≤ MaxPages)
//	Commit, Committed, Heartbeat := ref
//	Abort     := ref reason:u16
//	AbortAck  := ref drained:u8 (0 or 1)
//
// The decoder checks every length against its declared bound and against
// the bytes remaining before it allocates; it refuses trailing bytes,
// non-zero flags, non-canonical booleans and a bad checksum, so every
// accepted frame is the canonical encoding of the message it decodes to.
// The CRC catches corruption on links without TLS (and in tests); it is
// not authentication: that is mutual TLS's job.
//
// # Not here yet
//
// The drivers and transports. A decode driver allocates a Reserve's pages
// with kvcache.Pool.Reserve on a fresh Sequence; writes an accepted page
// with kvcache.Pool.ImportPage (Page.Data is kvcache's ExportPage wire
// form, checked to be HandoffPageBytes(filled) long) and reports
// WriteDone; on Deliver calls kvcache.Pool.CommitImport (a second,
// independent check of the fill counts) and hands the sequence to the
// scheduler; on Release releases it (scrubbed, I8); on Quarantine needs a
// pool call that quarantines without a violation, which kvcache does not
// offer yet. A prefill driver exports each page (ExportPage), digests it
// for PageReady and sends the same bytes on SendPage. Still to come as
// well: the in-process and TCP/mTLS transports, the gateway's side of the
// handshake and of the abort handshake, and retransmission of lost pages
// (today a handoff that loses a page fails by its lease, and the gateway
// retries with a new epoch).
package transfer
