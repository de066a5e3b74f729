package quant

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestF16Table(t *testing.T) {
	inf := float32(math.Inf(1))
	tests := []struct {
		name string
		f    float32
		h    uint16
	}{
		{"zero", 0, 0x0000},
		{"neg zero", float32(math.Copysign(0, -1)), 0x8000},
		{"one", 1, 0x3c00},
		{"minus two", -2, 0xc000},
		{"max", 65504, 0x7bff},
		{"min normal", 1.0 / (1 << 14), 0x0400},
		{"min subnormal", 1.0 / (1 << 24), 0x0001},
		{"max subnormal", 1023.0 / (1 << 24), 0x03ff},
		{"inf", inf, 0x7c00},
		{"neg inf", -inf, 0xfc00},
		{"third", 1.0 / 3, 0x3555},
	}
	for _, tc := range tests {
		if got := F32ToF16(tc.f); got != tc.h {
			t.Errorf("%s: F32ToF16(%g) = %#04x, want %#04x", tc.name, tc.f, got, tc.h)
		}
		if tc.name == "third" {
			continue // not exact
		}
		if got := F16ToF32(tc.h); math.Float32bits(got) != math.Float32bits(tc.f) {
			t.Errorf("%s: F16ToF32(%#04x) = %g, want %g", tc.name, tc.h, got, tc.f)
		}
	}
}

func TestF32ToF16Rounding(t *testing.T) {
	tests := []struct {
		name string
		f    float32
		h    uint16
	}{
		{"tie to even down", 1 + 1.0/2048, 0x3c00}, // halfway 1 and 1+2^-10
		{"tie to even up", 1 + 3.0/2048, 0x3c02},   // halfway 1+2^-10 and 1+2^-9
		{"just above tie", math.Nextafter32(1+1.0/2048, 2), 0x3c01},
		{"65519 rounds to max", 65519, 0x7bff},
		{"65520 ties to inf", 65520, 0x7c00},
		{"huge", 1e30, 0x7c00},
		{"half of min subnormal ties to zero", 1.0 / (1 << 25), 0x0000},
		{"above half of min subnormal", math.Nextafter32(1.0/(1<<25), 1), 0x0001},
		{"1.5 min subnormal ties to even 2", 3.0 / (1 << 25), 0x0002},
		{"subnormal carries into normal", math.Nextafter32(1.0/(1<<14), 0), 0x0400},
		{"tiny", 1e-30, 0x0000},
		{"neg tiny keeps sign", -1e-30, 0x8000},
		{"f32 subnormal", math.Float32frombits(1), 0x0000},
	}
	for _, tc := range tests {
		if got := F32ToF16(tc.f); got != tc.h {
			t.Errorf("%s: F32ToF16(%g) = %#04x, want %#04x", tc.name, tc.f, got, tc.h)
		}
	}
}

// TestF16Exhaustive checks every half: the round trip is the identity
// (NaNs become the canonical quiet NaN), and for every pair of adjacent
// finite halves the midpoint rounds to the even one and the float32s just
// beside it round to the nearer one.
func TestF16Exhaustive(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		got := F32ToF16(f)
		if isNaN16(uint16(h)) {
			if !f32IsNaN(f) || got != uint16(h)&0x8000|0x7e00 {
				t.Fatalf("NaN %#04x -> %g -> %#04x", h, f, got)
			}
			continue
		}
		if got != uint16(h) {
			t.Fatalf("round trip %#04x -> %g -> %#04x", h, f, got)
		}
	}
	for h := uint16(0); h < 0x7bff; h++ {
		for _, sign := range []uint16{0, 0x8000} {
			a, b := F16ToF32(sign|h), F16ToF32(sign|(h+1))
			mid := (a + b) / 2 // exact: halves have 11 significant bits
			even := sign | h
			if h&1 == 1 {
				even = sign | (h + 1)
			}
			if got := F32ToF16(mid); got != even {
				t.Fatalf("midpoint of %#04x,%#04x: got %#04x want %#04x", sign|h, sign|(h+1), got, even)
			}
			if got := F32ToF16(math.Nextafter32(mid, a)); got != sign|h {
				t.Fatalf("below midpoint of %#04x: got %#04x", sign|h, got)
			}
			if got := F32ToF16(math.Nextafter32(mid, b)); got != sign|(h+1) {
				t.Fatalf("above midpoint of %#04x: got %#04x", sign|h, got)
			}
		}
	}
}

