package transfer

import (
	"fmt"
	"strconv"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// Time is an instant on the driver's monotonic clock, in nanoseconds from
// an origin the driver picks; only differences matter. The cores never
// read a clock: time reaches them through Tick (and the constructors).
type Time int64

// Duration is a span of Time in nanoseconds; a time.Duration converts to
// it directly (Duration(5 * time.Second)).
type Duration int64

// Second is one second as a Duration.
const Second Duration = 1_000_000_000

// Add returns t+d, saturating instead of wrapping.
func (t Time) Add(d Duration) Time {
	s := t + Time(d)
	if d > 0 && s < t {
		return Time(1<<63 - 1)
	}
	if d < 0 && s > t {
		return Time(-1 << 63)
	}
	return s
}

func (d Duration) String() string {
	return strconv.FormatFloat(float64(d)/float64(Second), 'f', -1, 64) + "s"
}

// Peer names a node by its authenticated identity (the mutual-TLS
// certificate's name, I11). The cores only compare peers; the driver maps
// them to connections.
type Peer string

// ReservationID names one reservation of one receiver. Seq is never reused
// by a receiver, and Incarnation distinguishes one run of a receiver from
// the previous one (the driver draws it at random or takes it from its
// cluster lease), so a sender that outlived a decode node's restart cannot
// address a reservation of the new process by accident.
type ReservationID struct {
	Incarnation uint64
	Seq         uint64
}

// IsZero reports whether id was never set.
func (id ReservationID) IsZero() bool { return id == ReservationID{} }

func (id ReservationID) String() string { return fmt.Sprintf("%x.%d", id.Incarnation, id.Seq) }

// Reservation is what a receiver set aside for one handoff: the pages that
// will hold the prompt's KV, for one owner and epoch, until LeaseExpiry
// unless the sender's heartbeats renew it.
type Reservation struct {
	ID    ReservationID
	Owner request.Owner
	// Epoch is the gateway's attempt number for the request; a retried
	// handoff gets a new one, so a writer of an earlier attempt is stale.
	Epoch uint64
	// Pages are the decode pool's pages for the prompt, by logical index.
	// They are opaque to this package and never leave the receiver's node.
	Pages        []kvcache.PageID
	PromptTokens int
	MaxNewTokens int
	LeaseExpiry  Time
}

// Outcome is how a reservation (receiver) or a handoff (sender) ended. A
// reservation ends exactly once.
type Outcome uint8

const (
	OutcomeNone      Outcome = iota // not ended
	OutcomeCommitted                // receiver: validated and delivered to decode
	OutcomeAborted                  // validation failed or a party aborted
	OutcomeReaped                   // the lease expired
	OutcomeSent                     // sender: every page, the manifest and the commit left
)

func (o Outcome) String() string {
	switch o {
	case OutcomeNone:
		return "none"
	case OutcomeCommitted:
		return "committed"
	case OutcomeAborted:
		return "aborted"
	case OutcomeReaped:
		return "reaped"
	case OutcomeSent:
		return "sent"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// pagesFor is the number of pages tokens positions take.
func pagesFor(tokens, pageSize int) int {
	if tokens <= 0 || pageSize <= 0 {
		return 0
	}
	return (tokens + pageSize - 1) / pageSize
}

// expectedFilled is how many positions page index of a prompt of tokens
// positions holds: every page full except the last.
func expectedFilled(index, tokens, pageSize int) int {
	return max(0, min(pageSize, tokens-index*pageSize))
}
