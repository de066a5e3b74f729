package kernels

import (
	"fmt"
	"strings"
)

// Tiers: the instruction-set levels this package has kernels for, lowest
// first. A tier uses, for each kernel, the best implementation that needs
// nothing above it, so forcing a lower tier on a bigger CPU runs exactly
// the code a smaller CPU would run (PAGEWARDEN_KERNELS=avx2 on an AVX-512
// machine measures and tests the AVX2 path).
var tierNames = []string{"ref", "avx2", "avxvnni", "avx512", "avx512vnni"}

// tierRank is a tier's (or a variant's) position in tierNames; -1 if
// unknown.
func tierRank(name string) int {
	for i, n := range tierNames {
		if n == name {
			return i
		}
	}
	return -1
}

// tier is the rank installed now.
var tier int

// Tiers lists the tiers this CPU (and build) can run, lowest first; the
// last is the one chosen at start-up.
func Tiers() []string {
	var ts []string
	for _, n := range tierNames {
		if cpuLacks(n) == "" {
			ts = append(ts, n)
		}
	}
	return ts
}

// SetTier installs the kernels of the named tier ("ref", "avx2", "avx512",
// "avx512vnni"), or the best this CPU has for "" or "auto". A tier the CPU
// or the build cannot run is refused with an error naming what is missing;
// the installed kernels are then unchanged. It must not run concurrently
// with any kernel (call it at start-up, or between tests).
func SetTier(name string) error {
	name = strings.ToLower(strings.TrimSpace(name))
	if name == "" || name == "auto" {
		ts := Tiers()
		name = ts[len(ts)-1]
	}
	r := tierRank(name)
	if r < 0 {
		return fmt.Errorf("unknown kernel tier %q (want one of %s, or auto)", name, strings.Join(tierNames, ", "))
	}
	if why := cpuLacks(name); why != "" {
		return fmt.Errorf("kernel tier %s cannot run here: %s (this machine runs %s)", name, why, strings.Join(Tiers(), ", "))
	}
	install(r)
	return nil
}

// Implementation names the installed tier ("avx512vnni", "avx2", "ref",
// ...), for logs and benchmark labels: a name SetTier takes back, so that
// what a command installed can be put back (Assembly says whether the
// build has any assembly at all).
func Implementation() string { return tierNames[tier] }

// Assembly reports whether this build has the assembly kernels (false
// under the purego tag: every tier is then the reference).
func Assembly() bool { return hasAsm }

// pick returns the best implementation in vs usable at tier rank r: the
// last whose name ranks at or below r (the lists are in ascending order
// and start with the reference).
func pick[F any](vs []variant[F], r int) F {
	f := vs[0].fn
	for _, v := range vs {
		if tierRank(v.name) <= r {
			f = v.fn
		}
	}
	return f
}

// install sets every dispatched kernel to its tier-r implementation.
func install(r int) {
	tier = r
	dotImpl = pick(dotVariants, r)
	dotF16Impl = pick(dotF16Variants, r)
	axpyImpl = pick(axpyVariants, r)
	axpyF16Impl = pick(axpyF16Variants, r)
	f16ToF32sImpl = pick(f16ToF32sVariants, r)
	f32ToF16sImpl = pick(f32ToF16sVariants, r)
	f16RowsImpl = pick(f16RowsVariants, r)
	qTileImpl = pick(qTileVariants, r)
	gemmF32Impl = pick(gemmF32Variants, r)
	quantQ8Impl = pick(quantQ8Variants, r)
	kTileImpl = pick(kTileVariants, r)
	quantKImpl = pick(quantKVariants, r)
	siluMulImpl = pick(siluMulVariants, r)
	softmaxImpl = pick(softmaxVariants, r)
}
