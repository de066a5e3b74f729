package gguf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// Decoding limits, declared up front. A file exceeding one is refused with
// an error wrapping ErrLimit. They are far above anything a real model
// needs (the largest vocabularies hold ~260k tokens, the longest chat
// templates ~100 KiB) and far below what could exhaust memory.
const (
	MaxKeyLen        = 64 << 10 // bytes in a metadata key
	MaxStringLen     = 16 << 20 // bytes in a string value (also each array element)
	MaxArrayLen      = 1 << 24  // elements in an array value
	MaxKVs           = 1 << 20  // metadata pairs
	MaxTensors       = 1 << 20  // tensors
	MaxDims          = 4        // dimensions of a tensor (GGML_MAX_DIMS)
	MaxTensorNameLen = 63       // bytes in a tensor name (ggml keeps 64 with the NUL)
	DefaultAlignment = 32       // used when general.alignment is absent
)

// Magic is the first four bytes of every GGUF file.
const Magic = "GGUF"

// Sentinel errors. Every error from Parse and Open wraps exactly one of them
// (Open may also return the operating system's error for the file).
var (
	ErrNotGGUF     = errors.New("gguf: not a GGUF file")
	ErrUnsupported = errors.New("gguf: unsupported")
	ErrTruncated   = errors.New("gguf: truncated")
	ErrCorrupt     = errors.New("gguf: corrupt")
	ErrLimit       = errors.New("gguf: exceeds a decoding limit")
)

// formatError reads as "gguf: <what went wrong, where>" and unwraps to its
// sentinel, so messages stay specific while errors.Is still works.
type formatError struct {
	kind error
	msg  string
}

func (e *formatError) Error() string { return "gguf: " + e.msg }
func (e *formatError) Unwrap() error { return e.kind }

