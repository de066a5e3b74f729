package kernels

import (
	"slices"
	"strings"
	"testing"
)

// forEachTier runs f once per tier this machine supports, with that tier's
// kernels installed (restoring the start-up tier afterwards), so the
// dispatched paths of every tier meet the references, not only the best.
func forEachTier(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	saved := tierNames[tier]
	defer func() {
		if err := SetTier(saved); err != nil {
			t.Fatal(err)
		}
	}()
	for _, name := range Tiers() {
		if err := SetTier(name); err != nil {
			t.Fatal(err)
		}
		t.Run(name, f)
	}
}

// TestSetTier: every supported tier installs and reports itself, a tier
// outside the list or above the CPU is refused with an error that names
// the problem and leaves the installed tier alone, and "auto" (or "")
// returns to the best.
func TestSetTier(t *testing.T) {
	ts := Tiers()
	if len(ts) == 0 || ts[0] != "ref" {
		t.Fatalf("Tiers() = %v, want the reference first", ts)
	}
	best := ts[len(ts)-1]
	defer SetTier("auto")
	for _, name := range ts {
		if err := SetTier(strings.ToUpper(name)); err != nil {
			t.Fatalf("SetTier(%q): %v", name, err)
		}
		if got := tierNames[tier]; got != name {
			t.Fatalf("after SetTier(%q) the tier is %q", name, got)
		}
		if name != "ref" && Implementation() != name {
			t.Fatalf("Implementation() = %q after SetTier(%q)", Implementation(), name)
		}
	}
	if err := SetTier("ref"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, want string }{
		{"sse2", "unknown kernel tier"},
		{"avx-512", "unknown kernel tier"},
	} {
		err := SetTier(tc.name)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("SetTier(%q) = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	for _, name := range tierNames {
		if slices.Contains(ts, name) {
			continue
		}
		err := SetTier(name)
		if err == nil || !strings.Contains(err.Error(), "cannot run here") {
			t.Errorf("SetTier(%q) on a machine with %v = %v, want a refusal", name, ts, err)
		}
	}
	if tier != 0 {
		t.Fatalf("a refused SetTier changed the tier to %s", tierNames[tier])
	}
	for _, auto := range []string{"", "auto"} {
		if err := SetTier(auto); err != nil || tierNames[tier] != best {
			t.Fatalf("SetTier(%q) = %v, tier %s; want the best, %s", auto, err, tierNames[tier], best)
		}
	}
	// The reference tier installs references only.
	if err := SetTier("ref"); err != nil {
		t.Fatal(err)
	}
	for _, v := range [][]string{names(dotVariants), names(qTileVariants), names(kTileVariants)} {
		if v[0] != "ref" {
			t.Fatalf("variant list starts with %q, not the reference", v[0])
		}
	}
}

func names[F any](vs []variant[F]) []string {
	var s []string
	for _, v := range vs {
		if tierRank(v.name) < 0 {
			panic("variant named for no tier: " + v.name)
		}
		s = append(s, v.name)
	}
	return s
}
