package link

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// Scheme is the URI scheme of a node identity in a certificate.
const Scheme = "pagewarden"

// MaxNodeNameLen bounds a node name: it is a URI path segment, a file name
// (NAME.pem) and a transfer.Peer.
const MaxNodeNameLen = 63

// ErrIdentity: a certificate or string does not name exactly one valid
// node identity.
var ErrIdentity = errors.New("link: bad node identity")

// Identity is who a node is: its name and its role. On a link it comes
// from the peer's verified certificate, never from what the peer says.
type Identity struct {
	Name transfer.Peer
	Role transfer.Role
}

func (id Identity) String() string { return id.Role.String() + "/" + string(id.Name) }

// URI is the identity as it appears in a certificate's URI SAN:
// pagewarden://ROLE/NAME.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: Scheme, Host: id.Role.String(), Path: "/" + string(id.Name)}
}

// Validate reports whether id has a known role and a valid name.
func (id Identity) Validate() error {
	if _, ok := roleByName(id.Role.String()); !ok {
		return fmt.Errorf("%w: role %v", ErrIdentity, id.Role)
	}
	return ValidateName(string(id.Name))
}

// ValidateName reports whether name may name a node: 1 to MaxNodeNameLen
// letters, digits, '.', '_' or '-', starting with a letter or digit.
func ValidateName(name string) error {
	if len(name) == 0 || len(name) > MaxNodeNameLen {
		return fmt.Errorf("%w: node name of %d bytes (want 1 to %d)", ErrIdentity, len(name), MaxNodeNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return fmt.Errorf("%w: node name %q: want letters, digits, '.', '_' or '-', starting with a letter or digit", ErrIdentity, name)
		}
	}
	return nil
}

// ParseRole parses "gateway", "prefill" or "decode".
func ParseRole(s string) (transfer.Role, error) {
	if r, ok := roleByName(s); ok {
		return r, nil
	}
	return 0, fmt.Errorf("%w: role %q (want gateway, prefill or decode)", ErrIdentity, s)
}

func roleByName(s string) (transfer.Role, bool) {
	for _, r := range []transfer.Role{transfer.RoleGateway, transfer.RolePrefill, transfer.RoleDecode} {
		if r.String() == s {
			return r, true
		}
	}
	return 0, false
}

// ParseIdentity parses the canonical form pagewarden://ROLE/NAME and
// nothing else: no user, port, query, fragment, escapes or extra path.
func ParseIdentity(s string) (Identity, error) {
	rest, ok := strings.CutPrefix(s, Scheme+"://")
	if !ok {
		return Identity{}, fmt.Errorf("%w: %q is not a %s:// URI", ErrIdentity, s, Scheme)
	}
	role, name, ok := strings.Cut(rest, "/")
	if !ok {
		return Identity{}, fmt.Errorf("%w: %q has no node name", ErrIdentity, s)
	}
	r, err := ParseRole(role)
	if err != nil {
		return Identity{}, err
	}
	// ValidateName admits no '/', '%', '?', '#', ':' or '@', so what is
	// left is exactly one plain path segment.
	if err := ValidateName(name); err != nil {
		return Identity{}, err
	}
	return Identity{Name: transfer.Peer(name), Role: r}, nil
}

// IdentityOf returns the node identity a certificate names: its one
// pagewarden URI SAN. A certificate with none, or with more than one, names
// no node. IdentityOf does not verify the certificate: the TLS handshake
// did that against the operator's CA.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	if cert == nil {
		return Identity{}, fmt.Errorf("%w: no certificate", ErrIdentity)
	}
	var (
		id    Identity
		found int
	)
	for _, u := range cert.URIs {
		if u.Scheme != Scheme {
			continue
		}
		found++
		var err error
		if id, err = ParseIdentity(u.String()); err != nil {
			return Identity{}, err
		}
	}
	switch found {
	case 0:
		return Identity{}, fmt.Errorf("%w: certificate %q has no %s:// URI SAN", ErrIdentity, cert.Subject.CommonName, Scheme)
	case 1:
		return id, nil
	}
	return Identity{}, fmt.Errorf("%w: certificate %q names %d nodes", ErrIdentity, cert.Subject.CommonName, found)
}
