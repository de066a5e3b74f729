package tenants

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrQuotaExceeded is wrapped by every *QuotaError.
var ErrQuotaExceeded = errors.New("tenants: quota exceeded")

// QuotaError says which quota refused a request and when to retry.
type QuotaError struct {
	Tenant     string
	Limit      string        // "requests_per_minute", "tokens_per_minute", "max_concurrent", "max_kv_pages"
	RetryAfter time.Duration // at least one second
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("tenants: tenant %q exceeded %s; retry after %s", e.Tenant, e.Limit, e.RetryAfter)
}

func (e *QuotaError) Unwrap() error { return ErrQuotaExceeded }

// Registry authenticates API keys and enforces quotas. The tenant set is an
// immutable snapshot swapped atomically by Reload; quota state is kept per
// customer across reloads so that a reload neither refills buckets nor
// forgets requests in flight. A customer is a tenant id together with its
// CacheNamespace: when an id is removed or handed to someone with none of
// its keys, the new holder starts with full buckets and nothing in flight,
// and the previous holder's grants are released into the previous
// holder's counts.
type Registry struct {
	snap     atomic.Pointer[snapshot]
	reloadMu sync.Mutex // serialises Reload (namespaces carry over)

	mu    sync.Mutex
	usage map[string]*usage // by tenant id; guarded by mu
}

type snapshot struct {
	keys []keyEntry
	byID map[string]Tenant
	gen  uint64 // Generation
}

type keyEntry struct {
	hash   [32]byte
	tenant string
}

// usage is one customer's quota state.
type usage struct {
	customer string // the holder's CacheNamespace
	inflight int
	pages    int
	rpm      bucket
	tpm      bucket
}

// bucket is a token bucket of capacity perMinute refilling at perMinute/60
// per second. Its level may go negative when one request costs more than
// the capacity: such a request is admitted on a full bucket and later ones
// wait for the debt to be repaid, so a large request is slow, never
// impossible.
type bucket struct {
	level float64
	last  time.Time
	init  bool
}

func (b *bucket) refill(now time.Time, perMinute int) {
	c := float64(perMinute)
	if !b.init {
		b.level, b.last, b.init = c, now, true
		return
	}
	if dt := now.Sub(b.last).Seconds(); dt > 0 {
		b.level = math.Min(c, b.level+dt*c/60)
		b.last = now
	}
	if b.level > c { // capacity lowered by a reload
		b.level = c
	}
}

// wait is how long until cost (capped at capacity) is available; 0 if now.
func (b *bucket) wait(cost float64, perMinute int) time.Duration {
	need := math.Min(cost, float64(perMinute))
	if b.level >= need {
		return 0
	}
	secs := (need - b.level) * 60 / float64(perMinute)
	return time.Duration(math.Ceil(secs)) * time.Second
}

