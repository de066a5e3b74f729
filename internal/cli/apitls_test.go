package cli

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/syncbuf"
)

// selfSigned writes a certificate for 127.0.0.1 and its key, and returns
// their paths and a pool that trusts the certificate.
func selfSigned(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pagewarden test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool
}

// serveUntil runs serve with args until the test ends and returns the
// first submatch of re in its stderr once it appears.
func serveUntil(t *testing.T, re string, args ...string) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errb := &watchBuffer{wrote: make(chan struct{}, 1)}
	code := make(chan int, 1)
	args = append([]string{"serve", "--model", "builtin:tiny", "--threads", "1", "--colocated", "--listen", "127.0.0.1:0", "--kv-memory", "64MiB", "--metrics-listen="}, args...)
	go func() { code <- Main(ctx, args, io.Discard, errb) }()
	t.Cleanup(func() { cancel(); <-code })
	want := regexp.MustCompile(re)
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for {
		if m := want.FindStringSubmatch(errb.String()); m != nil {
			return m
		}
		select {
		case <-errb.wrote:
		case c := <-code:
			code <- c
			t.Fatalf("serve exited %d; stderr:\n%s", c, errb.String())
		case <-timeout.C:
			t.Fatalf("no %q after 30s; stderr:\n%s", re, errb.String())
		}
	}
}

// TestServeTLS: --tls-cert/--tls-key serve the API (and the admin
// listener) over TLS 1.2 or later, HTTP/2 included; TLS 1.1 and plain
// HTTP are refused.
func TestServeTLS(t *testing.T) {
	certFile, keyFile, pool := selfSigned(t)
	const adminKey = "pw-admin-tls"
	m := serveUntil(t, `admin on (https://\S+)/admin/\n(?:.*\n)*?listening on (https://\S+)\n`,
		"--tls-cert", certFile, "--tls-key", keyFile, "--api-key", "pw-tenant", "--admin-listen", "127.0.0.1:0", "--admin-key", adminKey)
	admin, api := m[1], m[2]
	for _, tc := range []struct {
		name    string
		tls     *tls.Config
		h2      bool
		wantErr bool
	}{
		{"TLS 1.3 over HTTP/2", &tls.Config{RootCAs: pool}, true, false},
		{"TLS 1.2 over HTTP/1.1", &tls.Config{RootCAs: pool, MaxVersion: tls.VersionTLS12}, false, false},
		{"TLS 1.1", &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}, false, true},
		{"untrusted certificate", &tls.Config{}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc.tls, ForceAttemptHTTP2: tc.h2}, Timeout: 10 * time.Second}
			for url, key := range map[string]string{api + "/v1/models": "pw-tenant", admin + "/admin/api/tenants": adminKey} {
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := c.Do(req)
				if tc.wantErr {
					if err == nil {
						resp.Body.Close()
						t.Errorf("%s: served", url)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: %v", url, err)
				}
				resp.Body.Close()
				if resp.StatusCode != 200 || (resp.ProtoMajor == 2) != tc.h2 {
					t.Errorf("%s: %d over %s", url, resp.StatusCode, resp.Proto)
				}
			}
		})
	}
	// Plain HTTP to the TLS port gets Go's 400, never the API.
	if resp, err := http.Get(strings.Replace(api, "https://", "http://", 1) + "/v1/models"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("plain HTTP: %d", resp.StatusCode)
		}
	}
}

func TestServeTLSFlagsRefused(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t)
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"cert without key":   {[]string{"--tls-cert", certFile}, "go together"},
		"key without cert":   {[]string{"--tls-key", keyFile}, "go together"},
		"key is not the key": {[]string{"--tls-cert", certFile, "--tls-key", certFile}, "--tls-key"},
		"missing file":       {[]string{"--tls-cert", certFile + ".nope", "--tls-key", keyFile}, "no such file"},
	} {
		t.Run(name, func(t *testing.T) {
			var stderr syncbuf.Buffer
			args := append([]string{"serve", "--model", "builtin:tiny", "--listen", "127.0.0.1:0", "--metrics-listen="}, tc.args...)
			if code := Main(context.Background(), args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, want 2 with %q:\n%s", code, tc.want, stderr.String())
			}
		})
	}
}

// TestGatewayTLSFlags: the gateway's API TLS flags are --api-tls-cert and
// --api-tls-key (its --tls-* flags are the link's identity), checked like
// serve's before anything starts.
func TestGatewayTLSFlags(t *testing.T) {
	certFile, keyFile, _ := selfSigned(t)
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"cert without key": {[]string{"--api-tls-cert", certFile}, "--api-tls-cert and --api-tls-key go together"},
		"key without cert": {[]string{"--api-tls-key", keyFile}, "go together"},
		"not a key pair":   {[]string{"--api-tls-cert", keyFile, "--api-tls-key", keyFile}, "--api-tls-cert"},
	} {
		t.Run(name, func(t *testing.T) {
			var stderr syncbuf.Buffer
			args := append([]string{"gateway", "--model", "builtin:tiny", "--prefill", "p=127.0.0.1:1", "--decode", "d=127.0.0.1:1", "--listen", "127.0.0.1:0", "--metrics-listen="}, tc.args...)
			if code := Main(context.Background(), args, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("exit %d, want 2 with %q:\n%s", code, tc.want, stderr.String())
			}
		})
	}
}
