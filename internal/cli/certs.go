package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

func init() { extraCommands = append(extraCommands, certsCmd) }

// certNode is one --node: the identity its certificate will carry and
// the host names and addresses it is reached at.
type certNode struct {
	id    link.Identity
	hosts []string
}

// parseCertNode parses NAME:ROLE[:HOST,HOST...]. Only the first two
// colons separate, so an IPv6 address is a host as it is.
func parseCertNode(s string) (certNode, error) {
	parts := strings.SplitN(s, ":", 3)
	if len(parts) < 2 {
		return certNode{}, fmt.Errorf("--node %q: want NAME:ROLE[:HOST,HOST...]", s)
	}
	if err := link.ValidateName(parts[0]); err != nil {
		return certNode{}, fmt.Errorf("--node %q: %v", s, err)
	}
	role, err := link.ParseRole(parts[1])
	if err != nil {
		return certNode{}, fmt.Errorf("--node %q: %v", s, err)
	}
	n := certNode{id: link.Identity{Name: transfer.Peer(parts[0]), Role: role}}
	if len(parts) == 3 {
		for _, h := range strings.Split(parts[2], ",") {
			if err := validHost(h); err != nil {
				return certNode{}, fmt.Errorf("--node %q: %v", s, err)
			}
			n.hosts = append(n.hosts, h)
		}
	}
	return n, nil
}

// validHost accepts an IP address or a DNS name (a leading "*." allowed).
func validHost(h string) error {
	if net.ParseIP(h) != nil {
		return nil
	}
	name := strings.TrimPrefix(h, "*.")
	if name == "" || len(name) > 253 {
		return fmt.Errorf("host %q: want an IP address or a DNS name", h)
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host %q: want an IP address or a DNS name", h)
		}
		for _, c := range label {
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
				return fmt.Errorf("host %q: want an IP address or a DNS name", h)
			}
		}
	}
	return nil
}

func certsCmd() *cobra.Command {
	var (
		out          string
		nodes        []string
		etcdHosts    []string
		force        bool
		caValidity   time.Duration
		nodeValidity time.Duration
	)
	c := &cobra.Command{
		Use:   "certs",
		Short: "Make a development CA and node certificates for the mutual-TLS links between nodes",
		Long: `Write a development certificate authority (ca.pem, ca-key.pem) and, for each
--node NAME:ROLE[:HOST,HOST...], a node certificate and key (NAME.pem,
NAME-key.pem) into --out. ROLE is gateway, prefill or decode. A node
certificate names its node in a URI SAN pagewarden://ROLE/NAME, which is what
links check; the HOSTs (DNS names or IP addresses, comma-separated) become DNS
and IP SANs. Keys are ECDSA P-256, written with mode 0600.

If --out already holds ca.pem and ca-key.pem, the new node certificates are
issued by that CA, so nodes can be added to a running development cluster.
Existing files are never overwritten without --force, which also makes a new
CA.

--etcd HOST,HOST... also writes etcd.pem and etcd-key.pem, the certificate
etcd's members serve clients and each other with (common name "etcd", the
HOSTs as SANs, no pagewarden identity, so it cannot pass for a node on the
links). etcd then trusts ca.pem for client certificates, and the nodes' own
certificates are their etcd client certificates (--etcd-cert, --etcd-key);
etcd's --peer-cert-allowed-cn=etcd keeps node certificates out of its
peer port. Production deployments use the operator's own CA and certificates
(--tls-ca, --tls-cert, --tls-key of gateway, prefill and decode).`,
		Example: `  pagewarden certs --out certs --node gw:gateway --node p1:prefill:10.0.0.5 \
      --node d1:decode:10.0.0.6,decode-1.example.internal`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required: the directory to write the certificates to")
			}
			if len(nodes) == 0 && len(etcdHosts) == 0 {
				return usagef("--node is required: NAME:ROLE[:HOST,HOST...], once per node (or --etcd HOST,... for etcd's certificate)")
			}
			for _, h := range etcdHosts {
				if err := validHost(h); err != nil {
					return usagef("--etcd: %v", err)
				}
			}
			if caValidity <= 0 || nodeValidity <= 0 {
				return usagef("--ca-validity %v, --validity %v: want positive durations", caValidity, nodeValidity)
			}
			var parsed []certNode
			seen := map[string]bool{}
			for _, s := range nodes {
				n, err := parseCertNode(s)
				if err != nil {
					return usageError{err}
				}
				if seen[string(n.id.Name)] {
					return usagef("--node: node %q named twice", n.id.Name)
				}
				// "ca" would collide with the CA's own files.
				if n.id.Name == "ca" {
					return usagef("--node %q: the name ca is the CA's", s)
				}
				if n.id.Name == etcdCertName && len(etcdHosts) > 0 {
					return usagef("--node %q: with --etcd, the name etcd is etcd's certificate", s)
				}
				seen[string(n.id.Name)] = true
				parsed = append(parsed, n)
			}
			return writeCertSet(cmd, out, parsed, etcdHosts, force, caValidity, nodeValidity)
		},
	}
	c.Flags().StringVar(&out, "out", "", "directory to write the certificates and keys to (created if missing)")
	c.Flags().StringArrayVar(&nodes, "node", nil, "a node certificate to make: NAME:ROLE[:HOST,HOST...] (repeatable)")
	c.Flags().StringSliceVar(&etcdHosts, "etcd", nil, "also make etcd.pem for etcd's members, for these DNS names and addresses (comma-separated; \"*.etcd\" covers a StatefulSet's pods)")
	c.Flags().BoolVar(&force, "force", false, "overwrite existing files and make a new CA")
	c.Flags().DurationVar(&caValidity, "ca-validity", link.DevCAValidity, "how long the CA is valid")
	c.Flags().DurationVar(&nodeValidity, "validity", link.DevNodeValidity, "how long each node certificate is valid (never past the CA)")
	return c
}

