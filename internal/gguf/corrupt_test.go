package gguf

import (
	"encoding/binary"
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// rawKV and rawTensor describe a file at the byte level, so corruption
// cases can say exactly what is wrong without a writer that refuses it.
type rawKV struct {
	key     string
	typ     uint32
	payload []byte
}

type rawTensor struct {
	name   string
	dims   []uint64
	typ    uint32
	offset uint64
}

type spec struct {
	magic         string
	version       uint32
	nTensors, nKV *uint64 // override the real counts
	kvs           []rawKV
	tensors       []rawTensor
	pad           int // padding alignment before data
	data          int // bytes of tensor data
}

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }
func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
func gstr(s string) []byte { return append(le64(uint64(len(s))), s...) }
func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}
func u64p(v uint64) *uint64 { return &v }

// validSpec: two KVs, an F32 tensor of 8 elements at 0 and a Q8_0 tensor
// of 2 rows of 32 at 32.
func validSpec() spec {
	return spec{
		magic:   "GGUF",
		version: 3,
		kvs: []rawKV{
			{"general.architecture", 8, gstr("llama")},
			{"a", 9, cat(le32(4), le64(3), le32(1), le32(2), le32(3))},
		},
		tensors: []rawTensor{
			{"t0", []uint64{8}, 0, 0},
			{"t1", []uint64{32, 2}, 8, 32},
		},
		pad:  32,
		data: 32 + 68,
	}
}

func (s spec) build() []byte {
	b := []byte(s.magic)
	b = append(b, le32(s.version)...)
	nT, nKV := uint64(len(s.tensors)), uint64(len(s.kvs))
	if s.nTensors != nil {
		nT = *s.nTensors
	}
	if s.nKV != nil {
		nKV = *s.nKV
	}
	b = append(b, le64(nT)...)
	b = append(b, le64(nKV)...)
	for _, kv := range s.kvs {
		b = append(b, gstr(kv.key)...)
		b = append(b, le32(kv.typ)...)
		b = append(b, kv.payload...)
	}
	for _, t := range s.tensors {
		b = append(b, gstr(t.name)...)
		b = append(b, le32(uint32(len(t.dims)))...)
		for _, d := range t.dims {
			b = append(b, le64(d)...)
		}
		b = append(b, le32(t.typ)...)
		b = append(b, le64(t.offset)...)
	}
	for s.pad > 0 && len(b)%s.pad != 0 {
		b = append(b, 0)
	}
	return append(b, make([]byte, s.data)...)
}

func TestValidSpecParses(t *testing.T) {
	f, err := Parse(validSpec().build())
	if err != nil {
		t.Fatal(err)
	}
	t1, _ := f.Tensor("t1")
	if len(f.Tensors) != 2 || t1.Type != quant.Q8_0 || len(t1.Data) != 68 {
		t.Fatalf("unexpected parse: %+v", f.Tensors)
	}
}

