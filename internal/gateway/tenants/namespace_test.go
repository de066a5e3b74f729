package tenants

import "testing"

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
