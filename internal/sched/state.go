package sched

import (
	"errors"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/request"
)

// State is the one lifecycle state of a request (invariant I4). It lives in
// exactly one field, Lifecycle.state, and only the transition methods below
// change it.
type State uint8

const (
	// StateReceived: the request reached the node but has not been checked
	// against Limits yet.
	StateReceived State = iota
	// StateAdmitted: the request passed admission and waits in its tenant's
	// queue (first time, or again after a preemption).
	StateAdmitted
	// StatePrefilling: the request holds pages and its prompt (or, after a
	// preemption, its prompt plus generated tokens) is being computed.
	StatePrefilling
	// StateHandoff: the prompt's KV is complete and the first token sampled; in
	// a disaggregated deployment the KV is on its way to the decode node.
	StateHandoff
	// StateDecoding: the request generates one token per step.
	StateDecoding
	// StateFinished: generation ended normally (stop token or max_tokens).
	StateFinished
	// StateRejected: refused before it ever ran (limits, quota, overload).
	StateRejected
	// StateAborted: ended after admission for any other reason (client,
	// operator, shutdown, internal error).
	StateAborted
	numStates
)

var stateNames = [...]string{
	StateReceived:   "Received",
	StateAdmitted:   "Admitted",
	StatePrefilling: "Prefilling",
	StateHandoff:    "Handoff",
	StateDecoding:   "Decoding",
	StateFinished:   "Finished",
	StateRejected:   "Rejected",
	StateAborted:    "Aborted",
}

func (s State) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Terminal reports whether s is one of the three end states.
func (s State) Terminal() bool { return s == StateFinished || s == StateRejected || s == StateAborted }

// Running reports whether a request in state s holds KV pages.
func (s State) Running() bool { return s == StatePrefilling || s == StateHandoff || s == StateDecoding }

// Errors of the state machine.
var (
	// ErrIllegalTransition is returned when an event does not apply to the
	// current state. From outside input (a late step result, a duplicate
	// message) it is an ordinary error; when the scheduler's own logic
	// produced it, the caller reports it through package invariants.
	ErrIllegalTransition = errors.New("sched: illegal state transition")
	// ErrTerminal is the ErrIllegalTransition returned when the request
	// already ended: its terminal state and reason stay as they are.
	ErrTerminal = fmt.Errorf("%w: request already ended", ErrIllegalTransition)
)

// Lifecycle is a request's state plus, once terminal, its one reason. The
// zero value is a request in state Received.
type Lifecycle struct {
	state  State
	reason request.FinishReason
	err    error
}

// State is the current state.
func (l *Lifecycle) State() State { return l.state }

// Reason is the terminal reason (FinishNone while not terminal).
func (l *Lifecycle) Reason() request.FinishReason { return l.reason }

// Err is the terminal error (nil for Finished).
func (l *Lifecycle) Err() error { return l.err }

// move checks that the current state is one of from and moves to to.
func (l *Lifecycle) move(event string, to State, from ...State) error {
	for _, f := range from {
		if l.state == f {
			l.state = to
			return nil
		}
	}
	if l.state.Terminal() {
		return fmt.Errorf("%w: %s in state %s (%s)", ErrTerminal, event, l.state, l.reason)
	}
	return fmt.Errorf("%w: %s in state %s", ErrIllegalTransition, event, l.state)
}

// Admit moves Received → Admitted.
func (l *Lifecycle) Admit() error { return l.move("admit", StateAdmitted, StateReceived) }

// StartPrefill moves Admitted → Prefilling: pages were reserved.
func (l *Lifecycle) StartPrefill() error {
	return l.move("start-prefill", StatePrefilling, StateAdmitted)
}

// Handoff moves Prefilling → Handoff: the whole prompt was computed and the
// first token sampled.
func (l *Lifecycle) Handoff() error { return l.move("handoff", StateHandoff, StatePrefilling) }

// StartDecode moves Handoff → Decoding.
func (l *Lifecycle) StartDecode() error { return l.move("start-decode", StateDecoding, StateHandoff) }

// Preempt moves a running request (Prefilling, Handoff, Decoding) back to
// StateAdmitted: its pages were released and it will be recomputed.
func (l *Lifecycle) Preempt() error {
	return l.move("preempt", StateAdmitted, StatePrefilling, StateHandoff, StateDecoding)
}

// HandedOff moves Handoff → Finished (FinishLength): the prefill half of
// a disaggregated request succeeded once its prompt's KV and first token
// were handed out; decoding is another node's.
func (l *Lifecycle) HandedOff() error {
	if err := l.move("handed-off", StateFinished, StateHandoff); err != nil {
		return err
	}
	l.reason = request.FinishLength
	return nil
}

// Finish moves Decoding → Finished with reason stop or length. Any other
// reason is refused: Finished means success, nothing else.
func (l *Lifecycle) Finish(reason request.FinishReason) error {
	if !reason.Success() {
		return fmt.Errorf("%w: finish with non-success reason %s", ErrIllegalTransition, reason)
	}
	if err := l.move("finish", StateFinished, StateDecoding); err != nil {
		return err
	}
	l.reason = reason
	return nil
}

// Reject moves Received or Admitted → Rejected with cause (which must not
// be nil): the request never ran.
func (l *Lifecycle) Reject(cause error) error {
	if cause == nil {
		cause = request.ErrInternal
	}
	if err := l.move("reject", StateRejected, StateReceived, StateAdmitted); err != nil {
		return err
	}
	l.reason, l.err = request.FinishError, cause
	return nil
}

// Abort moves any non-terminal state → Aborted. A cause that is
// request.ErrAborted or request.ErrShuttingDown (or wraps one) gives reason
// FinishAbort; anything else (an internal error, a failed check) gives
// FinishError. Abort of a terminal request changes nothing and returns
// ErrTerminal, so that the caller can tell "already over" apart; callers
// handling client aborts treat that as success (abort is idempotent).
func (l *Lifecycle) Abort(cause error) error {
	if cause == nil {
		cause = request.ErrAborted
	}
	if err := l.move("abort", StateAborted, StateReceived, StateAdmitted, StatePrefilling, StateHandoff, StateDecoding); err != nil {
		return err
	}
	l.reason, l.err = request.FinishError, cause
	if errors.Is(cause, request.ErrAborted) || errors.Is(cause, request.ErrShuttingDown) {
		l.reason = request.FinishAbort
	}
	return nil
}
