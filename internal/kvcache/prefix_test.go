package kvcache_test

import (
	"encoding/hex"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

type keyInput struct {
	tenant request.Tenant
	digest [32]byte
	salt   string
	tokens []int
	parent *[32]byte
}

func (k keyInput) key() [32]byte {
	return kvcache.PrefixKey(k.tenant, k.digest, k.salt, k.tokens, k.parent)
}

// TestPrefixKeyFraming: inputs that a naive concatenation would confuse
// must give different keys.
func TestPrefixKeyFraming(t *testing.T) {
	p1 := kvcache.PrefixKey("t", [32]byte{}, "", []int{1}, nil)
	tests := []struct {
		name string
		a, b keyInput
	}{
		{"tenant/salt boundary", keyInput{tenant: "org_1", salt: "2345"}, keyInput{tenant: "org_12345"}},
		{"tenant/salt swap", keyInput{tenant: "a", salt: "b"}, keyInput{tenant: "b", salt: "a"}},
		{"salt/tokens boundary", keyInput{tenant: "t", salt: "\x00", tokens: []int{1}}, keyInput{tenant: "t", tokens: []int{0, 1}}},
		{"empty tenant vs salt", keyInput{salt: "t"}, keyInput{tenant: "t"}},
		{"tenant", keyInput{tenant: "a", tokens: []int{1, 2}}, keyInput{tenant: "b", tokens: []int{1, 2}}},
		{"model digest", keyInput{tenant: "t", tokens: []int{1}}, keyInput{tenant: "t", digest: [32]byte{1}, tokens: []int{1}}},
		{"salt present", keyInput{tenant: "t", salt: "s", tokens: []int{1}}, keyInput{tenant: "t", tokens: []int{1}}},
		{"token order", keyInput{tenant: "t", tokens: []int{1, 2}}, keyInput{tenant: "t", tokens: []int{2, 1}}},
		{"token width", keyInput{tenant: "t", tokens: []int{1 << 32}}, keyInput{tenant: "t", tokens: []int{0, 1}}},
		{"negative token", keyInput{tenant: "t", tokens: []int{-1}}, keyInput{tenant: "t", tokens: []int{1<<63 - 1}}},
		{"parent", keyInput{tenant: "t", tokens: []int{2}}, keyInput{tenant: "t", tokens: []int{2}, parent: &p1}},
		{"parent vs zero parent", keyInput{tenant: "t", tokens: []int{2}, parent: &[32]byte{}}, keyInput{tenant: "t", tokens: []int{2}}},
		{"no tokens", keyInput{tenant: "t"}, keyInput{tenant: "t", tokens: []int{0}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.a.key() == tc.b.key() {
				t.Fatalf("keys collide: %+v and %+v", tc.a, tc.b)
			}
			if tc.a.key() != tc.a.key() {
				t.Fatal("key is not deterministic")
			}
		})
	}
}

// TestPrefixKeyGolden pins the key format: nodes that exchange or compare
// keys must compute the same bytes, so a change here is a protocol change
// (bump keyDomain's version). The values were computed independently
// from the documented framing (a few lines of Python over hashlib).
func TestPrefixKeyGolden(t *testing.T) {
	parent := kvcache.PrefixKey("org_1", [32]byte{7}, "2345", []int{1, 2, 3, 4}, nil)
	got := []string{
		hex.EncodeToString(parent[:]),
		hex.EncodeToString(ptr(kvcache.PrefixKey("org_12345", [32]byte{7}, "", []int{5, 6, 7, 8}, &parent))[:]),
	}
	want := []string{
		"b85b6d8e41c2a39912ae03554db2614a4b51a285f198e815077598e2a62b2db0",
		"88efb501362a43ee5f5318a8caa964225720c37e9cdea99db2f83098a3aceeb5",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("prefix keys changed (-want +got):\n%s", diff)
	}
}

func ptr[T any](v T) *T { return &v }

// FuzzPrefixKeyTenants: two different (tenant, salt) pairs never share a
// key for the same tokens.
func FuzzPrefixKeyTenants(f *testing.F) {
	f.Add("org_1", "2345", "org_12345", "")
	f.Add("a", "", "a", "x")
	f.Add("", "ab", "a", "b")
	f.Fuzz(func(t *testing.T, t1, s1, t2, s2 string) {
		if t1 == t2 && s1 == s2 {
			return
		}
		toks := []int{1, 2, 3}
		if kvcache.PrefixKey(request.Tenant(t1), [32]byte{}, s1, toks, nil) == kvcache.PrefixKey(request.Tenant(t2), [32]byte{}, s2, toks, nil) {
			t.Fatalf("(%q,%q) and (%q,%q) share a key", t1, s1, t2, s2)
		}
	})
}

// prefill runs a prompt through a new sequence (serving what the cache
// has), publishes it, and returns the sequence.
func prefill(t *testing.T, p *kvcache.Pool, o request.Owner, prompt []int, salt string) *kvcache.Sequence {
	t.Helper()
	s := p.NewSequence(o)
	cached := p.AttachPrefix(s, prompt, salt)
	if n := len(prompt) - cached; n > 0 {
		step(t, p, s, n, float32(len(o.Tenant)))
	}
	p.PublishPrefix(s, prompt, salt)
	audit(t, p)
	return s
}

func TestPrefixCacheSameTenant(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 16})
	prompt := seqTokens(13, 1) // 3 full pages of 4, one token more
	a := prefill(t, p, owner("org_1", 1), prompt, "")
	if st := p.Stats(); st.PublishedPages != 3 || st.SharedPages != 3 || st.OwnedPages != 1 {
		t.Fatalf("after publish: %+v", st)
	}
	b := p.NewSequence(owner("org_1", 2))
	if got := p.AttachPrefix(b, prompt, ""); got != 12 || b.CachedTokens() != 12 || b.Len() != 12 {
		t.Fatalf("AttachPrefix = %d, Len %d", got, b.Len())
	}
	if diff := cmp.Diff(a.Pages()[:3], b.Pages()); diff != "" {
		t.Fatalf("attached pages (-want +got):\n%s", diff)
	}
	step(t, p, b, 1, 9)
	audit(t, p)
	// A prompt of exactly the cached pages still leaves its last token to
	// compute: its logits are needed.
	c := p.NewSequence(owner("org_1", 3))
	if got := p.AttachPrefix(c, prompt[:12], ""); got != 8 {
		t.Fatalf("AttachPrefix of a 12-token prompt = %d, want 8", got)
	}
	// A sequence that already has pages attaches nothing.
	if got := p.AttachPrefix(b, prompt, ""); got != 0 {
		t.Fatalf("AttachPrefix on a started sequence = %d", got)
	}
	if st := p.Stats(); st.PrefixHitPages != 5 || st.PrefixMissPages != 3 || st.TenantPages["org_1"] != 5 {
		t.Fatalf("stats: %+v", st)
	}
}

