package kernels

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/pagewarden/pagewarden/internal/quant"
)

var weightTypes = []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K,
	quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.IQ4_NL, quant.Q5_K, quant.Q3_K, quant.Q2_K, quant.IQ4_XS}

// actDequant returns the activation row exactly as the product sees it
// (quantised and dequantised, or rounded), in float64.
func actDequant(t quant.Type, x []float32) []float64 {
	out := make([]float64, len(x))
	switch t {
	case quant.F32:
		for i, v := range x {
			out[i] = float64(v)
		}
	case quant.F16:
		for i, v := range x {
			out[i] = float64(roundF16(v))
		}
	case quant.BF16:
		for i, v := range x {
			out[i] = float64(roundBF16(v))
		}
	case quant.Q8_0, quant.Q4_0, quant.Q4_1, quant.Q5_0, quant.Q5_1, quant.IQ4_NL:
		q, d, c := make([]int8, len(x)), make([]float32, len(x)/32), make([]int32, len(x)/32)
		quantizeQ8_0(x, q, d, c)
		for i := range x {
			out[i] = float64(q[i]) * float64(d[i/32])
		}
	case quant.Q4_K, quant.Q6_K, quant.Q5_K, quant.Q3_K, quant.Q2_K, quant.IQ4_XS:
		q, d, bs := make([]int8, len(x)), make([]float32, len(x)/256), make([]int16, len(x)/16)
		quantizeQ8K(x, q, d, bs)
		for i := range x {
			out[i] = float64(q[i]) * float64(d[i/256])
		}
	}
	return out
}

// TestMatMulOracle checks MatMul against the naive definition: dequantise
// each weight row (Matrix.Row), take the activation as the product sees it,
// and sum in float64. The tolerance is relative to sum |w*x|: only the
// float rounding of the per-block scale products and of the accumulation
// may differ.
func TestMatMulOracle(t *testing.T) {
	rng := newRand(2)
	pool := NewPool(2)
	defer pool.Close()
	for _, typ := range weightTypes {
		bs := typ.BlockSize()
		for _, shape := range [][3]int{{1, 1, 1}, {5, 3, 2}, {7, 9, 3}, {4, 8, 1}, {33, 4, 5}, {130, 3, 9}} {
			rows, cols, n := shape[0], shape[1]*max(bs, 32), shape[2]
			if bs == 1 {
				cols = shape[1]*8 + shape[0]%5 // odd lengths for float types
			}
			name := fmt.Sprintf("%s/%dx%dxn%d", typ, rows, cols, n)
			t.Run(name, func(t *testing.T) {
				data := randWeights(rng, typ, rows, cols)
				m, err := NewMatrix(typ, rows, cols, data)
				if err != nil {
					t.Fatal(err)
				}
				x := randF32(rng, n*cols)
				dst := make([]float32, n*rows+3)
				dst[n*rows], dst[n*rows+1], dst[n*rows+2] = 7, 8, 9
				MatMul(pool, dst, m, x, n)
				if dst[n*rows] != 7 || dst[n*rows+1] != 8 || dst[n*rows+2] != 9 {
					t.Fatalf("MatMul wrote past n*rows")
				}
				w := make([]float32, cols)
				for i := 0; i < n; i++ {
					xa := actDequant(typ, x[i*cols:(i+1)*cols])
					for r := 0; r < rows; r++ {
						m.Row(r, w)
						var want, mag float64
						for j := range w {
							want += float64(w[j]) * xa[j]
							mag += math.Abs(float64(w[j]) * xa[j])
						}
						want += q8_1MinTerm(typ, data[r*m.rowBytes:(r+1)*m.rowBytes], x[i*cols:(i+1)*cols], xa)
						got := float64(dst[i*rows+r])
						if math.Abs(got-want) > 1e-5*mag+1e-30 {
							t.Fatalf("out[%d][%d] = %g, want %g (mag %g)", i, r, got, want, mag)
						}
					}
				}
			})
		}
	}
}

