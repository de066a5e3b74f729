package tenants

import (
	"crypto/sha256"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"
)

var h1, h2 = HashKey("k1"), HashKey("k2")

func TestParse(t *testing.T) {
	cfg, err := Parse(strings.NewReader(`
tenants:
  - id: acme
    api_key_sha256: [` + h1 + `]
    limits: {requests_per_minute: 60, tokens_per_minute: 1000, max_concurrent: 2, max_kv_pages: 64, priority: 3}
  - id: beta.co
    api_key_sha256: ["` + strings.ToUpper(h2) + `"]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{Tenants: []Tenant{
		{ID: "acme", APIKeySHA256: []string{h1}, Limits: Limits{60, 1000, 2, 64, 3}},
		{ID: "beta.co", APIKeySHA256: []string{strings.ToUpper(h2)}},
	}}
	if diff := cmp.Diff(want, cfg); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	for name, src := range map[string]string{
		"empty":         ``,
		"no tenants":    `tenants: []`,
		"unknown field": "tenants:\n  - id: a\n    api_key_sha256: [" + h1 + "]\n    limits: {request_per_minute: 5}",
		"bad id":        "tenants:\n  - id: 'a b'\n    api_key_sha256: [" + h1 + "]",
		"dup id":        "tenants:\n  - id: a\n    api_key_sha256: [" + h1 + "]\n  - id: a\n    api_key_sha256: [" + h2 + "]",
		"dup key":       "tenants:\n  - id: a\n    api_key_sha256: [" + h1 + "]\n  - id: b\n    api_key_sha256: [" + h1 + "]",
		"no key":        "tenants:\n  - id: a",
		"short hash":    "tenants:\n  - id: a\n    api_key_sha256: [abcd]",
		"not hex":       "tenants:\n  - id: a\n    api_key_sha256: [" + strings.Repeat("z", 64) + "]",
		"negative":      "tenants:\n  - id: a\n    api_key_sha256: [" + h1 + "]\n    limits: {max_concurrent: -1}",
		"not yaml":      "tenants: [",
	} {
		if _, err := Parse(strings.NewReader(src)); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestAuthenticateAndReload(t *testing.T) {
	cfg, key, err := Default()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, "pw-") || len(key) != 46 {
		t.Errorf("key %q", key)
	}
	r, err := NewRegistry(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if ten, err := r.Authenticate(key); err != nil || ten.ID != DefaultTenantID {
		t.Fatalf("Authenticate = %v, %v", ten, err)
	}
	for _, bad := range []string{"", key + "x", key[:len(key)-1], h1} {
		if _, err := r.Authenticate(bad); !errors.Is(err, ErrUnauthorized) {
			t.Errorf("Authenticate(%q) = %v", bad, err)
		}
	}
	if err := r.Reload(&Config{Tenants: []Tenant{{ID: "x", APIKeySHA256: []string{h1}}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Authenticate(key); err == nil {
		t.Error("old key valid after reload")
	}
	if ten, err := r.Authenticate("k1"); err != nil || ten.ID != "x" {
		t.Errorf("new key: %v %v", ten, err)
	}
	if err := r.Reload(&Config{}); err == nil {
		t.Error("invalid reload accepted")
	}
	if _, err := r.Authenticate("k1"); err != nil {
		t.Error("failed reload changed the config")
	}
}

func TestQuota(t *testing.T) {
	r, err := NewRegistry(&Config{Tenants: []Tenant{
		{ID: "a", APIKeySHA256: []string{h1}, Limits: Limits{RequestsPerMinute: 2, TokensPerMinute: 600, MaxConcurrent: 2, MaxKVPages: 10}},
		{ID: "b", APIKeySHA256: []string{h2}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	g1, err := r.Acquire(now, "a", 100, 4)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := r.Acquire(now, "a", 100, 4)
	if err != nil {
		t.Fatal(err)
	}
	var qe *QuotaError
	if _, err := r.Acquire(now, "a", 1, 1); !errors.As(err, &qe) || qe.Limit != "max_concurrent" || !errors.Is(err, ErrQuotaExceeded) {
		t.Fatalf("third concurrent: %v", err)
	}
	g1.Release(now, 50)
	g1.Release(now, 50) // second release is a no-op
	if r.InFlight("a") != 1 {
		t.Fatalf("in flight %d", r.InFlight("a"))
	}
	if _, err := r.Acquire(now, "a", 1, 7); !errors.As(err, &qe) || qe.Limit != "max_kv_pages" {
		t.Fatalf("pages: %v", err)
	}
	if _, err := r.Acquire(now, "a", 1, 1); !errors.As(err, &qe) || qe.Limit != "requests_per_minute" || qe.RetryAfter != 30*time.Second {
		t.Fatalf("rpm: %v", err)
	}
	g2.Release(now, 100)
	now = now.Add(30 * time.Second)
	// 600 tpm, refilled to full: a request larger than the bucket is
	// admitted on a full bucket and leaves a debt (-100).
	g3, err := r.Acquire(now, "a", 700, 1)
	if err != nil {
		t.Fatalf("large request on a full bucket: %v", err)
	}
	g3.Release(now, 700)
	now = now.Add(60 * time.Second) // -100 + 600 = 500 tokens
	if _, err := r.Acquire(now, "a", 550, 1); !errors.As(err, &qe) || qe.Limit != "tokens_per_minute" || qe.RetryAfter != 5*time.Second {
		t.Fatalf("tpm: %v", err)
	}
	if _, err := r.Acquire(now, "b", 1<<30, 1<<20); err != nil {
		t.Fatalf("unlimited tenant: %v", err)
	}
	if _, err := r.Acquire(now, "nobody", 1, 1); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("unknown tenant: %v", err)
	}
}

// TestQuotaProperties: under any sequence of acquire/release/advance, the
// in-flight count never exceeds max_concurrent, never goes negative, and
// the number of admissions in any 60 s never exceeds RPM + refill.
func TestQuotaProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxConc := rapid.IntRange(1, 4).Draw(t, "maxConc")
		rpm := rapid.IntRange(1, 30).Draw(t, "rpm")
		r, err := NewRegistry(&Config{Tenants: []Tenant{{ID: "a", APIKeySHA256: []string{h1},
			Limits: Limits{RequestsPerMinute: rpm, MaxConcurrent: maxConc, TokensPerMinute: 1000}}}})
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(0, 0)
		var held []*Grant
		admitted := 0
		start := now
		for i := 0; i < 100; i++ {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				g, err := r.Acquire(now, "a", rapid.IntRange(1, 2000).Draw(t, "cost"), 1)
				if err == nil {
					held = append(held, g)
					admitted++
				} else if qe := (*QuotaError)(nil); !errors.As(err, &qe) || qe.RetryAfter < time.Second {
					t.Fatalf("refusal %v", err)
				}
			case 1:
				if len(held) > 0 {
					k := rapid.IntRange(0, len(held)-1).Draw(t, "k")
					held[k].Release(now, rapid.IntRange(0, 2000).Draw(t, "used"))
					held = append(held[:k], held[k+1:]...)
				}
			case 2:
				now = now.Add(time.Duration(rapid.IntRange(0, 10).Draw(t, "dt")) * time.Second)
			}
			if n := r.InFlight("a"); n != len(held) || n > maxConc {
				t.Fatalf("in flight %d, held %d, max %d", n, len(held), maxConc)
			}
			if limit := rpm + int(now.Sub(start).Seconds()*float64(rpm)/60) + 1; admitted > limit {
				t.Fatalf("admitted %d > %d in %v", admitted, limit, now.Sub(start))
			}
		}
	})
}

// TestNegativeChargeRefused: a charge that wrapped negative upstream is
// refused and leaves the buckets as they were, instead of refilling them.
func TestNegativeChargeRefused(t *testing.T) {
	r, err := NewRegistry(&Config{Tenants: []Tenant{{ID: "a", APIKeySHA256: []string{HashKey("k")}, Limits: Limits{TokensPerMinute: 100}}}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1e9, 0)
	g, err := r.Acquire(now, "a", 90, 1)
	if err != nil {
		t.Fatal(err)
	}
	g.Release(now, 90)
	for _, c := range [][2]int{{-1 << 62, 0}, {-1, 0}, {0, -1}} {
		if _, err := r.Acquire(now, "a", c[0], c[1]); !errors.Is(err, ErrCharge) {
			t.Fatalf("charge %v: %v", c, err)
		}
	}
	if _, err := r.Acquire(now, "a", 90, 1); err == nil {
		t.Fatal("the bucket was refilled by a refused charge")
	}
}

// TestAdminKeys: admin key digests parse and are kept apart from tenant
// keys.
func TestAdminKeys(t *testing.T) {
	h3 := HashKey("admin")
	cfg, err := Parse(strings.NewReader("admin_key_sha256: [" + h3 + "]\ntenants:\n  - id: a\n    api_key_sha256: [" + h1 + "]"))
	if err != nil {
		t.Fatal(err)
	}
	if keys := cfg.AdminKeys(); len(keys) != 1 || keys[0] != sha256.Sum256([]byte("admin")) {
		t.Fatalf("admin keys %x", keys)
	}
	for name, src := range map[string]string{
		"tenant key as admin key": "admin_key_sha256: [" + h1 + "]\ntenants:\n  - id: a\n    api_key_sha256: [" + h1 + "]",
		"short admin hash":        "admin_key_sha256: [abc]\ntenants:\n  - id: a\n    api_key_sha256: [" + h1 + "]",
		"misspelt field":          "admin_keys_sha256: [" + h3 + "]\ntenants:\n  - id: a\n    api_key_sha256: [" + h1 + "]",
	} {
		if _, err := Parse(strings.NewReader(src)); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
}

func TestDiff(t *testing.T) {
	reg, err := NewRegistry(&Config{Tenants: []Tenant{
		{ID: "a", APIKeySHA256: []string{h1}},
		{ID: "b", APIKeySHA256: []string{h2}, Limits: Limits{MaxConcurrent: 2}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	old := reg.Tenants()
	if len(old) != 2 || old[0].ID != "a" || old[1].ID != "b" {
		t.Fatalf("tenants %+v", old)
	}
	if d := Diff(old, reg.Tenants()); d != nil {
		t.Fatalf("no change: %v", d)
	}
	h3 := HashKey("k3")
	if err := reg.Reload(&Config{Tenants: []Tenant{
		{ID: "a", APIKeySHA256: []string{h3}},                                                  // its only key replaced: changes hands
		{ID: "b", APIKeySHA256: []string{h2, HashKey("k4")}, Limits: Limits{MaxConcurrent: 4}}, // a key added, a limit raised
		{ID: "c", APIKeySHA256: []string{HashKey("k5")}},
	}}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"tenant a keys: 1 added, 1 removed",
		"tenant a changed hands (no key kept): new cache namespace",
		"tenant b limits {RequestsPerMinute:0 TokensPerMinute:0 MaxConcurrent:2 MaxKVPages:0 Priority:0} -> {RequestsPerMinute:0 TokensPerMinute:0 MaxConcurrent:4 MaxKVPages:0 Priority:0}",
		"tenant b keys: 1 added, 0 removed",
		"tenant c added (1 keys, limits {RequestsPerMinute:0 TokensPerMinute:0 MaxConcurrent:0 MaxKVPages:0 Priority:0})",
	}
	got := Diff(old, reg.Tenants())
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("diff (-want +got):\n%s", diff)
	}
	for _, line := range got {
		if strings.Contains(line, h3) || strings.Contains(line, h1) {
			t.Errorf("a key hash in %q", line)
		}
	}
	if got := Diff(reg.Tenants(), old[:1]); !slices.Contains(got, "tenant b removed") || !slices.Contains(got, "tenant c removed") {
		t.Errorf("removals: %v", got)
	}
}
