package transfer

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const dc Peer = "decode-1"

// srig is a sender serving one grant of a prompt, with its true pages.
type srig struct {
	t       *testing.T
	s       *Sender
	now     Time
	g       Grant
	data    [][]byte
	effects []Effect
}

func newSrig(t *testing.T, prompt int) *srig {
	t.Helper()
	s, err := NewSender(SenderConfig{Layout: testLayout()}, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := &srig{t: t, s: s}
	h.g = Grant{Ref: sampleRef(), PageCount: pagesFor(prompt, 16), PromptTokens: prompt, MaxNewTokens: 16, LeaseTTL: 10 * Second}
	for i := range h.g.PageCount {
		h.data = append(h.data, pageBytes(3, i, expectedFilled(i, prompt, 16)))
	}
	if err := s.Start(h.g, dc, gw); err != nil {
		t.Fatal(err)
	}
	h.drain()
	return h
}

func (h *srig) drain() []Effect {
	h.t.Helper()
	es := h.s.Ready()
	h.effects = append(h.effects, es...)
	if err := h.s.CheckInvariants(); err != nil {
		h.t.Fatalf("sender invariants: %v", err)
	}
	return es
}

func (h *srig) ready(i int) error {
	f := expectedFilled(i, h.g.PromptTokens, 16)
	err := h.s.PageReady(h.g.ID, i, f, PageDigest(i, f, h.data[i]))
	h.drain()
	return err
}

func (h *srig) sent(i int) {
	h.t.Helper()
	if err := h.s.Sent(h.g.ID, i); err != nil {
		h.t.Fatal(err)
	}
	h.drain()
}

func (h *srig) tick(d Duration) {
	h.now = h.now.Add(d)
	h.s.Tick(h.now)
	h.drain()
}

func (h *srig) ended() *Ended {
	h.t.Helper()
	es := effectsOf[*Ended](h.effects)
	if len(es) != 1 {
		h.t.Fatalf("%d Ended effects: %s", len(es), describe(h.effects))
	}
	return es[0]
}

// TestSenderHandoff: pages go out as prefill finishes them; the manifest
// and the commit only once every page has left and the first token is
// known; then the source pages are released.
func TestSenderHandoff(t *testing.T) {
	h := newSrig(t, 40)
	for i := range 3 {
		if err := h.ready(i); err != nil {
			t.Fatal(err)
		}
	}
	sp := effectsOf[*SendPage](h.effects)
	if len(sp) != 3 || sp[2].To != dc || sp[2].Page.Ref != h.g.Ref || sp[2].Page.Index != 2 || sp[2].Page.Filled != 8 {
		t.Fatalf("send pages: %s", describe(h.effects))
	}
	h.sent(0)
	h.sent(2)
	if err := h.s.PrefillDone(h.g.ID, 40, 42, nil); err != nil {
		t.Fatal(err)
	}
	h.drain()
	if len(sends[*Manifest](h.effects, dc)) != 0 {
		t.Fatal("manifest sent while page 1 is still being read")
	}
	h.sent(1)
	m := sends[*Manifest](h.effects, dc)
	want := &Manifest{Ref: h.g.Ref, Layout: testLayout().Hash(), PageCount: 3, Filled: []int{16, 16, 8}, TotalTokens: 40,
		PageDigests: [][32]byte{PageDigest(0, 16, h.data[0]), PageDigest(1, 16, h.data[1]), PageDigest(2, 8, h.data[2])}, FirstToken: 42}
	if len(m) != 1 || cmp.Diff(want, m[0]) != "" {
		t.Fatalf("manifest (-want +got):\n%s", cmp.Diff(want, m))
	}
	tail := h.effects[len(h.effects)-4:]
	if _, ok := tail[1].(*Send).Msg.(*Commit); !ok || tail[2].(*ReleaseSource).Quarantine || tail[3].(*Ended).Outcome != OutcomeSent {
		t.Fatalf("after the manifest: %s", describe(tail))
	}
	if st := h.s.Stats(); st.Active != 0 || st.Sent != 1 {
		t.Fatalf("stats %+v", st)
	}
	// The handoff is forgotten; a later Abort is simply acknowledged.
	if err := h.s.Step(dc, &Abort{Ref: h.g.Ref, Reason: ReasonDigestMismatch}); err != nil {
		t.Fatal(err)
	}
	if a := sends[*AbortAck](h.drain(), dc); len(a) != 1 || !a[0].Drained {
		t.Fatalf("ack %+v", a)
	}
}

// TestSenderHeartbeats: the lease is renewed while prefill works, at
// least three times per lease, and no longer once the handoff is sealed.
func TestSenderHeartbeats(t *testing.T) {
	h := newSrig(t, 40)
	for range 10 {
		h.tick(Second)
	}
	if n := len(sends[*Heartbeat](h.effects, dc)); n != 5 { // every 2s
		t.Fatalf("%d heartbeats in 10s", n)
	}
	for i := range 3 {
		_ = h.ready(i)
		h.sent(i)
	}
	_ = h.s.PrefillDone(h.g.ID, 40, 1, nil)
	h.drain()
	for range 10 {
		h.tick(Second)
	}
	if n := len(sends[*Heartbeat](h.effects, dc)); n != 5 {
		t.Fatalf("heartbeats after the seal: %d", n)
	}

	// A short lease is renewed three times per lease.
	s, _ := NewSender(SenderConfig{Layout: testLayout()}, 0)
	g := h.g
	g.LeaseTTL = 900_000_000
	_ = s.Start(g, dc, gw)
	var es []Effect
	for now := Time(0); now <= 900_000_000; now += 100_000_000 {
		s.Tick(now)
		es = append(es, s.Ready()...)
	}
	if n := len(sends[*Heartbeat](es, dc)); n != 3 {
		t.Fatalf("%d heartbeats in one 0.9s lease", n)
	}
}

// TestSenderChecksPrompt: the sender refuses to hand off a prompt other
// than the one the grant was for (the incident's placeholder).
func TestSenderChecksPrompt(t *testing.T) {
	tests := []struct {
		name   string
		do     func(h *srig) error
		reason Reason
	}{
		{"a page of the wrong size", func(h *srig) error {
			return h.s.PageReady(h.g.ID, 0, 1, PageDigest(0, 1, pageBytes(9, 0, 1)))
		}, ReasonFilledMismatch},
		{"fewer tokens", func(h *srig) error {
			for i := range 3 {
				_ = h.ready(i)
			}
			return h.s.PrefillDone(h.g.ID, 39, 5, nil)
		}, ReasonTotalTokensMismatch},
		{"pages missing", func(h *srig) error {
			_ = h.ready(0)
			_ = h.ready(1)
			return h.s.PrefillDone(h.g.ID, 40, 5, nil)
		}, ReasonPageCountMismatch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newSrig(t, 40)
			if err := tc.do(h); !errors.Is(err, ErrAborted) || ReasonOf(err) != tc.reason {
				t.Fatalf("err %v, want aborted (%v)", err, tc.reason)
			}
			h.drain()
			if e := h.ended(); e.Outcome != OutcomeAborted || e.Reason != tc.reason {
				t.Fatalf("ended %+v", e)
			}
			if len(sends[*Abort](h.effects, dc)) != 1 || len(sends[*Abort](h.effects, gw)) != 1 || len(sends[*Manifest](h.effects, dc)) != 0 {
				t.Fatalf("%s", describe(h.effects))
			}
		})
	}
}

