package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/pagewarden/pagewarden/internal/quant"
)

// Writer builds a GGUF v3 file: metadata in insertion order, then tensor
// infos and data in insertion order, each tensor's data padded to the
// alignment (general.alignment if set, else 32). The zero Writer is not
// usable; call NewWriter.
type Writer struct {
	kv          []KV
	kvIndex     map[string]int
	tensors     []TensorInfo
	tensorIndex map[string]int
	alignment   int
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer {
	return &Writer{kvIndex: map[string]int{}, tensorIndex: map[string]int{}, alignment: DefaultAlignment}
}

// SetKV sets key to v (see NewValue for the accepted Go types). Setting a
// key again replaces its value in place. general.alignment must be a uint32
// power of two; it sets the alignment of the tensor data.
func (w *Writer) SetKV(key string, v any) error {
	if key == "" {
		return errors.New("gguf: empty metadata key")
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("gguf: metadata key of %d bytes exceeds the maximum %d", len(key), MaxKeyLen)
	}
	val, err := NewValue(v)
	if err != nil {
		return fmt.Errorf("gguf: key %q: %w", key, err)
	}
	if err := checkWritable(key, val); err != nil {
		return err
	}
	if key == "general.alignment" {
		a, ok := val.v.(uint32)
		if !ok || a == 0 || a&(a-1) != 0 {
			return fmt.Errorf("gguf: general.alignment must be a uint32 power of two, got %s %v", describe(val), val)
		}
		w.alignment = int(a)
	}
	if i, ok := w.kvIndex[key]; ok {
		w.kv[i].Value = val
		return nil
	}
	w.kvIndex[key] = len(w.kv)
	w.kv = append(w.kv, KV{Key: key, Value: val})
	return nil
}

// checkWritable refuses values the reader would refuse, so a Writer never
// produces a file Parse rejects.
func checkWritable(key string, v Value) error {
	if s, ok := v.Str(); ok && len(s) > MaxStringLen {
		return fmt.Errorf("gguf: key %q: string of %d bytes exceeds the maximum %d", key, len(s), MaxStringLen)
	}
	if v.typ == TypeArray {
		if v.Len() > MaxArrayLen {
			return fmt.Errorf("gguf: key %q: array of %d elements exceeds the maximum %d", key, v.Len(), MaxArrayLen)
		}
		if ss, ok := v.Strings(); ok {
			for i, s := range ss {
				if len(s) > MaxStringLen {
					return fmt.Errorf("gguf: key %q element %d: string of %d bytes exceeds the maximum %d", key, i, len(s), MaxStringLen)
				}
			}
		}
	}
	return nil
}

// AddTensor appends a tensor. dims are in GGML order (dims[0] is the row
// length); data must hold exactly the tensor's bytes and must not be
// modified until WriteTo returns (it is not copied).
func (w *Writer) AddTensor(name string, t quant.Type, dims []uint64, data []byte) error {
	if name == "" || len(name) > MaxTensorNameLen {
		return fmt.Errorf("gguf: tensor name %q must be 1 to %d bytes", name, MaxTensorNameLen)
	}
	if _, dup := w.tensorIndex[name]; dup {
		return fmt.Errorf("gguf: duplicate tensor %q", name)
	}
	if !t.Known() {
		return fmt.Errorf("gguf: tensor %q: unknown tensor type %d", name, uint32(t))
	}
	if len(dims) == 0 || len(dims) > MaxDims {
		return fmt.Errorf("gguf: tensor %q has %d dimensions, want 1 to %d", name, len(dims), MaxDims)
	}
	info := TensorInfo{Name: name, Dims: append([]uint64(nil), dims...), Type: t, Data: data}
	elems := uint64(1)
	for _, d := range dims {
		if d > math.MaxInt64 || (d != 0 && elems > math.MaxInt64/d) {
			return fmt.Errorf("gguf: tensor %q: shape %v overflows", name, dims)
		}
		elems *= d
	}
	if dims[0]%uint64(t.BlockSize()) != 0 {
		return fmt.Errorf("gguf: tensor %q: row length %d is not a multiple of the %s block size %d", name, dims[0], t, t.BlockSize())
	}
	nb, ok := byteSize(&info)
	if !ok || nb != uint64(len(data)) {
		return fmt.Errorf("gguf: tensor %q: %s %v needs %d bytes, got %d", name, t, dims, nb, len(data))
	}
	w.tensorIndex[name] = len(w.tensors)
	w.tensors = append(w.tensors, info)
	return nil
}

// countingWriter counts bytes for WriteTo's result and the padding.
type countingWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countingWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}

