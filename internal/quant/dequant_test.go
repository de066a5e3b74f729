package quant

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDequantizeQ8_0Block(t *testing.T) {
	blk := make([]byte, 34)
	binary.LittleEndian.PutUint16(blk, 0x3800) // d = 0.5
	want := make([]float32, 32)
	for j := range 32 {
		q := int8(j*8 - 128) // -128 .. 120
		blk[2+j] = byte(q)
		want[j] = float32(q) * 0.5
	}
	got := make([]float32, 32)
	if err := Dequantize(Q8_0, blk, got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestDequantizeQ4_0Block(t *testing.T) {
	blk := make([]byte, 18)
	binary.LittleEndian.PutUint16(blk, 0xc000) // d = -2
	want := make([]float32, 32)
	for j := range 16 {
		lo, hi := byte(j), byte(15-j)
		blk[2+j] = lo | hi<<4
		want[j] = float32(int(lo)-8) * -2
		want[j+16] = float32(int(hi)-8) * -2
	}
	got := make([]float32, 32)
	if err := Dequantize(Q4_0, blk, got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// packK4 packs eight 6-bit scales and mins the way block_q4_K stores them
// (written from the format description, independently of the quantizer).
func packK4(sc, m [8]uint8) [12]byte {
	var b [12]byte
	for j := range 4 {
		b[j] = sc[j] | (sc[j+4]>>4)<<6
		b[j+4] = m[j] | (m[j+4]>>4)<<6
		b[j+8] = sc[j+4]&0xf | (m[j+4]&0xf)<<4
	}
	return b
}

func TestDequantizeQ4_KBlock(t *testing.T) {
	sc := [8]uint8{1, 17, 33, 63, 2, 18, 40, 63}
	m := [8]uint8{0, 63, 31, 5, 16, 47, 3, 60}
	const d, dmin = 0.5, 0.25 // powers of two: every product below is exact
	blk := make([]byte, 144)
	binary.LittleEndian.PutUint16(blk[0:], F32ToF16(d))
	binary.LittleEndian.PutUint16(blk[2:], F32ToF16(dmin))
	packed := packK4(sc, m)
	copy(blk[4:16], packed[:])
	rng := rand.New(rand.NewPCG(1, 2))
	want := make([]float32, 256)
	// Values are stored in chunks of 64: group 2c in the low nibbles of
	// qs[32c:32c+32], group 2c+1 in the high nibbles.
	for e := range 256 {
		g := e / 32
		q := uint8(rng.IntN(16))
		byteIdx := 16 + 32*(g/2) + e%32
		if g%2 == 0 {
			blk[byteIdx] |= q
		} else {
			blk[byteIdx] |= q << 4
		}
		want[e] = float32(d*float64(sc[g])*float64(q) - dmin*float64(m[g]))
	}
	got := make([]float32, 256)
	if err := Dequantize(Q4_K, blk, got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// packQ6K stores 256 6-bit values L (0..63) and 16 int8 scales as
// block_q6_K does.
func packQ6K(L [256]uint8, sc [16]int8, d uint16) []byte {
	blk := make([]byte, 210)
	ql, qh := blk[0:128], blk[128:192]
	for e, q := range L {
		n, k := e/128, e%128
		l, quarter := k%32, k/32 // quarter 0..3 selects nibble/bit pair
		lowByte := 64*n + l + 32*(quarter%2)
		if quarter < 2 {
			ql[lowByte] |= q & 0xf
		} else {
			ql[lowByte] |= (q & 0xf) << 4
		}
		qh[32*n+l] |= (q >> 4) << (2 * quarter)
	}
	for i, s := range sc {
		blk[192+i] = byte(s)
	}
	binary.LittleEndian.PutUint16(blk[208:], d)
	return blk
}

func TestDequantizeQ6_KBlock(t *testing.T) {
	var L [256]uint8
	var sc [16]int8
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range L {
		L[i] = uint8(rng.IntN(64))
	}
	for i := range sc {
		sc[i] = int8(i*17 - 128) // -128 .. 127
	}
	const d = 0.125
	blk := packQ6K(L, sc, F32ToF16(d))
	want := make([]float32, 256)
	for e := range want {
		want[e] = float32(d * float64(sc[e/16]) * float64(int(L[e])-32))
	}
	got := make([]float32, 256)
	if err := Dequantize(Q6_K, blk, got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestDequantizeFloats(t *testing.T) {
	src := []float32{0, 1, -2.5, 65504, 1e-7, float32(math.Inf(-1))}
	for _, typ := range []Type{F32, F16, BF16} {
		b, err := Quantize(typ, src)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]float32, len(src))
		if err := Dequantize(typ, b, got); err != nil {
			t.Fatal(err)
		}
		want := make([]float32, len(src))
		for i, v := range src {
			switch typ {
			case F32:
				want[i] = v
			case F16:
				want[i] = F16ToF32(F32ToF16(v))
			case BF16:
				want[i] = BF16ToF32(F32ToBF16(v))
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", typ, diff)
		}
	}
}

func TestDequantizeErrors(t *testing.T) {
	tests := []struct {
		name string
		t    Type
		src  int
		dst  int
		want error
	}{
		{"unknown", 9999, 64, 32, ErrUnknownType},
		{"removed id", 4, 64, 32, ErrUnknownType},
		{"unsupported", IQ2_XXS, 256, 256, ErrUnsupported},
		{"partial block", Q8_0, 68, 33, ErrBlockSize},
		{"short source", Q4_K, 143, 256, ErrShortBuffer},
		{"short f32", F32, 7, 2, ErrShortBuffer},
	}
	for _, tc := range tests {
		err := Dequantize(tc.t, make([]byte, tc.src), make([]float32, tc.dst))
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	err := Dequantize(IQ2_XXS, nil, nil)
	if err == nil || err.Error() != "quant: unsupported tensor type IQ2_XXS" {
		t.Errorf("message: %v", err)
	}
	if _, err := Quantize(IQ2_XXS, make([]float32, 256)); !errors.Is(err, ErrUnsupported) || err.Error() != "quant: unsupported tensor type IQ2_XXS" {
		t.Errorf("Quantize(IQ2_XXS): %v", err)
	}
	if _, err := Quantize(Q4_0, make([]float32, 31)); !errors.Is(err, ErrBlockSize) {
		t.Errorf("Quantize(Q4_0, 31): %v", err)
	}
}
