package link

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// Transport carries transfer messages between authenticated nodes. It is
// what the transfer drivers use; Inproc and GRPC implement it, and
// another (RDMA, shared memory) needs only these three methods.
type Transport interface {
	// Send frames m and sends it to the node named to, opening a link
	// first if there is none. It returns once the link has taken the
	// frame, or with an error: the link to that node failed (ErrPeerDown),
	// there is no way to reach it (ErrNoRoute), the handshake failed
	// (transfer.ErrPeer, ErrAuth, ErrHandshake), the transport is closed
	// (ErrClosed) or m cannot be framed (transfer.ErrFrame). A nil error
	// is not a delivery receipt: the protocol's own answers are. Send does
	// not retain m. Messages to one node arrive in the order Send took
	// them, except that a transport with page streams (GRPC) orders Page
	// frames only among themselves: a Manifest or Commit may overtake the
	// last pages, which the transfer Receiver allows for (it commits once
	// the pages the manifest announces have arrived). If ctx ends while
	// the link is blocked taking the frame (the receiver is slow), the
	// link is closed: a half-sent frame cannot be taken back.
	Send(ctx context.Context, to transfer.Peer, m transfer.Message) error
	// Inbox delivers what arrived, in order per link: messages, each with
	// the sender's authenticated identity, and a PeerDown event when a link
	// ends. It is closed after Close.
	Inbox() <-chan Inbound
	// Close ends every link and waits for the transport's goroutines.
	// Frames not yet delivered are dropped; Close does not produce PeerDown
	// events at this node.
	Close() error
}

// Inbound is one arrival. Exactly one of Msg and Down is set.
type Inbound struct {
	// From is the sender as its certificate (or, in process, its Join)
	// names it: never what a frame says.
	From Identity
	// Msg is the decoded message; a Page's Data is the receiver's own.
	Msg transfer.Message
	// Down reports that a link with From ended (ErrPeerDown wrapping the
	// cause): what it would have carried next will not arrive on it. The
	// driver aborts the handoffs From takes part in; the next Send to From
	// opens a new link.
	Down error
}

// Errors of the links. Handshake failures also wrap transfer.ErrPeer
// (limits or layout differ: a *transfer.PeerMismatch names the field).
var (
	ErrClosed    = errors.New("link: transport closed")
	ErrNoRoute   = errors.New("link: no route to node")
	ErrPeerDown  = errors.New("link: link to node down")
	ErrPolicy    = errors.New("link: message refused by role policy")
	ErrHandshake = errors.New("link: handshake failed")
)

// Options are what every transport takes. The zero value is usable.
type Options struct {
	// Policy is the role/message rule applied to every message received
	// (nil: DefaultPolicy).
	Policy Policy
	// InboxSize bounds the inbox (default 64 arrivals). A link whose
	// arrivals the driver does not take stops reading, so the sender is
	// held back by the transport's flow control: memory stays bounded by
	// InboxSize plus a frame per link.
	InboxSize int
	// HandshakeTimeout bounds the exchange of Hellos on a new link
	// (default 10s).
	HandshakeTimeout time.Duration
	// MaxLinksPerPeer bounds the links one node may hold open to this one
	// at once (default 4).
	MaxLinksPerPeer int
	// Logger receives refusals (warn) and link changes (info); nil
	// discards.
	Logger *slog.Logger
}

func (o *Options) withDefaults() {
	if o.Policy == nil {
		o.Policy = DefaultPolicy
	}
	if o.InboxSize <= 0 {
		o.InboxSize = 64
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.MaxLinksPerPeer <= 0 {
		o.MaxLinksPerPeer = 4
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Stats are a transport's counters.
type Stats struct {
	Sent      uint64 // frames taken by a link
	Received  uint64 // messages delivered to the inbox
	Refused   uint64 // links closed for a bad frame, handshake or the policy
	LinksUp   uint64 // links opened (handshake passed)
	LinksDown uint64 // links that ended while the transport was open
	Links     int    // links open now
}
