package kernels

import (
	"math"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// f16ToF32 converts an IEEE 754 half-precision value to float32 exactly.
// The kernels keep a private copy of the conversion (package quant has the
// public one) because it sits in inner loops and must be inlinable.
func f16ToF32(h uint16) float32 {
	return f16Table[h]
}

// f16Table maps every half-precision bit pattern to its float32 value.
// 256 KiB, built once at start-up; a table lookup beats bit-twiddling in the
// scalar loops that use it.
var f16Table = buildF16Table()

func buildF16Table() *[1 << 16]float32 {
	var t [1 << 16]float32
	for i := range t {
		t[i] = f16ToF32Slow(uint16(i))
	}
	return &t
}

// f16ToF32Slow decodes a half by its fields: sign, 5-bit exponent (bias 15),
// 10-bit mantissa. Subnormals are renormalised; Inf stays Inf, and NaN
// keeps its payload but comes out quiet, as VCVTPH2PS makes it, so every
// path agrees bit for bit.
func f16ToF32Slow(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f && man == 0: // Inf
		return math.Float32frombits(sign | 0x7f800000)
	case exp == 0x1f: // NaN, quietened
		return math.Float32frombits(sign | 0x7fc00000 | man<<13)
	case exp != 0: // normal
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0: // signed zero
		return math.Float32frombits(sign)
	}
	// Subnormal: value = man * 2^-24. Shift the mantissa up until its
	// leading one reaches the implicit-bit position.
	e := uint32(113)
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}

// f32ToF16 rounds a float32 to the nearest half (ties to even), as F16C's
// VCVTPS2PH with round-to-nearest and ggml's GGML_FP32_TO_FP16 do. Values
// too large become ±Inf; NaN stays NaN (quiet).
func f32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	if exp == 0xff {
		if man != 0 {
			return sign | 0x7e00 | uint16(man>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Result is subnormal or zero: shift the full mantissa (with its
		// implicit one) right, rounding to nearest even.
		if e < -10 {
			return sign
		}
		m := man | 0x800000
		shift := uint32(14 - e)
		half := uint32(1) << (shift - 1)
		rem := m & (1<<shift - 1)
		r := m >> shift
		if rem > half || (rem == half && r&1 == 1) {
			r++
		}
		return sign | uint16(r)
	}
	r := uint32(e)<<10 | man>>13
	rem := man & 0x1fff
	if rem > 0x1000 || (rem == 0x1000 && r&1 == 1) {
		r++ // may carry into the exponent, which is the right answer (up to Inf)
	}
	return sign | uint16(r)
}

// bf16ToF32 and f32ToBF16 are package quant's conversions (ggml's
// rounding, NaN kept quiet); unlike the half-precision pair they need no
// private variant to match the hardware.
func bf16ToF32(h uint16) float32 { return quant.BF16ToF32(h) }
func f32ToBF16(f float32) uint16 { return quant.F32ToBF16(f) }

// roundF16 returns f rounded to the nearest half-precision value.
func roundF16(f float32) float32 { return f16ToF32(f32ToF16(f)) }

// roundBF16 returns f rounded to the nearest bfloat16 value.
func roundBF16(f float32) float32 { return bf16ToF32(f32ToBF16(f)) }
