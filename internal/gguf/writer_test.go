package gguf

import (
	"bytes"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// allValues holds one value of every type the writer accepts.
var allValues = []struct {
	key string
	v   any
}{
	{"t.u8", uint8(200)},
	{"t.i8", int8(-100)},
	{"t.u16", uint16(60000)},
	{"t.i16", int16(-30000)},
	{"t.u32", uint32(4000000000)},
	{"t.i32", int32(-2000000000)},
	{"t.f32", float32(1.5)},
	{"t.bool", true},
	{"t.str", "héllo\x00world"},
	{"t.u64", uint64(math.MaxUint64)},
	{"t.i64", int64(math.MinInt64)},
	{"t.f64", math.Pi},
	{"t.au8", []uint8{1, 2, 255}},
	{"t.ai8", []int8{-1, 0, 127}},
	{"t.au16", []uint16{1, 65535}},
	{"t.ai16", []int16{-32768, 5}},
	{"t.au32", []uint32{0, 7, math.MaxUint32}},
	{"t.ai32", []int32{-7, 0, 7}},
	{"t.af32", []float32{0.25, float32(math.Inf(-1))}},
	{"t.abool", []bool{true, false, true}},
	{"t.astr", []string{"", "a", "ééé"}},
	{"t.au64", []uint64{1 << 63}},
	{"t.ai64", []int64{-1}},
	{"t.af64", []float64{-0.5}},
	{"t.empty", []string{}},
}

func tensorBytes(t testing.TB, typ quant.Type, dims []uint64, seed int) []byte {
	t.Helper()
	n := uint64(1)
	for _, d := range dims {
		n *= d
	}
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(math.Sin(float64(i*7+seed))) * 2
	}
	b, err := quant.Quantize(typ, x)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

type testTensor struct {
	name string
	typ  quant.Type
	dims []uint64
}

var testTensors = []testTensor{
	{"a.f32", quant.F32, []uint64{3, 5}},
	{"b.f16", quant.F16, []uint64{7}},
	{"c.bf16", quant.BF16, []uint64{2, 2, 2, 2}},
	{"d.q8_0", quant.Q8_0, []uint64{64, 3}},
	{"e.q4_0", quant.Q4_0, []uint64{32, 1, 2}},
	{"f.q4_k", quant.Q4_K, []uint64{256, 2}},
	{"g.q6_k", quant.Q6_K, []uint64{512}},
	{"h.empty", quant.F32, []uint64{0, 4}},
}

func buildFile(t testing.TB, alignment uint32) []byte {
	t.Helper()
	w := NewWriter()
	if alignment != 0 {
		if err := w.SetKV("general.alignment", alignment); err != nil {
			t.Fatal(err)
		}
	}
	for _, kv := range allValues {
		if err := w.SetKV(kv.key, kv.v); err != nil {
			t.Fatalf("SetKV(%s): %v", kv.key, err)
		}
	}
	for i, tt := range testTensors {
		if err := w.AddTensor(tt.name, tt.typ, tt.dims, tensorBytes(t, tt.typ, tt.dims, i)); err != nil {
			t.Fatalf("AddTensor(%s): %v", tt.name, err)
		}
	}
	var buf bytes.Buffer
	n, err := w.WriteTo(&buf)
	if err != nil || n != int64(buf.Len()) {
		t.Fatalf("WriteTo = %d, %v; buffer has %d", n, err, buf.Len())
	}
	return buf.Bytes()
}

func TestWriterRoundTrip(t *testing.T) {
	for _, align := range []uint32{0, 1, 64, 4096} {
		data := buildFile(t, align)
		f, err := Parse(data)
		if err != nil {
			t.Fatalf("alignment %d: %v", align, err)
		}
		wantAlign := int(align)
		if align == 0 {
			wantAlign = DefaultAlignment
		}
		if f.Version != 3 || f.Alignment != wantAlign || f.DataOffset%int64(wantAlign) != 0 {
			t.Errorf("alignment %d: version %d alignment %d data offset %d", align, f.Version, f.Alignment, f.DataOffset)
		}
		var gotKV []any
		for _, kv := range f.KV {
			if kv.Key != "general.alignment" {
				gotKV = append(gotKV, kv.Value.Any())
			}
		}
		var wantKV []any
		for _, kv := range allValues {
			wantKV = append(wantKV, kv.v)
		}
		if diff := cmp.Diff(wantKV, gotKV, cmpopts.EquateNaNs()); diff != "" {
			t.Errorf("alignment %d: values (-want +got):\n%s", align, diff)
		}
		for i, tt := range testTensors {
			ti, ok := f.Tensor(tt.name)
			if !ok {
				t.Fatalf("no tensor %s", tt.name)
			}
			want := tensorBytes(t, tt.typ, tt.dims, i)
			if ti.Type != tt.typ || !cmp.Equal(ti.Dims, tt.dims) || !bytes.Equal(ti.Data, want) {
				t.Errorf("alignment %d: tensor %s = %s %v (%d bytes), want %s %v (%d bytes)", align, tt.name, ti.Type, ti.Dims, len(ti.Data), tt.typ, tt.dims, len(want))
			}
			if ti.Offset%uint64(wantAlign) != 0 {
				t.Errorf("tensor %s offset %d not aligned", tt.name, ti.Offset)
			}
		}
	}
}

func TestValueGetters(t *testing.T) {
	f, err := Parse(buildFile(t, 0))
	if err != nil {
		t.Fatal(err)
	}
	type got struct {
		U   uint64
		UOK bool
		I   int64
		IOK bool
	}
	ints := map[string]got{
		"t.u8":  {200, true, 200, true},
		"t.i8":  {0, false, -100, true},
		"t.u32": {4000000000, true, 4000000000, true},
		"t.i32": {0, false, -2000000000, true},
		"t.u64": {math.MaxUint64, true, 0, false},
		"t.i64": {0, false, math.MinInt64, true},
		"t.str": {},
		"t.f32": {},
		"nope":  {},
	}
	for key, want := range ints {
		var g got
		g.U, g.UOK = f.Uint(key)
		g.I, g.IOK = f.Int(key)
		if diff := cmp.Diff(want, g); diff != "" {
			t.Errorf("%s (-want +got):\n%s", key, diff)
		}
	}
	if v, ok := f.Float("t.f32"); !ok || v != 1.5 {
		t.Errorf("Float(t.f32) = %v, %v", v, ok)
	}
	if v, ok := f.Float("t.f64"); !ok || v != math.Pi {
		t.Errorf("Float(t.f64) = %v, %v", v, ok)
	}
	if _, ok := f.Float("t.i32"); ok {
		t.Errorf("Float(t.i32) accepted an integer")
	}
	if v, ok := f.Bool("t.bool"); !ok || !v {
		t.Errorf("Bool = %v, %v", v, ok)
	}
	if v, ok := f.String("t.str"); !ok || v != "héllo\x00world" {
		t.Errorf("String = %q, %v", v, ok)
	}
	if v, ok := f.Strings("t.astr"); !ok || !cmp.Equal(v, []string{"", "a", "ééé"}) {
		t.Errorf("Strings = %q, %v", v, ok)
	}
	if v, ok := f.Int32s("t.au8"); !ok || !cmp.Equal(v, []int32{1, 2, 255}) {
		t.Errorf("Int32s(u8 array) = %v, %v", v, ok)
	}
	if _, ok := f.Int32s("t.au32"); ok {
		t.Errorf("Int32s accepted a uint32 array holding MaxUint32")
	}
	if v, ok := f.Uint32s("t.au32"); !ok || !cmp.Equal(v, []uint32{0, 7, math.MaxUint32}) {
		t.Errorf("Uint32s = %v, %v", v, ok)
	}
	if v, ok := f.Float32s("t.af64"); !ok || !cmp.Equal(v, []float32{-0.5}) {
		t.Errorf("Float32s(f64 array) = %v, %v", v, ok)
	}
	if _, ok := f.Strings("t.str"); ok {
		t.Errorf("Strings accepted a scalar")
	}
	v, _ := f.Lookup("t.astr")
	if v.Len() != 3 || v.Type() != TypeArray || v.ElemType() != TypeString || v.String() != "[3 x string]" {
		t.Errorf("array Value: len %d type %s elem %s string %q", v.Len(), v.Type(), v.ElemType(), v.String())
	}
}

func TestWriterRejects(t *testing.T) {
	w := NewWriter()
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"plain int", w.SetKV("k", 5)},
		{"nil", w.SetKV("k", nil)},
		{"empty key", w.SetKV("", uint32(1))},
		{"nested", w.SetKV("k", [][]string{{"a"}})},
		{"alignment not pow2", w.SetKV("general.alignment", uint32(48))},
		{"alignment wrong type", w.SetKV("general.alignment", uint64(64))},
		{"unknown type", w.AddTensor("x", 9999, []uint64{4}, make([]byte, 16))},
		{"long name", w.AddTensor(string(make([]byte, 64)), quant.F32, []uint64{1}, make([]byte, 4))},
		{"five dims", w.AddTensor("x", quant.F32, []uint64{1, 1, 1, 1, 1}, make([]byte, 4))},
		{"partial block", w.AddTensor("x", quant.Q8_0, []uint64{16}, make([]byte, 17))},
		{"wrong size", w.AddTensor("x", quant.F32, []uint64{4}, make([]byte, 15))},
		{"overflow", w.AddTensor("x", quant.F32, []uint64{1 << 40, 1 << 40}, nil)},
	} {
		if tc.err == nil {
			t.Errorf("%s: accepted", tc.name)
		}
	}
	if err := w.AddTensor("x", quant.F32, []uint64{1}, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("x", quant.F32, []uint64{1}, make([]byte, 4)); err == nil {
		t.Errorf("duplicate tensor accepted")
	}
	// Setting a key twice replaces it in place.
	_ = w.SetKV("a", uint32(1))
	_ = w.SetKV("b", uint32(2))
	_ = w.SetKV("a", "x")
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.KV) != 2 || f.KV[0].Key != "a" || f.KV[0].Value.Any() != "x" {
		t.Errorf("KV after replace: %v", f.KV)
	}
}

