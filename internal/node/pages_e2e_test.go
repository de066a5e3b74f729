package node_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
)

// TestE2EPageBudgetOneRule: the gateway and the scheduler charge a request
// the same KV pages (prompt+max_tokens-1 positions), a request that can
// never fit the tenant's budget gets one definite 400 (not a 429 to retry
// forever), and an omitted max_tokens is capped to what the budget holds.
func TestE2EPageBudgetOneRule(t *testing.T) {
	s := startE2E(t, e2eConfig{limits: map[string]tenants.Limits{"a": {MaxKVPages: 4}}})
	// "x" is 2 tokens with BOS: 2 + 63 - 1 = 64 positions = 4 pages of 16.
	var c completionBody
	s.postOK(e2eKeyA, "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 63, "temperature": 0}, &c)
	if c.Usage.CompletionTokens == 0 {
		t.Fatalf("exactly the budget: no tokens")
	}
	for range 3 {
		code, hdr, body := s.post(e2eKeyA, "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 64})
		var e apiErr
		if code != http.StatusBadRequest || json.Unmarshal(body, &e) != nil || e.Error.Code == nil || *e.Error.Code != "kv_page_limit_exceeded" {
			t.Fatalf("one page over the budget: status %d %s; want 400 kv_page_limit_exceeded", code, body)
		}
		if hdr.Get("Retry-After") != "" || !strings.Contains(e.Error.Message, "at most 4") {
			t.Errorf("over-budget answer %s with Retry-After %q: want the numbers and no retry", body, hdr.Get("Retry-After"))
		}
	}
	// No max_tokens: as much as the budget holds, not the whole window.
	s.postOK(e2eKeyA, "/v1/completions", map[string]any{"prompt": "x", "temperature": 0}, &c)
	if c.Usage.CompletionTokens < 1 || c.Usage.CompletionTokens > 63 {
		t.Errorf("omitted max_tokens generated %d tokens; the 4-page budget holds at most 63", c.Usage.CompletionTokens)
	}
	s.waitAllFree()
	s.checkMustBeZero()
}
