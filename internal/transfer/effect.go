package transfer

import (
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// Effect is something a core asks its driver to do. Ready returns effects
// in the order they must be carried out: the cores rely on it (a Release
// comes before the AbortAck that reports it).
//
// Receiver effects: *Send, *Deliver, *Release, *Quarantine, *Fence,
// *Ended, *AbortDelivered. Sender effects: *Send, *SendPage,
// *ReleaseSource, *Ended.
type Effect interface{ effect() }

// Send asks the driver to frame Msg and send it to the node To.
type Send struct {
	To  Peer
	Msg Message
}

// Deliver: the handoff committed. The reservation's pages now belong to
// the decode scheduler, holding TotalTokens positions (Filled per page),
// and decoding starts from FirstToken. The receiver no longer tracks them.
type Deliver struct {
	Reservation
	Filled      []int
	TotalTokens int
	FirstToken  int
	// FirstLogprobs are FirstToken's, when the request asked for them.
	FirstLogprobs *request.Logprobs
	// PromptLogprobs are the prompt's, when the request asked for them
	// (the decode scheduler checks their count: sched.CommitImportPrompt).
	PromptLogprobs []request.Logprobs
}

// Release asks the driver to scrub and free the pages (kvcache.Release,
// I8). No writer of the receiver's is in flight on any of them.
type Release struct {
	ID     ReservationID
	Owner  request.Owner
	Pages  []kvcache.PageID
	Reason Reason
}

// Quarantine asks the driver to withhold the pages until an operator or
// the quarantine reaper scrubs them: a writer on one of them could not be
// drained (I7).
type Quarantine struct {
	ID     ReservationID
	Owner  request.Owner
	Pages  []kvcache.PageID
	Reason Reason
}

// Fence asks the driver to stop the writers still in flight on the given
// logical pages of a reservation (cancel the copy, close the stream that
// feeds it) and to treat a completion that arrives later as void. Their
// pages are quarantined, never freed.
type Fence struct {
	ID      ReservationID
	Indexes []int
	Pages   []kvcache.PageID
}

// Ended reports, exactly once per reservation (receiver) or handoff
// (sender), how it ended and why: for metrics, logs and the request's
// terminal state.
type Ended struct {
	Ref
	Outcome Outcome
	Reason  Reason
	Detail  string // for the operator's log only: it may name pages and owners
}

// AbortDelivered: an Abort arrived for a reservation that was already
// delivered. The request is the decode scheduler's now; the driver passes
// the abort on to it and answers From with AbortAck once the scheduler has
// released the request's pages.
type AbortDelivered struct {
	Ref
	From   Peer
	Reason Reason
}

// SendPage asks the sender's driver to read page Page.Index of the
// handoff from the prefill pool, frame it with Page's header and send it
// to To, then call Sender.Sent.
type SendPage struct {
	To   Peer
	Page Page // Data is nil: the driver reads it
}

// ReleaseSource tells the prefill driver that the handoff no longer needs
// its source pages: no read of them is in flight any more, and it may free
// them; or, with Quarantine, a read could not be drained in time and the
// pages must be withheld until scrubbed.
type ReleaseSource struct {
	Ref
	Quarantine bool
}

func (*Send) effect()           {}
func (*Deliver) effect()        {}
func (*Release) effect()        {}
func (*Quarantine) effect()     {}
func (*Fence) effect()          {}
func (*Ended) effect()          {}
func (*AbortDelivered) effect() {}
func (*SendPage) effect()       {}
func (*ReleaseSource) effect()  {}
