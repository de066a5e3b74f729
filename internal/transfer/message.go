package transfer

import (
	"fmt"

	"github.com/pagewarden/pagewarden/internal/request"
)

// MsgType is a frame's message type. Its values are part of the protocol.
type MsgType uint8

const (
	MsgHello     MsgType = 1 + iota // any ↔ any, first on a link
	MsgReserve                      // gateway → decode
	MsgGrant                        // decode → gateway (→ prefill)
	MsgPage                         // prefill → decode
	MsgManifest                     // prefill → decode
	MsgCommit                       // prefill → decode
	MsgCommitted                    // decode → gateway, prefill
	MsgAbort                        // any → the other parties
	MsgAbortAck                     // back to the aborting party, once drained
	MsgHeartbeat                    // prefill → decode: renew the lease
	MsgGenerate                     // gateway → decode: Reserve plus the request (job.go)
	MsgPrefill                      // gateway → prefill: compute and hand off a prompt
	MsgTokens                       // decode → gateway: generated tokens
	MsgResult                       // decode, prefill → gateway: a request's end
	MsgLoadQuery                    // gateway → prefill, decode: how loaded are you? (load.go)
	MsgLoad                         // prefill, decode → gateway: the answer
	numMsgTypes
)

var msgNames = [...]string{
	MsgHello: "hello", MsgReserve: "reserve", MsgGrant: "grant", MsgPage: "page",
	MsgManifest: "manifest", MsgCommit: "commit", MsgCommitted: "committed",
	MsgAbort: "abort", MsgAbortAck: "abort_ack", MsgHeartbeat: "heartbeat",
	MsgGenerate: "generate", MsgPrefill: "prefill", MsgTokens: "tokens", MsgResult: "result",
	MsgLoadQuery: "load_query", MsgLoad: "load",
}

func (t MsgType) String() string {
	if t >= MsgHello && t < numMsgTypes {
		return msgNames[t]
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

// Message is one protocol message: *Hello, *Reserve, *Grant, *Page,
// *Manifest, *Commit, *Committed, *Abort, *AbortAck or *Heartbeat.
type Message interface {
	Type() MsgType
}

// Ref names the reservation a message is about, with the owner and epoch
// its sender believes the reservation has. The receiver checks all three.
type Ref struct {
	ID    ReservationID
	Owner request.Owner
	Epoch uint64
}

func (r Ref) String() string {
	return fmt.Sprintf("%v %v epoch %d", r.ID, r.Owner, r.Epoch)
}

// ref returns the reservation's Ref.
func (r *Reservation) ref() Ref { return Ref{ID: r.ID, Owner: r.Owner, Epoch: r.Epoch} }

// Role is what a node does in the handoff.
type Role uint8

const (
	RoleGateway Role = 1 + iota
	RolePrefill
	RoleDecode
	numRoles
)

func (r Role) String() string {
	switch r {
	case RoleGateway:
		return "gateway"
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return fmt.Sprintf("Role(%d)", uint8(r))
}

// Limits are the limits (I5) two linked nodes must agree on, exchanged in
// Hello.
type Limits struct {
	MaxContext      int // W: prompt + max_tokens ≤ W
	MaxPromptTokens int
	PageSize        int
	PageBytes       int64
}

// LimitsOf is the Limits a layout implies with a prompt of at most W-1
// tokens (the scheduler's rule: a prompt leaves room for one token).
func LimitsOf(l Layout) Limits {
	return Limits{MaxContext: l.MaxContext, MaxPromptTokens: l.MaxContext - 1, PageSize: l.PageSize, PageBytes: l.PageBytes()}
}

// Hello opens every link: who the node is, the layout it computes KV in
// (fields and hash) and its limits. See CheckPeer.
type Hello struct {
	Node   Peer
	Role   Role
	Layout Layout
	Hash   LayoutHash
	Limits Limits
}

// Reserve asks a decode node to set aside pages for a request's prompt.
// Sender is the prefill node that will send the pages; no other node may.
type Reserve struct {
	Owner        request.Owner
	Epoch        uint64
	PromptTokens int
	MaxNewTokens int
	Sender       Peer
}

// Grant is a decode node's answer to Reserve: the reservation's id, how
// many pages the prompt must arrive in, and how long the lease lasts
// without a heartbeat. Page ids stay on the decode node.
type Grant struct {
	Ref
	PageCount    int
	PromptTokens int
	MaxNewTokens int
	LeaseTTL     Duration
}

// Page carries one page of KV: Filled positions of logical page Index.
// Data's format is the driver's (kvcache's export of a page); the protocol
// only digests it. A decoded Page's Data aliases the frame.
type Page struct {
	Ref
	Index  int
	Filled int
	Data   []byte
}

// Manifest is the sender's account of a whole handoff (I6): the layout it
// computed in, the pages by logical index with their filled counts and
// content digests, the prompt's length and the first sampled token.
type Manifest struct {
	Ref
	Layout      LayoutHash
	PageCount   int
	Filled      []int      // len PageCount
	TotalTokens int        // prompt positions written
	PageDigests [][32]byte // len PageCount; PageDigest(i, Filled[i], bytes of page i)
	FirstToken  int
	// FirstLogprobs are FirstToken's when the request asked for them
	// (logprobs.go), nil otherwise.
	FirstLogprobs *request.Logprobs
	// PromptLogprobs are the prompt's when the request asked for them
	// (logprobs.go, protocol 4), nil otherwise.
	PromptLogprobs []request.Logprobs
}

// Commit says the sender has sent every page and the manifest: the
// receiver may validate and hand the request to decode.
type Commit struct{ Ref }

// Committed tells the gateway and the sender that the receiver validated
// the handoff and the request is decoding.
type Committed struct{ Ref }

// Abort ends a handoff at every party it reaches. Each acknowledges with
// AbortAck once it has drained its writers.
type Abort struct {
	Ref
	Reason Reason
}

// AbortAck answers an Abort once the party holds nothing writable for the
// handoff: Drained is true when every writer finished and the pages were
// scrubbed and freed, false when a writer could not be drained and the
// pages were quarantined instead.
type AbortAck struct {
	Ref
	Drained bool
}

// Heartbeat renews the lease of a reservation while its sender works.
type Heartbeat struct{ Ref }

func (*Hello) Type() MsgType     { return MsgHello }
func (*Reserve) Type() MsgType   { return MsgReserve }
func (*Grant) Type() MsgType     { return MsgGrant }
func (*Page) Type() MsgType      { return MsgPage }
func (*Manifest) Type() MsgType  { return MsgManifest }
func (*Commit) Type() MsgType    { return MsgCommit }
func (*Committed) Type() MsgType { return MsgCommitted }
func (*Abort) Type() MsgType     { return MsgAbort }
func (*AbortAck) Type() MsgType  { return MsgAbortAck }
func (*Heartbeat) Type() MsgType { return MsgHeartbeat }
