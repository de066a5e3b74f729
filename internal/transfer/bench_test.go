package transfer

import (
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// A page of a small real model: 30 layers, 3 KV heads of 64, F16, 16
// positions: 2*30*16*192*2 bytes.
const benchPageBytes = 2 * 30 * 16 * 192 * 2

func benchPage() *Page {
	return &Page{Ref: sampleRef(), Index: 3, Filled: 16, Data: make([]byte, benchPageBytes)}
}

func BenchmarkEncodePage(b *testing.B) {
	p := benchPage()
	buf := make([]byte, 0, benchPageBytes+256)
	b.SetBytes(benchPageBytes)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = AppendFrame(buf[:0], p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodePage(b *testing.B) {
	f, err := EncodeFrame(benchPage())
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchPageBytes)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeFrame(f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkPageDigest(b *testing.B) {
	data := make([]byte, benchPageBytes)
	b.SetBytes(benchPageBytes)
	b.ReportAllocs()
	for b.Loop() {
		PageDigest(3, 16, data)
	}
}

// BenchmarkReceiverHandoff is the core's bookkeeping for one handoff of 64
// pages (digests precomputed): reserve, pages, writes, manifest, commit.
func BenchmarkReceiverHandoff(b *testing.B) {
	r, err := NewReceiver(ReceiverConfig{Layout: testLayout(), Incarnation: 1}, 0)
	if err != nil {
		b.Fatal(err)
	}
	const prompt = 64 * 16
	l := testLayout()
	l.MaxContext = 2 * prompt
	r.cfg.Layout, r.hash = l, l.Hash()
	pages := make([]kvcache.PageID, 64)
	for i := range pages {
		pages[i] = kvcache.PageID(i + 1)
	}
	m := &Manifest{Layout: l.Hash(), PageCount: 64, Filled: make([]int, 64), TotalTokens: prompt, PageDigests: make([][32]byte, 64)}
	for i := range 64 {
		m.Filled[i], m.PageDigests[i] = 16, PageDigest(i, 16, []byte{byte(i)})
	}
	b.ReportAllocs()
	n := byte(0)
	for b.Loop() {
		n++
		res, err := r.Reserve(gw, Reserve{Owner: owner("org_a", n), Epoch: 1, PromptTokens: prompt, MaxNewTokens: 1, Sender: pf}, pages)
		if err != nil {
			b.Fatal(err)
		}
		for i := range 64 {
			w, err := r.PageArrived(pf, PageArrived{Ref: res.ref(), Index: i, Filled: 16, Digest: m.PageDigests[i]})
			if err != nil {
				b.Fatal(err)
			}
			_ = r.WriteDone(w.ID, w.Index)
		}
		m.Ref = res.ref()
		_ = r.Step(pf, m)
		_ = r.Step(pf, &Commit{res.ref()})
		if len(effectsOf[*Deliver](r.Ready())) != 1 {
			b.Fatal("not delivered")
		}
		r.Tick(r.now.Add(2 * r.cfg.TombstoneTTL)) // forget it
	}
}