// TestMatMulExactVsReference: the dispatched kernels of every tier give the same bits as
// the references for quantised weights, and agree to float rounding for
// float weights, across shapes, batch sizes and thread counts.
func TestMatMulExactVsReference(t *testing.T) {
	forEachTier(t, func(t *testing.T) {
		rng := newRand(3)
		for _, threads := range []int{1, 2, 3} {
			pool := NewPool(threads)
			for _, typ := range weightTypes {
				bs := max(typ.BlockSize(), 32)
				for _, shape := range [][3]int{{1, 1, 1}, {6, 2, 4}, {67, 9, 3}, {200, 8, 9}} {
					rows, cols, n := shape[0], shape[1]*bs, shape[2]
					if typ.BlockSize() == 256 {
						cols = shape[1] * 256
					}
					data := randWeights(rng, typ, rows, cols)
					m, err := NewMatrix(typ, rows, cols, data)
					if err != nil {
						t.Fatal(err)
					}
					x := randF32(rng, n*cols)
					got := make([]float32, n*rows)
					MatMul(pool, got, m, x, n)
					restore := useRef()
					want := make([]float32, n*rows)
					MatMul(nil, want, m, x, n)
					restore()
					if typ == quant.F32 || typ == quant.F16 || typ == quant.BF16 {
						for i := range got {
							if !closeRel(got[i], want[i], 1e-5, x, cols) {
								t.Fatalf("%s %v t%d: out[%d] = %g, reference %g", typ, shape, threads, i, got[i], want[i])
							}
						}
						continue
					}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Fatalf("%s %v t%d: SIMD differs from reference (-ref +simd):\n%s", typ, shape, threads, diff)
					}
				}
			}
			pool.Close()
		}
	})
}

func closeRel(a, b float32, tol float64, x []float32, cols int) bool {
	var mag float64
	for _, v := range x[:cols] {
		mag += math.Abs(float64(v))
	}
	return math.Abs(float64(a)-float64(b)) <= tol*(mag+math.Abs(float64(b)))
}

func TestNewMatrixErrors(t *testing.T) {
	tests := []struct {
		name       string
		typ        quant.Type
		rows, cols int
		size       int
		want       error
	}{
		{"zero rows", quant.F32, 0, 4, 0, ErrShape},
		{"negative cols", quant.F32, 1, -4, 0, ErrShape},
		{"cols not multiple of block", quant.Q8_0, 2, 40, 0, ErrShape},
		{"k-quant short row", quant.Q4_K, 1, 128, 72, ErrShape},
		{"unsupported type", quant.IQ2_XXS, 1, 256, 66, ErrUnsupported},
		{"unknown type", quant.Type(99), 1, 32, 32, ErrUnsupported},
		{"short data", quant.Q8_0, 2, 32, 67, ErrDataSize},
		{"long data", quant.F16, 2, 3, 13, ErrDataSize},
		{"overflow", quant.F32, 1 << 62, 1 << 3, 0, ErrShape},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewMatrix(tt.typ, tt.rows, tt.cols, make([]byte, tt.size))
			if !errors.Is(err, tt.want) {
				t.Fatalf("NewMatrix error = %v, want %v", err, tt.want)
			}
		})
	}
}

// TestRowMatchesGGMLLayout: Row of a repacked or aliased matrix equals the
// row decoded straight from the GGML bytes, including an unaligned F32/F16
// buffer (copied rather than aliased).
func TestRowMatchesGGMLLayout(t *testing.T) {
	rng := newRand(4)
	for _, typ := range weightTypes {
		rows, cols := 7, 2*max(typ.BlockSize(), 32)
		data := randWeights(rng, typ, rows, cols)
		unaligned := append(make([]byte, 1, len(data)+1), data...)[1:]
		for _, buf := range [][]byte{data, unaligned} {
			m, err := NewMatrix(typ, rows, cols, buf)
			if err != nil {
				t.Fatal(err)
			}
			rb, _ := quant.RowBytes(typ, cols)
			got, want := make([]float32, cols), make([]float32, cols)
			for r := 0; r < rows; r++ {
				m.Row(r, got)
				decodeRowGGML(typ, data[r*rb:(r+1)*rb], want)
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("%s row %d (-want +got):\n%s", typ, r, diff)
				}
			}
		}
	}
}

