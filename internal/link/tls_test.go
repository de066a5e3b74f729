package link

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

func TestLoadTLS(t *testing.T) {
	pki := newPKI(t)
	id := Identity{Name: "decode-1", Role: transfer.RoleDecode}
	nc, err := pki.ca.Issue(id, []string{"10.0.0.7", "decode-1.pagewarden.svc"}, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg, err := LoadTLS(write("ca.pem", pki.ca.CertPEM), write("d.pem", nc.CertPEM), write("d-key.pem", nc.KeyPEM))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Self != id {
		t.Errorf("Self = %v, want %v", cfg.Self, id)
	}
	for name, c := range map[string]*tls.Config{"server": cfg.Server, "client": cfg.Client} {
		if c.MinVersion != tls.VersionTLS13 || c.MaxVersion != tls.VersionTLS13 {
			t.Errorf("%s: TLS versions %#x..%#x, want 1.3 only", name, c.MinVersion, c.MaxVersion)
		}
		if len(c.Certificates) != 1 {
			t.Errorf("%s: %d certificates", name, len(c.Certificates))
		}
	}
	if cfg.Server.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Errorf("server ClientAuth = %v", cfg.Server.ClientAuth)
	}
	leaf := cfg.Server.Certificates[0].Leaf
	if len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.ParseIP("10.0.0.7")) || len(leaf.DNSNames) != 1 {
		t.Errorf("SANs: IPs %v, DNS %v", leaf.IPAddresses, leaf.DNSNames)
	}
	if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || pub.Curve != elliptic.P256() {
		t.Errorf("node key %T, want ECDSA P-256", leaf.PublicKey)
	}

	if _, err := LoadTLS(filepath.Join(dir, "missing.pem"), write("d2.pem", nc.CertPEM), write("d2-key.pem", nc.KeyPEM)); !errors.Is(err, ErrPKI) {
		t.Errorf("missing CA file: %v", err)
	}
}

// TestNewTLSRefuses: a node whose own certificate its peers would refuse
// does not start.
func TestNewTLSRefuses(t *testing.T) {
	pki, other := newPKI(t), newPKI(t)
	nc, err := other.ca.Issue(Identity{Name: "decode-1", Role: transfer.RoleDecode}, nil, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewTLS(pki.ca.CertPEM, nc.CertPEM, nc.KeyPEM); !errors.Is(err, ErrPKI) || !strings.Contains(err.Error(), "does not verify") {
		t.Errorf("certificate of another CA: %v", err)
	}
	plain := selfSigned(t, nil)
	if _, err := NewTLS(plain.CertPEM, plain.CertPEM, plain.KeyPEM); !errors.Is(err, ErrIdentity) {
		t.Errorf("certificate without a node identity: %v", err)
	}
	if _, err := NewTLS([]byte("not PEM"), nc.CertPEM, nc.KeyPEM); !errors.Is(err, ErrPKI) {
		t.Errorf("no CA: %v", err)
	}
}

// selfSigned is an impostor's certificate: self-signed, for server and
// client use, naming id when id is not nil.
func selfSigned(t testing.TB, id *Identity) NodeCert {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "impostor"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	if id != nil {
		tmpl.URIs = append(tmpl.URIs, id.URI())
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := encodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return NodeCert{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), KeyPEM: kb}
}

func TestLoadCA(t *testing.T) {
	pki := newPKI(t)
	ca, err := LoadCA(pki.ca.CertPEM, pki.ca.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Cert.Equal(pki.ca.Cert) {
		t.Error("loaded CA differs")
	}
	other := newPKI(t)
	if _, err := LoadCA(pki.ca.CertPEM, other.ca.KeyPEM); !errors.Is(err, ErrPKI) {
		t.Errorf("mismatched key: %v", err)
	}
	nc, err := pki.ca.Issue(Identity{Name: "decode-1", Role: transfer.RoleDecode}, nil, time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(nc.CertPEM, nc.KeyPEM); !errors.Is(err, ErrPKI) {
		t.Errorf("a node certificate as CA: %v", err)
	}
	// A node certificate is valid no longer than its CA.
	short, err := NewCA("short", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nc, err = short.Issue(Identity{Name: "decode-1", Role: transfer.RoleDecode}, nil, time.Now(), DevNodeValidity)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(nc.CertPEM)
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if c.NotAfter.After(short.Cert.NotAfter) {
		t.Errorf("node certificate outlives its CA: %v > %v", c.NotAfter, short.Cert.NotAfter)
	}
}

// testPKI is a development CA for one test.
type testPKI struct {
	t  testing.TB
	ca *CA
}

func newPKI(t testing.TB) *testPKI {
	ca, err := NewCA("pagewarden test CA", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{t: t, ca: ca}
}

// tls issues a node certificate for id and returns its TLS configuration.
func (p *testPKI) tls(id Identity) *TLS {
	p.t.Helper()
	nc, err := p.ca.Issue(id, []string{"127.0.0.1", "localhost"}, time.Now(), time.Hour)
	if err != nil {
		p.t.Fatal(err)
	}
	c, err := NewTLS(p.ca.CertPEM, nc.CertPEM, nc.KeyPEM)
	if err != nil {
		p.t.Fatal(err)
	}
	return c
}
