package transfer

import (
	"crypto/sha256"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/kvcache"
)

var checkNames = map[check]string{
	checkTenant: "tenant", checkRequest: "request", checkEpoch: "epoch", checkLayout: "layout",
	checkPageCount: "page count", checkFilled: "filled", checkTotalTokens: "total tokens",
	checkDigest: "digest", checkDuplicate: "duplicate", checkLateWrite: "late write",
	checkDrain: "drain", checkPeer: "peer", checkSenderPrompt: "sender prompt",
}

// checkReason is the reason each check aborts with.
var checkReason = map[check]Reason{
	checkTenant: ReasonWrongTenant, checkRequest: ReasonWrongRequest, checkEpoch: ReasonStaleEpoch,
	checkLayout: ReasonLayoutMismatch, checkPageCount: ReasonPageCountMismatch, checkFilled: ReasonFilledMismatch,
	checkTotalTokens: ReasonTotalTokensMismatch, checkDigest: ReasonDigestMismatch, checkDuplicate: ReasonDuplicate,
}

func (c check) String() string {
	var names []string
	for b := check(1); b != 0 && b <= c; b <<= 1 {
		if c&b != 0 {
			names = append(names, checkNames[b])
		}
	}
	return strings.Join(names, "+")
}

// badHandoff is a handoff that must not commit. send plays the sender's
// side completely, commit included.
type badHandoff struct {
	name   string
	send   func(h *rig)
	reason Reason // with every check on
	// catchers are the checks that catch it: with all of them disabled it
	// commits, and each one alone still catches it. 0: a bound that no
	// check may skip (the page has nowhere to go).
	catchers check
}

// The reservation in every case: a prompt of 120 tokens, 8 pages of 16,
// the last holding 8.
const badPrompt = 120

func otherLayoutHash() LayoutHash {
	l := testLayout()
	l.ModelDigest = sha256.Sum256([]byte("another model"))
	return l.Hash()
}

// pages sends the true pages with indexes idx.
func (h *rig) pages(idx ...int) {
	for _, i := range idx {
		_ = h.arrive(h.page(i))
	}
}

func (h *rig) allPages() []int {
	idx := make([]int, len(h.res.Pages))
	for i := range idx {
		idx[i] = i
	}
	return idx
}

// seal sends m and a commit.
func (h *rig) seal(m *Manifest) {
	_ = h.step(m)
	_ = h.step(&Commit{m.Ref})
}

// bytesPage is page i made of data holding filled positions.
func (h *rig) bytesPage(i, filled int, data []byte) PageArrived {
	return PageArrived{Ref: h.ref(), Index: i, Filled: filled, Digest: PageDigest(i, filled, data)}
}

