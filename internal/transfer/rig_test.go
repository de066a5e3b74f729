package transfer

import (
	"fmt"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// effectsOf returns the effects of type T in es.
func effectsOf[T Effect](es []Effect) []T {
	var out []T
	for _, e := range es {
		if v, ok := e.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// sends returns the messages of type T sent to to.
func sends[T Message](es []Effect, to Peer) []T {
	var out []T
	for _, s := range effectsOf[*Send](es) {
		if v, ok := s.Msg.(T); ok && s.To == to {
			out = append(out, v)
		}
	}
	return out
}

// rig is a receiver with one reservation and the true pages of its
// prompt, for driving handoffs by hand.
type rig struct {
	t       *testing.T
	r       *Receiver
	now     Time
	res     Reservation
	data    [][]byte
	effects []Effect
	writes  map[int]WritePage // granted and not yet done
}

func newRig(t *testing.T, prompt int) *rig {
	t.Helper()
	r, err := NewReceiver(ReceiverConfig{Layout: testLayout(), Incarnation: 7}, 0)
	if err != nil {
		t.Fatal(err)
	}
	h := &rig{t: t, r: r, writes: map[int]WritePage{}}
	h.res = h.reserve(owner("org_a", 1), 3, prompt)
	for i := range h.res.Pages {
		h.data = append(h.data, pageBytes(1, i, expectedFilled(i, prompt, 16)))
	}
	return h
}

func (h *rig) reserve(o request.Owner, epoch uint64, prompt int) Reservation {
	h.t.Helper()
	req := Reserve{Owner: o, Epoch: epoch, PromptTokens: prompt, MaxNewTokens: 16, Sender: pf}
	n, err := h.r.PagesNeeded(gw, req)
	if err != nil {
		h.t.Fatal(err)
	}
	pages := make([]kvcache.PageID, n)
	for i := range pages {
		pages[i] = kvcache.PageID(100*epoch + uint64(i) + 1 + uint64(o.ID[0])*1000)
	}
	res, err := h.r.Reserve(gw, req, pages)
	if err != nil {
		h.t.Fatal(err)
	}
	h.drain()
	return res
}

func (h *rig) ref() Ref { return h.res.ref() }

// page is the true header and digest of page i.
func (h *rig) page(i int) PageArrived {
	f := expectedFilled(i, h.res.PromptTokens, 16)
	return PageArrived{Ref: h.ref(), Index: i, Filled: f, Digest: PageDigest(i, f, h.data[i])}
}

// manifest is the true manifest of the handoff.
func (h *rig) manifest() *Manifest {
	n := len(h.res.Pages)
	m := &Manifest{Ref: h.ref(), Layout: testLayout().Hash(), PageCount: n, Filled: make([]int, n),
		TotalTokens: h.res.PromptTokens, PageDigests: make([][32]byte, n), FirstToken: 42}
	for i := range n {
		p := h.page(i)
		m.Filled[i], m.PageDigests[i] = p.Filled, p.Digest
	}
	return m
}

// arrive delivers a page from pf and, if granted, completes its write.
func (h *rig) arrive(p PageArrived) error {
	return h.arriveFrom(pf, p, true)
}

func (h *rig) arriveFrom(from Peer, p PageArrived, complete bool) error {
	w, err := h.r.PageArrived(from, p)
	if err == nil {
		if w.ID != p.ID || w.Index != p.Index || w.Filled != p.Filled {
			h.t.Fatalf("write grant %+v for page %+v", w, p)
		}
		if complete {
			if err := h.r.WriteDone(w.ID, w.Index); err != nil {
				h.t.Fatalf("WriteDone: %v", err)
			}
		} else {
			h.writes[w.Index] = w
		}
	}
	h.drain()
	return err
}

func (h *rig) step(m Message) error {
	err := h.r.Step(pf, m)
	h.drain()
	return err
}

// sendAll sends every true page, the manifest and the commit.
func (h *rig) sendAll() {
	for i := range h.res.Pages {
		if err := h.arrive(h.page(i)); err != nil {
			h.t.Fatalf("page %d: %v", i, err)
		}
	}
	if err := h.step(h.manifest()); err != nil {
		h.t.Fatal(err)
	}
	if err := h.step(&Commit{h.ref()}); err != nil {
		h.t.Fatal(err)
	}
}

func (h *rig) tick(d Duration) {
	h.now = h.now.Add(d)
	h.r.Tick(h.now)
	h.drain()
}

func (h *rig) drain() []Effect {
	h.t.Helper()
	es := h.r.Ready()
	h.effects = append(h.effects, es...)
	if err := h.r.CheckInvariants(); err != nil && skipChecks == 0 {
		h.t.Fatalf("receiver invariants: %v", err)
	}
	return es
}

// ended returns the one Ended effect of the reservation, failing if there
// is not exactly one.
func (h *rig) ended() *Ended {
	h.t.Helper()
	var got []*Ended
	for _, e := range effectsOf[*Ended](h.effects) {
		if e.ID == h.res.ID {
			got = append(got, e)
		}
	}
	if len(got) != 1 {
		h.t.Fatalf("%d Ended effects for the reservation, want 1: %v", len(got), describe(h.effects))
	}
	return got[0]
}

func (h *rig) delivered() *Deliver {
	ds := effectsOf[*Deliver](h.effects)
	if len(ds) > 1 {
		h.t.Fatalf("%d deliveries", len(ds))
	}
	if len(ds) == 0 {
		return nil
	}
	return ds[0]
}

func describe(es []Effect) string {
	s := ""
	for _, e := range es {
		switch e := e.(type) {
		case *Send:
			s += fmt.Sprintf("\n  send %s %T %+v", e.To, e.Msg, e.Msg)
		default:
			s += fmt.Sprintf("\n  %T %+v", e, e)
		}
	}
	return s
}
