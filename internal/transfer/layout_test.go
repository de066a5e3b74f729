package transfer

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// TestLayoutHashFields: changing any one field changes the hash, and the
// framing is pinned by a golden value, so that a change of the encoding
// (after which old and new nodes would refuse each other's manifests)
// cannot happen without a test saying so.
func TestLayoutHashFields(t *testing.T) {
	base := testLayout()
	h := base.Hash()
	variants := map[string]func(l *Layout){
		"model digest": func(l *Layout) { l.ModelDigest[31] ^= 1 },
		"dtype":        func(l *Layout) { l.DType = kvcache.F32 },
		"page size":    func(l *Layout) { l.PageSize = 32 },
		"layers":       func(l *Layout) { l.Layers = 3 },
		"KV heads":     func(l *Layout) { l.KVHeads = 1 },
		"head dim":     func(l *Layout) { l.HeadDim = 8 },
		"window":       func(l *Layout) { l.MaxContext = 2048 },
		"protocol":     func(l *Layout) { l.Protocol = 1 },
	}
	seen := map[LayoutHash]string{h: "base"}
	for name, change := range variants {
		l := base
		change(&l)
		got := l.Hash()
		if prev, dup := seen[got]; dup {
			t.Errorf("%s: hash equals that of %s", name, prev)
		}
		seen[got] = name
	}
	// Swapping two fields of the same type must not collide either.
	swapped := base
	swapped.KVHeads, swapped.HeadDim = base.HeadDim, base.KVHeads
	if swapped.Hash() == h {
		t.Error("KV heads and head dim swapped: same hash")
	}
	// Protocol 0 means the current version.
	zero := base
	zero.Protocol = 0
	if zero.Hash() != h {
		t.Error("protocol 0 does not hash as the current version")
	}
	if NewLayoutHash(base) != h {
		t.Error("NewLayoutHash differs from Hash")
	}
	// Computed independently from the framing in layout.go's comment
	// (tag:u8 len:u64be bytes; integers int64be; F16 is dtype 1).
	want := "204d8f9a11566a4f5a5741a00ca252f07f3ca7644588611ca837bcf3ed1b4ccf"
	if got := hex.EncodeToString(h[:]); got != want {
		t.Logf("layout hash framing: got %s", got)
		t.Errorf("the layout hash of testLayout changed: an incompatible framing change must bump ProtocolVersion (update the golden value once it has)")
	}
}

// TestPageDigestPosition: the digest binds the bytes to their logical
// index and filled count, so swapped or relabelled pages do not match.
func TestPageDigestPosition(t *testing.T) {
	a, b := pageBytes(1, 0, 16), pageBytes(1, 1, 16)
	d := PageDigest(0, 16, a)
	for name, other := range map[string][32]byte{
		"other index":  PageDigest(1, 16, a),
		"other filled": PageDigest(0, 15, a),
		"other bytes":  PageDigest(0, 16, b),
		"one bit":      PageDigest(0, 16, append(append([]byte{}, a[:len(a)-1]...), a[len(a)-1]^1)),
		"shorter":      PageDigest(0, 16, a[:len(a)-1]),
	} {
		if other == d {
			t.Errorf("%s: same digest", name)
		}
	}
	// Two pages swapped: each digest appears in the manifest, but not at
	// the index its bytes arrived under.
	if PageDigest(0, 16, b) == PageDigest(1, 16, b) {
		t.Error("digest ignores the index")
	}
	if PageDigest(0, 16, a) != d || d == sha256.Sum256(a) {
		t.Error("digest is not deterministic, or is the bare hash of the bytes")
	}
}

func TestLayoutValidate(t *testing.T) {
	if err := testLayout().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, change := range map[string]func(l *Layout){
		"no layers":     func(l *Layout) { l.Layers = 0 },
		"no heads":      func(l *Layout) { l.KVHeads = 0 },
		"page size 0":   func(l *Layout) { l.PageSize = 0 },
		"huge page":     func(l *Layout) { l.PageSize = 1 << 13 },
		"bad dtype":     func(l *Layout) { l.DType = 9 },
		"window 1":      func(l *Layout) { l.MaxContext = 1 },
		"huge frame":    func(l *Layout) { l.Layers, l.KVHeads, l.HeadDim, l.PageSize = 4096, 64, 128, 64 },
		"huge manifest": func(l *Layout) { l.PageSize, l.MaxContext = 1, 1<<20 },
	} {
		l := testLayout()
		change(&l)
		if l.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	kv := kvcache.Layout{Layers: 2, KVHeads: 2, HeadDim: 4, DType: kvcache.F16}
	if got := LayoutOf(kv, testLayout().ModelDigest, 1024); got != testLayout() {
		t.Errorf("LayoutOf = %+v", got)
	}
}
