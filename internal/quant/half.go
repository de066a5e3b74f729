package quant

import "math"

// F16ToF32 converts an IEEE 754 binary16 value to float32. The conversion is
// exact (every half is a float32), including subnormals, signed zeros,
// infinities and NaN payloads.
func F16ToF32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: mant * 2^-24, exact in float32.
		f := float32(mant) * (1.0 / (1 << 24))
		return math.Float32frombits(sign | math.Float32bits(f))
	case 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	default:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	}
}

// F32ToF16 converts f to IEEE 754 binary16, rounding to nearest with ties to
// even. Values at or above 65520 in magnitude become infinity; values that
// round below the smallest subnormal become signed zero; any NaN becomes the
// quiet NaN 0x7e00 with f's sign (what ggml's conversion produces).
func F32ToF16(f float32) uint16 {
	u := math.Float32bits(f)
	sign := uint16(u>>16) & 0x8000
	a := u & 0x7fffffff
	switch {
	case a > 0x7f800000: // NaN
		return sign | 0x7e00
	case a >= 0x477ff000: // >= 65520: rounds to infinity (ties go to the even inf)
		return sign | 0x7c00
	case a >= 0x38800000: // >= 2^-14: normal half
		m := a - 112<<23 // rebias the exponent from 127 to 15
		m += 0xfff + (m>>13)&1
		return sign | uint16(m>>13)
	}
	e := a >> 23
	if e < 102 { // below 2^-25: rounds to zero (2^-25 itself is a tie, handled below)
		return sign
	}
	// value = sig * 2^(e-150); in units of the half subnormal step 2^-24 that
	// is sig >> (126-e), rounded to nearest even.
	sig := a&0x7fffff | 0x800000
	shift := 126 - e // 14..24
	q := sig >> shift
	rem := sig & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && q&1 == 1) {
		q++ // may carry into the smallest normal, which is the right encoding
	}
	return sign | uint16(q)
}

// BF16ToF32 converts a bfloat16 value to float32 (exact).
func BF16ToF32(h uint16) float32 {
	return math.Float32frombits(uint32(h) << 16)
}

// F32ToBF16 converts f to bfloat16, rounding to nearest with ties to even,
// as ggml does: subnormals are kept (rounded), large finite values may round
// to infinity, and NaN stays NaN with the quiet bit forced on.
func F32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + (u>>16)&1) >> 16)
}