// NewRegistry validates cfg and builds a registry from it.
func NewRegistry(cfg *Config) (*Registry, error) {
	r := &Registry{usage: make(map[string]*usage)}
	if err := r.Reload(cfg); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload validates cfg and swaps it in atomically. On error the previous
// configuration stays in force. Requests already admitted keep running
// under the grant they hold, even if their tenant is removed.
func (r *Registry) Reload(cfg *Config) error {
	if cfg == nil {
		return fmt.Errorf("%w: nil", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	r.reloadMu.Lock()
	defer r.reloadMu.Unlock()
	prev := r.snap.Load()
	s := &snapshot{byID: make(map[string]Tenant, len(cfg.Tenants))}
	for _, t := range cfg.Tenants {
		t.APIKeySHA256 = append([]string(nil), t.APIKeySHA256...)
		t.CacheNamespace = ""
		if prev != nil {
			if old, ok := prev.byID[t.ID]; ok && sharesKey(old, t) {
				t.CacheNamespace = old.CacheNamespace
			}
		}
		if t.CacheNamespace == "" {
			ns, err := newNamespace()
			if err != nil {
				return err
			}
			t.CacheNamespace = ns
		}
		s.byID[t.ID] = t
		for _, h := range t.APIKeySHA256 {
			d, _ := parseHash(h) // validated above
			s.keys = append(s.keys, keyEntry{hash: d, tenant: t.ID})
		}
	}
	s.gen = 1
	if prev != nil {
		s.gen = prev.gen + 1
	}
	r.snap.Store(s)
	// Forget the counts of customers who no longer hold their id; grants
	// still out keep theirs and release into them.
	r.mu.Lock()
	for id, u := range r.usage {
		if t, ok := s.byID[id]; !ok || t.CacheNamespace != u.customer {
			delete(r.usage, id)
		}
	}
	r.mu.Unlock()
	return nil
}

// Generation counts the configurations the registry has held: 1 after
// NewRegistry, one more after each successful Reload. Whoever caches what
// Tenant returned re-reads it when the generation changes.
func (r *Registry) Generation() uint64 { return r.snap.Load().gen }

// sharesKey reports whether two definitions of a tenant id have a key in
// common: the same customer, reconfigured, rather than a new customer
// given an old id.
func sharesKey(a, b Tenant) bool {
	for _, x := range a.APIKeySHA256 {
		dx, _ := parseHash(x)
		for _, y := range b.APIKeySHA256 {
			if dy, _ := parseHash(y); dx == dy {
				return true
			}
		}
	}
	return false
}

// newNamespace is 128 random bits in hex.
func newNamespace() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("tenants: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Authenticate maps an API key to its tenant. It hashes the key and
// compares the digest with every configured hash in constant time, without
// stopping at a match, so timing reveals neither which key matched nor how
// many bytes of a guess were right.
func (r *Registry) Authenticate(key string) (Tenant, error) {
	s := r.snap.Load()
	if key == "" {
		return Tenant{}, ErrUnauthorized
	}
	d := sha256.Sum256([]byte(key))
	match := -1
	for i := range s.keys {
		if subtle.ConstantTimeCompare(d[:], s.keys[i].hash[:]) == 1 {
			match = i
		}
	}
	if match < 0 {
		return Tenant{}, ErrUnauthorized
	}
	return s.byID[s.keys[match].tenant], nil
}

// Tenant returns the current configuration of tenant id.
func (r *Registry) Tenant(id string) (Tenant, bool) {
	t, ok := r.snap.Load().byID[id]
	return t, ok
}

// Grant is one admitted request's hold on its tenant's quota. Release it
// exactly once when the request ends.
type Grant struct {
	r        *Registry
	u        *usage // the customer's counts at Acquire, even if the id changed hands since
	tenant   string
	tokens   int
	pages    int
	released atomic.Bool
}

// Acquire admits one request of tenant costing tokens (prompt + max_tokens)
// and pages (worst-case KV pages) under the tenant's current limits, or
// returns a *QuotaError. Nothing is charged when it refuses.
func (r *Registry) Acquire(now time.Time, tenant string, tokens, pages int) (*Grant, error) {
	if tokens < 0 || pages < 0 {
		return nil, fmt.Errorf("%w: %d tokens, %d pages", ErrCharge, tokens, pages)
	}
	t, ok := r.Tenant(tenant)
	if !ok {
		// Removed by a reload between authentication and admission.
		return nil, ErrUnauthorized
	}
	l := t.Limits
	r.mu.Lock()
	defer r.mu.Unlock()
	u := r.usage[tenant]
	if u == nil || u.customer != t.CacheNamespace {
		u = &usage{customer: t.CacheNamespace}
		r.usage[tenant] = u
	}
	refuse := func(limit string, after time.Duration) error {
		if after < time.Second {
			after = time.Second
		}
		return &QuotaError{Tenant: tenant, Limit: limit, RetryAfter: after}
	}
	if l.MaxConcurrent > 0 && u.inflight >= l.MaxConcurrent {
		return nil, refuse("max_concurrent", time.Second)
	}
	if l.MaxKVPages > 0 && u.pages+pages > l.MaxKVPages && u.inflight > 0 {
		// A request larger than the whole budget is admitted alone:
		// refusing it forever would be a silent denial.
		return nil, refuse("max_kv_pages", time.Second)
	}
	if l.RequestsPerMinute > 0 {
		u.rpm.refill(now, l.RequestsPerMinute)
		if w := u.rpm.wait(1, l.RequestsPerMinute); w > 0 {
			return nil, refuse("requests_per_minute", w)
		}
	}
	if l.TokensPerMinute > 0 {
		u.tpm.refill(now, l.TokensPerMinute)
		if w := u.tpm.wait(float64(tokens), l.TokensPerMinute); w > 0 {
			return nil, refuse("tokens_per_minute", w)
		}
	}
	if l.RequestsPerMinute > 0 {
		u.rpm.level--
	}
	if l.TokensPerMinute > 0 {
		u.tpm.level -= float64(tokens)
	}
	u.inflight++
	u.pages += pages
	return &Grant{r: r, u: u, tenant: tenant, tokens: tokens, pages: pages}, nil
}

// Release returns the grant's concurrency slot and pages, and refunds the
// tokens it charged but did not use (used is prompt + completion tokens
// actually processed). Calls after the first do nothing.
func (g *Grant) Release(now time.Time, used int) {
	if g == nil || !g.released.CompareAndSwap(false, true) {
		return
	}
	r := g.r
	r.mu.Lock()
	defer r.mu.Unlock()
	u := g.u
	u.inflight--
	u.pages -= g.pages
	// Refund only a customer who still holds the id: the bucket of one
	// who left is gone.
	if unused := g.tokens - used; unused > 0 && u.tpm.init && r.usage[g.tenant] == u {
		l, _ := r.Tenant(g.tenant)
		if l.Limits.TokensPerMinute > 0 {
			u.tpm.refill(now, l.Limits.TokensPerMinute)
			u.tpm.level = math.Min(float64(l.Limits.TokensPerMinute), u.tpm.level+float64(unused))
		}
	}
}

// InFlight is the number of admitted, unreleased requests of the customer
// who now holds tenant id (those of a previous holder are not counted).
func (r *Registry) InFlight(tenant string) int {
	t, ok := r.Tenant(tenant)
	r.mu.Lock()
	defer r.mu.Unlock()
	if u := r.usage[tenant]; ok && u != nil && u.customer == t.CacheNamespace {
		return u.inflight
	}
	return 0
}

// Tenants returns the configured tenants, by id. Their key hashes are
// copies; CacheNamespace is the registry's.
func (r *Registry) Tenants() []Tenant {
	s := r.snap.Load()
	out := make([]Tenant, 0, len(s.byID))
	for _, t := range s.byID {
		t.APIKeySHA256 = slices.Clone(t.APIKeySHA256)
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b Tenant) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Diff describes what changed from old to new tenants, one line per
// change, for the audit trail of a reload: tenants added or removed,
// limits changed (old and new values), keys added or removed (counts,
// never the hashes), and a cache namespace minted afresh (the id changed
// hands). Nil when nothing changed.
func Diff(old, new []Tenant) []string {
	byID := func(ts []Tenant) map[string]Tenant {
		m := make(map[string]Tenant, len(ts))
		for _, t := range ts {
			m[t.ID] = t
		}
		return m
	}
	o, n := byID(old), byID(new)
	var out []string
	for _, t := range new {
		ot, ok := o[t.ID]
		if !ok {
			out = append(out, fmt.Sprintf("tenant %s added (%d keys, limits %+v)", t.ID, len(t.APIKeySHA256), t.Limits))
			continue
		}
		if ot.Limits != t.Limits {
			out = append(out, fmt.Sprintf("tenant %s limits %+v -> %+v", t.ID, ot.Limits, t.Limits))
		}
		added, removed := 0, 0
		for _, h := range t.APIKeySHA256 {
			if !slices.ContainsFunc(ot.APIKeySHA256, func(x string) bool { return strings.EqualFold(x, h) }) {
				added++
			}
		}
		for _, h := range ot.APIKeySHA256 {
			if !slices.ContainsFunc(t.APIKeySHA256, func(x string) bool { return strings.EqualFold(x, h) }) {
				removed++
			}
		}
		if added > 0 || removed > 0 {
			out = append(out, fmt.Sprintf("tenant %s keys: %d added, %d removed", t.ID, added, removed))
		}
		if ot.CacheNamespace != "" && t.CacheNamespace != "" && ot.CacheNamespace != t.CacheNamespace {
			out = append(out, fmt.Sprintf("tenant %s changed hands (no key kept): new cache namespace", t.ID))
		}
	}
	for _, t := range old {
		if _, ok := n[t.ID]; !ok {
			out = append(out, fmt.Sprintf("tenant %s removed", t.ID))
		}
	}
	return out
}