// decodeRowGGML decodes one GGML row independently of Matrix, element by
// element from the block definitions.
func decodeRowGGML(t quant.Type, row []byte, dst []float32) {
	le16 := func(b []byte) uint16 { return uint16(b[0]) | uint16(b[1])<<8 }
	switch t {
	case quant.F32:
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(le16(row[4*i:])) | uint32(le16(row[4*i+2:]))<<16)
		}
	case quant.F16:
		for i := range dst {
			dst[i] = f16ToF32Slow(le16(row[2*i:]))
		}
	case quant.BF16:
		for i := range dst {
			dst[i] = bf16ToF32(le16(row[2*i:]))
		}
	case quant.Q8_0:
		for i := range dst {
			blk := row[(i/32)*34:]
			dst[i] = float32(int8(blk[2+i%32])) * f16ToF32Slow(le16(blk))
		}
	case quant.Q4_0:
		for i := range dst {
			blk := row[(i/32)*18:]
			j := i % 32
			q := blk[2+j%16] & 0x0f
			if j >= 16 {
				q = blk[2+j%16] >> 4
			}
			dst[i] = float32(int32(q)-8) * f16ToF32Slow(le16(blk))
		}
	default:
		// K-quants: Row and the dot reference share the unpacking helpers;
		// they are checked against package quant's Dequantize where that
		// exists (quant_compat_test.go) and by the product oracle above.
		switch t {
		case quant.Q4_K:
			dequantQ4KRow(row, dst)
		case quant.Q6_K:
			dequantQ6KRow(row, dst)
		default:
			// The added types: package quant's decoders, held bit-exact
			// to ggml's by its golden test.
			if err := quant.Dequantize(t, row, dst); err != nil {
				panic(err)
			}
		}
	}
}

func TestQuantizeQ8_0(t *testing.T) {
	x := make([]float32, 64)
	for i := range x[:32] {
		x[i] = float32(i) - 15.5
	}
	x[5] = -25.4 // the block's amax
	// second block all zero
	q, d, c := make([]int8, 64), make([]float32, 2), make([]int32, 2)
	quantizeQ8_0(x, q, d, c)
	wantD := f16ToF32(f32ToF16(float32(25.4) / 127))
	if d[0] != wantD || d[1] != 0 {
		t.Fatalf("scales = %v, want [%v 0]", d, wantD)
	}
	if q[5] != -127 {
		t.Fatalf("q[amax] = %d, want -127", q[5])
	}
	var sum int32
	id := 127 / float32(25.4)
	for i := 0; i < 32; i++ {
		want := int8(math.RoundToEven(float64(x[i] * id)))
		if q[i] != want {
			t.Fatalf("q[%d] = %d, want %d", i, q[i], want)
		}
		sum += int32(q[i])
	}
	if c[0] != sum || c[1] != 0 {
		t.Fatalf("sums = %v, want [%d 0]", c, sum)
	}
	for i := 32; i < 64; i++ {
		if q[i] != 0 {
			t.Fatalf("zero block quantised to %d", q[i])
		}
	}
	// Ties round to even: 0.5*d and 1.5*d where x*id is exactly .5.
	y := make([]float32, 32)
	y[0], y[1], y[2] = 127, 0.5, 1.5 // id = 1
	quantizeQ8_0(y, q[:32], d[:1], c[:1])
	if q[1] != 0 || q[2] != 2 {
		t.Fatalf("ties: q = %d, %d, want 0, 2", q[1], q[2])
	}
}

func TestQuantizeQ8K(t *testing.T) {
	rng := newRand(5)
	x := randF32(rng, 512)
	x[17] = 9   // largest magnitude of block 0 is positive ...
	x[300] = -9 // ... of block 1 negative
	clear(x[256+64 : 256+80])
	q, d, bs := make([]int8, 512), make([]float32, 2), make([]int16, 32)
	quantizeQ8K(x, q, d, bs)
	// iscale = -127/max, so the largest-magnitude value always maps to -127
	// and d carries the sign.
	if q[17] != -127 || q[300] != -127 {
		t.Fatalf("max quants = %d, %d, want -127", q[17], q[300])
	}
	if d[0] != 1/(-127/float32(9)) || d[1] != 1/(-127/float32(-9)) {
		t.Fatalf("d = %v", d)
	}
	for g := 0; g < 32; g++ {
		var s int16
		for _, v := range q[g*16 : (g+1)*16] {
			s += int16(v)
		}
		if bs[g] != s {
			t.Fatalf("bsums[%d] = %d, want %d", g, bs[g], s)
		}
	}
	if bs[16+4] != 0 {
		t.Fatalf("zero group sum = %d", bs[20])
	}
	z := make([]float32, 256)
	quantizeQ8K(z, q[:256], d[:1], bs[:16])
	if d[0] != 0 || q[0] != 0 || bs[0] != 0 {
		t.Fatal("all-zero block not zero")
	}
}