// WriteTo writes the file to out.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	// cw counts what reaches out (WriteTo's result); the encoder tracks
	// its own position for padding.
	cw := &countingWriter{w: out}
	bw := bufio.NewWriterSize(cw, 1<<16)
	e := encoder{w: bw}
	e.bytes([]byte(Magic))
	e.u32(3)
	e.u64(uint64(len(w.tensors)))
	e.u64(uint64(len(w.kv)))
	for _, kv := range w.kv {
		e.str(kv.Key)
		e.u32(uint32(kv.Value.typ))
		e.value(kv.Value)
	}
	var off uint64
	for _, t := range w.tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, d := range t.Dims {
			e.u64(d)
		}
		e.u32(uint32(t.Type))
		e.u64(off)
		off += pad(uint64(len(t.Data)), w.alignment)
	}
	e.zeros(int(pad(uint64(e.n()), w.alignment)) - int(e.n()))
	for _, t := range w.tensors {
		e.bytes(t.Data)
		e.zeros(int(pad(uint64(len(t.Data)), w.alignment)) - len(t.Data))
	}
	if e.err != nil {
		return cw.n, e.err
	}
	if err := bw.Flush(); err != nil {
		return cw.n, err
	}
	return cw.n, nil
}

func pad(n uint64, align int) uint64 {
	a := uint64(align)
	return (n + a - 1) / a * a
}

type encoder struct {
	w   *bufio.Writer
	pos int64
	err error
	buf [8]byte
}

func (e *encoder) n() int64 { return e.pos }

func (e *encoder) bytes(b []byte) {
	if e.err != nil {
		return
	}
	n, err := e.w.Write(b)
	e.pos += int64(n)
	e.err = err
}
func (e *encoder) u8(v uint8)   { e.buf[0] = v; e.bytes(e.buf[:1]) }
func (e *encoder) u16(v uint16) { binary.LittleEndian.PutUint16(e.buf[:], v); e.bytes(e.buf[:2]) }
func (e *encoder) u32(v uint32) { binary.LittleEndian.PutUint32(e.buf[:], v); e.bytes(e.buf[:4]) }
func (e *encoder) u64(v uint64) { binary.LittleEndian.PutUint64(e.buf[:], v); e.bytes(e.buf[:8]) }
func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	if e.err == nil {
		n, err := e.w.WriteString(s)
		e.pos += int64(n)
		e.err = err
	}
}

var zeroPad [256]byte

func (e *encoder) zeros(n int) {
	for n > 0 {
		k := min(n, len(zeroPad))
		e.bytes(zeroPad[:k])
		n -= k
	}
}

func (e *encoder) value(v Value) {
	switch x := v.v.(type) {
	case uint8:
		e.u8(x)
	case int8:
		e.u8(uint8(x))
	case bool:
		e.u8(b2u(x))
	case uint16:
		e.u16(x)
	case int16:
		e.u16(uint16(x))
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	case string:
		e.str(x)
	default:
		e.u32(uint32(v.elem))
		e.u64(uint64(v.Len()))
		switch a := x.(type) {
		case []uint8:
			e.bytes(a)
		case []int8:
			for _, y := range a {
				e.u8(uint8(y))
			}
		case []bool:
			for _, y := range a {
				e.u8(b2u(y))
			}
		case []uint16:
			for _, y := range a {
				e.u16(y)
			}
		case []int16:
			for _, y := range a {
				e.u16(uint16(y))
			}
		case []uint32:
			for _, y := range a {
				e.u32(y)
			}
		case []int32:
			for _, y := range a {
				e.u32(uint32(y))
			}
		case []float32:
			for _, y := range a {
				e.u32(math.Float32bits(y))
			}
		case []uint64:
			for _, y := range a {
				e.u64(y)
			}
		case []int64:
			for _, y := range a {
				e.u64(uint64(y))
			}
		case []float64:
			for _, y := range a {
				e.u64(math.Float64bits(y))
			}
		case []string:
			for _, y := range a {
				e.str(y)
			}
		}
	}
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}
