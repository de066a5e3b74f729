package gguf

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/pagewarden/pagewarden/internal/quant"
	"pgregory.net/rapid"
)

// genValue draws a Go value of a random GGUF type.
func genValue(t *rapid.T, label string) any {
	small := rapid.IntRange(0, 5)
	switch rapid.IntRange(0, 12).Draw(t, label+".kind") {
	case 0:
		return rapid.Uint8().Draw(t, label)
	case 1:
		return rapid.Int8().Draw(t, label)
	case 2:
		return rapid.Uint16().Draw(t, label)
	case 3:
		return rapid.Int32().Draw(t, label)
	case 4:
		return rapid.Uint64().Draw(t, label)
	case 5:
		return rapid.Int64().Draw(t, label)
	case 6:
		return rapid.Float32().Draw(t, label)
	case 7:
		return rapid.Float64().Draw(t, label)
	case 8:
		return rapid.Bool().Draw(t, label)
	case 9:
		return rapid.String().Draw(t, label)
	case 10:
		return rapid.SliceOfN(rapid.String(), 0, small.Draw(t, label+".n")).Draw(t, label)
	case 11:
		return rapid.SliceOfN(rapid.Int32(), 0, 20).Draw(t, label)
	default:
		return rapid.SliceOfN(rapid.Float32(), 0, 20).Draw(t, label)
	}
}

// TestRoundTripProperty: any metadata and tensors the Writer accepts come
// back from Parse unchanged, in order.
func TestRoundTripProperty(t *testing.T) {
	types := []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_0, quant.Q4_K, quant.Q6_K, quant.Q5_1, quant.I32}
	rapid.Check(t, func(t *rapid.T) {
		w := NewWriter()
		var wantKV []KV
		if rapid.Bool().Draw(t, "align") {
			a := uint32(1) << rapid.IntRange(0, 12).Draw(t, "log2align")
			if err := w.SetKV("general.alignment", a); err != nil {
				t.Fatal(err)
			}
			wantKV = append(wantKV, KV{"general.alignment", Value{typ: TypeUint32, v: a}})
		}
		nkv := rapid.IntRange(0, 8).Draw(t, "nkv")
		for i := range nkv {
			key := fmt.Sprintf("k%d.%s", i, rapid.StringN(0, 10, -1).Draw(t, "key"))
			v := genValue(t, key)
			if err := w.SetKV(key, v); err != nil {
				t.Fatalf("SetKV(%q, %T): %v", key, v, err)
			}
			val, _ := NewValue(v)
			wantKV = append(wantKV, KV{key, val})
		}
		type tensor struct {
			Name string
			Type quant.Type
			Dims []uint64
			Data []byte
		}
		var want []tensor
		for i := range rapid.IntRange(0, 5).Draw(t, "ntensors") {
			typ := rapid.SampledFrom(types).Draw(t, "type")
			dims := []uint64{uint64(typ.BlockSize() * rapid.IntRange(0, 3).Draw(t, "blocks"))}
			for range rapid.IntRange(0, 3).Draw(t, "extra dims") {
				dims = append(dims, uint64(rapid.IntRange(1, 3).Draw(t, "dim")))
			}
			n := uint64(typ.BlockBytes())
			for _, d := range dims {
				n *= d
			}
			n /= uint64(typ.BlockSize())
			data := rapid.SliceOfN(rapid.Byte(), int(n), int(n)).Draw(t, "data")
			name := fmt.Sprintf("t%d", i)
			if err := w.AddTensor(name, typ, dims, data); err != nil {
				t.Fatal(err)
			}
			want = append(want, tensor{name, typ, dims, data})
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		f, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("Parse: %v", err)
		}
		opts := []cmp.Option{cmp.AllowUnexported(Value{}), cmpopts.EquateNaNs(), cmpopts.EquateEmpty()}
		if diff := cmp.Diff(wantKV, f.KV, opts...); diff != "" {
			t.Fatalf("KV (-want +got):\n%s", diff)
		}
		var got []tensor
		for _, ti := range f.Tensors {
			got = append(got, tensor{ti.Name, ti.Type, ti.Dims, ti.Data})
			if ti.Offset%uint64(f.Alignment) != 0 {
				t.Fatalf("%s: offset %d not aligned to %d", ti.Name, ti.Offset, f.Alignment)
			}
		}
		if diff := cmp.Diff(want, got, opts...); diff != "" {
			t.Fatalf("tensors (-want +got):\n%s", diff)
		}
	})
}
