package sched

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/request"
	"pgregory.net/rapid"
)

// lifecycleEvent is one event of the state × event table.
type lifecycleEvent struct {
	name  string
	apply func(*Lifecycle) error
}

var lifecycleEvents = []lifecycleEvent{
	{"admit", (*Lifecycle).Admit},
	{"start-prefill", (*Lifecycle).StartPrefill},
	{"handoff", (*Lifecycle).Handoff},
	{"start-decode", (*Lifecycle).StartDecode},
	{"preempt", (*Lifecycle).Preempt},
	{"finish-stop", func(l *Lifecycle) error { return l.Finish(request.FinishStop) }},
	{"finish-length", func(l *Lifecycle) error { return l.Finish(request.FinishLength) }},
	{"finish-abort", func(l *Lifecycle) error { return l.Finish(request.FinishAbort) }},
	{"reject", func(l *Lifecycle) error { return l.Reject(request.ErrOverloaded) }},
	{"abort-client", func(l *Lifecycle) error { return l.Abort(request.ErrAborted) }},
	{"abort-shutdown", func(l *Lifecycle) error { return l.Abort(request.ErrShuttingDown) }},
	{"abort-internal", func(l *Lifecycle) error { return l.Abort(request.ErrInternal) }},
	{"handed-off", (*Lifecycle).HandedOff},
}

// lifecycleIn returns a lifecycle in state s, reached through legal edges
// only (so terminal states carry a reason).
func lifecycleIn(t *testing.T, s State) Lifecycle {
	t.Helper()
	var l Lifecycle
	path := map[State][]func(*Lifecycle) error{
		StateReceived:   nil,
		StateAdmitted:   {(*Lifecycle).Admit},
		StatePrefilling: {(*Lifecycle).Admit, (*Lifecycle).StartPrefill},
		StateHandoff:    {(*Lifecycle).Admit, (*Lifecycle).StartPrefill, (*Lifecycle).Handoff},
		StateDecoding:   {(*Lifecycle).Admit, (*Lifecycle).StartPrefill, (*Lifecycle).Handoff, (*Lifecycle).StartDecode},
		StateFinished: {(*Lifecycle).Admit, (*Lifecycle).StartPrefill, (*Lifecycle).Handoff, (*Lifecycle).StartDecode,
			func(l *Lifecycle) error { return l.Finish(request.FinishLength) }},
		StateRejected: {func(l *Lifecycle) error { return l.Reject(request.ErrContextLength) }},
		StateAborted:  {(*Lifecycle).Admit, func(l *Lifecycle) error { return l.Abort(request.ErrAborted) }},
	}[s]
	for _, step := range path {
		if err := step(&l); err != nil {
			t.Fatalf("reaching %s: %v", s, err)
		}
	}
	if l.State() != s {
		t.Fatalf("reached %s, want %s", l.State(), s)
	}
	return l
}