// TestUnpackQ6K: the fast unpacking agrees with the element-by-element
// definition for random blocks.
func TestUnpackQ6K(t *testing.T) {
	rng := newRand(6)
	for trial := 0; trial < 20; trial++ {
		var blk [210]byte
		for i := range blk {
			blk[i] = byte(rng.Uint32())
		}
		var a [256]int8
		unpackQ6K(&blk, &a)
		for i := range a {
			if want := q6KValue(blk[0:128], blk[128:192], i); int32(a[i]) != want {
				t.Fatalf("value %d = %d, want %d", i, a[i], want)
			}
		}
	}
}

// TestMatMulQMatchesGGML: MatMul over repacked Q8_0 and Q4_0 weights gives,
// bit for bit, ggml's vec_dot over the original GGML rows with ggml's
// Q8_0 activations, for every activation-group width (n = 1, 2..4, 5..8
// and several groups with padding), row counts that leave a padded weight
// group, and one or two threads.
func TestMatMulQMatchesGGML(t *testing.T) {
	forEachTier(t, func(t *testing.T) {
		rng := newRand(42)
		pools := []*Pool{nil, NewPool(2)}
		defer pools[1].Close()
		for _, typ := range []quant.Type{quant.Q8_0, quant.Q4_0} {
			for _, sh := range [][2]int{{16, 32}, {37, 96}, {5, 64}, {64, 576}} {
				rows, cols := sh[0], sh[1]
				data := randWeights(rng, typ, rows, cols)
				m, err := NewMatrix(typ, rows, cols, data)
				if err != nil {
					t.Fatal(err)
				}
				rb, _ := quant.RowBytes(typ, cols)
				for _, n := range []int{1, 2, 4, 5, 8, 9, 17} {
					x := randF32(rng, n*cols)
					nb := cols / 32
					xq, xd, xs := make([]int8, n*cols), make([]float32, n*nb), make([]int32, n*nb)
					for i := 0; i < n; i++ {
						quantizeQ8_0(x[i*cols:(i+1)*cols], xq[i*cols:(i+1)*cols], xd[i*nb:(i+1)*nb], xs[i*nb:(i+1)*nb])
					}
					want := make([]float32, n*rows)
					for i := 0; i < n; i++ {
						for r := 0; r < rows; r++ {
							row := data[r*rb : (r+1)*rb]
							if typ == quant.Q8_0 {
								want[i*rows+r] = dotQ8_0Ref(row, xq[i*cols:(i+1)*cols], xd[i*nb:(i+1)*nb])
							} else {
								want[i*rows+r] = dotQ4_0Ref(row, xq[i*cols:(i+1)*cols], xd[i*nb:(i+1)*nb])
							}
						}
					}
					for pi, p := range pools {
						got := make([]float32, n*rows)
						MatMul(p, got, m, x, n)
						if diff := cmp.Diff(bitsOf(want), bitsOf(got)); diff != "" {
							t.Fatalf("%s %dx%d n=%d pool %d: MatMul vs ggml vec_dot (-ggml +got bits):\n%s", typ, rows, cols, n, pi, diff)
						}
					}
				}
			}
		}
	})
}

