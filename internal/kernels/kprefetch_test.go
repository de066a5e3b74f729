package kernels

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestKPrefetchSameBits: the prefetching K-quant kernels give the bits of
// the others, on every tier and for every type that runs on them, one
// thread or several.
func TestKPrefetchSameBits(t *testing.T) {
	defer SetKPrefetch(SetKPrefetch(false))
	forEachTier(t, func(t *testing.T) {
		rng := newRand(47)
		pool := NewPool(3)
		defer pool.Close()
		seen := 0
		for _, typ := range weightTypes {
			rows, cols := 53, 3*256
			m, err := NewMatrix(typ, rows, cols, randWeights(rng, typ, rows, cols))
			if err != nil {
				t.Fatal(err)
			}
			if m.kw == nil {
				continue
			}
			seen++
			x := randF32(rng, cols)
			for _, p := range []*Pool{nil, pool} {
				SetKPrefetch(false)
				plain := make([]float32, rows)
				MatMul(p, plain, m, x, 1)
				SetKPrefetch(true)
				pf := make([]float32, rows)
				MatMul(p, pf, m, x, 1)
				if diff := cmp.Diff(bitsOf(plain), bitsOf(pf)); diff != "" {
					t.Fatalf("%s: prefetching kernels differ (-plain +prefetching bits):\n%s", typ, diff)
				}
			}
		}
		if seen == 0 {
			t.Fatal("no weight type runs on the K-quant kernels: the test checks nothing")
		}
	})
}

// TestCalibrateKPrefetchSmall: matrices that fit in the cache are not
// timed, and the setting stays as it was.
func TestCalibrateKPrefetchSmall(t *testing.T) {
	defer SetKPrefetch(SetKPrefetch(true))
	rng := newRand(48)
	m, err := NewMatrix(weightTypes[0], 64, 256, randWeights(rng, weightTypes[0], 64, 256))
	if err != nil {
		t.Fatal(err)
	}
	on, without, with := CalibrateKPrefetch([]*Matrix{m, nil})
	if !on || without != 0 || with != 0 || !KPrefetch() {
		t.Errorf("CalibrateKPrefetch on a small model = %v, %v, %v (setting now %v); want the setting kept and no timing", on, without, with, KPrefetch())
	}
}
