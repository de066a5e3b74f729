package quant

import (
	"encoding/binary"
	"math"
	"testing"
)

// FuzzDequantize feeds Dequantize arbitrary bytes (as a downloaded file's
// tensor data is) for every type it reads: it must never panic or read
// past the blocks, and where a block's fp16 scale fields are finite its
// values must be finite too; re-quantising finite values and decoding
// them again must work for every type (Quantize writes all of them).
func FuzzDequantize(f *testing.F) {
	types := []Type{F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS}
	for i, typ := range types {
		seed := make([]byte, typ.BlockBytes()*2)
		for j := range seed {
			seed[j] = byte(j*7 + i)
		}
		f.Add(uint8(i), seed)
	}
	f.Fuzz(func(t *testing.T, ti uint8, data []byte) {
		typ := types[int(ti)%len(types)]
		n := len(data) / typ.BlockBytes() * typ.BlockSize()
		dst := make([]float32, n+1)
		dst[n] = 42
		if err := Dequantize(typ, data, dst[:n]); err != nil {
			t.Fatalf("%s: %d bytes: %v", typ, len(data), err)
		}
		if dst[n] != 42 {
			t.Fatalf("%s: wrote past the end", typ)
		}
		if typ.BlockSize() == 1 {
			return
		}
		finite := make([]float32, 0, n)
		for b := 0; b < n/typ.BlockSize(); b++ {
			blk := data[b*typ.BlockBytes() : (b+1)*typ.BlockBytes()]
			ok := true
			for _, off := range halfFields(typ) {
				if h := F16ToF32(binary.LittleEndian.Uint16(blk[off:])); math.IsNaN(float64(h)) || math.IsInf(float64(h), 0) {
					ok = false
				}
			}
			vals := dst[b*typ.BlockSize() : (b+1)*typ.BlockSize()]
			for _, v := range vals {
				if ok && (math.IsNaN(float64(v)) || math.IsInf(float64(v), 0)) {
					// fp16 scale times a small integer stays below the
					// float32 range: a non-finite value is a decoding bug.
					t.Fatalf("%s block %d: finite scales decode to %v", typ, b, v)
				}
			}
			if ok {
				finite = append(finite, vals...)
			}
		}
		q, err := Quantize(typ, finite)
		if err != nil {
			t.Fatalf("%s: Quantize: %v", typ, err)
		}
		if err := Dequantize(typ, q, make([]float32, len(finite))); err != nil {
			t.Fatalf("%s: round trip: %v", typ, err)
		}
	})
}

// halfFields returns the byte offsets of the fp16 fields of a block of t.
func halfFields(t Type) []int {
	switch t {
	case Q8_0, Q4_0, Q5_0, IQ4_NL, IQ4_XS:
		return []int{0}
	case Q4_1, Q5_1, Q4_K, Q5_K:
		return []int{0, 2}
	case Q2_K:
		return []int{80, 82}
	case Q3_K:
		return []int{108}
	case Q6_K:
		return []int{208}
	}
	return nil
}
