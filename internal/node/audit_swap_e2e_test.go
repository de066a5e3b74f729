//go:build pw_mutants

package node_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

// TestReplayAuditCatchesSwappedPage is the replay audit's positive control
// through the whole path — gateway, node, scheduler, pool — with the
// incident's kind of fault: behind the ownership check, tenant b's running
// sequences read a page of tenant a's in place of their own first page
// (kvcache.SwapPageForControls). Every contaminated answer that went out
// with a 200 is a mismatch, logged with its request id, positions and the
// pages and epochs it held; none of a's is; contaminated requests whose
// foreign page was released (poisoned) meanwhile fail and are never
// answered.
func TestReplayAuditCatchesSwappedPage(t *testing.T) {
	s := startE2E(t, e2eConfig{auditRate: 1})
	swapped, restore := kvcache.SwapPageForControls("b")
	long := strings.Repeat("the quick brown fox jumps over the lazy dog and keeps on running ", 3)
	var mu sync.Mutex
	answered := map[string]request.Tenant{} // request id → tenant
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key, tenant, max := e2eKeyA, request.Tenant("a"), 48
			if i%2 == 1 {
				key, tenant, max = e2eKeyB, "b", 16
			}
			code, _, body := s.post(key, "/v1/completions", map[string]any{"prompt": fmt.Sprintf("%d %s", i, long),
				"max_tokens": max, "temperature": 1, "seed": i, "ignore_eos": true})
			if code != 200 {
				return // a contaminated sequence that read a poisoned page
			}
			var out struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(body, &out); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			answered[strings.TrimPrefix(out.ID, "cmpl-")] = tenant
			mu.Unlock()
		}()
	}
	wg.Wait()
	restore()
	s.waitReplays(len(answered))
	contaminated := map[string]bool{}
	for _, r := range swapped() {
		contaminated[r.Owner.ID.String()] = true
	}
	if len(contaminated) == 0 {
		t.Fatal("the control contaminated no sequence: it has no power")
	}
	caught := map[string]bool{}
	for _, l := range strings.Split(s.logs.String(), "\n") {
		if !strings.Contains(l, "replay audit mismatch") {
			continue
		}
		var rec struct {
			RequestID string   `json:"request_id"`
			Tenant    string   `json:"tenant"`
			Pages     []string `json:"pages"`
			Positions []int    `json:"positions"`
		}
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("%s: %v", l, err)
		}
		if len(rec.Pages) == 0 || len(rec.Positions) == 0 {
			t.Errorf("mismatch line without pages or positions: %s", l)
		}
		caught[rec.RequestID] = true
	}
	want, failed := 0, 0
	for id := range contaminated {
		tenant, ok := answered[id]
		switch {
		case !ok:
			failed++
		case tenant != "b":
			t.Errorf("the control contaminated %s of tenant %s", id, tenant)
		default:
			want++
			if !caught[id] {
				t.Errorf("contaminated answer %s went out and its re-score matched: not caught", id)
			}
		}
	}
	for id := range caught {
		if !contaminated[id] {
			t.Errorf("answer %s of tenant %s was not contaminated but mismatched", id, answered[id])
		}
	}
	if want == 0 {
		t.Fatalf("no contaminated answer went out (%d failed): the audit was not exercised", failed)
	}
	if v := s.metricValue("pagewarden_audit_mismatches_total"); v != float64(want) {
		t.Errorf("pagewarden_audit_mismatches_total = %v, want %d", v, want)
	}
	t.Logf("%d answers, %d contaminated: %d answered and caught by the audit, %d failed unanswered", len(answered), len(contaminated), want, failed)
}
