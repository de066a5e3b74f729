package transfer

import (
	"errors"
	"fmt"
)

// Reason says why a handoff failed or a message was refused. It travels in
// Abort messages, so its values are part of the protocol: append, never
// renumber.
type Reason uint16

const (
	ReasonNone Reason = iota
	// Checks of the manifest and pages against the reservation (I6).
	ReasonPageCountMismatch   // pages announced or received ≠ pages reserved
	ReasonWrongTenant         // a message names another tenant
	ReasonWrongRequest        // a message names another request
	ReasonStaleEpoch          // a message of another attempt, or a superseded reservation
	ReasonLayoutMismatch      // the manifest's layout hash is not the receiver's
	ReasonDigestMismatch      // a page's bytes are not the ones the manifest names
	ReasonFilledMismatch      // a page's filled count is not what the prompt implies
	ReasonTotalTokensMismatch // the manifest's tokens ≠ the reserved prompt
	ReasonDuplicate           // two different versions of one page or manifest
	ReasonMalformed           // a message that is inconsistent in itself
	// Messages that are refused without touching a reservation.
	ReasonLateWrite          // for a reservation that has ended
	ReasonUnknownReservation // for a reservation this receiver never made
	ReasonWrongPeer          // from a node that is not a party to the reservation
	// Ends that are not a mismatch.
	ReasonLeaseExpired  // no heartbeat (or no commit) within the lease
	ReasonAborted       // the client or the gateway gave up on the request
	ReasonShutdown      // a node is shutting down
	ReasonPrefillFailed // the prefill node could not compute the prompt
	ReasonOverloaded    // the prefill node had no room for the prompt in time (retry elsewhere or later)
	numReasons
)

var reasonNames = [...]string{
	ReasonNone:                "none",
	ReasonPageCountMismatch:   "page_count_mismatch",
	ReasonWrongTenant:         "wrong_tenant",
	ReasonWrongRequest:        "wrong_request",
	ReasonStaleEpoch:          "stale_epoch",
	ReasonLayoutMismatch:      "layout_mismatch",
	ReasonDigestMismatch:      "digest_mismatch",
	ReasonFilledMismatch:      "filled_mismatch",
	ReasonTotalTokensMismatch: "total_tokens_mismatch",
	ReasonDuplicate:           "duplicate",
	ReasonMalformed:           "malformed",
	ReasonLateWrite:           "late_write",
	ReasonUnknownReservation:  "unknown_reservation",
	ReasonWrongPeer:           "wrong_peer",
	ReasonLeaseExpired:        "lease_expired",
	ReasonAborted:             "aborted",
	ReasonShutdown:            "shutting_down",
	ReasonPrefillFailed:       "prefill_failed",
	ReasonOverloaded:          "overloaded",
}

// String is a stable snake_case name, fit for a metric label or a log
// field. A value from a newer peer prints as Reason(n).
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint16(r))
}

// Mismatch reports whether r is a failed check of the handoff's contents
// (as opposed to a timeout, a refusal or a party's decision to abort).
func (r Reason) Mismatch() bool { return r >= ReasonPageCountMismatch && r <= ReasonMalformed }

// Errors returned by the cores' input methods. Both wrap a *Failure, so
// ReasonOf tells why.
var (
	// ErrRefused: the input was not applied; no reservation changed.
	ErrRefused = errors.New("transfer: refused")
	// ErrAborted: the input made the reservation (or handoff) abort.
	ErrAborted = errors.New("transfer: aborted")
	// ErrInvalid: the caller (the driver) passed something unusable.
	ErrInvalid = errors.New("transfer: invalid argument")
	// ErrDuplicate: a Reserve for an owner and epoch that already has a
	// reservation; its grant was sent again.
	ErrDuplicate = errors.New("transfer: duplicate reservation")
)

// Failure is the error a core returns for a refused input or an abort.
type Failure struct {
	Kind   error // ErrRefused or ErrAborted
	Reason Reason
	ID     ReservationID
	Detail string // for the operator's log; may name pages and owners
}

func (f *Failure) Error() string {
	s := f.Kind.Error() + ": " + f.Reason.String()
	if !f.ID.IsZero() {
		s += " (reservation " + f.ID.String() + ")"
	}
	if f.Detail != "" {
		s += ": " + f.Detail
	}
	return s
}

func (f *Failure) Unwrap() error { return f.Kind }

// ReasonOf returns the Reason of an error a core returned, ReasonNone for
// nil or any other error.
func ReasonOf(err error) Reason {
	var f *Failure
	if errors.As(err, &f) {
		return f.Reason
	}
	return ReasonNone
}

func refused(id ReservationID, r Reason, format string, args ...any) error {
	return &Failure{Kind: ErrRefused, Reason: r, ID: id, Detail: fmt.Sprintf(format, args...)}
}

func aborted(id ReservationID, r Reason, format string, args ...any) error {
	return &Failure{Kind: ErrAborted, Reason: r, ID: id, Detail: fmt.Sprintf(format, args...)}
}