// TestPrefixCacheIsolation: the same prompt under another tenant, another
// salt or another model never hits.
func TestPrefixCacheIsolation(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 16, ModelDigest: [32]byte{1}})
	other := newPool(t, kvcache.Config{Pages: 16, ModelDigest: [32]byte{2}})
	prompt := seqTokens(9, 1)
	prefill(t, p, owner("org_1", 1), prompt, "2345")
	prefill(t, other, owner("org_1", 1), prompt, "2345")
	for _, tc := range []struct {
		name   string
		tenant request.Tenant
		salt   string
		want   int
	}{
		{"same tenant and salt", "org_1", "2345", 8},
		{"framing neighbour", "org_12345", "", 0},
		{"other tenant, same salt", "org_2", "2345", 0},
		{"same tenant, no salt", "org_1", "", 0},
		{"same tenant, other salt", "org_1", "2346", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := p.NewSequence(owner(tc.tenant, 9))
			defer p.Release(s)
			if got := p.AttachPrefix(s, prompt, tc.salt); got != tc.want {
				t.Fatalf("AttachPrefix = %d, want %d", got, tc.want)
			}
		})
	}
	// Same tenant, same salt, but the other pool holds another model: its
	// key differs, so even an exchanged key could not hit.
	if kvcache.PrefixKey("org_1", [32]byte{1}, "", prompt[:4], nil) == kvcache.PrefixKey("org_1", [32]byte{2}, "", prompt[:4], nil) {
		t.Fatal("model digest not in the key")
	}
	if p.Violations() != 0 {
		t.Fatalf("violations %d", p.Violations())
	}
}

