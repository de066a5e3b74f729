package cli

import (
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/cluster"
	"github.com/pagewarden/pagewarden/internal/cluster/etcdtest"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

func readCert(t *testing.T, p string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b)
	if block == nil {
		t.Fatalf("%s: no PEM", p)
	}
	c, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCerts: pagewarden certs writes a CA and node certificates that
// LoadTLS accepts, with the identity and hosts asked for and private
// keys readable by their owner only; it adds nodes under an existing CA
// and overwrites nothing without --force.
func TestCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	r := pw(t, "certs", "--out", dir, "--node", "gw-1:gateway", "--node", "d-1:decode:10.0.0.6,decode-1.example.internal,::1")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, "pagewarden://decode/d-1 (10.0.0.6,decode-1.example.internal,::1)") {
		t.Errorf("stdout does not list d-1's identity and hosts:\n%s", r.stdout)
	}
	for name, mode := range map[string]os.FileMode{"ca.pem": 0o644, "ca-key.pem": 0o600, "gw-1.pem": 0o644, "gw-1-key.pem": 0o600, "d-1.pem": 0o644, "d-1-key.pem": 0o600} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode().Perm(), mode)
		}
	}
	load := func(name string) *link.TLS {
		t.Helper()
		cfg, err := link.LoadTLS(filepath.Join(dir, "ca.pem"), filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem"))
		if err != nil {
			t.Fatalf("LoadTLS %s: %v", name, err)
		}
		return cfg
	}
	if id := load("d-1").Self; id != (link.Identity{Name: "d-1", Role: transfer.RoleDecode}) {
		t.Errorf("d-1 names %v", id)
	}
	if id := load("gw-1").Self; id != (link.Identity{Name: "gw-1", Role: transfer.RoleGateway}) {
		t.Errorf("gw-1 names %v", id)
	}
	d := readCert(t, filepath.Join(dir, "d-1.pem"))
	if len(d.IPAddresses) != 2 || !d.IPAddresses[0].Equal(net.ParseIP("10.0.0.6")) || !d.IPAddresses[1].Equal(net.ParseIP("::1")) ||
		len(d.DNSNames) != 1 || d.DNSNames[0] != "decode-1.example.internal" {
		t.Errorf("d-1 SANs: IPs %v, DNS %v", d.IPAddresses, d.DNSNames)
	}
	ca := readCert(t, filepath.Join(dir, "ca.pem"))
	if !ca.IsCA || d.NotAfter.After(ca.NotAfter) {
		t.Errorf("CA %v (IsCA %v); node valid until %v", ca.NotAfter, ca.IsCA, d.NotAfter)
	}

	// Nothing is overwritten without --force, and nothing is written.
	before, _ := os.ReadFile(filepath.Join(dir, "d-1-key.pem"))
	r = pw(t, "certs", "--out", dir, "--node", "p-1:prefill", "--node", "d-1:decode")
	if r.code != 1 || !strings.Contains(r.stderr, "d-1.pem exists") || !strings.Contains(r.stderr, "--force") {
		t.Errorf("overwrite without --force: exit %d, %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "p-1.pem")); err == nil {
		t.Error("a refused run wrote p-1.pem")
	}

	// A new node joins under the same CA.
	r = pw(t, "certs", "--out", dir, "--node", "p-1:prefill:127.0.0.1")
	if r.code != 0 || !strings.Contains(r.stdout, "existing CA") {
		t.Fatalf("adding a node: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	load("p-1")
	if !readCert(t, filepath.Join(dir, "ca.pem")).Equal(ca) {
		t.Error("adding a node replaced the CA")
	}

	// --force makes a new CA and overwrites.
	r = pw(t, "certs", "--out", dir, "--node", "d-1:decode", "--force")
	if r.code != 0 {
		t.Fatalf("--force: exit %d: %s", r.code, r.stderr)
	}
	if readCert(t, filepath.Join(dir, "ca.pem")).Equal(ca) {
		t.Error("--force kept the old CA")
	}
	after, _ := os.ReadFile(filepath.Join(dir, "d-1-key.pem"))
	if string(after) == string(before) {
		t.Error("--force kept the old key")
	}
	load("d-1")
	// p-1 was issued by the old CA: it no longer verifies.
	if _, err := link.LoadTLS(filepath.Join(dir, "ca.pem"), filepath.Join(dir, "p-1.pem"), filepath.Join(dir, "p-1-key.pem")); err == nil {
		t.Error("a certificate of the replaced CA still loads")
	}

	// Half a CA is an error, not a new CA.
	half := t.TempDir()
	if err := os.WriteFile(filepath.Join(half, "ca.pem"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r = pw(t, "certs", "--out", half, "--node", "d-1:decode"); r.code != 1 || !strings.Contains(r.stderr, "only one of ca.pem and ca-key.pem") {
		t.Errorf("half a CA: exit %d, %q", r.code, r.stderr)
	}
}

func TestCertsUsageErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"certs", "--node", "d:decode"}, "--out is required"},
		{[]string{"certs", "--out", dir}, "--node is required"},
		{[]string{"certs", "--out", dir, "--node", "d"}, "want NAME:ROLE"},
		{[]string{"certs", "--out", dir, "--node", "d:router"}, `role "router"`},
		{[]string{"certs", "--out", dir, "--node", "d/x:decode"}, "node name"},
		{[]string{"certs", "--out", dir, "--node", ":decode"}, "node name"},
		{[]string{"certs", "--out", dir, "--node", "d:decode:"}, `host ""`},
		{[]string{"certs", "--out", dir, "--node", "d:decode:a..b"}, `host "a..b"`},
		{[]string{"certs", "--out", dir, "--node", "d:decode:h_1"}, `host "h_1"`},
		{[]string{"certs", "--out", dir, "--node", "d:decode", "--node", "d:prefill"}, `"d" named twice`},
		{[]string{"certs", "--out", dir, "--node", "ca:decode"}, "the name ca is the CA's"},
		{[]string{"certs", "--out", dir, "--node", "d:decode", "--validity", "-1h"}, "positive durations"},
	} {
		t.Run(strings.Join(tc.args[1:], " "), func(t *testing.T) {
			r := pw(t, tc.args...)
			if r.code != 2 || !strings.HasPrefix(r.stderr, "pagewarden: ") || !strings.Contains(r.stderr, tc.msg) {
				t.Errorf("exit %d, stderr %q; want 2 naming %q", r.code, r.stderr, tc.msg)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("a usage error wrote %d files", len(entries))
			}
		})
	}
}

// TestCertsForEtcd: --etcd writes a certificate an etcd server (embedded,
// real) serves TLS with, to which a node's own certificate of the same
// set is a client certificate; it names no pagewarden node, so the links
// refuse it; and its file name cannot also be a node's.
func TestCertsForEtcd(t *testing.T) {
	dir := t.TempDir()
	r := pw(t, "certs", "--out", dir, "--node", "d-1:decode", "--etcd", "127.0.0.1,*.etcd,localhost")
	if r.code != 0 || !strings.Contains(r.stdout, "etcd's members") {
		t.Fatalf("exit %d: %s %s", r.code, r.stdout, r.stderr)
	}
	file := func(name string) string { return filepath.Join(dir, name) }
	c := readCert(t, file("etcd.pem"))
	if c.Subject.CommonName != "etcd" || len(c.URIs) != 0 || len(c.IPAddresses) != 1 || !slices.Equal(c.DNSNames, []string{"*.etcd", "localhost"}) {
		t.Errorf("etcd.pem: CN %q, URIs %v, IPs %v, DNS %v", c.Subject.CommonName, c.URIs, c.IPAddresses, c.DNSNames)
	}
	if fi, err := os.Stat(file("etcd-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("etcd-key.pem: %v %v", fi, err)
	}
	if _, err := link.LoadTLS(file("ca.pem"), file("etcd.pem"), file("etcd-key.pem")); err == nil {
		t.Error("the links accept etcd's certificate as a node's")
	}
	srv := etcdtest.Start(t, etcdtest.Options{TLS: &etcdtest.TLS{Cert: file("etcd.pem"), Key: file("etcd-key.pem"), ClientCA: file("ca.pem")}})
	cl, err := cluster.Dial(t.Context(), cluster.Config{Endpoints: []string{srv.Endpoint}, TLS: cluster.TLSFiles{CA: file("ca.pem"), Cert: file("d-1.pem"), Key: file("d-1-key.pem")}})
	if err != nil {
		t.Fatalf("a node's certificate as etcd client: %v", err)
	}
	cl.Close()
	if _, err := cluster.Dial(t.Context(), cluster.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: time.Second, TLS: cluster.TLSFiles{CA: file("ca.pem")}}); err == nil {
		t.Error("etcd took a client without a certificate")
	}
	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"certs", "--out", t.TempDir(), "--node", "etcd:decode", "--etcd", "*.etcd"}, "the name etcd is etcd's"},
		{[]string{"certs", "--out", t.TempDir(), "--etcd", "a..b"}, `--etcd: host "a..b"`},
	} {
		if r := pw(t, tc.args...); r.code != 2 || !strings.Contains(r.stderr, tc.msg) {
			t.Errorf("%q: exit %d, %q; want 2 and %q", tc.args, r.code, r.stderr, tc.msg)
		}
	}
	// etcd's certificate alone (a CA and etcd.pem, no node).
	alone := t.TempDir()
	if r := pw(t, "certs", "--out", alone, "--etcd", "localhost"); r.code != 0 {
		t.Errorf("--etcd alone: exit %d: %s", r.code, r.stderr)
	}
	readCert(t, filepath.Join(alone, "etcd.pem"))
}