var badHandoffs = []badHandoff{
	{
		// The incident: prefill replaced the prompt by a 1-token
		// placeholder and sent one page for the eight reserved.
		name: "incident: 1 placeholder page for 8 reserved",
		send: func(h *rig) {
			p := h.bytesPage(0, 1, pageBytes(9, 0, 1))
			_ = h.arrive(p)
			h.seal(&Manifest{Ref: h.ref(), Layout: testLayout().Hash(), PageCount: 1, Filled: []int{1}, TotalTokens: 1,
				PageDigests: [][32]byte{p.Digest}, FirstToken: 7})
		},
		reason:   ReasonPageCountMismatch,
		catchers: checkPageCount | checkTotalTokens | checkFilled,
	},
	{
		name: "fewer pages: 7 of 8, manifest of 7",
		send: func(h *rig) {
			h.pages(0, 1, 2, 3, 4, 5, 6)
			m := h.manifest()
			m.PageCount, m.Filled, m.PageDigests, m.TotalTokens = 7, m.Filled[:7], m.PageDigests[:7], 7*16
			h.seal(m)
		},
		reason:   ReasonPageCountMismatch,
		catchers: checkPageCount | checkTotalTokens,
	},
	{
		name: "more pages: a manifest of 9 for 8",
		send: func(h *rig) {
			// The sender believes the prompt is 130 tokens: page 7 full
			// and a ninth page of 2 that it never gets to send.
			m := h.manifest()
			h.pages(0, 1, 2, 3, 4, 5, 6)
			p7 := h.bytesPage(7, 16, pageBytes(1, 7, 16))
			_ = h.arrive(p7)
			m.PageCount, m.TotalTokens = 9, 130
			m.Filled = append(m.Filled[:7], 16, 2)
			m.PageDigests = append(m.PageDigests[:7], p7.Digest, PageDigest(8, 2, pageBytes(1, 8, 2)))
			h.seal(m)
		},
		reason:   ReasonPageCountMismatch,
		catchers: checkPageCount | checkTotalTokens | checkFilled,
	},
	{
		name: "a page beyond the reservation",
		send: func(h *rig) {
			h.pages(h.allPages()...)
			_ = h.arrive(h.bytesPage(8, 2, pageBytes(1, 8, 2)))
			h.seal(h.manifest())
		},
		reason: ReasonPageCountMismatch,
	},
	{
		name: "wrong tenant in the manifest",
		send: func(h *rig) {
			h.pages(h.allPages()...)
			m := h.manifest()
			m.Owner.Tenant = "org_b"
			h.seal(m)
		},
		reason:   ReasonWrongTenant,
		catchers: checkTenant,
	},
	{
		name: "wrong tenant on a page",
		send: func(h *rig) {
			h.pages(0, 1, 3, 4, 5, 6, 7)
			p := h.page(2)
			p.Owner.Tenant = "org_b"
			_ = h.arrive(p)
			h.seal(h.manifest())
		},
		reason:   ReasonWrongTenant,
		catchers: checkTenant,
	},
	{
		name: "wrong request",
		send: func(h *rig) {
			h.pages(h.allPages()...)
			m := h.manifest()
			m.Owner.ID[3] ^= 1
			h.seal(m)
		},
		reason:   ReasonWrongRequest,
		catchers: checkRequest,
	},
	{
		name: "stale epoch: a writer of the previous attempt",
		send: func(h *rig) {
			for i := range h.res.Pages {
				p := h.page(i)
				p.Epoch--
				_ = h.arrive(p)
			}
			m := h.manifest()
			m.Epoch--
			h.seal(m)
		},
		reason:   ReasonStaleEpoch,
		catchers: checkEpoch,
	},
	{
		name: "layout of another model",
		send: func(h *rig) {
			h.pages(h.allPages()...)
			m := h.manifest()
			m.Layout = otherLayoutHash()
			h.seal(m)
		},
		reason:   ReasonLayoutMismatch,
		catchers: checkLayout,
	},
	{
		name: "corrupted page bytes",
		send: func(h *rig) {
			h.pages(0, 1, 2, 4, 5, 6, 7)
			bad := pageBytes(1, 3, 16)
			bad[5] ^= 0x10
			_ = h.arrive(h.bytesPage(3, 16, bad))
			h.seal(h.manifest())
		},
		reason:   ReasonDigestMismatch,
		catchers: checkDigest,
	},
	{
		name: "two pages' bytes swapped",
		send: func(h *rig) {
			h.pages(0, 1, 4, 5, 6, 7)
			_ = h.arrive(h.bytesPage(2, 16, h.data[3]))
			_ = h.arrive(h.bytesPage(3, 16, h.data[2]))
			h.seal(h.manifest())
		},
		reason:   ReasonDigestMismatch,
		catchers: checkDigest,
	},
	{
		name: "filled counts shifted between pages",
		send: func(h *rig) {
			// Page 2 holds 15 positions and page 7 holds 9: the total is
			// still 120, and the sender digested what it claims.
			m := h.manifest()
			for i := range h.res.Pages {
				f := m.Filled[i]
				switch i {
				case 2:
					f = 15
				case 7:
					f = 9
				}
				p := h.bytesPage(i, f, pageBytes(1, i, f))
				_ = h.arrive(p)
				m.Filled[i], m.PageDigests[i] = f, p.Digest
			}
			h.seal(m)
		},
		reason:   ReasonFilledMismatch,
		catchers: checkFilled,
	},
	{
		name: "total tokens off by one",
		send: func(h *rig) {
			h.pages(h.allPages()...)
			m := h.manifest()
			m.TotalTokens = badPrompt - 1
			h.seal(m)
		},
		reason:   ReasonTotalTokensMismatch,
		catchers: checkTotalTokens,
	},
	{
		name: "two different copies of a page",
		send: func(h *rig) {
			h.pages(h.allPages()...)
			bad := pageBytes(2, 3, 16)
			_ = h.arrive(h.bytesPage(3, 16, bad))
			h.seal(h.manifest())
		},
		reason:   ReasonDuplicate,
		catchers: checkDuplicate | checkDigest,
	},
	{
		name: "two different manifests",
		send: func(h *rig) {
			h.pages(h.allPages()...)
			_ = h.step(h.manifest())
			m := h.manifest()
			m.FirstToken++
			h.seal(m)
		},
		reason:   ReasonDuplicate,
		catchers: checkDuplicate,
	},
}

