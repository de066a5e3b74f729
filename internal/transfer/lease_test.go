package transfer

import (
	"slices"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

const ttl = 10 * Second // the default lease

// TestLeaseExpiresWithoutWriter: a reservation nobody heartbeats is
// reaped at its lease's end: pages scrubbed and freed at once, gateway
// and sender told.
func TestLeaseExpiresWithoutWriter(t *testing.T) {
	h := newRig(t, 40)
	h.pages(0)
	h.tick(ttl - 1)
	if len(effectsOf[*Ended](h.effects)) != 0 {
		t.Fatal("reaped before the lease ended")
	}
	h.tick(1)
	if e := h.ended(); e.Outcome != OutcomeReaped || e.Reason != ReasonLeaseExpired || e.Detail != "no heartbeat" {
		t.Fatalf("ended %+v", e)
	}
	if rel := effectsOf[*Release](h.effects); len(rel) != 1 || !slices.Equal(rel[0].Pages, h.res.Pages) {
		t.Fatalf("release %v", rel)
	}
	for _, p := range []Peer{gw, pf} {
		if a := sends[*Abort](h.effects, p); len(a) != 1 || a[0].Reason != ReasonLeaseExpired {
			t.Fatalf("abort to %s: %v", p, a)
		}
	}
	if st := h.r.Stats(); st.Reaped != 1 || st.PagesHeld != 0 || st.PagesReleased != 3 {
		t.Fatalf("stats %+v", st)
	}
}

// TestHeartbeatRenews: heartbeats push the lease out, up to MaxLease.
func TestHeartbeatRenews(t *testing.T) {
	h := newRig(t, 40)
	for range 5 {
		h.tick(ttl / 2)
		if err := h.step(&Heartbeat{h.ref()}); err != nil {
			t.Fatal(err)
		}
	}
	if len(effectsOf[*Ended](h.effects)) != 0 {
		t.Fatal("reaped while heartbeating")
	}
	h.tick(ttl)
	if h.ended().Outcome != OutcomeReaped {
		t.Fatal("not reaped a lease after the last heartbeat")
	}

	// MaxLease caps a sender that heartbeats but never finishes.
	h = newRig(t, 40)
	maxLease := h.r.Config().MaxLease
	for h.now < Time(maxLease) {
		_ = h.step(&Heartbeat{h.ref()})
		h.tick(ttl / 4)
	}
	if e := h.ended(); e.Outcome != OutcomeReaped || !strings.Contains(e.Detail, "longest lease") {
		t.Fatalf("ended %+v", e)
	}
	if h.now > Time(maxLease+ttl/4) {
		t.Fatalf("reaped at %v, MaxLease is %v", Duration(h.now), maxLease)
	}
}

// TestNoRenewalAfterCommit: once the sender committed, heartbeats no
// longer extend the lease; pages still missing then never come, and the
// reservation is reaped, saying what was missing.
func TestNoRenewalAfterCommit(t *testing.T) {
	h := newRig(t, 40)
	h.pages(0, 2) // page 1 lost
	h.seal(h.manifest())
	h.tick(ttl / 2)
	_ = h.step(&Heartbeat{h.ref()})
	h.tick(ttl / 2)
	if e := h.ended(); e.Outcome != OutcomeReaped || e.Detail != "committed, 2 of 3 pages arrived, 0 writes in flight" {
		t.Fatalf("ended %+v", e)
	}
}

// TestLeaseExpiresWithWriterInFlight (I7): the reaper does not free a page
// that is still being written; the pages go when the write lands, and
// only then.
func TestLeaseExpiresWithWriterInFlight(t *testing.T) {
	h := newRig(t, 40)
	h.pages(0)
	if err := h.arriveFrom(pf, h.page(1), false); err != nil {
		t.Fatal(err)
	}
	h.tick(ttl)
	if h.ended().Outcome != OutcomeReaped {
		t.Fatal("not reaped")
	}
	if len(effectsOf[*Release](h.effects)) != 0 {
		t.Fatal("released with a writer in flight")
	}
	if st := h.r.Stats(); st.PagesHeld != 3 || st.WritesInFlight != 1 || st.Live != 1 {
		t.Fatalf("stats while draining %+v", st)
	}
	h.tick(Second)
	if err := h.r.WriteDone(h.res.ID, 1); err != nil {
		t.Fatal(err)
	}
	h.drain()
	if rel := effectsOf[*Release](h.effects); len(rel) != 1 || len(effectsOf[*Quarantine](h.effects)) != 0 {
		t.Fatalf("after the write landed: %s", describe(h.effects))
	}
}

// TestUndrainableWriterQuarantined (I7): a writer that does not finish
// within DrainTimeout is fenced and the pages are quarantined, never
// freed; the writer's late completion is void.
func TestUndrainableWriterQuarantined(t *testing.T) {
	h := newRig(t, 40)
	if err := h.arriveFrom(pf, h.page(2), false); err != nil {
		t.Fatal(err)
	}
	if err := h.r.Step(gw, &Abort{Ref: h.ref(), Reason: ReasonAborted}); err != nil {
		t.Fatal(err)
	}
	h.drain()
	drain := h.r.Config().DrainTimeout
	h.tick(drain - 1)
	if len(effectsOf[*Quarantine](h.effects)) != 0 || len(sends[*AbortAck](h.effects, gw)) != 0 {
		t.Fatal("gave up on the writer early, or acknowledged before draining")
	}
	h.tick(1)
	f := effectsOf[*Fence](h.effects)
	q := effectsOf[*Quarantine](h.effects)
	if len(f) != 1 || !slices.Equal(f[0].Indexes, []int{2}) || !slices.Equal(f[0].Pages, []kvcache.PageID{h.res.Pages[2]}) {
		t.Fatalf("fence %+v", f)
	}
	if len(q) != 1 || !slices.Equal(q[0].Pages, h.res.Pages) || len(effectsOf[*Release](h.effects)) != 0 {
		t.Fatalf("quarantine %v, releases %v", q, effectsOf[*Release](h.effects))
	}
	if a := sends[*AbortAck](h.effects, gw); len(a) != 1 || a[0].Drained {
		t.Fatalf("ack to the gateway %+v, want one not drained", a)
	}
	if err := h.r.WriteDone(h.res.ID, 2); ReasonOf(err) != ReasonLateWrite {
		t.Fatalf("fenced writer's completion: %v", err)
	}
	h.tick(h.r.Config().TombstoneTTL)
	if err := h.r.WriteDone(h.res.ID, 2); ReasonOf(err) != ReasonLateWrite {
		t.Fatalf("completion after the tombstone: %v", err)
	}
	if st := h.r.Stats(); st.VoidCompletions != 2 || st.PagesQuarantined != 3 || st.PagesReleased != 0 || st.PagesHeld != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// TestControlDrain: without the drain check the pages of an aborted
// reservation are released while a writer is still in flight on one of
// them: the bug of SGLang #24527 (the next request got the old KV).
func TestControlDrain(t *testing.T) {
	withSkipped(t, checkDrain)
	h := newRig(t, 40)
	if err := h.arriveFrom(pf, h.page(2), false); err != nil {
		t.Fatal(err)
	}
	_ = h.r.Step(gw, &Abort{Ref: h.ref(), Reason: ReasonAborted})
	h.drain()
	rel := effectsOf[*Release](h.effects)
	if len(rel) != 1 || !slices.Contains(rel[0].Pages, h.writes[2].Page) {
		t.Fatalf("with the check off, the page being written should have been released: %s", describe(h.effects))
	}
}

// TestReaperOrder: expired reservations are reaped in lease order,
// whatever order they were made in.
func TestReaperOrder(t *testing.T) {
	h := newRig(t, 40)
	first := h.res
	var ids []ReservationID
	for i := range 5 {
		h.tick(Second)
		ids = append(ids, h.reserve(owner("org_b", byte(10+i)), 1, 17).ID)
	}
	// Renew in reverse, a second apart: expiries now run backwards.
	for i := len(ids) - 1; i >= 0; i-- {
		h.tick(Second)
		res, _, _, _ := h.r.Lookup(ids[i])
		if err := h.r.Step(pf, &Heartbeat{res.ref()}); err != nil {
			t.Fatal(err)
		}
	}
	h.tick(3 * ttl)
	var order []ReservationID
	for _, e := range effectsOf[*Ended](h.effects) {
		order = append(order, e.ID)
	}
	want := append([]ReservationID{first.ID}, ids...)
	slices.Reverse(want[1:])
	if !slices.Equal(order, want) {
		t.Fatalf("reaped %v, want %v", order, want)
	}
}

// TestAbortHandshake: an abort from the gateway with a write in flight is
// acknowledged only after the write lands and the pages are released; the
// sender is told and the abort is sent again until it acknowledges.
func TestAbortHandshake(t *testing.T) {
	h := newRig(t, 40)
	if err := h.arriveFrom(pf, h.page(0), false); err != nil {
		t.Fatal(err)
	}
	if err := h.r.Step(gw, &Abort{Ref: h.ref(), Reason: ReasonAborted}); err != nil {
		t.Fatal(err)
	}
	h.drain()
	if e := h.ended(); e.Outcome != OutcomeAborted || e.Reason != ReasonAborted {
		t.Fatalf("ended %+v", e)
	}
	if len(sends[*Abort](h.effects, gw)) != 0 || len(sends[*Abort](h.effects, pf)) != 1 {
		t.Fatalf("aborts: %s", describe(h.effects))
	}
	if len(sends[*AbortAck](h.effects, gw)) != 0 {
		t.Fatal("acknowledged with a write in flight")
	}
	// A repeated abort from the gateway is acknowledged with the first.
	_ = h.r.Step(gw, &Abort{Ref: h.ref(), Reason: ReasonAborted})
	if err := h.r.WriteDone(h.res.ID, 0); err != nil {
		t.Fatal(err)
	}
	es := h.drain()
	if len(es) != 2 {
		t.Fatalf("after the write: %s", describe(es))
	}
	if _, ok := es[0].(*Release); !ok {
		t.Fatalf("the release must come before the ack: %s", describe(es))
	}
	if a, ok := es[1].(*Send); !ok || a.To != gw || !a.Msg.(*AbortAck).Drained {
		t.Fatalf("ack: %s", describe(es))
	}
	// The sender has not acknowledged: the abort goes again, and stops
	// once it does.
	h.tick(h.r.Config().RetryEvery)
	h.tick(h.r.Config().RetryEvery)
	if n := len(sends[*Abort](h.effects, pf)); n != 3 {
		t.Fatalf("%d aborts to the sender, want 3", n)
	}
	if err := h.r.Step(pf, &AbortAck{Ref: h.ref(), Drained: true}); err != nil {
		t.Fatal(err)
	}
	h.tick(5 * h.r.Config().RetryEvery)
	if n := len(sends[*Abort](h.effects, pf)); n != 3 {
		t.Fatalf("%d aborts to the sender after its ack", n)
	}
	// Later aborts are answered from the tombstone; once it is forgotten,
	// as for any reservation we hold nothing of.
	_ = h.r.Step(gw, &Abort{Ref: h.ref(), Reason: ReasonAborted})
	h.tick(h.r.Config().TombstoneTTL)
	if _, _, _, ok := h.r.Lookup(h.res.ID); ok {
		t.Fatal("tombstone not forgotten")
	}
	_ = h.r.Step(gw, &Abort{Ref: h.ref(), Reason: ReasonAborted})
	h.drain()
	if a := sends[*AbortAck](h.effects, gw); len(a) != 3 || !a[1].Drained || !a[2].Drained {
		t.Fatalf("acks %+v", a)
	}
}

// TestAbortBeforeGrant: the gateway may abort by owner and epoch before it
// has seen the reservation's id.
func TestAbortBeforeGrant(t *testing.T) {
	h := newRig(t, 40)
	r := h.ref()
	r.ID = ReservationID{}
	if err := h.r.Step(gw, &Abort{Ref: r, Reason: ReasonAborted}); err != nil {
		t.Fatal(err)
	}
	h.drain()
	if e := h.ended(); e.Outcome != OutcomeAborted {
		t.Fatalf("ended %+v", e)
	}
}

// TestAbortAfterCommit: the request belongs to the decode scheduler now;
// the abort is handed on to it, not acknowledged by the transfer core.
func TestAbortAfterCommit(t *testing.T) {
	h := newRig(t, 40)
	h.sendAll()
	if err := h.r.Step(gw, &Abort{Ref: h.ref(), Reason: ReasonAborted}); err != nil {
		t.Fatal(err)
	}
	h.drain()
	ad := effectsOf[*AbortDelivered](h.effects)
	if len(ad) != 1 || ad[0].From != gw || ad[0].Ref != h.ref() || len(sends[*AbortAck](h.effects, gw)) != 0 {
		t.Fatalf("%s", describe(h.effects))
	}
	if e := h.ended(); e.Outcome != OutcomeCommitted {
		t.Fatal("an abort after the commit changed the outcome")
	}
}

// TestLocalAbort: the decode node aborts on its own (shutdown): both
// parties are told.
func TestLocalAbort(t *testing.T) {
	h := newRig(t, 40)
	if err := h.r.Abort(h.res.ID, ReasonShutdown); err != nil {
		t.Fatal(err)
	}
	h.drain()
	if len(sends[*Abort](h.effects, gw)) != 1 || len(sends[*Abort](h.effects, pf)) != 1 || h.ended().Reason != ReasonShutdown {
		t.Fatalf("%s", describe(h.effects))
	}
	if err := h.r.Abort(h.res.ID, ReasonShutdown); ReasonOf(err) != ReasonLateWrite {
		t.Fatalf("second abort: %v", err)
	}
}