// TestQuantizeQ8_0Packed: the packed quantiser writes exactly quantizeQ8_0's
// quants, scales and (corrected) sums, in qgemm.go's layout, and leaves the
// other rows of the group alone.
func TestQuantizeQ8_0Packed(t *testing.T) {
	rng := newRand(43)
	const cols, nb = 96, 3
	for _, width := range []int{1, 4, 8} {
		for i := 0; i < width; i++ {
			x := randF32(rng, cols)
			q, d, s := make([]int8, cols), make([]float32, nb), make([]int32, nb)
			quantizeQ8_0(x, q, d, s)
			xq, xd, xc := make([]int8, width*cols), make([]float32, width*nb), make([]int32, width*nb)
			for j := range xq {
				xq[j] = 99
			}
			quantizeQ8_0Packed(x, width, i, -8, xq, xd, xc)
			for b := 0; b < nb; b++ {
				if xd[b*width+i] != d[b] || xc[b*width+i] != -8*s[b] {
					t.Fatalf("width %d row %d block %d: d %v c %d, want %v %d", width, i, b, xd[b*width+i], xc[b*width+i], d[b], -8*s[b])
				}
				for k := 0; k < 32; k++ {
					o := (b*8+k/4)*width*4 + i*4 + k%4
					if xq[o] != q[b*32+k] {
						t.Fatalf("width %d row %d: quant %d = %d, want %d", width, i, b*32+k, xq[o], q[b*32+k])
					}
					xq[o] = 99
				}
			}
			for j, v := range xq {
				if v != 99 {
					t.Fatalf("width %d row %d: wrote xq[%d] of another row", width, i, j)
				}
			}
		}
	}
}

// TestMatMulKMatchesGGML: MatMul over repacked Q4_K and Q6_K weights gives,
// bit for bit, ggml's vec_dot over the original GGML rows with ggml's Q8_K
// activations, for one row (decode), a padded group and several groups,
// weight row counts that leave a padded group, one or two threads.
func TestMatMulKMatchesGGML(t *testing.T) {
	forEachTier(t, func(t *testing.T) {
		rng := newRand(44)
		pools := []*Pool{nil, NewPool(2)}
		defer pools[1].Close()
		for _, typ := range []quant.Type{quant.Q4_K, quant.Q6_K} {
			for _, sh := range [][2]int{{16, 256}, {37, 512}, {3, 768}} {
				rows, cols := sh[0], sh[1]
				data := randWeights(rng, typ, rows, cols)
				if typ == quant.Q4_K {
					// Real Q4_K blocks too: quant.Quantize's scale/min packing.
					q, err := quant.Quantize(typ, randF32(rng, rows*cols))
					if err != nil {
						t.Fatal(err)
					}
					data = q
				}
				m, err := NewMatrix(typ, rows, cols, data)
				if err != nil {
					t.Fatal(err)
				}
				rb, _ := quant.RowBytes(typ, cols)
				nb := cols / 256
				for _, n := range []int{1, 2, 4, 5, 9} {
					x := randF32(rng, n*cols)
					if n == 2 {
						clear(x[:256]) // an all-zero super-block
					}
					xq, xd, bs := make([]int8, n*cols), make([]float32, n*nb), make([]int16, n*nb*16)
					for i := 0; i < n; i++ {
						quantizeQ8K(x[i*cols:(i+1)*cols], xq[i*cols:(i+1)*cols], xd[i*nb:(i+1)*nb], bs[i*nb*16:(i+1)*nb*16])
					}
					want := make([]float32, n*rows)
					for i := 0; i < n; i++ {
						for r := 0; r < rows; r++ {
							row := data[r*rb : (r+1)*rb]
							if typ == quant.Q4_K {
								want[i*rows+r] = dotQ4KRef(row, xq[i*cols:(i+1)*cols], xd[i*nb:(i+1)*nb], bs[i*nb*16:(i+1)*nb*16])
							} else {
								want[i*rows+r] = dotQ6KRef(row, xq[i*cols:(i+1)*cols], xd[i*nb:(i+1)*nb])
							}
						}
					}
					for pi, p := range pools {
						got := make([]float32, n*rows)
						MatMul(p, got, m, x, n)
						if diff := cmp.Diff(bitsOf(want), bitsOf(got)); diff != "" {
							t.Fatalf("%s %dx%d n=%d pool %d: MatMul vs ggml vec_dot (-ggml +got bits):\n%s", typ, rows, cols, n, pi, diff)
						}
					}
				}
			}
		}
	})
}

