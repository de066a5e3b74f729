package kernels

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/quant"
)

// q8_1MinTerm is what a Q4_1/Q5_1 product adds beyond sum(w*x) over the
// dequantised weights and activations: ggml multiplies each block's min by
// the activation's fp16 s = d*sum(q) instead of by the sum of the
// dequantised activations. Zero for other types.
func q8_1MinTerm(t quant.Type, row []byte, x []float32, xa []float64) float64 {
	if t != quant.Q4_1 && t != quant.Q5_1 {
		return 0
	}
	bb := t.BlockBytes()
	q, d, xs := make([]int8, len(x)), make([]float32, len(x)/32), make([]float32, len(x)/32)
	quantizeQ8_1(x, q, d, xs)
	var fix float64
	for b := 0; b < len(x)/32; b++ {
		m := float64(f16ToF32(binary.LittleEndian.Uint16(row[b*bb+2:])))
		var sum float64
		for _, v := range xa[32*b : 32*b+32] {
			sum += v
		}
		fix += m * (float64(xs[b]) - sum)
	}
	return fix
}

// extRefProduct is ggml's vec_dot (ref_ext.go) of one GGML row with one
// activation row, the activation quantised to the type's vec_dot_type.
func extRefProduct(t quant.Type, row []byte, x []float32) float32 {
	n := len(x)
	q := make([]int8, n)
	switch t {
	case quant.Q4_1, quant.Q5_1:
		d, s := make([]float32, n/32), make([]float32, n/32)
		quantizeQ8_1(x, q, d, s)
		if t == quant.Q4_1 {
			return dotQ4_1Ref(row, q, d, s)
		}
		return dotQ5_1Ref(row, q, d, s)
	case quant.Q5_0, quant.IQ4_NL:
		d, c := make([]float32, n/32), make([]int32, n/32)
		quantizeQ8_0(x, q, d, c)
		if t == quant.Q5_0 {
			return dotQ5_0Ref(row, q, d)
		}
		return dotIQ4NLRef(row, q, d)
	}
	d, bs := make([]float32, n/256), make([]int16, n/16)
	quantizeQ8K(x, q, d, bs)
	switch t {
	case quant.Q5_K:
		return dotQ5KRef(row, q, d, bs)
	case quant.Q3_K:
		return dotQ3KRef(row, q, d)
	case quant.Q2_K:
		return dotQ2KRef(row, q, d, bs)
	}
	return dotIQ4XSRef(row, q, d)
}

// TestExtMatMulMatchesGGML: MatMul over the added types (repacked for the
// Q8_0 or Q6_K kernels, matrix_ext.go) gives, bit for bit, the reference
// product over the original GGML rows (ggml's vec_dot; see ref_ext.go),
// on every kernel tier of this CPU and with the references swapped in,
// for one activation row (decode), padded and several activation groups,
// a padded weight group, more groups than one chunk, one or two threads.
func TestExtMatMulMatchesGGML(t *testing.T) {
	forEachTier(t, testExtMatMul)
}

func testExtMatMul(t *testing.T) {
	rng := newRand(47)
	pools := []*Pool{nil, NewPool(2)}
	defer pools[1].Close()
	for _, typ := range extTypes {
		for _, sh := range [][2]int{{16, 256}, {37, 512}, {300, 256}, {5, 768}} {
			rows, cols := sh[0], sh[1]
			data := randWeights(rng, typ, rows, cols)
			if q, err := quant.Quantize(typ, randF32(rng, rows*cols)); err == nil && rows == 37 {
				data = q // real blocks from the ggml-exact quantiser
			}
			m, err := NewMatrix(typ, rows, cols, data)
			if err != nil {
				t.Fatal(err)
			}
			rb := m.rowBytes
			for _, n := range []int{1, 2, 4, 5, 9, 17} {
				x := randF32(rng, n*cols)
				if n == 2 {
					clear(x[:256]) // all-zero blocks
				}
				want := make([]float32, n*rows)
				for i := 0; i < n; i++ {
					for r := 0; r < rows; r++ {
						want[i*rows+r] = extRefProduct(typ, data[r*rb:(r+1)*rb], x[i*cols:(i+1)*cols])
					}
				}
				for _, ref := range []bool{false, true} {
					for pi, p := range pools {
						restore := func() {}
						if ref {
							restore = useRef()
						}
						got := make([]float32, n*rows)
						MatMul(p, got, m, x, n)
						restore()
						if diff := cmp.Diff(bitsOf(want), bitsOf(got)); diff != "" {
							t.Fatalf("%s %dx%d n=%d pool %d ref %v: MatMul vs ggml vec_dot (-ggml +got bits):\n%s", typ, rows, cols, n, pi, ref, diff)
						}
					}
				}
			}
		}
	}
}

