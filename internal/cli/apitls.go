package cli

import (
	"crypto/tls"
	"net"

	"github.com/spf13/cobra"
)

// apiTLSFlags put the API listener (and the admin listener, which serves
// the admin key over HTTP Basic) behind TLS: --tls-cert/--tls-key on
// serve, --api-tls-cert/--api-tls-key on the gateway, whose --tls-* flags
// are the node link's mutual-TLS identity.
type apiTLSFlags struct {
	prefix     string // "" or "api-"
	cert, key  string
	loaded     *tls.Config
	registered bool
}

func (f *apiTLSFlags) register(c *cobra.Command, prefix string) {
	f.prefix, f.registered = prefix, true
	c.Flags().StringVar(&f.cert, prefix+"tls-cert", "", "certificate chain (PEM) the API listener serves over TLS 1.2 or later (needs --"+prefix+"tls-key)")
	c.Flags().StringVar(&f.key, prefix+"tls-key", "", "private key (PEM) of --"+prefix+"tls-cert")
}

// load reads the key pair, so that a bad file stops the start before the
// model is loaded. Neither flag: plain HTTP (nil). One without the other
// is a usage error: a certificate given without its key must not
// silently mean plain HTTP.
func (f *apiTLSFlags) load() (*tls.Config, error) {
	switch {
	case f.cert == "" && f.key == "":
		return nil, nil
	case f.cert == "" || f.key == "":
		return nil, usagef("--%stls-cert and --%stls-key go together: give both, or neither for plain HTTP", f.prefix, f.prefix)
	}
	pair, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		return nil, usagef("--%stls-cert %s / --%stls-key %s: %v", f.prefix, f.cert, f.prefix, f.key, err)
	}
	// TLS 1.2 is the floor (1.0 and 1.1 are deprecated, RFC 8996); Go's
	// default 1.2 cipher suites are all AEAD with forward secrecy.
	f.loaded = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2", "http/1.1"}}
	return f.loaded, nil
}

// wrap puts ln behind TLS when a key pair was loaded.
func (f *apiTLSFlags) wrap(ln net.Listener) net.Listener {
	if f.loaded == nil {
		return ln
	}
	return tls.NewListener(ln, f.loaded)
}

// scheme is the URL scheme of the API listener.
func (f *apiTLSFlags) scheme() string {
	if f.loaded == nil {
		return "http"
	}
	return "https"
}