func writeCertSet(cmd *cobra.Command, dir string, nodes []certNode, etcdHosts []string, force bool, caValidity, nodeValidity time.Duration) error {
	caCert, caKey := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "ca-key.pem")
	var targets []string
	for _, n := range nodes {
		targets = append(targets, filepath.Join(dir, string(n.id.Name)+".pem"), filepath.Join(dir, string(n.id.Name)+"-key.pem"))
	}
	if len(etcdHosts) > 0 {
		targets = append(targets, filepath.Join(dir, etcdCertName+".pem"), filepath.Join(dir, etcdCertName+"-key.pem"))
	}
	now := time.Now()
	var (
		ca    *link.CA
		newCA = true
	)
	haveCert, haveKey := fileExists(caCert), fileExists(caKey)
	switch {
	case force:
	case haveCert && haveKey:
		certPEM, err := os.ReadFile(caCert)
		if err != nil {
			return err
		}
		keyPEM, err := os.ReadFile(caKey)
		if err != nil {
			return err
		}
		if ca, err = link.LoadCA(certPEM, keyPEM); err != nil {
			return fmt.Errorf("%s: %w (--force makes a new CA)", dir, err)
		}
		newCA = false
	case haveCert || haveKey:
		return fmt.Errorf("%s holds only one of ca.pem and ca-key.pem: restore the other, or --force to make a new CA", dir)
	}
	if !force {
		// Refuse before writing anything: no half-written set.
		for _, p := range targets {
			if fileExists(p) {
				return fmt.Errorf("%s exists: not overwritten (--force overwrites, and makes a new CA)", p)
			}
		}
	}
	if newCA {
		var err error
		if ca, err = link.NewCA("pagewarden development CA", now, caValidity); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	if newCA {
		if err := writeCertFile(caCert, ca.CertPEM, 0o644, force); err != nil {
			return err
		}
		if err := writeCertFile(caKey, ca.KeyPEM, 0o600, force); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s  development CA, valid until %s\n%s  its key: keep it off the nodes\n", caCert, ca.Cert.NotAfter.UTC().Format(time.DateOnly), caKey)
	} else {
		fmt.Fprintf(w, "%s  existing CA, used to issue the certificates below\n", caCert)
	}
	for _, n := range nodes {
		nc, err := ca.Issue(n.id, n.hosts, now, nodeValidity)
		if err != nil {
			return err
		}
		certPath := filepath.Join(dir, string(n.id.Name)+".pem")
		keyPath := filepath.Join(dir, string(n.id.Name)+"-key.pem")
		if err := writeCertFile(certPath, nc.CertPEM, 0o644, force); err != nil {
			return err
		}
		if err := writeCertFile(keyPath, nc.KeyPEM, 0o600, force); err != nil {
			return err
		}
		hosts := "no host names"
		if len(n.hosts) > 0 {
			hosts = strings.Join(n.hosts, ",")
		}
		fmt.Fprintf(w, "%s  %s (%s)\n%s\n", certPath, n.id.URI(), hosts, keyPath)
	}
	if len(etcdHosts) > 0 {
		certPEM, keyPEM, err := issueEtcd(ca, etcdHosts, now, nodeValidity)
		if err != nil {
			return err
		}
		certPath, keyPath := filepath.Join(dir, etcdCertName+".pem"), filepath.Join(dir, etcdCertName+"-key.pem")
		if err := writeCertFile(certPath, certPEM, 0o644, force); err != nil {
			return err
		}
		if err := writeCertFile(keyPath, keyPEM, 0o600, force); err != nil {
			return err
		}
		fmt.Fprintf(w, "%s  etcd's members, server and peer (%s)\n%s\n", certPath, strings.Join(etcdHosts, ","), keyPath)
	}
	return nil
}

// etcdCertName is the common name of etcd's certificate and its files'
// stem: etcd's --peer-cert-allowed-cn names it.
const etcdCertName = "etcd"

// issueEtcd makes the certificate etcd's members use as servers (to
// clients and to each other) and as clients of each other: ECDSA P-256,
// common name etcd, hosts as SANs. Unlike a node certificate it carries
// no pagewarden:// URI, so link.LoadTLS refuses it: the links never take
// it for a node.
func issueEtcd(ca *link.CA, hosts []string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial.Add(serial, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: etcdCertName, Organization: []string{"pagewarden"}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("etcd certificate: %v", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return !errors.Is(err, fs.ErrNotExist)
}

// writeCertFile writes b to p with mode perm. Without overwrite it refuses an
// existing file (O_EXCL: no race with another writer); with it, it also
// resets the mode of the file it replaces.
func writeCertFile(p string, b []byte, perm os.FileMode, overwrite bool) error {
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	if overwrite {
		flags = os.O_WRONLY | os.O_CREATE | os.O_TRUNC
	}
	f, err := os.OpenFile(p, flags, perm)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s exists: not overwritten (--force overwrites)", p)
		}
		return err
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