type failWriter struct{ after int }

func (w *failWriter) Write(p []byte) (int, error) {
	if len(p) > w.after {
		n := w.after
		w.after = 0
		return n, errors.New("disk full")
	}
	w.after -= len(p)
	return len(p), nil
}

func TestWriterPropagatesErrors(t *testing.T) {
	w := NewWriter()
	_ = w.SetKV("k", "v")
	_ = w.AddTensor("t", quant.F32, []uint64{1 << 16}, make([]byte, 4<<16))
	n, err := w.WriteTo(&failWriter{after: 100})
	if err == nil || n != 100 {
		t.Errorf("WriteTo = %d, %v; want 100 and an error", n, err)
	}
}

// TestRewriteRealFiles parses each model and writes it back through the
// Writer. The two d256 files were written by llama.cpp itself, so a
// byte-identical copy shows the writer's layout matches llama.cpp's.
func TestRewriteRealFiles(t *testing.T) {
	files, _ := filepath.Glob(testdata.Path(t, "models", "*.gguf"))
	if len(files) < 6 {
		t.Fatalf("found %d model files", len(files))
	}
	for _, p := range files {
		t.Run(filepath.Base(p), func(t *testing.T) {
			orig, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			f, err := Parse(orig)
			if err != nil {
				t.Fatal(err)
			}
			w := NewWriter()
			for _, kv := range f.KV {
				if err := w.SetKV(kv.Key, kv.Value); err != nil {
					t.Fatal(err)
				}
			}
			for _, ti := range f.Tensors {
				if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
					t.Fatal(err)
				}
			}
			var buf bytes.Buffer
			if _, err := w.WriteTo(&buf); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), orig) {
				i := 0
				for i < min(buf.Len(), len(orig)) && buf.Bytes()[i] == orig[i] {
					i++
				}
				t.Errorf("rewrite differs: %d bytes vs %d, first difference at %d", buf.Len(), len(orig), i)
			}
		})
	}
}