// TestPrefixCacheLRU: unreferenced cached pages are evicted least recently
// used first, chain tails before heads, and only when Reserve runs short.
func TestPrefixCacheLRU(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 6})
	long := seqTokens(9, 1)
	a := prefill(t, p, owner("t", 1), long, "") // pages 1,2 shared, 3 owned
	p.Release(a)
	if st := p.Stats(); st.CachedPages != 2 || p.FreePages() != 6 {
		t.Fatalf("after release: %+v, %d allocatable", st, p.FreePages())
	}
	// Touch the chain again; release makes it most recent.
	b := p.NewSequence(owner("t", 2))
	if got := p.AttachPrefix(b, long, ""); got != 8 {
		t.Fatalf("re-attach = %d", got)
	}
	if p.FreePages() != 4 {
		t.Fatalf("referenced cache pages are allocatable: %d", p.FreePages())
	}
	p.Release(b)
	// Four free pages: a 5-page reservation must evict exactly one cached
	// page, the chain's tail (its second page).
	c := p.NewSequence(owner("u", 1))
	if err := p.Reserve(c, 20); err != nil {
		t.Fatal(err)
	}
	audit(t, p)
	d := p.NewSequence(owner("t", 3))
	if got := p.AttachPrefix(d, long, ""); got != 4 || p.Stats().Evictions != 1 {
		t.Fatalf("after one eviction: attach = %d, %d evictions", got, p.Stats().Evictions)
	}
	// Evicted pages are scrubbed before reuse: c's pages read zero.
	v, err := p.Begin(c, 20)
	if err != nil {
		t.Fatal(err)
	}
	for pg := range 5 {
		if !isPattern(v, 0, pg, kvcache.ScrubZero) {
			t.Fatalf("page %d of a new sequence holds old data", pg)
		}
	}
	if err := p.Reserve(p.NewSequence(owner("u", 2)), 4); err == nil {
		t.Fatal("Reserve took a referenced cache page")
	}
	if n := p.EvictCached(-1); n != 0 {
		t.Fatalf("evicted %d referenced pages", n)
	}
	audit(t, p)
}

// TestPublishSkipsTakenKeys: two sequences computing the same prompt
// concurrently publish once; the second keeps its pages private.
func TestPublishSkipsTakenKeys(t *testing.T) {
	p := newPool(t, kvcache.Config{Pages: 8})
	prompt := seqTokens(8, 1)
	a, b := p.NewSequence(owner("t", 1)), p.NewSequence(owner("t", 2))
	step(t, p, a, 8, 1)
	step(t, p, b, 8, 1)
	if n := p.PublishPrefix(a, prompt, ""); n != 2 {
		t.Fatalf("first publish indexed %d pages", n)
	}
	if n := p.PublishPrefix(b, prompt, ""); n != 0 {
		t.Fatalf("second publish indexed %d pages", n)
	}
	if n := p.PublishPrefix(a, prompt, ""); n != 0 {
		t.Fatalf("republish indexed %d pages", n)
	}
	audit(t, p)
	if st := p.Stats(); st.SharedPages != 2 || st.OwnedPages != 2 {
		t.Fatalf("stats %+v", st)
	}
}
