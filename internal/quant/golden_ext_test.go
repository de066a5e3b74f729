package quant

import (
	"bytes"
	"encoding/binary"
	"hash/fnv"
	"math"
	"os"
	"testing"
)

// TestGGMLReferenceVectorsExt checks the types added for llama-quantize's
// K-quant mixes against ggml itself. testdata/ggml-ext-ref.bin was made
// from the same four input cases as ggml-quantize-ref.bin (read from that
// file) by a driver compiled with ggml's src/ggml-quants.c (ggml-org/ggml
// commit d99724f2, gcc -O2 -ffp-contract=off; the driver is kept outside
// the repository). Per case: u32 n, then for each type of extTypes:
// ggml's encoding of the input (quantize_row_*_ref; quantize_iq4_nl and
// quantize_iq4_xs without an importance matrix for the IQ4 types) and the
// 64-bit FNV-1a hash of the float32 bytes ggml's dequantize_row_* makes of
// that encoding. So Quantize is held byte-exact to ggml, and Dequantize
// bit-exact, for every type.
func TestGGMLReferenceVectorsExt(t *testing.T) {
	inputs := refInputs(t)
	data, err := os.ReadFile("testdata/ggml-ext-ref.bin")
	if err != nil {
		t.Fatal(err)
	}
	extTypes := []Type{Q4_1, Q5_0, Q5_1, Q5_K, Q3_K, Q2_K, IQ4_NL, IQ4_XS}
	for c, x := range inputs {
		n := int(binary.LittleEndian.Uint32(data))
		if n != len(x) {
			t.Fatalf("case %d: %d values, inputs have %d", c, n, len(x))
		}
		data = data[4:]
		for _, typ := range extTypes {
			nb, _ := RowBytes(typ, n)
			want := data[:nb]
			wantHash := binary.LittleEndian.Uint64(data[nb:])
			data = data[nb+8:]
			y := make([]float32, n)
			if err := Dequantize(typ, want, y); err != nil {
				t.Fatal(err)
			}
			h := fnv.New64a()
			var b [4]byte
			for _, v := range y {
				binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
				h.Write(b[:])
			}
			if got := h.Sum64(); got != wantHash {
				t.Errorf("case %d %s: Dequantize of ggml's blocks hashes to %#x, ggml's to %#x", c, typ, got, wantHash)
			}
			got, err := Quantize(typ, x)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				bs := typ.BlockBytes()
				for k := 0; k < nb; k += bs {
					if !bytes.Equal(got[k:k+bs], want[k:k+bs]) {
						t.Errorf("case %d %s: block %d differs from ggml:\n got %x\nwant %x", c, typ, k/bs, got[k:k+bs], want[k:k+bs])
						break
					}
				}
			}
		}
	}
	if len(data) != 0 {
		t.Errorf("%d bytes left over", len(data))
	}
}

// refInputs returns the float32 input cases of ggml-quantize-ref.bin.
func refInputs(t *testing.T) [][]float32 {
	t.Helper()
	data, err := os.ReadFile("testdata/ggml-quantize-ref.bin")
	if err != nil {
		t.Fatal(err)
	}
	var out [][]float32
	for len(data) > 0 {
		n := int(binary.LittleEndian.Uint32(data))
		data = data[4:]
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
		data = data[4*n:]
		for _, typ := range []Type{Q4_K, Q6_K, Q8_0, Q4_0} {
			nb, _ := RowBytes(typ, n)
			data = data[nb:]
		}
		out = append(out, x)
	}
	return out
}
