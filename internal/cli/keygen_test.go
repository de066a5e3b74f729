package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
)

// TestKeygen: a fresh key of the default key's format, and a YAML line
// that, in a tenant of a config, makes exactly that key authenticate.
func TestKeygen(t *testing.T) {
	seen := map[string]bool{}
	for range 3 {
		r := pw(t, "keygen")
		if r.code != 0 {
			t.Fatalf("exit %d: %s", r.code, r.stderr)
		}
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if len(lines) != 2 || !regexp.MustCompile(`^pw-[A-Za-z0-9_-]{43}$`).MatchString(lines[0]) {
			t.Fatalf("keygen printed %q; want a key and a YAML line", r.stdout)
		}
		key := lines[0]
		if seen[key] {
			t.Fatalf("key %s printed twice", key)
		}
		seen[key] = true
		cfg, err := tenants.Parse(strings.NewReader("tenants:\n  - id: acme\n    " + lines[1] + "\n"))
		if err != nil {
			t.Fatalf("the YAML line %q does not parse in a config: %v", lines[1], err)
		}
		reg, err := tenants.NewRegistry(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if tn, err := reg.Authenticate(key); err != nil || tn.ID != "acme" {
			t.Errorf("the printed key does not authenticate as the tenant: %v, %v", tn.ID, err)
		}
		if _, err := reg.Authenticate(key + "x"); err == nil {
			t.Error("another key authenticates")
		}
	}
}