// TestQuantizeQ8KPacked: the packed Q8_K quantiser writes quantizeQ8K's
// quants and scale in kgemm.go's layout, with the bsum pairs each weight
// type needs, and leaves the other rows of the group alone.
func TestQuantizeQ8KPacked(t *testing.T) {
	rng := newRand(45)
	const cols, nb = 512, 2
	for _, typ := range []quant.Type{quant.Q4_K, quant.Q6_K} {
		for _, width := range []int{1, 4} {
			for i := 0; i < width; i++ {
				x := randF32(rng, cols)
				if i == 1 {
					clear(x[256:])
				}
				q, d, bs := make([]int8, cols), make([]float32, nb), make([]int16, nb*16)
				quantizeQ8K(x, q, d, bs)
				xq, xd, xp := make([]int8, width*cols), make([]float32, width*nb), make([]int32, width*nb*8)
				for j := range xq {
					xq[j] = 99
				}
				quantizeQ8KPacked(typ, x, width, i, xq, xd, xp)
				for s := 0; s < nb; s++ {
					if math.Float32bits(xd[s*width+i]) != math.Float32bits(d[s]) {
						t.Fatalf("%s width %d row %d: d = %v, want %v", typ, width, i, xd[s*width+i], d[s])
					}
					for p := 0; p < 8; p++ {
						var lo, hi int16
						b := bs[s*16:]
						if typ == quant.Q6_K {
							lo, hi = b[2*p], b[2*p+1]
						} else if p < 4 {
							lo, hi = b[4*p]+b[4*p+1], b[4*p+2]+b[4*p+3]
						}
						v := uint32(xp[(s*8+p)*width+i])
						if int16(v) != lo || int16(v>>16) != hi {
							t.Fatalf("%s width %d row %d: pair %d = (%d, %d), want (%d, %d)", typ, width, i, p, int16(v), int16(v>>16), lo, hi)
						}
					}
					for k := 0; k < 256; k++ {
						o := s*256*width + (k/4)*width*4 + i*4 + k%4
						if xq[o] != q[s*256+k] {
							t.Fatalf("%s width %d row %d: quant %d = %d, want %d", typ, width, i, s*256+k, xq[o], q[s*256+k])
						}
						xq[o] = 99
					}
				}
				for j, v := range xq {
					if v != 99 {
						t.Fatalf("%s width %d row %d: wrote xq[%d] of another row", typ, width, i, j)
					}
				}
			}
		}
	}
}

// TestMatMulBatchInvariant: an activation row's outputs are bit-identical
// whether it is multiplied alone or at any position of a batch of any
// size, with any number of threads, for every weight type. Continuous
// batching relies on this: a sequence's logits must not depend on which
// other sequences (other tenants') share its step.
func TestMatMulBatchInvariant(t *testing.T) {
	forEachTier(t, func(t *testing.T) {
		rng := newRand(46)
		pools := []*Pool{nil, NewPool(2), NewPool(3)}
		defer pools[1].Close()
		defer pools[2].Close()
		for _, typ := range weightTypes {
			bs := max(typ.BlockSize(), 32)
			for _, sh := range [][2]int{{37, 3 * bs}, {64, 1100 / bs * bs}, {21, 2 * bs}} {
				rows, cols := sh[0], sh[1]
				if typ.BlockSize() == 256 {
					cols = sh[1] / 256 * 256
					if cols == 0 {
						cols = 256
					}
				}
				if typ.BlockSize() == 1 {
					cols = sh[1] + 5 // a masked tail and, for 1100, three column chunks
				}
				m, err := NewMatrix(typ, rows, cols, randWeights(rng, typ, rows, cols))
				if err != nil {
					t.Fatal(err)
				}
				const n = 19
				x := randF32(rng, n*cols)
				alone := make([]float32, n*rows)
				for i := 0; i < n; i++ {
					MatMul(nil, alone[i*rows:(i+1)*rows], m, x[i*cols:(i+1)*cols], 1)
				}
				for _, sub := range [][2]int{{0, n}, {3, 7}, {5, 13}, {1, 3}, {2, 6}} {
					for pi, p := range pools {
						lo, hi := sub[0], sub[1]
						got := make([]float32, (hi-lo)*rows)
						MatMul(p, got, m, x[lo*cols:hi*cols], hi-lo)
						if diff := cmp.Diff(bitsOf(alone[lo*rows:hi*rows]), bitsOf(got)); diff != "" {
							t.Fatalf("%s %dx%d rows %d..%d pool %d: batched differs from alone (-alone +batched bits):\n%s", typ, rows, cols, lo, hi, pi, diff)
						}
					}
				}
			}
		}
	})
}
