package link

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"time"
)

// Validity defaults for development certificates (`pagewarden certs`).
// Production takes the operator's certificates, whatever their lifetime.
const (
	DevCAValidity   = 5 * 365 * 24 * time.Hour
	DevNodeValidity = 397 * 24 * time.Hour
)

// ErrPKI: a certificate or key could not be made, read or used.
var ErrPKI = errors.New("link: certificate")

// CA is a certificate authority that issues node certificates: the
// operator's own (LoadCA) or a development one (NewCA).
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// CertPEM and KeyPEM are the PEM encodings of Cert and Key.
	CertPEM, KeyPEM []byte
}

// NewCA makes a self-signed ECDSA P-256 CA named name, valid from now
// (less a minute of clock skew) for validity, that can sign only leaf
// certificates.
func NewCA(name string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("%w: CA key: %v", ErrPKI, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"pagewarden"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("%w: CA: %v", ErrPKI, err)
	}
	return caFrom(der, key)
}

// LoadCA reads a CA certificate and its private key (PEM, "CERTIFICATE"
// and "PRIVATE KEY" or "EC PRIVATE KEY").
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: CA: no CERTIFICATE block", ErrPKI)
	}
	key, err := parseECKey(keyPEM)
	if err != nil {
		return nil, err
	}
	ca, err := caFrom(block.Bytes, key)
	if err != nil {
		return nil, err
	}
	if !ca.Cert.IsCA {
		return nil, fmt.Errorf("%w: %q is not a CA certificate", ErrPKI, ca.Cert.Subject.CommonName)
	}
	if !key.PublicKey.Equal(ca.Cert.PublicKey) {
		return nil, fmt.Errorf("%w: the CA key does not match the CA certificate", ErrPKI)
	}
	return ca, nil
}

func caFrom(der []byte, key *ecdsa.PrivateKey) (*CA, error) {
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%w: CA: %v", ErrPKI, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: keyPEM}, nil
}

// NodeCert is an issued node certificate and its key, PEM-encoded.
type NodeCert struct {
	CertPEM, KeyPEM []byte
}

// Issue makes a node certificate for id, with an ECDSA P-256 key, valid
// from now (less a minute) for validity but not past the CA's own expiry,
// usable as both TLS server and client. Hosts (DNS names or IP addresses
// where the node is reached) become DNS and IP SANs; the identity is the
// URI SAN pagewarden://ROLE/NAME, which is what links check.
func (ca *CA) Issue(id Identity, hosts []string, now time.Time, validity time.Duration) (NodeCert, error) {
	if err := id.Validate(); err != nil {
		return NodeCert{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return NodeCert{}, fmt.Errorf("%w: node key: %v", ErrPKI, err)
	}
	serial, err := newSerial()
	if err != nil {
		return NodeCert{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: string(id.Name), Organization: []string{"pagewarden"}, OrganizationalUnit: []string{id.Role.String()}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{id.URI()},
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return NodeCert{}, fmt.Errorf("%w: %v: %v", ErrPKI, id, err)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return NodeCert{}, err
	}
	return NodeCert{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: keyPEM}, nil
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("%w: serial: %v", ErrPKI, err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

func encodeKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("%w: key: %v", ErrPKI, err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseECKey(keyPEM []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM key block", ErrPKI)
	}
	switch block.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: key: %v", ErrPKI, err)
		}
		ec, ok := k.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("%w: a %T key (want ECDSA)", ErrPKI, k)
		}
		return ec, nil
	case "EC PRIVATE KEY":
		k, err := x509.ParseECPrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: key: %v", ErrPKI, err)
		}
		return k, nil
	}
	return nil, fmt.Errorf("%w: PEM block %q (want PRIVATE KEY)", ErrPKI, block.Type)
}
