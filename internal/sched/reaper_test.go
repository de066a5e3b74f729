package sched

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// errEngineViolation is what an executor reports when it detects an
// isolation violation: the core must quarantine the request's pages.
var errEngineViolation = fmt.Errorf("sched test: engine check: %w", kvcache.ErrViolation)

// quarantineVictim runs one request of tenant "victim" whose first step
// fails with a violation, and returns the pages that were quarantined.
func quarantineVictim(t *testing.T, h *harness, prompt int) []kvcache.PageID {
	t.Helper()
	before := h.pool.Quarantined()
	o := h.submit(t, "victim", prompt, 4)
	h.failNext[o] = true
	h.failErr = errEngineViolation
	h.step(t)
	h.ready(t) // deliver the result
	if r := h.results[o]; r.Reason != request.FinishError || !errors.Is(r.Err, kvcache.ErrViolation) {
		t.Fatalf("victim result %+v, want a violation error", r)
	}
	var fresh []kvcache.PageID
	for _, id := range h.pool.Quarantined() {
		if !contains(before, id) {
			fresh = append(fresh, id)
		}
	}
	if want := h.lim.PagesFor(prompt); len(fresh) != want {
		t.Fatalf("%d pages quarantined (%v), want the victim's %d", len(fresh), fresh, want)
	}
	return fresh
}

