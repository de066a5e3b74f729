package node_test

import (
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/node"
)

// TestE2ERecycledTenantIDCannotProbeTheCache: a reload that hands tenant id
// "a" to a different customer (none of the old keys) must not let the new
// customer hit the old one's prefix-cache pages, while a reload that keeps
// a's key keeps its cache.
func TestE2ERecycledTenantIDCannotProbeTheCache(t *testing.T) {
	s := startE2E(t, e2eConfig{node: node.Options{PrefixCache: true}})
	secret := strings.Repeat("The previous customer's confidential preamble. ", 8)
	body := map[string]any{"prompt": secret, "max_tokens": 4, "temperature": 0}
	var c completionBody
	s.postOK(e2eKeyA, "/v1/completions", body, &c)
	s.postOK(e2eKeyA, "/v1/completions", body, &c)
	if c.Usage.cached() <= 0 {
		t.Fatalf("the same tenant's repeat was not served from the cache")
	}
	reload := func(keyA string) {
		t.Helper()
		cfg := &tenants.Config{Tenants: []tenants.Tenant{
			{ID: "a", APIKeySHA256: []string{tenants.HashKey(keyA)}},
			{ID: "b", APIKeySHA256: []string{tenants.HashKey(e2eKeyB)}},
		}}
		if err := s.srv.Reload(cfg); err != nil {
			t.Fatal(err)
		}
	}
	reload(e2eKeyA) // same customer: cache kept
	s.postOK(e2eKeyA, "/v1/completions", body, &c)
	if c.Usage.cached() <= 0 {
		t.Errorf("a reload that kept the tenant's key dropped its cache")
	}
	const newKey = "sk-someone-else-entirely"
	reload(newKey) // id "a" now belongs to another customer
	s.postOK(newKey, "/v1/completions", body, &c)
	if got := c.Usage.cached(); got != 0 {
		t.Errorf("the new holder of id \"a\" hit %d cached tokens of the previous customer's prompt", got)
	}
	s.waitAllFree()
	s.checkMustBeZero()
}