// TestStateEventTable covers every (state, event) pair: the resulting state
// and reason, or the error with state and reason unchanged.
func TestStateEventTable(t *testing.T) {
	type outcome struct {
		State  string
		Reason string
		Err    string // "", "illegal", "terminal"
	}
	ok := func(s State, r request.FinishReason) outcome { return outcome{s.String(), r.String(), ""} }
	none := request.FinishNone
	abortOK := ok(StateAborted, request.FinishAbort)
	abortErr := ok(StateAborted, request.FinishError)
	rejected := ok(StateRejected, request.FinishError)
	illegal := func(s State, r request.FinishReason) outcome { return outcome{s.String(), r.String(), "illegal"} }
	terminal := func(s State, r request.FinishReason) outcome { return outcome{s.String(), r.String(), "terminal"} }

	// want[state][event], in the order of lifecycleEvents.
	want := map[State][]outcome{
		StateReceived: {
			ok(StateAdmitted, none), illegal(StateReceived, none), illegal(StateReceived, none), illegal(StateReceived, none),
			illegal(StateReceived, none), illegal(StateReceived, none), illegal(StateReceived, none), illegal(StateReceived, none),
			rejected, abortOK, abortOK, abortErr, illegal(StateReceived, none),
		},
		StateAdmitted: {
			illegal(StateAdmitted, none), ok(StatePrefilling, none), illegal(StateAdmitted, none), illegal(StateAdmitted, none),
			illegal(StateAdmitted, none), illegal(StateAdmitted, none), illegal(StateAdmitted, none), illegal(StateAdmitted, none),
			rejected, abortOK, abortOK, abortErr, illegal(StateAdmitted, none),
		},
		StatePrefilling: {
			illegal(StatePrefilling, none), illegal(StatePrefilling, none), ok(StateHandoff, none), illegal(StatePrefilling, none),
			ok(StateAdmitted, none), illegal(StatePrefilling, none), illegal(StatePrefilling, none), illegal(StatePrefilling, none),
			illegal(StatePrefilling, none), abortOK, abortOK, abortErr, illegal(StatePrefilling, none),
		},
		StateHandoff: {
			illegal(StateHandoff, none), illegal(StateHandoff, none), illegal(StateHandoff, none), ok(StateDecoding, none),
			ok(StateAdmitted, none), illegal(StateHandoff, none), illegal(StateHandoff, none), illegal(StateHandoff, none),
			illegal(StateHandoff, none), abortOK, abortOK, abortErr, ok(StateFinished, request.FinishLength),
		},
		StateDecoding: {
			illegal(StateDecoding, none), illegal(StateDecoding, none), illegal(StateDecoding, none), illegal(StateDecoding, none),
			ok(StateAdmitted, none), ok(StateFinished, request.FinishStop), ok(StateFinished, request.FinishLength), illegal(StateDecoding, none),
			illegal(StateDecoding, none), abortOK, abortOK, abortErr, illegal(StateDecoding, none),
		},
	}
	for _, s := range []State{StateFinished, StateRejected, StateAborted} {
		l := lifecycleIn(t, s)
		row := make([]outcome, len(lifecycleEvents))
		for i := range row {
			row[i] = terminal(s, l.Reason())
		}
		// Finish with a non-success reason is refused before the state
		// is looked at: still illegal, never terminal-overwritten.
		row[7] = illegal(s, l.Reason())
		want[s] = row
	}

	for s := State(0); s < numStates; s++ {
		for i, ev := range lifecycleEvents {
			t.Run(fmt.Sprintf("%s/%s", s, ev.name), func(t *testing.T) {
				l := lifecycleIn(t, s)
				beforeErr := l.Err()
				err := ev.apply(&l)
				got := outcome{l.State().String(), l.Reason().String(), ""}
				switch {
				case errors.Is(err, ErrTerminal):
					got.Err = "terminal"
				case errors.Is(err, ErrIllegalTransition):
					got.Err = "illegal"
				case err != nil:
					t.Fatalf("unexpected error kind: %v", err)
				}
				if diff := cmp.Diff(want[s][i], got); diff != "" {
					t.Errorf("(-want +got)\n%s", diff)
				}
				if err != nil && l.Err() != beforeErr {
					t.Errorf("failed event changed the terminal error from %v to %v", beforeErr, l.Err())
				}
				if l.State().Terminal() != (l.Reason() != request.FinishNone) {
					t.Errorf("state %s with reason %s: terminal iff reason set", l.State(), l.Reason())
				}
			})
		}
	}
}

// TestTerminalNeverOverwritten is the #33507 case: an abort recorded first
// stays an abort whatever arrives after it, and nothing after it reports
// success.
func TestTerminalNeverOverwritten(t *testing.T) {
	l := lifecycleIn(t, StateDecoding)
	if err := l.Abort(request.ErrAborted); err != nil {
		t.Fatal(err)
	}
	for _, ev := range lifecycleEvents {
		if err := ev.apply(&l); err == nil {
			t.Errorf("%s after abort succeeded", ev.name)
		}
	}
	if l.State() != StateAborted || l.Reason() != request.FinishAbort || !errors.Is(l.Err(), request.ErrAborted) {
		t.Errorf("after late events: %s %s %v, want StateAborted abort ErrAborted", l.State(), l.Reason(), l.Err())
	}
	if l.Reason().Success() {
		t.Error("aborted request reports success")
	}
}

func TestStateString(t *testing.T) {
	for s := State(0); s < numStates; s++ {
		if s.String() == "" || s.String()[0] == 'S' {
			t.Errorf("state %d has no name: %q", s, s.String())
		}
	}
	if got := State(200).String(); got != "State(200)" {
		t.Errorf("unknown state: %q", got)
	}
}

// TestLifecycleProperties drives a Lifecycle with random event sequences:
// a failed event changes nothing; once terminal, state, reason and error
// never change; Finished is reached only through Decoding (or, for the
// prefill half of a disaggregated request, Handoff) and is the only
// success.
func TestLifecycleProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var l Lifecycle
		n := rapid.IntRange(1, 40).Draw(t, "n")
		for range n {
			ev := lifecycleEvents[rapid.IntRange(0, len(lifecycleEvents)-1).Draw(t, "event")]
			before := l
			err := ev.apply(&l)
			if err != nil && l != before {
				t.Fatalf("%s failed (%v) but changed %+v to %+v", ev.name, err, before, l)
			}
			if before.State().Terminal() && l != before {
				t.Fatalf("%s changed terminal %+v to %+v", ev.name, before, l)
			}
			if l.State() == StateFinished && before.State() != StateFinished && before.State() != StateDecoding && (before.State() != StateHandoff || ev.name != "handed-off") {
				t.Fatalf("finished from %s", before.State())
			}
			if l.Reason().Success() != (l.State() == StateFinished) {
				t.Fatalf("state %s with reason %s", l.State(), l.Reason())
			}
		}
	})
}