func contains(ids []kvcache.PageID, id kvcache.PageID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// checkHeld fails unless every page of ids is still quarantined, untouched
// since epochs were taken.
func checkHeld(t *testing.T, h *harness, ids []kvcache.PageID, epochs map[kvcache.PageID]uint64, when string) {
	t.Helper()
	for _, id := range ids {
		info, _ := h.pool.Page(id)
		if info.State != kvcache.PageQuarantined || info.Epoch != epochs[id] {
			t.Fatalf("%s: page %d is %v (epoch %d, was %d), want it still quarantined", when, id, info.State, info.Epoch, epochs[id])
		}
	}
}

// TestReaperFreesQuarantineOnlyAfterDeadline: pages quarantined by a
// violation stay out of circulation, however short the pool is and however
// much other traffic runs, until QuarantineReapAfter has passed on the
// core's clock; then a Tick scrubs and frees them, and a request that needs
// them runs on them (the pool verifies the scrub pattern on allocation).
func TestReaperFreesQuarantineOnlyAfterDeadline(t *testing.T) {
	const after = time.Minute
	h := newHarness(t, harnessOpts{window: 20, pageSize: 4, pages: 6, batchTokens: 64, reapAfter: after})
	t0 := time.Unix(1000, 0)
	h.core.Tick(t0)
	q := quarantineVictim(t, h, 5) // 2 of 6 pages
	epochs := map[kvcache.PageID]uint64{}
	for _, id := range q {
		info, _ := h.pool.Page(id)
		epochs[id] = info.Epoch
	}

	// Traffic that churns every other page, while time passes up to just
	// before the deadline.
	now := t0
	for i := range 6 {
		now = now.Add(after / 7)
		h.core.Tick(now)
		o := h.submit(t, request.Tenant(fmt.Sprint("t", i%2)), 1+i*2, 3)
		h.drain(t)
		if r := h.results[o]; r.Reason != request.FinishLength {
			t.Fatalf("request %d: %+v", i, r)
		}
		checkHeld(t, h, q, epochs, fmt.Sprintf("after request %d at +%v", i, now.Sub(t0)))
	}

	// A request that needs 5 pages cannot start while 2 are withheld.
	big := h.submit(t, "big", 17, 3)
	h.core.Tick(t0.Add(after - time.Nanosecond))
	if rd := h.ready(t); rd.Batch != nil {
		t.Fatalf("a batch ran with only 4 usable pages: %v", h.last)
	}
	checkHeld(t, h, q, epochs, "one nanosecond before the deadline")
	if st := h.core.Stats(); st.Reaped != 0 {
		t.Fatalf("reaped %d pages before the deadline", st.Reaped)
	}

	h.core.Tick(t0.Add(after))
	if got := h.pool.Quarantined(); len(got) != 0 {
		t.Fatalf("still quarantined at the deadline: %v", got)
	}
	for _, id := range q {
		if info, _ := h.pool.Page(id); info.State != kvcache.PageFree {
			t.Fatalf("page %d is %v after reaping, want free", id, info.State)
		}
	}
	if st := h.core.Stats(); st.Reaped != uint64(len(q)) || st.Scrubbed != 0 {
		t.Fatalf("stats after reaping: reaped %d scrubbed %d, want %d and 0", st.Reaped, st.Scrubbed, len(q))
	}
	h.drain(t)
	if r := h.results[big]; r.Reason != request.FinishLength {
		t.Fatalf("big request after reaping: %+v", r)
	}
	h.checkFree(t)
	if v := h.pool.Violations(); v != 0 {
		t.Fatalf("%d violations detected by the pool (a reaped page was not scrubbed?)", v)
	}
}

// TestReaperTimesEachQuarantineSeparately: pages quarantined later wait
// their own full delay.
func TestReaperTimesEachQuarantineSeparately(t *testing.T) {
	const after = 10 * time.Second
	h := newHarness(t, harnessOpts{window: 16, pageSize: 4, pages: 16, batchTokens: 64, reapAfter: after})
	t0 := time.Unix(0, 0).Add(time.Hour)
	h.core.Tick(t0)
	first := quarantineVictim(t, h, 4)
	h.core.Tick(t0.Add(6 * time.Second))
	second := quarantineVictim(t, h, 8)

	for _, tc := range []struct {
		at          time.Duration
		quarantined []kvcache.PageID
		reaped      uint64
	}{
		{9 * time.Second, append(append([]kvcache.PageID(nil), first...), second...), 0},
		{10 * time.Second, second, uint64(len(first))},
		{15 * time.Second, second, uint64(len(first))},
		{16 * time.Second, nil, uint64(len(first) + len(second))},
	} {
		h.core.Tick(t0.Add(tc.at))
		want := map[kvcache.PageID]bool{}
		for _, id := range tc.quarantined {
			want[id] = true
		}
		got := map[kvcache.PageID]bool{}
		for _, id := range h.pool.Quarantined() {
			got[id] = true
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("at +%v, quarantined pages (-want +got):\n%s", tc.at, d)
		}
		if st := h.core.Stats(); st.Reaped != tc.reaped {
			t.Errorf("at +%v: reaped %d, want %d", tc.at, st.Reaped, tc.reaped)
		}
		if err := h.core.CheckInvariants(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestOperatorScrub: with no reaper, quarantine lasts forever on the
// core's clock; the operator's ScrubQuarantined frees it, but never while a
// batch is in flight.
func TestOperatorScrub(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 16, pageSize: 4, pages: 16, batchTokens: 64})
	t0 := time.Unix(5000, 0)
	h.core.Tick(t0)
	q := quarantineVictim(t, h, 6)
	h.core.Tick(t0.Add(1000 * time.Hour))
	if got := h.pool.Quarantined(); len(got) != len(q) {
		t.Fatalf("without a reaper, quarantine shrank to %v", got)
	}

	h.submit(t, "a", 3, 2)
	rd := h.ready(t)
	if rd.Batch == nil {
		t.Fatal("no batch")
	}
	if n, err := h.core.ScrubQuarantined(); !errors.Is(err, ErrInFlight) || n != 0 {
		t.Fatalf("scrub with a batch in flight: %d, %v; want 0, ErrInFlight", n, err)
	}
	h.finish(t, rd)

	n, err := h.core.ScrubQuarantined()
	if err != nil || n != len(q) {
		t.Fatalf("scrub: %d, %v; want %d", n, err, len(q))
	}
	if st := h.core.Stats(); st.Scrubbed != uint64(len(q)) || st.Reaped != 0 {
		t.Fatalf("stats: %+v", st)
	}
	if n, err := h.core.ScrubQuarantined(); n != 0 || err != nil {
		t.Fatalf("second scrub: %d, %v", n, err)
	}
	h.drain(t)
	h.checkFree(t)
}

func TestReapAfterValidated(t *testing.T) {
	h := newHarness(t, harnessOpts{window: 16, pageSize: 4, pages: 16, batchTokens: 64})
	_, err := NewCore(Config{Limits: h.lim, Pool: h.pool, QuarantineReapAfter: -time.Second})
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("negative reap delay: %v, want ErrConfig", err)
	}
}

// TestReaperProperty drives a core through random steps, violations, clock
// advances and operator scrubs, and checks against a model of when each
// page entered quarantine: a quarantined page keeps its state and epoch
// until it is freed, the reaper frees it only once QuarantineReapAfter has
// passed since (and at the first Tick after that), and only the operator
// frees it earlier.
func TestReaperProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		after := time.Duration(rapid.IntRange(1, 20).Draw(rt, "after")) * time.Second
		h := newHarness(t, harnessOpts{window: 16, pageSize: 4, pages: 24, batchTokens: 32, reapAfter: after})
		now := time.Unix(100, 0)
		h.core.Tick(now)
		type entry struct {
			epoch uint64
			since time.Time
		}
		model := map[kvcache.PageID]entry{}
		observe := func(op string, operator bool) {
			got := map[kvcache.PageID]bool{}
			for _, id := range h.pool.Quarantined() {
				got[id] = true
				info, _ := h.pool.Page(id)
				if e, ok := model[id]; ok && e.epoch != info.Epoch {
					rt.Fatalf("%s: page %d changed epoch in quarantine", op, id)
				}
				if _, ok := model[id]; !ok {
					model[id] = entry{info.Epoch, now}
				}
			}
			for id, e := range model {
				if got[id] {
					if op == "tick" && now.Sub(e.since) >= after {
						rt.Fatalf("page %d quarantined at %v still held at %v (reap after %v)", id, e.since, now, after)
					}
					continue
				}
				if !operator && (op != "tick" || now.Sub(e.since) < after) {
					rt.Fatalf("%s: page %d left quarantine after %v (reap after %v)", op, id, now.Sub(e.since), after)
				}
				delete(model, id)
			}
		}
		ids := 0
		for range rapid.IntRange(1, 40).Draw(rt, "ops") {
			switch rapid.IntRange(0, 4).Draw(rt, "op") {
			case 0: // a request whose next step may fail with a violation
				ids++
				p := h.mkParams(request.Tenant(fmt.Sprint("t", ids%3)), rapid.IntRange(1, 12).Draw(rt, "prompt"), rapid.IntRange(1, 4).Draw(rt, "max"))
				if err := h.submitParams(p); err != nil {
					continue
				}
				if rapid.Bool().Draw(rt, "violate") {
					h.failNext[p.Owner] = true
					h.failErr = errEngineViolation
				}
			case 1, 2:
				h.step(t)
				observe("step", false)
			case 3:
				now = now.Add(time.Duration(rapid.IntRange(0, 8000).Draw(rt, "ms")) * time.Millisecond)
				h.core.Tick(now)
				observe("tick", false)
			case 4:
				if h.core.inflight == nil {
					if _, err := h.core.ScrubQuarantined(); err != nil {
						rt.Fatal(err)
					}
					observe("scrub", true)
				}
			}
			if err := h.core.CheckInvariants(); err != nil {
				rt.Fatal(err)
			}
		}
	})
}

