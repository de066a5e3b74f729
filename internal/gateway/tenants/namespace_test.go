package tenants

import (
	"errors"
	"testing"
	"time"
)

// TestCacheNamespaceFollowsTheCustomer: a tenant keeps its prefix-cache
// namespace across reloads while it keeps a key, and gets a new one when
// its id is removed and re-added or handed to someone with none of its keys.
func TestCacheNamespaceFollowsTheCustomer(t *testing.T) {
	k1, k2, k3 := HashKey("key-one"), HashKey("key-two"), HashKey("key-three")
	cfg := func(keys ...string) *Config {
		return &Config{Tenants: []Tenant{{ID: "a", APIKeySHA256: keys}, {ID: "b", APIKeySHA256: []string{HashKey("b-key")}}}}
	}
	r, err := NewRegistry(cfg(k1))
	if err != nil {
		t.Fatal(err)
	}
	ns := func() string { tn, _ := r.Tenant("a"); return tn.CacheNamespace }
	nsB := func() string { tn, _ := r.Tenant("b"); return tn.CacheNamespace }
	first, b0 := ns(), nsB()
	if len(first) != 32 || first == b0 {
		t.Fatalf("namespaces %q and %q: want distinct 32-hex values", first, b0)
	}
	steps := []struct {
		name string
		cfg  *Config
		same bool
	}{
		{"same keys", cfg(k1), true},
		{"a key added", cfg(k1, k2), true},
		{"the old key retired, one kept", cfg(k2), true},
		{"an entirely new key set: another customer", cfg(k3), false},
		{"removed", &Config{Tenants: []Tenant{{ID: "b", APIKeySHA256: []string{HashKey("b-key")}}}}, false},
		{"re-added with its old key", cfg(k3), false},
	}
	prev := first
	for _, st := range steps {
		if err := r.Reload(st.cfg); err != nil {
			t.Fatal(err)
		}
		if _, ok := r.Tenant("a"); !ok {
			prev = ""
			continue
		}
		if got := ns(); (got == prev) != st.same {
			t.Errorf("%s: namespace %q after %q; same = %v, want %v", st.name, got, prev, got == prev, st.same)
		}
		prev = ns()
		if nsB() != b0 {
			t.Errorf("%s: tenant b's namespace changed", st.name)
		}
	}
}

// TestRecycledIDStartsWithFreshQuota: quota state follows the customer,
// like the cache namespace. A reload that keeps a customer keeps its
// buckets and in-flight count; an id handed to another customer starts
// with full buckets and nothing in flight, and the previous holder's grant
// is released into the previous holder's counts, not the new one's.
func TestRecycledIDStartsWithFreshQuota(t *testing.T) {
	lim := Limits{TokensPerMinute: 100, MaxConcurrent: 1}
	cfg := func(keys ...string) *Config {
		return &Config{Tenants: []Tenant{{ID: "a", APIKeySHA256: keys, Limits: lim}}}
	}
	k1, k2, k3 := HashKey("key-one"), HashKey("key-two"), HashKey("key-three")
	r, err := NewRegistry(cfg(k1))
	if err != nil {
		t.Fatal(err)
	}
	if g := r.Generation(); g != 1 {
		t.Fatalf("generation %d after NewRegistry, want 1", g)
	}
	now := time.Unix(1000, 0)
	old, err := r.Acquire(now, "a", 90, 1)
	if err != nil {
		t.Fatal(err)
	}

	// The same customer, reconfigured: the old state stays in force.
	if err := r.Reload(cfg(k1, k2)); err != nil {
		t.Fatal(err)
	}
	if g := r.Generation(); g != 2 {
		t.Fatalf("generation %d after a reload, want 2", g)
	}
	if _, err := r.Acquire(now, "a", 1, 1); !errors.Is(err, ErrQuotaExceeded) {
		t.Fatalf("same customer after a reload: %v, want its quota still spent", err)
	}

	// Another customer gets the id: nothing carries over.
	if err := r.Reload(cfg(k3)); err != nil {
		t.Fatal(err)
	}
	if n := r.InFlight("a"); n != 0 {
		t.Fatalf("new holder starts with %d in flight", n)
	}
	fresh, err := r.Acquire(now, "a", 90, 1)
	if err != nil {
		t.Fatalf("new holder refused on the previous holder's quota: %v", err)
	}
	old.Release(now, 0) // the previous holder's request ends, unused
	if n := r.InFlight("a"); n != 1 {
		t.Fatalf("in flight %d after the previous holder's release, want the new holder's 1", n)
	}
	var qe *QuotaError
	if _, err := r.Acquire(now, "a", 1, 1); !errors.As(err, &qe) || qe.Limit != "max_concurrent" {
		t.Fatalf("second concurrent request of the new holder: %v", err)
	}
	// The previous holder's refund of 90 tokens did not reach the new
	// holder's bucket, which has 10 of 100 left.
	fresh.Release(now, 90)
	if _, err := r.Acquire(now, "a", 20, 1); !errors.As(err, &qe) || qe.Limit != "tokens_per_minute" {
		t.Fatalf("the new holder's own tpm bucket: %v", err)
	}
	if _, err := r.Acquire(now, "a", 10, 1); err != nil {
		t.Fatalf("the new holder within its bucket: %v", err)
	}
}