func TestCorruptFiles(t *testing.T) {
	tests := []struct {
		name string
		mod  func(s *spec)
		raw  []byte // used instead of the spec when set
		want error
		msg  string // substring of the message
	}{
		{name: "empty", raw: []byte{}, want: ErrNotGGUF},
		{name: "bad magic", mod: func(s *spec) { s.magic = "GGML" }, want: ErrNotGGUF, msg: "bad magic"},
		{name: "version 1", mod: func(s *spec) { s.version = 1 }, want: ErrUnsupported, msg: "version 1"},
		{name: "version 4", mod: func(s *spec) { s.version = 4 }, want: ErrUnsupported},
		{name: "big-endian version", mod: func(s *spec) { s.version = 3 << 24 }, want: ErrUnsupported, msg: "big-endian"},
		{name: "header truncated", raw: []byte("GGUF\x03\x00\x00\x00\x01"), want: ErrTruncated},
		{name: "absurd tensor count", mod: func(s *spec) { s.nTensors = u64p(math.MaxUint64) }, want: ErrLimit},
		{name: "absurd KV count", mod: func(s *spec) { s.nKV = u64p(1 << 40) }, want: ErrLimit},
		{name: "KV count beyond file", mod: func(s *spec) { s.nKV = u64p(1000) }, want: ErrTruncated},
		{name: "tensor count beyond file", mod: func(s *spec) { s.nTensors = u64p(100000) }, want: ErrTruncated},
		{name: "huge key length", mod: func(s *spec) { s.kvs[0].key = strings.Repeat("k", MaxKeyLen+1) }, want: ErrLimit},
		{name: "key length past end", raw: cat([]byte("GGUF"), le32(3), le64(0), le64(1), le64(1<<20)), want: ErrTruncated},
		{name: "huge string value", mod: func(s *spec) { s.kvs[0].payload = le64(1 << 62) }, want: ErrLimit, msg: `key "general.architecture"`},
		{name: "string value past end", mod: func(s *spec) { s.kvs[0].payload = le64(1 << 20) }, want: ErrTruncated},
		{name: "empty key", mod: func(s *spec) { s.kvs[0].key = "" }, want: ErrCorrupt},
		{name: "duplicate key", mod: func(s *spec) { s.kvs[1].key = s.kvs[0].key }, want: ErrCorrupt, msg: "duplicate"},
		{name: "unknown value type", mod: func(s *spec) { s.kvs[0].typ = 13 }, want: ErrCorrupt},
		{name: "unknown array element type", mod: func(s *spec) { s.kvs[1].payload = cat(le32(77), le64(1), le32(0)) }, want: ErrCorrupt},
		{name: "array of arrays", mod: func(s *spec) { s.kvs[1].payload = cat(le32(9), le64(1), le32(4), le64(0)) }, want: ErrUnsupported},
		{name: "absurd array length", mod: func(s *spec) { s.kvs[1].payload = cat(le32(4), le64(1<<60)) }, want: ErrLimit},
		{name: "array past end", mod: func(s *spec) { s.kvs[1].payload = cat(le32(4), le64(1<<23)) }, want: ErrTruncated},
		{name: "string array past end", mod: func(s *spec) { s.kvs[1].payload = cat(le32(8), le64(1<<23)) }, want: ErrTruncated},
		{name: "bad bool", mod: func(s *spec) { s.kvs[1].payload = []byte{2}; s.kvs[1].typ = 7 }, want: ErrCorrupt},
		{name: "alignment not power of two", mod: func(s *spec) { s.kvs = append(s.kvs, rawKV{"general.alignment", 4, le32(48)}) }, want: ErrCorrupt, msg: "power of two"},
		{name: "alignment zero", mod: func(s *spec) { s.kvs = append(s.kvs, rawKV{"general.alignment", 4, le32(0)}) }, want: ErrCorrupt},
		{name: "alignment wrong type", mod: func(s *spec) { s.kvs = append(s.kvs, rawKV{"general.alignment", 10, le64(32)}) }, want: ErrCorrupt, msg: "uint32"},
		{name: "unknown tensor type", mod: func(s *spec) { s.tensors[0].typ = 9999 }, want: ErrUnsupported, msg: `tensor "t0": unknown tensor type 9999`},
		{name: "removed tensor type", mod: func(s *spec) { s.tensors[0].typ = 4 }, want: ErrUnsupported},
		{name: "long tensor name", mod: func(s *spec) { s.tensors[0].name = strings.Repeat("n", 64) }, want: ErrLimit},
		{name: "empty tensor name", mod: func(s *spec) { s.tensors[0].name = "" }, want: ErrCorrupt},
		{name: "duplicate tensor", mod: func(s *spec) { s.tensors[1].name = "t0" }, want: ErrCorrupt, msg: "duplicate"},
		{name: "zero dims", mod: func(s *spec) { s.tensors[0].dims = nil }, want: ErrCorrupt},
		{name: "five dims", mod: func(s *spec) { s.tensors[0].dims = []uint64{8, 1, 1, 1, 1} }, want: ErrCorrupt},
		{name: "element count overflow", mod: func(s *spec) { s.tensors[0].dims = []uint64{1 << 32, 1 << 32} }, want: ErrCorrupt, msg: "overflow"},
		{name: "dim above int64", mod: func(s *spec) { s.tensors[0].dims = []uint64{1 << 63} }, want: ErrCorrupt},
		{name: "byte size overflow", mod: func(s *spec) { s.tensors[0].dims = []uint64{1 << 61, 2} }, want: ErrCorrupt},
		{name: "partial block row", mod: func(s *spec) { s.tensors[1].dims = []uint64{48, 2} }, want: ErrCorrupt, msg: "block size"},
		{name: "misaligned offset", mod: func(s *spec) { s.tensors[1].offset = 36 }, want: ErrCorrupt, msg: "alignment"},
		{name: "overlapping tensors", mod: func(s *spec) { s.tensors[1].offset = 0 }, want: ErrCorrupt, msg: "overlap"},
		{name: "data past end", mod: func(s *spec) { s.data = 99 }, want: ErrTruncated,
			msg: `tensor "t1": data [offset 32, 68 bytes) runs past end of file`},
		{name: "offset wraps", mod: func(s *spec) { s.tensors[1].offset = math.MaxUint64 - 31 }, want: ErrTruncated},
		{name: "tensor infos truncated", mod: func(s *spec) { s.pad = 0; s.data = 0; s.tensors[1].dims = []uint64{32, 2, 1, 1} }, want: ErrTruncated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.raw
			if data == nil {
				s := validSpec()
				tc.mod(&s)
				data = s.build()
			}
			if tc.name == "tensor infos truncated" {
				data = data[:len(data)-10]
			}
			var f *File
			var err error
			alloc := allocated(func() { f, err = Parse(data) })
			if err == nil {
				t.Fatalf("accepted: %+v", f)
			}
			if !errors.Is(err, tc.want) {
				t.Errorf("error %q does not wrap %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "gguf: ") || !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("error %q: want prefix \"gguf: \" and %q", err, tc.msg)
			}
			// Bounded decoding: a small input never costs much memory.
			if limit := uint64(64<<10 + 64*len(data)); alloc > limit {
				t.Errorf("allocated %d bytes for a %d-byte input (limit %d)", alloc, len(data), limit)
			}
		})
	}
}

