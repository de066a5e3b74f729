package gguf

import (
	"bytes"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/pagewarden/pagewarden/internal/quant"
	"github.com/pagewarden/pagewarden/internal/testdata"
)

// realHeaderSeed rebuilds a real model's metadata and tensor table in
// miniature: every key and tensor name of tiny-llama-f32.gguf, arrays cut
// to 8 elements and tensors shrunk to 32 F32 values, so the fuzzer starts
// from a realistic layout without megabytes of weights.
func realHeaderSeed(tb testing.TB) []byte {
	tb.Helper()
	f, err := Open(testdata.Path(tb, "models", "tiny-llama-f32.gguf"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	w := NewWriter()
	for _, kv := range f.KV {
		v := kv.Value
		switch a := v.Any().(type) {
		case []string:
			v, _ = NewValue(a[:min(8, len(a))])
		case []float32:
			v, _ = NewValue(a[:min(8, len(a))])
		case []int32:
			v, _ = NewValue(a[:min(8, len(a))])
		}
		if err := w.SetKV(kv.Key, v); err != nil {
			tb.Fatal(err)
		}
	}
	for _, ti := range f.Tensors {
		if err := w.AddTensor(ti.Name, quant.F32, []uint64{32}, make([]byte, 128)); err != nil {
			tb.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzParse: Parse never panics, and whatever it accepts survives a trip
// through the Writer unchanged (so reader and writer agree on the format
// and every accepted tensor's bytes were really inside the input).
func FuzzParse(f *testing.F) {
	f.Add(buildFile(f, 0))
	f.Add(buildFile(f, 64))
	f.Add(validSpec().build())
	f.Add(realHeaderSeed(f))
	if head, err := os.ReadFile(testdata.Path(f, "models", "tiny-llama-q8_0.gguf")); err == nil {
		f.Add(head[:4096]) // a real header, cut inside the vocabulary
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			return
		}
		if file.Alignment > 1<<16 {
			// Valid, but the rewrite would pad with up to 2 GiB of zeros
			// (llama.cpp pads after the tensor table even without tensors).
			return
		}
		w := NewWriter()
		for _, kv := range file.KV {
			if err := w.SetKV(kv.Key, kv.Value); err != nil {
				t.Fatalf("writer refused parsed key %q: %v", kv.Key, err)
			}
		}
		for _, ti := range file.Tensors {
			if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, ti.Data); err != nil {
				t.Fatalf("writer refused parsed tensor %q: %v", ti.Name, err)
			}
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		again, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		opts := []cmp.Option{cmpopts.EquateNaNs(), cmp.AllowUnexported(Value{}), cmpopts.EquateEmpty(),
			cmpopts.IgnoreFields(TensorInfo{}, "Offset")}
		if diff := cmp.Diff(file.KV, again.KV, opts...); diff != "" {
			t.Fatalf("KV changed (-parsed +rewritten):\n%s", diff)
		}
		if diff := cmp.Diff(file.Tensors, again.Tensors, opts...); diff != "" {
			t.Fatalf("tensors changed (-parsed +rewritten):\n%s", diff)
		}
	})
}

func BenchmarkOpen(b *testing.B) {
	path := testdata.Path(b, "models", "tiny-llama-f32.gguf")
	b.ReportAllocs()
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

func BenchmarkParseSmall(b *testing.B) {
	data := buildFile(b, 0)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