func isNaN16(h uint16) bool   { return h&0x7c00 == 0x7c00 && h&0x3ff != 0 }
func f32IsNaN(f float32) bool { return f != f }

func TestBF16(t *testing.T) {
	tests := []struct {
		name string
		f    float32
		h    uint16
	}{
		{"zero", 0, 0},
		{"one", 1, 0x3f80},
		{"neg two", -2, 0xc000},
		{"tie to even down", math.Float32frombits(0x3f808000), 0x3f80},
		{"tie to even up", math.Float32frombits(0x3f818000), 0x3f82},
		{"above tie", math.Float32frombits(0x3f808001), 0x3f81},
		{"max finite rounds to inf", math.MaxFloat32, 0x7f80},
		{"inf", float32(math.Inf(1)), 0x7f80},
		{"neg inf", float32(math.Inf(-1)), 0xff80},
		{"subnormal kept", math.Float32frombits(0x00018000), 0x0002},
		{"quiet NaN", math.Float32frombits(0x7fc00000), 0x7fc0},
		{"signalling NaN made quiet", math.Float32frombits(0x7f800001), 0x7fc0},
		{"NaN payload in low bits only", math.Float32frombits(0xff80ffff), 0xffc0},
	}
	for _, tc := range tests {
		if got := F32ToBF16(tc.f); got != tc.h {
			t.Errorf("%s: F32ToBF16(%#08x) = %#04x, want %#04x", tc.name, math.Float32bits(tc.f), got, tc.h)
		}
	}
	for h := 0; h < 1<<16; h++ {
		f := BF16ToF32(uint16(h))
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) = %#08x", h, math.Float32bits(f))
		}
		want := uint16(h)
		if f32IsNaN(f) {
			want |= 0x40
		}
		if got := F32ToBF16(f); got != want {
			t.Fatalf("bf16 round trip %#04x -> %#04x", h, got)
		}
	}
}

func TestTypeTable(t *testing.T) {
	type row struct {
		Name             string
		Block, Bytes     int
		Known, Supported bool
	}
	tests := map[Type]row{
		F32:     {"F32", 1, 4, true, true},
		F16:     {"F16", 1, 2, true, true},
		BF16:    {"BF16", 1, 2, true, true},
		Q4_0:    {"Q4_0", 32, 18, true, true},
		Q5_1:    {"Q5_1", 32, 24, true, true},
		Q8_0:    {"Q8_0", 32, 34, true, true},
		Q4_K:    {"Q4_K", 256, 144, true, true},
		Q5_K:    {"Q5_K", 256, 176, true, true},
		Q6_K:    {"Q6_K", 256, 210, true, true},
		Q8_K:    {"Q8_K", 256, 292, true, false},
		IQ4_XS:  {"IQ4_XS", 256, 136, true, true},
		IQ2_XXS: {"IQ2_XXS", 256, 66, true, false},
		TQ1_0:   {"TQ1_0", 256, 54, true, false},
		MXFP4:   {"MXFP4", 32, 17, true, false},
		4:       {"type(4)", 0, 0, false, false},
		9999:    {"type(9999)", 0, 0, false, false},
	}
	for typ, want := range tests {
		got := row{typ.String(), typ.BlockSize(), typ.BlockBytes(), typ.Known(), typ.Supported()}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("type %d (-want +got):\n%s", uint32(typ), diff)
		}
		if typ.Known() {
			if p, err := ParseType(want.Name); err != nil || p != typ {
				t.Errorf("ParseType(%q) = %v, %v", want.Name, p, err)
			}
		}
	}
}

func TestRowBytes(t *testing.T) {
	tests := []struct {
		t    Type
		n    int
		want int
		ok   bool
	}{
		{F32, 7, 28, true},
		{Q8_0, 64, 68, true},
		{Q8_0, 33, 0, false},
		{Q4_K, 512, 288, true},
		{Q6_K, 256, 210, true},
		{Q6_K, 128, 0, false},
		{F16, -1, 0, false},
		{F32, maxInt, 0, false}, // overflow
		{9999, 32, 0, false},
	}
	for _, tc := range tests {
		got, err := RowBytes(tc.t, tc.n)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("RowBytes(%s, %d) = %d, %v; want %d, ok=%v", tc.t, tc.n, got, err, tc.want, tc.ok)
		}
	}
}