// TestControlSenderPrompt: without the sender's own check the placeholder
// handoff goes out, and the receiver's checks are what stop it.
func TestControlSenderPrompt(t *testing.T) {
	withSkipped(t, checkSenderPrompt)
	h := newSrig(t, 120)
	placeholder := pageBytes(9, 0, 1)
	if err := h.s.PageReady(h.g.ID, 0, 1, PageDigest(0, 1, placeholder)); err != nil {
		t.Fatal(err)
	}
	h.sent(0)
	if err := h.s.PrefillDone(h.g.ID, 1, 7, nil); err != nil {
		t.Fatal(err)
	}
	h.drain()
	m := sends[*Manifest](h.effects, dc)
	if len(m) != 1 || m[0].PageCount != 1 || m[0].TotalTokens != 1 {
		t.Fatalf("with the check off the placeholder should have gone out: %s", describe(h.effects))
	}

	// The same handoff into a receiver with its checks on.
	skipChecks = 0
	r := newRig(t, 120)
	m[0].Ref = r.ref()
	_ = r.arrive(r.bytesPage(0, 1, placeholder))
	r.seal(m[0])
	if e := r.ended(); e.Outcome != OutcomeAborted || e.Reason != ReasonPageCountMismatch || r.delivered() != nil {
		t.Fatalf("receiver: %+v", e)
	}
}