// TestBadHandoffs: every bad handoff aborts with its reason; its pages are
// released, never delivered, and the gateway and the sender are told why.
func TestBadHandoffs(t *testing.T) {
	for _, tc := range badHandoffs {
		t.Run(tc.name, func(t *testing.T) {
			h := newRig(t, badPrompt)
			tc.send(h)
			if d := h.delivered(); d != nil {
				t.Fatalf("committed: %+v", d)
			}
			if e := h.ended(); e.Outcome != OutcomeAborted || e.Reason != tc.reason {
				t.Fatalf("ended %v (%v: %s), want aborted (%v)", e.Outcome, e.Reason, e.Detail, tc.reason)
			}
			rel := effectsOf[*Release](h.effects)
			if len(rel) != 1 || !slices.Equal(rel[0].Pages, h.res.Pages) || len(effectsOf[*Quarantine](h.effects)) != 0 {
				t.Fatalf("releases %v, want one of %v", rel, h.res.Pages)
			}
			for _, p := range []Peer{gw, pf} {
				if a := sends[*Abort](h.effects, p); len(a) != 1 || a[0].Reason != tc.reason || a[0].Ref != h.ref() {
					t.Fatalf("aborts to %s: %v", p, a)
				}
			}
			if st := h.r.Stats(); st.Live != 0 || st.PagesHeld != 0 || st.Aborted != 1 || st.Committed != 0 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestBadHandoffControls are the positive controls of I6: for each bad
// handoff, disabling exactly the checks that catch it lets it commit (so
// those checks, and nothing else, stand between it and decode), and each
// of them alone still catches it. Every check of the receiver's manifest
// validation is shown to be necessary by at least one case.
func TestBadHandoffControls(t *testing.T) {
	var covered check
	for _, tc := range badHandoffs {
		if tc.catchers == 0 {
			continue
		}
		covered |= tc.catchers
		t.Run(tc.name+"/without "+tc.catchers.String(), func(t *testing.T) {
			withSkipped(t, tc.catchers)
			h := newRig(t, badPrompt)
			tc.send(h)
			d := h.delivered()
			if d == nil {
				t.Fatalf("with %v disabled it still did not commit: the case does not test what it claims\n%s", tc.catchers, describe(h.effects))
			}
			// What decode would now attend: all eight reserved pages.
			if !slices.Equal(d.Pages, h.res.Pages) {
				t.Fatalf("delivered %v", d.Pages)
			}
		})
		for c := check(1); c <= tc.catchers; c <<= 1 {
			if tc.catchers&c == 0 {
				continue
			}
			t.Run(tc.name+"/only "+c.String(), func(t *testing.T) {
				withSkipped(t, tc.catchers&^c)
				h := newRig(t, badPrompt)
				tc.send(h)
				if e := h.ended(); e.Outcome != OutcomeAborted || e.Reason != checkReason[c] {
					t.Fatalf("with only %v of %v: %v (%v), want %v", c, tc.catchers, e.Outcome, e.Reason, checkReason[c])
				}
			})
		}
	}
	want := checkTenant | checkRequest | checkEpoch | checkLayout | checkPageCount | checkFilled | checkTotalTokens | checkDigest | checkDuplicate
	if covered != want {
		t.Errorf("checks without a control among the bad handoffs: %v", want&^covered)
	}
}

// TestGoodHandoff: the true handoff commits, once, with exactly what was
// reserved, and the parties are told.
func TestGoodHandoff(t *testing.T) {
	for _, prompt := range []int{1, 15, 16, 17, badPrompt, 1008} {
		h := newRig(t, prompt)
		h.sendAll()
		d := h.delivered()
		if d == nil {
			t.Fatalf("prompt %d: not committed: %s", prompt, describe(h.effects))
		}
		want := &Deliver{Reservation: h.res, Filled: h.manifest().Filled, TotalTokens: prompt, FirstToken: 42}
		if diff := cmp.Diff(want, d); diff != "" {
			t.Fatalf("prompt %d: delivery (-want +got):\n%s", prompt, diff)
		}
		if e := h.ended(); e.Outcome != OutcomeCommitted || e.Reason != ReasonNone {
			t.Fatalf("ended %+v", e)
		}
		if len(sends[*Committed](h.effects, gw)) != 1 || len(sends[*Committed](h.effects, pf)) != 1 {
			t.Fatal("gateway or sender not told of the commit")
		}
		if len(effectsOf[*Release](h.effects)) != 0 || h.r.Stats().PagesHeld != 0 {
			t.Fatal("committed pages released or still held")
		}
	}
}

// TestReorderedAndDuplicated: pages, manifest and commit in any order,
// each possibly repeated, commit exactly once with exactly the truth;
// every page is written once, the copies are refused as duplicates.
func TestReorderedAndDuplicated(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := range 300 {
		h := newRig(t, 1+rng.IntN(200))
		type msg struct {
			page int // -1 manifest, -2 commit
		}
		var msgs []msg
		for i := range h.res.Pages {
			msgs = append(msgs, msg{i})
		}
		msgs = append(msgs, msg{-1}, msg{-2})
		for range rng.IntN(len(msgs) + 1) {
			msgs = append(msgs, msgs[rng.IntN(len(msgs))])
		}
		rng.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
		writes, dups := 0, 0
		committed := false
		for _, m := range msgs {
			var err error
			switch m.page {
			case -1:
				err = h.step(h.manifest())
			case -2:
				err = h.step(&Commit{h.ref()})
			default:
				w, e := h.r.PageArrived(pf, h.page(m.page))
				if err = e; e == nil {
					writes++
					if err := h.r.WriteDone(w.ID, w.Index); err != nil {
						t.Fatal(err)
					}
				}
				h.drain()
			}
			switch {
			case err == nil:
			case ReasonOf(err) == ReasonDuplicate && !committed:
				dups++
			case ReasonOf(err) == ReasonLateWrite && committed:
			default:
				t.Fatalf("trial %d: %v", trial, err)
			}
			committed = h.delivered() != nil
		}
		if !committed || writes != len(h.res.Pages) || h.ended().Outcome != OutcomeCommitted {
			t.Fatalf("trial %d: committed %v, %d writes for %d pages", trial, committed, writes, len(h.res.Pages))
		}
		if d := h.delivered(); d.TotalTokens != h.res.PromptTokens || !slices.Equal(d.Filled, h.manifest().Filled) {
			t.Fatalf("trial %d: delivered %+v", trial, d)
		}
		if got := h.r.Stats().Duplicates; got != uint64(dups) {
			t.Fatalf("trial %d: %d duplicates counted, %d seen", trial, got, dups)
		}
	}
}

// TestWritesBeforeCommit: the commit waits for every write in flight, so
// decode never attends a page still being written.
func TestWritesBeforeCommit(t *testing.T) {
	h := newRig(t, 40)
	h.pages(0, 1)
	if err := h.arriveFrom(pf, h.page(2), false); err != nil {
		t.Fatal(err)
	}
	h.seal(h.manifest())
	if h.delivered() != nil {
		t.Fatal("committed with a write in flight")
	}
	if err := h.r.WriteDone(h.res.ID, 2); err != nil {
		t.Fatal(err)
	}
	h.drain()
	if h.delivered() == nil {
		t.Fatal("not committed once the write landed")
	}
}

// TestRefusedMessages: messages that cannot concern a reservation are
// refused without touching it, and the handoff then commits normally.
func TestRefusedMessages(t *testing.T) {
	tests := []struct {
		name   string
		do     func(h *rig) error
		reason Reason
		reply  func(h *rig) bool
	}{
		{"page from a stranger", func(h *rig) error { return h.arriveFrom(pf2, h.page(0), true) }, ReasonWrongPeer,
			func(h *rig) bool {
				a := sends[*Abort](h.effects, pf2)
				return len(a) == 1 && a[0].Reason == ReasonWrongPeer
			}},
		{"manifest from a stranger", func(h *rig) error { return h.r.Step(pf2, h.manifest()) }, ReasonWrongPeer, nil},
		{"commit from the gateway", func(h *rig) error { return h.r.Step(gw, &Commit{h.ref()}) }, ReasonWrongPeer, nil},
		{"abort from a stranger", func(h *rig) error { return h.r.Step(pf2, &Abort{Ref: h.ref(), Reason: ReasonAborted}) }, ReasonUnknownReservation,
			func(h *rig) bool { a := sends[*AbortAck](h.effects, pf2); return len(a) == 1 && a[0].Drained }},
		{"abort for another epoch", func(h *rig) error {
			r := h.ref()
			r.Epoch++
			return h.r.Step(gw, &Abort{Ref: r, Reason: ReasonAborted})
		}, ReasonUnknownReservation, nil},
		{"page for an unknown reservation", func(h *rig) error {
			p := h.page(0)
			p.ID.Seq += 100
			return h.arrive(p)
		}, ReasonUnknownReservation,
			func(h *rig) bool {
				a := sends[*Abort](h.effects, pf)
				return len(a) == 1 && a[0].Reason == ReasonUnknownReservation && a[0].ID.Seq == h.res.ID.Seq+100
			}},
		{"page of a previous incarnation", func(h *rig) error {
			p := h.page(0)
			p.ID.Incarnation--
			return h.arrive(p)
		}, ReasonUnknownReservation, nil},
		{"abort ack never asked for", func(h *rig) error { return h.r.Step(pf, &AbortAck{Ref: h.ref(), Drained: true}) }, ReasonUnknownReservation, nil},
		{"grant sent to a receiver", func(h *rig) error { return h.r.Step(gw, &Grant{Ref: h.ref()}) }, ReasonMalformed, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newRig(t, 40)
			err := tc.do(h)
			h.drain()
			if !errors.Is(err, ErrRefused) || ReasonOf(err) != tc.reason {
				t.Fatalf("err %v, want refused (%v)", err, tc.reason)
			}
			if tc.reply != nil && !tc.reply(h) {
				t.Fatalf("no reply to the refused message: %s", describe(h.effects))
			}
			if len(effectsOf[*Ended](h.effects)) != 0 {
				t.Fatal("a refused message ended the reservation")
			}
			h.sendAll()
			if h.delivered() == nil {
				t.Fatal("the reservation did not survive a refused message")
			}
		})
	}
}

// TestControlPeer: without the peer check, a node the gateway never named
// gets to write into the reservation's pages.
func TestControlPeer(t *testing.T) {
	withSkipped(t, checkPeer)
	h := newRig(t, 40)
	w, err := h.r.PageArrived(pf2, h.page(0))
	if err != nil || w.Page != h.res.Pages[0] {
		t.Fatalf("stranger's page: %+v, %v; with the check off it should have been granted", w, err)
	}
}

// TestLateWrites: after a reservation ended, nothing is written into its
// pages: a page after the commit is refused (decode owns them), and so is
// one after an abort released them.
func TestLateWrites(t *testing.T) {
	t.Run("after commit", func(t *testing.T) {
		h := newRig(t, 40)
		h.sendAll()
		bad := pageBytes(5, 1, 16)
		if err := h.arrive(h.bytesPage(1, 16, bad)); ReasonOf(err) != ReasonLateWrite {
			t.Fatalf("page after commit: %v", err)
		}
		if err := h.step(&Heartbeat{h.ref()}); ReasonOf(err) != ReasonLateWrite {
			t.Fatalf("heartbeat after commit: %v", err)
		}
	})
	t.Run("after release", func(t *testing.T) {
		h := newRig(t, 40)
		h.pages(0)
		if err := h.r.Step(gw, &Abort{Ref: h.ref(), Reason: ReasonAborted}); err != nil {
			t.Fatal(err)
		}
		h.drain()
		if len(effectsOf[*Release](h.effects)) != 1 {
			t.Fatal("not released")
		}
		if err := h.arrive(h.page(1)); ReasonOf(err) != ReasonLateWrite || !errors.Is(err, ErrRefused) {
			t.Fatalf("page after release: %v", err)
		}
		if err := h.step(h.manifest()); ReasonOf(err) != ReasonLateWrite {
			t.Fatalf("manifest after release: %v", err)
		}
	})
}

// TestControlLateWrite: without the late-write check, a page arriving
// after the abort is granted a write into a page already released, and a
// page arriving after the commit one into a page decode now owns.
func TestControlLateWrite(t *testing.T) {
	t.Run("released", func(t *testing.T) {
		withSkipped(t, checkLateWrite)
		h := newRig(t, 40)
		h.pages(0)
		_ = h.r.Step(gw, &Abort{Ref: h.ref(), Reason: ReasonAborted})
		h.drain()
		released := effectsOf[*Release](h.effects)[0].Pages
		w, err := h.r.PageArrived(pf, h.page(1))
		if err != nil || !slices.Contains(released, w.Page) {
			t.Fatalf("late page: %+v, %v; want a write into released page %v", w, err, released[1])
		}
	})
	t.Run("delivered", func(t *testing.T) {
		withSkipped(t, checkLateWrite|checkDuplicate)
		h := newRig(t, 40)
		h.sendAll()
		w, err := h.r.PageArrived(pf, h.bytesPage(1, 16, pageBytes(5, 1, 16)))
		if err != nil || w.Page != h.delivered().Pages[1] {
			t.Fatalf("late page: %+v, %v; want a write into delivered page", w, err)
		}
	})
}

// TestReserve: what a reservation may be asked for, repeated, superseded.
func TestReserve(t *testing.T) {
	h := newRig(t, 40)
	o := h.res.Owner
	req := Reserve{Owner: o, Epoch: 3, PromptTokens: 40, MaxNewTokens: 16, Sender: pf}

	// A repeated Reserve is answered with the same grant, nothing allocated.
	if n, err := h.r.PagesNeeded(gw, req); n != 0 || !errors.Is(err, ErrDuplicate) {
		t.Fatalf("repeated reserve: %d, %v", n, err)
	}
	if g := sends[*Grant](h.drain(), gw); len(g) != 1 || g[0].Ref != h.ref() || g[0].PageCount != 3 {
		t.Fatalf("grant re-sent: %+v", g)
	}
	// The same epoch with other numbers, or an earlier epoch: refused.
	if _, err := h.r.PagesNeeded(gw, Reserve{Owner: o, Epoch: 3, PromptTokens: 41, MaxNewTokens: 16, Sender: pf}); ReasonOf(err) != ReasonDuplicate {
		t.Fatalf("other numbers: %v", err)
	}
	if _, err := h.r.PagesNeeded(gw, Reserve{Owner: o, Epoch: 2, PromptTokens: 40, MaxNewTokens: 16, Sender: pf}); ReasonOf(err) != ReasonStaleEpoch {
		t.Fatalf("earlier epoch: %v", err)
	}
	// A later epoch supersedes the live reservation.
	old := h.res
	h.res = h.reserve(o, 4, 40)
	var superseded *Ended
	for _, e := range effectsOf[*Ended](h.effects) {
		if e.ID == old.ID {
			superseded = e
		}
	}
	if superseded == nil || superseded.Reason != ReasonStaleEpoch {
		t.Fatalf("epoch 3 not aborted by epoch 4: %s", describe(h.effects))
	}
	// The old attempt's writer is refused; the new one commits.
	p := h.page(0)
	p.Ref = old.ref()
	if err := h.arrive(p); ReasonOf(err) != ReasonLateWrite {
		t.Fatalf("old attempt's page: %v", err)
	}
	h.sendAll()
	if h.delivered() == nil {
		t.Fatal("epoch 4 did not commit")
	}

	invalid := []Reserve{
		{Owner: owner("org_a", 9), Epoch: 1, PromptTokens: 0, MaxNewTokens: 1, Sender: pf},
		{Owner: owner("org_a", 9), Epoch: 1, PromptTokens: 1000, MaxNewTokens: 25, Sender: pf}, // over the window
		{Owner: owner("org_a", 9), Epoch: 1, PromptTokens: 1 << 62, MaxNewTokens: 1 << 62, Sender: pf},
		{Owner: owner("org_a", 9), Epoch: 1, PromptTokens: 10, MaxNewTokens: 0, Sender: pf},
		{Owner: owner("", 9), Epoch: 1, PromptTokens: 10, MaxNewTokens: 1, Sender: pf},
		{Owner: owner("org_a", 9), Epoch: 1, PromptTokens: 10, MaxNewTokens: 1},
	}
	for _, req := range invalid {
		if _, err := h.r.PagesNeeded(gw, req); !errors.Is(err, ErrInvalid) {
			t.Errorf("%+v: %v", req, err)
		}
	}
	good := Reserve{Owner: owner("org_a", 9), Epoch: 1, PromptTokens: 17, MaxNewTokens: 1, Sender: pf}
	if _, err := h.r.Reserve(gw, good, []kvcache.PageID{900}); !errors.Is(err, ErrInvalid) {
		t.Errorf("one page for two: %v", err)
	}
	lenient(t)
	if _, err := h.r.Reserve(gw, good, []kvcache.PageID{900, 900}); err == nil {
		t.Error("the same page twice accepted")
	}
	if _, err := h.r.Reserve(gw, good, []kvcache.PageID{0, 901}); err == nil {
		t.Error("page 0 accepted")
	}
	if h.r.Stats().PagesHeld != 0 {
		t.Errorf("refused reservations hold pages: %+v", h.r.Stats())
	}
}

func TestReceiverConfig(t *testing.T) {
	for name, cfg := range map[string]ReceiverConfig{
		"no incarnation": {Layout: testLayout()},
		"bad layout":     {Layout: Layout{}, Incarnation: 1},
		"max below ttl":  {Layout: testLayout(), Incarnation: 1, LeaseTTL: 10 * Second, MaxLease: Second},
		"negative drain": {Layout: testLayout(), Incarnation: 1, DrainTimeout: -1},
	} {
		if _, err := NewReceiver(cfg, 0); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	r, err := NewReceiver(ReceiverConfig{Layout: testLayout(), Incarnation: 1}, 0)
	if err != nil || r.Config().LeaseTTL != 10*Second || r.Config().DrainTimeout != 5*Second {
		t.Fatalf("defaults: %+v, %v", r.Config(), err)
	}
}
