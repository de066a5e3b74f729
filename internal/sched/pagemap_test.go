package sched

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched/ownerecho"
)

// TestPageMap: the map agrees with the ledger page by page, marks a
// reservation's pages as in transfer, counts each tenant's queue, running
// requests and pages, and keeps a quarantined page's last owner.
func TestPageMap(t *testing.T) {
	defer invariants.SetStrict(invariants.SetStrict(false))
	o := harnessOpts{window: 32, pageSize: 4, pages: 24, batchTokens: 64, maxRunning: 3}
	h := newHarness(t, o)
	h.submit(t, "acme", 9, 8) // 3 pages after the first step
	h.submit(t, "beta", 5, 8) // 2 pages
	h.step(t)
	p := h.mkParams("gamma", 6, 4)
	a, _ := h.lim.Admit(p)
	reserved, err := h.core.Reserve(a)
	if err != nil {
		t.Fatal(err)
	}
	h.params[p.Owner] = p
	h.submit(t, "beta", 4, 8) // waits: MaxRunning is 3

	m := h.core.PageMap(nil)
	if m.PageSize != 4 || len(m.Pages) != 24 {
		t.Fatalf("page size %d, %d pages", m.PageSize, len(m.Pages))
	}
	if want := slices.Sorted(slices.Values(reserved)); !cmp.Equal(m.InTransfer, want) {
		t.Errorf("in transfer %v, want %v", m.InTransfer, want)
	}
	owners := map[request.Tenant]int{}
	for i, c := range m.Pages {
		id := kvcache.PageID(i + 1)
		info, _ := h.pool.Page(id)
		if c != info {
			t.Fatalf("page %d: map %+v, ledger %+v", id, c, info)
		}
		if c.State == kvcache.PageOwned {
			owners[c.Owner.Tenant]++
			if c.Seq == 0 || c.Epoch == 0 {
				t.Errorf("owned page %d without sequence or epoch: %+v", id, c)
			}
		}
	}
	if want := (map[request.Tenant]int{"acme": 3, "beta": 2, "gamma": 2}); !cmp.Equal(owners, want) {
		t.Errorf("owned pages by tenant %v, want %v", owners, want)
	}
	want := []TenantLoad{
		{Tenant: "acme", Pages: 3, Running: 1},
		{Tenant: "beta", Pages: 2, Running: 1, Queued: 1},
		{Tenant: "gamma", Pages: 2, Running: 1},
	}
	if diff := cmp.Diff(want, m.Tenants); diff != "" {
		t.Errorf("tenants (-want +got):\n%s", diff)
	}
	if m.Core.Running != 3 || m.Core.Queued != 1 || m.Pool.OwnedPages != 7 {
		t.Errorf("counters: core %+v, pool %+v", m.Core, m.Pool)
	}

	// A violation quarantines the reservation's pages: the map keeps
	// their last owner and no longer calls them in transfer.
	if err := h.core.abort(p.Owner, fmt.Errorf("%w: injected", kvcache.ErrViolation)); err != nil {
		t.Fatal(err)
	}
	h.step(t)
	m = h.core.PageMap(m.Pages)
	for _, id := range reserved {
		c := m.Pages[id-1]
		if c.State != kvcache.PageQuarantined || slices.Contains(m.InTransfer, id) || c.Owner != p.Owner {
			t.Errorf("page %d after the violation: %+v", id, c)
		}
	}
	if m.Pool.QuarantinedPages != len(reserved) {
		t.Errorf("quarantined %d, want %d", m.Pool.QuarantinedPages, len(reserved))
	}
}

// TestNodePageMap: the node's loop answers the map between steps, and
// after Run ends a caller gets ErrShuttingDown.
func TestNodePageMap(t *testing.T) {
	layout := ownerecho.Layout(4)
	lim, err := ComputeLimits(ModelShape{ContextLength: 32, Vocab: harnessVocab}, layout, 16, 32, 1)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kvcache.NewPool(kvcache.Config{Layout: layout, Pages: 16})
	if err != nil {
		t.Fatal(err)
	}
	n, err := NewNode(NodeConfig{Core: Config{Limits: lim, Pool: pool}, Executor: &echoExecutor{vocab: harnessVocab}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	p := request.Params{Owner: request.Owner{Tenant: "acme", ID: request.NewID()}, Prompt: []int{1, 2, 3, 4, 5}, MaxTokens: 2}
	s, err := n.Submit(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	s.Result()
	m, err := n.PageMap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Pages) != 16 || m.Pool.FreePages != 16 || m.Core.Finished != 1 {
		t.Fatalf("map after one finished request: %d pages, pool %+v, core %+v", len(m.Pages), m.Pool, m.Core)
	}
	cancel()
	<-done
	if _, err := n.PageMap(context.Background()); err != request.ErrShuttingDown {
		t.Fatalf("after Run: %v", err)
	}
}

// BenchmarkPageMap: the loop's cost of one page-map snapshot of a 65,536
// page pool, half of it owned by 1,024 running requests of 16 tenants.
func BenchmarkPageMap(b *testing.B) {
	const pages, reqs = 1 << 16, 1024
	o := harnessOpts{window: 512, pageSize: 16, pages: pages, batchTokens: 1 << 20, maxRunning: reqs}
	h := newHarness(b, o)
	for i := range reqs {
		h.submit(b, request.Tenant(fmt.Sprintf("t%02d", i%16)), 500, 8)
	}
	h.step(b)
	m := h.core.PageMap(nil)
	if m.Pool.OwnedPages < pages/2 {
		b.Fatalf("%d owned pages", m.Pool.OwnedPages)
	}
	// fresh is what Node.PageMap does (the map goes to another
	// goroutine); reuse is the floor, with the pages' memory recycled.
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m = h.core.PageMap(nil)
		}
	})
	b.Run("reuse", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m = h.core.PageMap(m.Pages)
		}
	})
}
