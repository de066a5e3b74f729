package link

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
)

// ErrAuth: a peer's certificate does not prove the identity a link needs
// (wrong CA, no node identity, not the node that was dialled).
var ErrAuth = errors.New("link: peer not authenticated")

// TLS is a node's mutual-TLS configuration: what its listener presents
// and requires (Server), what its dialer presents and requires (Client),
// and the identity its own certificate names (Self). Both configurations
// pin TLS 1.3 and verify the peer's chain against the operator's CA only;
// the system roots play no part.
type TLS struct {
	Self   Identity
	Server *tls.Config
	Client *tls.Config
}

// LoadTLS reads the operator's CA certificate(s) and this node's
// certificate and key (PEM files) and returns the node's TLS
// configuration. The node certificate must name a node (IdentityOf) and
// chain to the CA.
func LoadTLS(caFile, certFile, keyFile string) (*TLS, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPKI, err)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPKI, err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPKI, err)
	}
	return NewTLS(caPEM, certPEM, keyPEM)
}

// NewTLS is LoadTLS from PEM bytes.
func NewTLS(caPEM, certPEM, keyPEM []byte) (*TLS, error) {
	roots := x509.NewCertPool()
	n := 0
	for rest := caPEM; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: CA: %v", ErrPKI, err)
		}
		roots.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("%w: no CA certificate in the CA file", ErrPKI)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%w: node certificate: %v", ErrPKI, err)
	}
	leaf := pair.Leaf
	self, err := IdentityOf(leaf)
	if err != nil {
		return nil, err
	}
	// A node whose own certificate its peers would refuse is a
	// configuration error to report now, not at the first handoff.
	inter := x509.NewCertPool()
	for _, der := range pair.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%w: node certificate chain: %v", ErrPKI, err)
		}
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, fmt.Errorf("%w: node certificate %v does not verify against the CA: %v", ErrPKI, self, err)
	}
	server := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		MaxVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    roots,
		// The chain was verified against ClientCAs; the client must also
		// name a node.
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := PeerIdentity(cs)
			return err
		},
	}
	client := &tls.Config{
		MinVersion:   tls.VersionTLS13,
		MaxVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		// Nodes are authenticated by the identity in their certificate,
		// not by a host name: the standard check, which compares
		// ServerName with DNS SANs, is replaced by verifyServer, which
		// checks the chain against roots and that the certificate names
		// the node ServerName names. Both run in the handshake.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyServer(cs, roots)
		},
	}
	return &TLS{Self: self, Server: server, Client: client}, nil
}

// ForPeer returns a client configuration that accepts only the node
// named peer: a connection to an address where another node (or another
// CA's certificate) answers fails in the handshake.
func (t *TLS) ForPeer(peer Identity) *tls.Config {
	c := t.Client.Clone()
	c.ServerName = string(peer.Name)
	return c
}

// verifyServer is the client's check of the server: the chain verifies
// against the CA for server use, and the certificate names the node the
// client meant to reach (ServerName holds its name).
func verifyServer(cs tls.ConnectionState, roots *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("%w: no certificate", ErrAuth)
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	leaf := cs.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("%w: %v", ErrAuth, err)
	}
	id, err := IdentityOf(leaf)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrAuth, err)
	}
	if cs.ServerName == "" || string(id.Name) != cs.ServerName {
		return fmt.Errorf("%w: dialled node %s, answered by %v", ErrAuth, cs.ServerName, id)
	}
	return nil
}

// PeerIdentity is the node identity of a verified connection's peer.
func PeerIdentity(cs tls.ConnectionState) (Identity, error) {
	if len(cs.PeerCertificates) == 0 {
		return Identity{}, fmt.Errorf("%w: no certificate", ErrAuth)
	}
	id, err := IdentityOf(cs.PeerCertificates[0])
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrAuth, err)
	}
	return id, nil
}