// TestExtQuantizeQ8_1: s is the fp16 of (amax/127, unrounded) times the
// sum of the quants, which are quantizeQ8_0's.
func TestExtQuantizeQ8_1(t *testing.T) {
	x := make([]float32, 64)
	for i := range x {
		x[i] = float32(i%7) - 2.5
	}
	x[40] = 100 // block 1's amax
	q, d, s := make([]int8, 64), make([]float32, 2), make([]float32, 2)
	quantizeQ8_1(x, q, d, s)
	q0, d0, c0 := make([]int8, 64), make([]float32, 2), make([]int32, 2)
	quantizeQ8_0(x, q0, d0, c0)
	if diff := cmp.Diff(q0, q); diff != "" {
		t.Fatalf("quants differ from Q8_0 (-q8_0 +q8_1):\n%s", diff)
	}
	for b, amax := range []float32{3.5, 100} {
		want := f16ToF32(f32ToF16(float32(amax/127) * float32(c0[b])))
		if d[b] != d0[b] || s[b] != want {
			t.Errorf("block %d: d %v s %v, want %v %v", b, d[b], s[b], d0[b], want)
		}
	}
}

// TestSupports: the list NewMatrix accepts and the errors for the rest.
func TestSupports(t *testing.T) {
	for _, typ := range WeightTypes() {
		bs := typ.BlockSize()
		data := randWeights(newRand(1), typ, 1, max(bs, 32))
		if _, err := NewMatrix(typ, 1, max(bs, 32), data); err != nil {
			t.Errorf("%s: %v", typ, err)
		}
	}
	for _, typ := range []quant.Type{quant.IQ2_XXS, quant.Q8_K, quant.TQ1_0, quant.MXFP4, quant.I8} {
		if Supports(typ) {
			t.Errorf("Supports(%s) = true", typ)
		}
		_, err := NewMatrix(typ, 1, 256, make([]byte, 1024))
		if want := fmt.Sprintf("kernels: unsupported weight type: %s", typ); err == nil || err.Error() != want {
			t.Errorf("NewMatrix(%s): %v, want %q", typ, err, want)
		}
	}
}

// BenchmarkExtMatMul times the added types against Q8_0 (and Q4_K/Q6_K for
// the 256-wide types) on the 135M shapes llama-quantize gives them: the
// 1536 x 576 gate/up projection (576 is not a multiple of 256, hence the
// fall-back types) and the 576 x 1536 down projection; decode (n=1) and a
// 16-row prefill chunk, on one thread.
func BenchmarkExtMatMul(b *testing.B) {
	rng := newRand(48)
	for _, sh := range []struct {
		rows, cols int
		types      []quant.Type
	}{
		{1536, 576, []quant.Type{quant.Q8_0, quant.Q5_0, quant.IQ4_NL, quant.Q4_1, quant.Q5_1}},
		{576, 1536, []quant.Type{quant.Q8_0, quant.Q4_K, quant.Q6_K, quant.Q5_K, quant.Q3_K, quant.Q2_K, quant.IQ4_XS}},
	} {
		for _, typ := range sh.types {
			m, err := NewMatrix(typ, sh.rows, sh.cols, randWeights(rng, typ, sh.rows, sh.cols))
			if err != nil {
				b.Fatal(err)
			}
			for _, n := range []int{1, 16} {
				x := randF32(rng, n*sh.cols)
				dst := make([]float32, n*sh.rows)
				b.Run(fmt.Sprintf("%dx%d/%s/n%d", sh.rows, sh.cols, typ, n), func(b *testing.B) {
					b.SetBytes(int64(m.Bytes()))
					for b.Loop() {
						MatMul(nil, dst, m, x, n)
					}
				})
			}
		}
	}
}