func errf(kind error, format string, args ...any) error {
	return &formatError{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// KV is one metadata pair.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor.
type TensorInfo struct {
	Name string
	// Dims in GGML order: Dims[0] is the contiguous (row) length.
	Dims []uint64
	Type quant.Type
	// Offset is relative to the start of the data section (File.DataOffset).
	Offset uint64
	// Data is the tensor's bytes inside the file (or the mapping, for Open),
	// length already validated. It becomes invalid after File.Close.
	Data []byte
}

// Elements returns the number of elements (the product of Dims).
// Parse has checked that it does not overflow.
func (t *TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Rows returns the number of rows: the product of Dims[1:].
func (t *TensorInfo) Rows() uint64 {
	n := uint64(1)
	for _, d := range t.Dims[1:] {
		n *= d
	}
	return n
}

// File is a parsed GGUF file.
type File struct {
	Version    uint32
	Alignment  int
	KV         []KV
	Tensors    []TensorInfo
	DataOffset int64 // file offset of the tensor data section
	Size       int64 // file size in bytes

	kvIndex     map[string]int
	tensorIndex map[string]int
	unmap       func() error // set by Open
}

// Lookup returns the value stored under key.
func (f *File) Lookup(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.KV[i].Value, true
}

// String returns the string stored under key.
func (f *File) String(key string) (string, bool) { v, _ := f.Lookup(key); return v.Str() }

// Uint returns the integer stored under key, of any integer type, if it is
// non-negative.
func (f *File) Uint(key string) (uint64, bool) { v, _ := f.Lookup(key); return v.Uint() }

// Int returns the integer stored under key, of any integer type, if it
// fits an int64.
func (f *File) Int(key string) (int64, bool) { v, _ := f.Lookup(key); return v.Int() }

// Float returns the float32 or float64 stored under key.
func (f *File) Float(key string) (float64, bool) { v, _ := f.Lookup(key); return v.Float() }

// Bool returns the bool stored under key.
func (f *File) Bool(key string) (bool, bool) { v, _ := f.Lookup(key); return v.Bool() }

// Strings returns the string array stored under key (shared; do not modify).
func (f *File) Strings(key string) ([]string, bool) { v, _ := f.Lookup(key); return v.Strings() }

// Float32s returns the float array stored under key (see Value.Float32s).
func (f *File) Float32s(key string) ([]float32, bool) { v, _ := f.Lookup(key); return v.Float32s() }

// Int32s returns the integer array stored under key (see Value.Int32s).
func (f *File) Int32s(key string) ([]int32, bool) { v, _ := f.Lookup(key); return v.Int32s() }

// Uint32s returns the integer array stored under key (see Value.Uint32s).
func (f *File) Uint32s(key string) ([]uint32, bool) { v, _ := f.Lookup(key); return v.Uint32s() }

// Tensor returns the tensor called name.
func (f *File) Tensor(name string) (*TensorInfo, bool) {
	i, ok := f.tensorIndex[name]
	if !ok {
		return nil, false
	}
	return &f.Tensors[i], true
}

// Close releases the memory mapping made by Open (a no-op for Parse). Every
// TensorInfo.Data becomes nil; slices of it kept elsewhere must not be used
// afterwards. Close is idempotent.
func (f *File) Close() error {
	for i := range f.Tensors {
		f.Tensors[i].Data = nil
	}
	if f.unmap == nil {
		return nil
	}
	unmap := f.unmap
	f.unmap = nil
	return unmap()
}

// decoder reads little-endian values from data, never past its end.
type decoder struct {
	data []byte
	off  int
}

func (d *decoder) remain() int { return len(d.data) - d.off }

// take returns the next n bytes, or an ErrTruncated error naming what was
// being read.
func (d *decoder) take(n int, what func() string) ([]byte, error) {
	if n < 0 || n > d.remain() {
		return nil, errf(ErrTruncated, "%s: need %d bytes at offset %d, file has %d", what(), n, d.off, len(d.data))
	}
	b := d.data[d.off : d.off+n]
	d.off += n
	return b, nil
}

func (d *decoder) u32(what func() string) (uint32, error) {
	b, err := d.take(4, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (d *decoder) u64(what func() string) (uint64, error) {
	b, err := d.take(8, what)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// str reads a length-prefixed string of at most max bytes; the length is
// checked against max and the remaining bytes before anything is copied.
func (d *decoder) str(max int, what func() string) (string, error) {
	b, err := d.strBytes(max, what)
	return string(b), err
}

// strBytes is str without the copy: the bytes alias the input.
func (d *decoder) strBytes(max int, what func() string) ([]byte, error) {
	n, err := d.u64(what)
	if err != nil {
		return nil, err
	}
	if n > uint64(max) {
		return nil, errf(ErrLimit, "%s: string length %d exceeds the maximum %d", what(), n, max)
	}
	return d.take(int(n), what)
}

// Parse decodes a GGUF file held in data. The returned File's tensor Data
// slices alias data.
func Parse(data []byte) (*File, error) {
	d := &decoder{data: data}
	f := &File{Size: int64(len(data))}
	if err := f.parseHeader(d); err != nil {
		return nil, err
	}
	return f, nil
}

func fixed(s string) func() string { return func() string { return s } }

func (f *File) parseHeader(d *decoder) error {
	magic, err := d.take(4, fixed("magic"))
	if err != nil {
		return errf(ErrNotGGUF, "file of %d bytes is too short for the magic", len(d.data))
	}
	if string(magic) != Magic {
		return errf(ErrNotGGUF, "bad magic %q, want %q", magic, Magic)
	}
	f.Version, err = d.u32(fixed("version"))
	if err != nil {
		return err
	}
	switch {
	case f.Version == 1:
		return errf(ErrUnsupported, "GGUF version 1 is not supported (re-convert the model with a current llama.cpp)")
	case f.Version == 2 || f.Version == 3:
	case f.Version&0xffff == 0:
		return errf(ErrUnsupported, "GGUF version %d (0x%08x): the file looks big-endian, which is not supported", f.Version, f.Version)
	default:
		return errf(ErrUnsupported, "GGUF version %d (supported: 2, 3)", f.Version)
	}
	nTensors, err := d.u64(fixed("tensor count"))
	if err != nil {
		return err
	}
	nKV, err := d.u64(fixed("metadata count"))
	if err != nil {
		return err
	}
	if nTensors > MaxTensors {
		return errf(ErrLimit, "tensor count %d exceeds the maximum %d", nTensors, MaxTensors)
	}
	if nKV > MaxKVs {
		return errf(ErrLimit, "metadata count %d exceeds the maximum %d", nKV, MaxKVs)
	}
	// Each KV takes at least 8+0+4+1 bytes (key length, key, type, value),
	// each tensor info at least 8+1+4+8+4+8 (name length, name, n_dims,
	// one dim, type, offset): bound the counts by the bytes left before
	// sizing any slice from them.
	const minKV, minTensor = 13, 33
	if nKV > uint64(d.remain()/minKV) {
		return errf(ErrTruncated, "metadata count %d cannot fit in the %d bytes left", nKV, d.remain())
	}
	if err := f.parseKVs(d, int(nKV)); err != nil {
		return err
	}
	f.Alignment = DefaultAlignment
	if v, ok := f.Lookup("general.alignment"); ok {
		a, isU32 := v.v.(uint32)
		if !isU32 {
			return errf(ErrCorrupt, "key \"general.alignment\" must be uint32, is %s", describe(v))
		}
		if a == 0 || a&(a-1) != 0 {
			return errf(ErrCorrupt, "key \"general.alignment\" = %d is not a power of two", a)
		}
		f.Alignment = int(a)
	}
	if nTensors > uint64(d.remain()/minTensor) {
		return errf(ErrTruncated, "tensor count %d cannot fit in the %d bytes left", nTensors, d.remain())
	}
	if err := f.parseTensorInfos(d, int(nTensors)); err != nil {
		return err
	}
	// The data section starts at the next multiple of the alignment. A file
	// without tensors may end before it (vocabulary-only files do).
	start := uint64(d.off)
	if r := start % uint64(f.Alignment); r != 0 {
		start += uint64(f.Alignment) - r
	}
	f.DataOffset = int64(start)
	return f.placeTensors(d.data, start)
}

func (f *File) parseKVs(d *decoder, n int) error {
	f.KV = make([]KV, 0, n)
	f.kvIndex = make(map[string]int, n)
	for i := 0; i < n; i++ {
		key, err := d.str(MaxKeyLen, func() string { return fmt.Sprintf("metadata key %d", i) })
		if err != nil {
			return err
		}
		if key == "" {
			return errf(ErrCorrupt, "metadata key %d is empty", i)
		}
		if _, dup := f.kvIndex[key]; dup {
			return errf(ErrCorrupt, "duplicate metadata key %q", key)
		}
		what := func() string { return fmt.Sprintf("key %q", key) }
		t, err := d.u32(what)
		if err != nil {
			return err
		}
		v, err := d.value(ValueType(t), what)
		if err != nil {
			return err
		}
		f.kvIndex[key] = len(f.KV)
		f.KV = append(f.KV, KV{Key: key, Value: v})
	}
	return nil
}

// value decodes one value of type t (an array header included).
func (d *decoder) value(t ValueType, what func() string) (Value, error) {
	if t == TypeArray {
		et, err := d.u32(what)
		if err != nil {
			return Value{}, err
		}
		n, err := d.u64(what)
		if err != nil {
			return Value{}, err
		}
		return d.array(ValueType(et), n, what)
	}
	if t == TypeString {
		s, err := d.str(MaxStringLen, what)
		return Value{typ: TypeString, v: s}, err
	}
	sz := t.size()
	if sz == 0 {
		return Value{}, errf(ErrCorrupt, "%s: unknown value type %d", what(), uint32(t))
	}
	b, err := d.take(sz, what)
	if err != nil {
		return Value{}, err
	}
	v := Value{typ: t}
	switch t {
	case TypeUint8:
		v.v = b[0]
	case TypeInt8:
		v.v = int8(b[0])
	case TypeBool:
		if b[0] > 1 {
			return Value{}, errf(ErrCorrupt, "%s: bool byte is %d, want 0 or 1", what(), b[0])
		}
		v.v = b[0] == 1
	case TypeUint16:
		v.v = binary.LittleEndian.Uint16(b)
	case TypeInt16:
		v.v = int16(binary.LittleEndian.Uint16(b))
	case TypeUint32:
		v.v = binary.LittleEndian.Uint32(b)
	case TypeInt32:
		v.v = int32(binary.LittleEndian.Uint32(b))
	case TypeFloat32:
		v.v = math.Float32frombits(binary.LittleEndian.Uint32(b))
	case TypeUint64:
		v.v = binary.LittleEndian.Uint64(b)
	case TypeInt64:
		v.v = int64(binary.LittleEndian.Uint64(b))
	case TypeFloat64:
		v.v = math.Float64frombits(binary.LittleEndian.Uint64(b))
	}
	return v, nil
}

func (d *decoder) array(et ValueType, n uint64, what func() string) (Value, error) {
	if et == TypeArray {
		return Value{}, errf(ErrUnsupported, "%s: arrays of arrays are not supported", what())
	}
	if n > MaxArrayLen {
		return Value{}, errf(ErrLimit, "%s: array length %d exceeds the maximum %d", what(), n, MaxArrayLen)
	}
	if et == TypeString {
		// Each string needs at least its 8-byte length.
		if n > uint64(d.remain()/8) {
			return Value{}, errf(ErrTruncated, "%s: %d strings cannot fit in the %d bytes left", what(), n, d.remain())
		}
		// Two passes: validate every length and sum them, then copy all
		// the bytes into one string and slice it, so a 150k-token
		// vocabulary costs two allocations instead of 150k.
		start, total := d.off, 0
		for i := uint64(0); i < n; i++ {
			s, err := d.strBytes(MaxStringLen, func() string { return fmt.Sprintf("%s element %d", what(), i) })
			if err != nil {
				return Value{}, err
			}
			total += len(s)
		}
		d.off = start
		var sb strings.Builder
		sb.Grow(total)
		ends := make([]int, n)
		for i := range ends {
			s, _ := d.strBytes(MaxStringLen, what)
			sb.Write(s)
			ends[i] = sb.Len()
		}
		all := sb.String()
		out := make([]string, n)
		prev := 0
		for i, e := range ends {
			out[i] = all[prev:e]
			prev = e
		}
		return Value{typ: TypeArray, elem: et, v: out}, nil
	}
	sz := et.size()
	if sz == 0 {
		return Value{}, errf(ErrCorrupt, "%s: unknown array element type %d", what(), uint32(et))
	}
	if n > uint64(d.remain()/sz) {
		return Value{}, errf(ErrTruncated, "%s: array of %d %s needs %d bytes, %d left", what(), n, et, n*uint64(sz), d.remain())
	}
	b, _ := d.take(int(n)*sz, what)
	v := Value{typ: TypeArray, elem: et}
	switch et {
	case TypeUint8:
		v.v = slices.Clone(b)
	case TypeInt8:
		v.v = decodeArray(b, 1, func(p []byte) int8 { return int8(p[0]) })
	case TypeBool:
		out := make([]bool, n)
		for i, c := range b {
			if c > 1 {
				return Value{}, errf(ErrCorrupt, "%s element %d: bool byte is %d, want 0 or 1", what(), i, c)
			}
			out[i] = c == 1
		}
		v.v = out
	case TypeUint16:
		v.v = decodeArray(b, 2, binary.LittleEndian.Uint16)
	case TypeInt16:
		v.v = decodeArray(b, 2, func(p []byte) int16 { return int16(binary.LittleEndian.Uint16(p)) })
	case TypeUint32:
		v.v = decodeArray(b, 4, binary.LittleEndian.Uint32)
	case TypeInt32:
		v.v = decodeArray(b, 4, func(p []byte) int32 { return int32(binary.LittleEndian.Uint32(p)) })
	case TypeFloat32:
		v.v = decodeArray(b, 4, func(p []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(p)) })
	case TypeUint64:
		v.v = decodeArray(b, 8, binary.LittleEndian.Uint64)
	case TypeInt64:
		v.v = decodeArray(b, 8, func(p []byte) int64 { return int64(binary.LittleEndian.Uint64(p)) })
	case TypeFloat64:
		v.v = decodeArray(b, 8, func(p []byte) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(p)) })
	}
	return v, nil
}

func decodeArray[T any](b []byte, size int, get func([]byte) T) []T {
	out := make([]T, len(b)/size)
	for i := range out {
		out[i] = get(b[i*size:])
	}
	return out
}

func (f *File) parseTensorInfos(d *decoder, n int) error {
	f.Tensors = make([]TensorInfo, 0, n)
	f.tensorIndex = make(map[string]int, n)
	for i := 0; i < n; i++ {
		name, err := d.str(MaxTensorNameLen, func() string { return fmt.Sprintf("tensor %d name", i) })
		if err != nil {
			return err
		}
		if name == "" {
			return errf(ErrCorrupt, "tensor %d has an empty name", i)
		}
		if _, dup := f.tensorIndex[name]; dup {
			return errf(ErrCorrupt, "duplicate tensor name %q", name)
		}
		what := func() string { return fmt.Sprintf("tensor %q", name) }
		nd, err := d.u32(what)
		if err != nil {
			return err
		}
		if nd == 0 || nd > MaxDims {
			return errf(ErrCorrupt, "tensor %q has %d dimensions, want 1 to %d", name, nd, MaxDims)
		}
		dims := make([]uint64, nd)
		elems := uint64(1)
		for j := range dims {
			if dims[j], err = d.u64(what); err != nil {
				return err
			}
			hi, lo := bits.Mul64(elems, dims[j])
			if hi != 0 || lo > math.MaxInt64 || dims[j] > math.MaxInt64 {
				return errf(ErrCorrupt, "tensor %q: shape %v overflows", name, dims[:j+1])
			}
			elems = lo
		}
		t, err := d.u32(what)
		if err != nil {
			return err
		}
		typ := quant.Type(t)
		if !typ.Known() {
			return errf(ErrUnsupported, "tensor %q: unknown tensor type %d", name, t)
		}
		off, err := d.u64(what)
		if err != nil {
			return err
		}
		if dims[0]%uint64(typ.BlockSize()) != 0 {
			return errf(ErrCorrupt, "tensor %q: row length %d is not a multiple of the %s block size %d", name, dims[0], typ, typ.BlockSize())
		}
		f.tensorIndex[name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, TensorInfo{Name: name, Dims: dims, Type: typ, Offset: off})
	}
	return nil
}

// byteSize returns the tensor's size in bytes, or false on overflow.
func byteSize(t *TensorInfo) (uint64, bool) {
	blocks := t.Elements() / uint64(t.Type.BlockSize())
	hi, lo := bits.Mul64(blocks, uint64(t.Type.BlockBytes()))
	return lo, hi == 0 && lo <= math.MaxInt64
}

// placeTensors checks each tensor's data range (aligned, inside the file,
// not overlapping another) and points Data at it.
func (f *File) placeTensors(data []byte, start uint64) error {
	size := uint64(len(data))
	type span struct {
		off, end uint64
		i        int
	}
	spans := make([]span, 0, len(f.Tensors))
	for i := range f.Tensors {
		t := &f.Tensors[i]
		nb, ok := byteSize(t)
		if !ok {
			return errf(ErrCorrupt, "tensor %q: %d elements of %s overflow the byte size", t.Name, t.Elements(), t.Type)
		}
		if t.Offset%uint64(f.Alignment) != 0 {
			return errf(ErrCorrupt, "tensor %q: data offset %d is not a multiple of the alignment %d", t.Name, t.Offset, f.Alignment)
		}
		abs := start + t.Offset
		end := abs + nb
		if abs < start || end < abs || end > size {
			return errf(ErrTruncated, "tensor %q: data [offset %d, %d bytes) runs past end of file (%d bytes)", t.Name, t.Offset, nb, size)
		}
		t.Data = data[abs:end:end]
		if nb > 0 {
			spans = append(spans, span{abs, end, i})
		}
	}
	slices.SortFunc(spans, func(a, b span) int {
		switch {
		case a.off < b.off:
			return -1
		case a.off > b.off:
			return 1
		}
		return 0
	})
	for k := 1; k < len(spans); k++ {
		if spans[k].off < spans[k-1].end {
			a, b := &f.Tensors[spans[k-1].i], &f.Tensors[spans[k].i]
			return errf(ErrCorrupt, "tensors %q [offset %d, %d bytes) and %q [offset %d) overlap",
				a.Name, a.Offset, spans[k-1].end-spans[k-1].off, b.Name, b.Offset)
		}
	}
	return nil
}
