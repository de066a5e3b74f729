package transfer

import (
	"crypto/sha256"
	"testing"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
)

const (
	gw  Peer = "gateway-1"
	pf  Peer = "prefill-1"
	pf2 Peer = "prefill-2"
)

func testLayout() Layout {
	return Layout{ModelDigest: sha256.Sum256([]byte("stories260K")), DType: kvcache.F16, PageSize: 16,
		Layers: 2, KVHeads: 2, HeadDim: 4, MaxContext: 1024, Protocol: ProtocolVersion}
}

func owner(tenant string, n byte) request.Owner {
	o := request.Owner{Tenant: request.Tenant(tenant)}
	o.ID[0], o.ID[15] = n, 0xa5
	return o
}

// withSkipped runs the rest of the test with checks c disabled.
func withSkipped(t *testing.T, c check) {
	t.Helper()
	old := skipChecks
	skipChecks = c
	t.Cleanup(func() { skipChecks = old })
}

// lenient turns invariant failures into returned errors for the test.
func lenient(t *testing.T) {
	old := invariants.SetStrict(false)
	t.Cleanup(func() { invariants.SetStrict(old) })
}

// pageBytes is the deterministic content of page i of a handoff: filled
// positions of a few bytes each, distinct per seed and index.
func pageBytes(seed byte, i, filled int) []byte {
	b := make([]byte, filled*4)
	for j := range b {
		b[j] = seed ^ byte(i*31+j*7+1)
	}
	return b
}
