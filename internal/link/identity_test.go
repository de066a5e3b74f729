package link

import (
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

func TestParseIdentity(t *testing.T) {
	good := map[string]Identity{
		"pagewarden://gateway/gw":                        {"gw", transfer.RoleGateway},
		"pagewarden://prefill/prefill-1":                 {"prefill-1", transfer.RolePrefill},
		"pagewarden://decode/decode_2.eu-west":           {"decode_2.eu-west", transfer.RoleDecode},
		"pagewarden://decode/" + strings.Repeat("a", 63): {transfer.Peer(strings.Repeat("a", 63)), transfer.RoleDecode},
	}
	for s, want := range good {
		got, err := ParseIdentity(s)
		if err != nil || got != want {
			t.Errorf("ParseIdentity(%q) = %v, %v; want %v", s, got, err, want)
		}
		if u := want.URI().String(); u != s {
			t.Errorf("%v.URI() = %q, want %q", want, u, s)
		}
	}
	bad := []string{
		"", "pagewarden://", "pagewarden://decode", "pagewarden://decode/", "pagewarden://router/x",
		"https://decode/x", "PAGEWARDEN://decode/x", "pagewarden://Decode/x", "pagewarden:decode/x",
		"pagewarden://decode/x/y", "pagewarden://decode/x?y", "pagewarden://decode/x#y", "pagewarden://decode/x%41",
		"pagewarden://decode:1/x", "pagewarden://u@decode/x", "pagewarden://decode/-x", "pagewarden://decode/.x",
		"pagewarden://decode/" + strings.Repeat("a", 64), "pagewarden://decode/x y", "pagewarden://decode/é",
	}
	for _, s := range bad {
		if id, err := ParseIdentity(s); !errors.Is(err, ErrIdentity) {
			t.Errorf("ParseIdentity(%q) = %v, %v; want ErrIdentity", s, id, err)
		}
	}
}

// FuzzParseIdentity: ParseIdentity never panics, accepts only the
// canonical form, and agrees with what a certificate's URI SAN carries.
func FuzzParseIdentity(f *testing.F) {
	for _, s := range []string{"pagewarden://decode/d1", "pagewarden://gateway/g", "pagewarden://prefill/a.b_c-d", "pagewarden://x/%2F", "pagewarden://decode/a/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := ParseIdentity(s)
		if err != nil {
			return
		}
		if err := id.Validate(); err != nil {
			t.Fatalf("ParseIdentity(%q) = %v, which does not validate: %v", s, id, err)
		}
		if u := id.URI().String(); u != s {
			t.Fatalf("ParseIdentity(%q) = %v, whose URI is %q", s, id, u)
		}
		u, err := url.Parse(s)
		if err != nil {
			t.Fatalf("%q parsed as an identity but not as a URL: %v", s, err)
		}
		if got, err := IdentityOf(&x509.Certificate{URIs: []*url.URL{u}}); err != nil || got != id {
			t.Fatalf("IdentityOf(%q) = %v, %v; want %v", s, got, err, id)
		}
	})
}

func TestIdentityOf(t *testing.T) {
	uri := func(s string) *url.URL {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	id, err := IdentityOf(&x509.Certificate{URIs: []*url.URL{uri("spiffe://example/x"), uri("pagewarden://decode/d1")}})
	if err != nil || id != (Identity{"d1", transfer.RoleDecode}) {
		t.Errorf("one pagewarden URI among others: %v, %v", id, err)
	}
	for name, c := range map[string]*x509.Certificate{
		"nil":       nil,
		"no URI":    {DNSNames: []string{"decode-1"}},
		"two nodes": {URIs: []*url.URL{uri("pagewarden://decode/d1"), uri("pagewarden://gateway/d1")}},
		"bad role":  {URIs: []*url.URL{uri("pagewarden://admin/d1")}},
	} {
		if id, err := IdentityOf(c); !errors.Is(err, ErrIdentity) {
			t.Errorf("%s: %v, %v; want ErrIdentity", name, id, err)
		}
	}
}