// TestSenderAbort: an abort from decode stops the pages; the
// acknowledgement waits for the read in flight; the gateway is told too,
// until it acknowledges.
func TestSenderAbort(t *testing.T) {
	h := newSrig(t, 40)
	_ = h.ready(0)
	h.sent(0)
	_ = h.ready(1) // read in flight
	if err := h.s.Step(dc, &Abort{Ref: h.g.Ref, Reason: ReasonDigestMismatch}); err != nil {
		t.Fatal(err)
	}
	h.drain()
	if e := h.ended(); e.Outcome != OutcomeAborted || e.Reason != ReasonDigestMismatch {
		t.Fatalf("ended %+v", e)
	}
	if len(sends[*Abort](h.effects, gw)) != 1 || len(sends[*Abort](h.effects, dc)) != 0 || len(sends[*AbortAck](h.effects, dc)) != 0 {
		t.Fatalf("%s", describe(h.effects))
	}
	if err := h.ready(2); ReasonOf(err) != ReasonLateWrite {
		t.Fatalf("page after the abort: %v", err)
	}
	if err := h.s.PrefillDone(h.g.ID, 40, 1, nil); ReasonOf(err) != ReasonLateWrite {
		t.Fatalf("prefill done after the abort: %v", err)
	}
	h.sent(1)
	es := h.effects[len(h.effects)-2:]
	if rs, ok := es[0].(*ReleaseSource); !ok || rs.Quarantine {
		t.Fatalf("after the read: %s", describe(es))
	}
	if a, ok := es[1].(*Send); !ok || a.To != dc || !a.Msg.(*AbortAck).Drained {
		t.Fatalf("after the read: %s", describe(es))
	}
	h.tick(Second)
	if n := len(sends[*Abort](h.effects, gw)); n != 2 {
		t.Fatalf("%d aborts to the gateway", n)
	}
	_ = h.s.Step(gw, &AbortAck{Ref: h.g.Ref, Drained: true})
	h.drain()
	if _, _, ok := h.s.Outcome(h.g.ID); ok {
		t.Fatal("not forgotten once drained and acknowledged")
	}
	if n := len(effectsOf[*SendPage](h.effects)); n != 2 {
		t.Fatalf("%d pages sent, want the 2 ready before the abort", n)
	}
}

// TestSenderUndrainableRead: a read that does not finish within
// DrainTimeout leaves the source pages quarantined.
func TestSenderUndrainableRead(t *testing.T) {
	h := newSrig(t, 40)
	_ = h.ready(0)
	if err := h.s.Abort(h.g.ID, ReasonPrefillFailed); err != nil {
		t.Fatal(err)
	}
	_ = h.s.Step(gw, &Abort{Ref: h.g.Ref, Reason: ReasonAborted})
	h.drain()
	h.tick(5 * Second)
	rs := effectsOf[*ReleaseSource](h.effects)
	if len(rs) != 1 || !rs[0].Quarantine {
		t.Fatalf("release %+v", rs)
	}
	if a := sends[*AbortAck](h.effects, gw); len(a) != 1 || a[0].Drained {
		t.Fatalf("ack %+v", a)
	}
	if err := h.s.Sent(h.g.ID, 0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("late read completion: %v", err)
	}
	h.tick(60 * Second)
	if _, _, ok := h.s.Outcome(h.g.ID); ok {
		t.Fatal("aborted handoff never forgotten")
	}
}

func TestSenderRefuses(t *testing.T) {
	h := newSrig(t, 40)
	if err := h.s.Start(h.g, dc, gw); !errors.Is(err, ErrDuplicate) {
		t.Fatalf("same grant twice: %v", err)
	}
	g := h.g
	g.PromptTokens++
	if err := h.s.Start(g, dc, gw); !errors.Is(err, ErrInvalid) {
		t.Fatalf("other grant, same id: %v", err)
	}
	if err := h.s.PageReady(h.g.ID, 3, 16, [32]byte{}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("page beyond the grant: %v", err)
	}
	_ = h.ready(0)
	if err := h.ready(0); !errors.Is(err, ErrInvalid) {
		t.Fatalf("page ready twice: %v", err)
	}
	other := h.g.Ref
	other.Epoch++
	if err := h.s.Step(dc, &Abort{Ref: other, Reason: ReasonAborted}); ReasonOf(err) != ReasonWrongPeer {
		t.Fatalf("abort naming another epoch: %v", err)
	}
	if err := h.s.Step(pf2, &Abort{Ref: h.g.Ref, Reason: ReasonAborted}); ReasonOf(err) != ReasonWrongPeer {
		t.Fatalf("abort from a stranger: %v", err)
	}
	if h.s.Stats().Active != 1 {
		t.Fatal("a refused abort stopped the handoff")
	}
	// A grant whose page count does not fit this node's page size.
	s, _ := NewSender(SenderConfig{Layout: testLayout()}, 0)
	g = h.g
	g.ID.Seq++
	g.PageCount = 5
	if err := s.Start(g, dc, gw); ReasonOf(err) != ReasonPageCountMismatch {
		t.Fatalf("grant of 5 pages for 40 tokens: %v", err)
	}
}