func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestTruncateEverywhere cuts a writer-made file at every length: each cut
// before the end of the last tensor's data must fail with ErrTruncated (or
// ErrNotGGUF inside the magic), and never panic.
func TestTruncateEverywhere(t *testing.T) {
	data := buildFile(t, 0)
	full, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	last := full.Tensors[len(full.Tensors)-1]
	end := int(full.DataOffset) + int(last.Offset) + len(last.Data)
	for n := 0; n < len(data); n++ {
		_, err := Parse(data[:n])
		switch {
		case n >= end:
			if err != nil {
				t.Fatalf("cut at %d (after the data, in padding): %v", n, err)
			}
		case n < 4:
			if !errors.Is(err, ErrNotGGUF) {
				t.Fatalf("cut at %d: %v, want ErrNotGGUF", n, err)
			}
		default:
			if !errors.Is(err, ErrTruncated) {
				t.Fatalf("cut at %d: %v, want ErrTruncated", n, err)
			}
		}
	}
}

// TestZeroSizedTensors: tensors with a zero dimension occupy no bytes and
// may share an offset (llama.cpp allows zero-length dimensions).
func TestZeroSizedTensors(t *testing.T) {
	s := validSpec()
	s.tensors = append(s.tensors, rawTensor{"z", []uint64{0, 3}, 0, 32}, rawTensor{"z2", []uint64{32, 0}, 8, 96})
	f, err := Parse(s.build())
	if err != nil {
		t.Fatal(err)
	}
	z, _ := f.Tensor("z2")
	if len(z.Data) != 0 || z.Elements() != 0 {
		t.Errorf("z2: %d bytes, %d elements", len(z.Data), z.Elements())
	}
}

func TestVersion2(t *testing.T) {
	s := validSpec()
	s.version = 2
	f, err := Parse(s.build())
	if err != nil || f.Version != 2 {
		t.Fatalf("version 2: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open("/nonexistent/x.gguf"); err == nil {
		t.Error("Open of a missing file succeeded")
	}
	dir := t.TempDir()
	empty := dir + "/empty.gguf"
	if err := writeFile(empty, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(empty); !errors.Is(err, ErrNotGGUF) {
		t.Errorf("Open(empty) = %v", err)
	}
	bad := dir + "/bad.gguf"
	s := validSpec()
	s.data = 10
	if err := writeFile(bad, s.build()); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(bad); !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), bad) {
		t.Errorf("Open(truncated) = %v", err)
	}
	good := dir + "/good.gguf"
	if err := writeFile(good, buildFile(t, 0)); err != nil {
		t.Fatal(err)
	}
	f, err := Open(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if f.Tensors[0].Data != nil {
		t.Errorf("Data still set after Close")
	}
}