// runViolator submits one request of tenant "mallory" (whose every item
// the test executor fails with a violation) and checks that it failed.
func runViolator(t *testing.T, n *Node, prompt, seed int) {
	t.Helper()
	p := testParams("mallory", prompt, 4, seed)
	s, err := n.Submit(context.Background(), p)
	if err != nil {
		t.Error(err)
		return
	}
	if res := s.Result(); res.Reason != request.FinishError || !errors.Is(res.Err, kvcache.ErrViolation) {
		t.Errorf("violator: %s %v", res.Reason, res.Err)
	}
}

func nodeStats(t *testing.T, n *Node) NodeStats {
	t.Helper()
	st, err := n.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestNodeScrubQuarantined: the operator's scrub is an event applied by the
// loop between steps, safe to call from any goroutine while tenants run
// (run with -race). Without a reaper, quarantine lasts until it is called;
// every page that entered quarantine is freed by exactly one call.
func TestNodeScrubQuarantined(t *testing.T) {
	n, _, cancel, done := newTestNode(t, nodeOpts{window: 32, pageSize: 4, pages: 48, batchTokens: 32, violate: "mallory"})
	runViolator(t, n, 9, 1) // 3 pages
	st := nodeStats(t, n)
	if st.Pool.QuarantinedPages != 3 {
		t.Fatalf("after one violation: %d pages quarantined, want 3", st.Pool.QuarantinedPages)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	scrubbed := 0
	stop := make(chan struct{})
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 8 {
				if w%3 == 0 {
					runViolator(t, n, 1+(w+i)%12, w*100+i)
					continue
				}
				p := testParams(request.Tenant(fmt.Sprint("tenant", w)), 1+(w*5+i*3)%20, 1+i%6, w*100+i)
				s, err := n.Submit(context.Background(), p)
				if err != nil {
					t.Errorf("submit: %v", err)
					continue
				}
				if toks, res := collect(t, s, p); res.Reason != request.FinishLength || len(toks) != p.MaxTokens {
					t.Errorf("%v: %s %v after %d tokens", p.Owner, res.Reason, res.Err, len(toks))
				}
			}
		}()
	}
	var operator sync.WaitGroup
	operator.Add(1)
	go func() {
		defer operator.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			k, err := n.ScrubQuarantined(context.Background())
			if err != nil {
				t.Errorf("scrub: %v", err)
				return
			}
			mu.Lock()
			scrubbed += k
			mu.Unlock()
			runtime.Gosched()
		}
	}()
	wg.Wait()
	close(stop)
	operator.Wait()
	k, err := n.ScrubQuarantined(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	scrubbed += k
	st = nodeStats(t, n)
	if scrubbed != int(st.Pool.Quarantines) || st.Core.Scrubbed != st.Pool.Quarantines || st.Core.Reaped != 0 {
		t.Errorf("operator freed %d pages, the core counted %d, the pool quarantined %d (reaped %d)",
			scrubbed, st.Core.Scrubbed, st.Pool.Quarantines, st.Core.Reaped)
	}
	if st.Pool.QuarantinedPages != 0 || st.Pool.FreePages != st.Pool.TotalPages || st.Pool.Violations != 0 {
		t.Errorf("pool after the last scrub: %+v", st.Pool)
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the cleanup
	if _, err := n.ScrubQuarantined(context.Background()); !errors.Is(err, request.ErrShuttingDown) {
		t.Errorf("scrub after shutdown: %v", err)
	}
}

// TestNodeReaper runs the node in a synctest bubble: an idle node keeps
// its clock running while pages wait for the reaper, which frees them once
// QuarantineReapAfter has passed and not before.
func TestNodeReaper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, _, _, _ := newTestNode(t, nodeOpts{window: 32, pageSize: 4, pages: 16, batchTokens: 32, violate: "mallory", reapAfter: time.Minute})
		runViolator(t, n, 6, 1) // 2 pages
		if st := nodeStats(t, n); st.Pool.QuarantinedPages != 2 {
			t.Fatalf("%d pages quarantined, want 2", st.Pool.QuarantinedPages)
		}
		time.Sleep(time.Minute - time.Second)
		synctest.Wait()
		if st := nodeStats(t, n); st.Pool.QuarantinedPages != 2 || st.Core.Reaped != 0 {
			t.Fatalf("before the deadline: %d quarantined, %d reaped", st.Pool.QuarantinedPages, st.Core.Reaped)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		st := nodeStats(t, n)
		if st.Pool.QuarantinedPages != 0 || st.Core.Reaped != 2 || st.Pool.FreePages != st.Pool.TotalPages {
			t.Fatalf("after the deadline: %d quarantined, %d reaped, %d of %d free",
				st.Pool.QuarantinedPages, st.Core.Reaped, st.Pool.FreePages, st.Pool.TotalPages)
		}
	})
}
