package tenants

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"regexp"

	"go.yaml.in/yaml/v3"
)

// Errors returned by this package.
var (
	ErrInvalidConfig = errors.New("tenants: invalid config")
	ErrUnauthorized  = errors.New("tenants: invalid API key")
	// ErrCharge: a charge that is negative (a caller's overflow), which
	// would refill the buckets it was meant to drain.
	ErrCharge = errors.New("tenants: invalid quota charge")
)

// maxConfigBytes bounds a config file: it is read whole.
const maxConfigBytes = 4 << 20

// Limits are one tenant's quotas. Zero means unlimited for every field.
type Limits struct {
	RequestsPerMinute int `yaml:"requests_per_minute"`
	TokensPerMinute   int `yaml:"tokens_per_minute"`
	MaxConcurrent     int `yaml:"max_concurrent"`
	MaxKVPages        int `yaml:"max_kv_pages"`
	// Priority is passed to the scheduler; higher runs first when pages
	// are short.
	Priority int `yaml:"priority"`
}

// Tenant is one configured customer.
type Tenant struct {
	ID string `yaml:"id"`
	// APIKeySHA256 are lowercase or uppercase hex SHA-256 digests of the
	// tenant's API keys; the keys themselves are never stored.
	APIKeySHA256 []string `yaml:"api_key_sha256"`
	Limits       Limits   `yaml:"limits"`
	// CacheNamespace is minted by the Registry, never configured: 128
	// random bits that stay with the tenant across reloads while it keeps
	// at least one of its keys, and change when an id is removed or handed
	// to a customer with none of the old keys. The gateway mixes it into
	// prefix-cache keys, so a recycled tenant id cannot probe the cache of
	// the customer who had it before.
	CacheNamespace string `yaml:"-"`
}

// Config is the tenant configuration file.
//
//	admin_key_sha256: ["<64 hex digits>"]
//	tenants:
//	  - id: acme
//	    api_key_sha256: ["<64 hex digits>"]
//	    limits: {requests_per_minute: 600, tokens_per_minute: 200000,
//	             max_concurrent: 8, max_kv_pages: 4096, priority: 1}
type Config struct {
	// AdminKeySHA256 are the hex SHA-256 digests of the keys that open the
	// admin listener (serve --admin-listen). They are never tenant keys:
	// a digest listed for a tenant too is refused.
	AdminKeySHA256 []string `yaml:"admin_key_sha256"`
	Tenants        []Tenant `yaml:"tenants"`
}

// AdminKeys returns the digests of the admin keys (the config was
// validated, so each parses).
func (c *Config) AdminKeys() [][32]byte {
	var out [][32]byte
	for _, h := range c.AdminKeySHA256 {
		if d, err := parseHash(h); err == nil {
			out = append(out, d)
		}
	}
	return out
}

var tenantIDRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// Validate checks the config: at least one tenant, ids well-formed and
// unique, every key hash 64 hex digits and owned by exactly one tenant,
// limits non-negative.
func (c *Config) Validate() error {
	if len(c.Tenants) == 0 {
		return fmt.Errorf("%w: no tenants", ErrInvalidConfig)
	}
	ids := make(map[string]bool)
	keys := make(map[[32]byte]string)
	for i, t := range c.Tenants {
		if !tenantIDRe.MatchString(t.ID) {
			return fmt.Errorf("%w: tenant %d: id %q must match %s", ErrInvalidConfig, i, t.ID, tenantIDRe)
		}
		if ids[t.ID] {
			return fmt.Errorf("%w: tenant id %q appears twice", ErrInvalidConfig, t.ID)
		}
		ids[t.ID] = true
		if len(t.APIKeySHA256) == 0 {
			return fmt.Errorf("%w: tenant %q has no api_key_sha256", ErrInvalidConfig, t.ID)
		}
		for _, h := range t.APIKeySHA256 {
			d, err := parseHash(h)
			if err != nil {
				return fmt.Errorf("%w: tenant %q: %v", ErrInvalidConfig, t.ID, err)
			}
			if other, dup := keys[d]; dup {
				return fmt.Errorf("%w: a key hash of tenant %q is also listed for %q", ErrInvalidConfig, t.ID, other)
			}
			keys[d] = t.ID
		}
		l := t.Limits
		if l.RequestsPerMinute < 0 || l.TokensPerMinute < 0 || l.MaxConcurrent < 0 || l.MaxKVPages < 0 {
			return fmt.Errorf("%w: tenant %q: limits must not be negative", ErrInvalidConfig, t.ID)
		}
	}
	for i, h := range c.AdminKeySHA256 {
		d, err := parseHash(h)
		if err != nil {
			return fmt.Errorf("%w: admin_key_sha256 %d: %v", ErrInvalidConfig, i, err)
		}
		if t, dup := keys[d]; dup {
			return fmt.Errorf("%w: admin_key_sha256 %d is also a key of tenant %q: an admin key must not be a tenant key", ErrInvalidConfig, i, t)
		}
	}
	return nil
}

func parseHash(h string) ([32]byte, error) {
	var d [32]byte
	if len(h) != 64 {
		return d, fmt.Errorf("key hash must be 64 hex digits (SHA-256), got %d characters", len(h))
	}
	if _, err := hex.Decode(d[:], []byte(h)); err != nil {
		return d, fmt.Errorf("key hash is not hex")
	}
	return d, nil
}

// Parse reads and validates a YAML config. Unknown fields are an error: a
// misspelt limit must not silently mean "unlimited".
func Parse(r io.Reader) (*Config, error) {
	data, err := io.ReadAll(io.LimitReader(r, maxConfigBytes+1))
	if err != nil {
		return nil, fmt.Errorf("tenants: read config: %w", err)
	}
	if len(data) > maxConfigBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrInvalidConfig, maxConfigBytes)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var c Config
	if err := dec.Decode(&c); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty", ErrInvalidConfig)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalidConfig, err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// HashKey returns the hex SHA-256 of an API key, the form stored in configs.
func HashKey(key string) string {
	d := sha256.Sum256([]byte(key))
	return hex.EncodeToString(d[:])
}

// GenerateKey returns a fresh random API key ("pw-" and 43 base64url
// characters: 256 bits) and its hash.
func GenerateKey() (key, hash string, err error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("tenants: generate key: %w", err)
	}
	key = "pw-" + base64.RawURLEncoding.EncodeToString(b[:])
	return key, HashKey(key), nil
}

// DefaultTenantID is the tenant of the config made by Default.
const DefaultTenantID = "default"

// Default returns the configuration used when none is given: one tenant,
// no limits, and a freshly generated key, returned so that the caller can
// print it once. The key is not stored anywhere else.
func Default() (cfg *Config, key string, err error) {
	key, hash, err := GenerateKey()
	if err != nil {
		return nil, "", err
	}
	return &Config{Tenants: []Tenant{{ID: DefaultTenantID, APIKeySHA256: []string{hash}}}}, key, nil
}
