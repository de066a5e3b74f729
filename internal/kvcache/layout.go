package kvcache

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DType is the element type of the K/V arenas.
type DType uint8

const (
	F32 DType = iota // float32 elements; the zero value
	F16              // IEEE half elements stored as uint16
)

func (d DType) String() string {
	switch d {
	case F32:
		return "f32"
	case F16:
		return "f16"
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Size is the number of bytes of one element, 0 for an unknown type.
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16:
		return 2
	}
	return 0
}

// DefaultPageSize is the page size, in token positions, used when a
// Layout leaves PageSize at zero.
const DefaultPageSize = 16

// Limits on layout dimensions. They are far above any real model and keep
// every size computation well inside int64.
const (
	maxLayers   = 1 << 12
	maxKVDim    = 1 << 16
	maxPageSize = 1 << 12
	maxPages    = 1<<31 - 1 // PageID is a uint32 and 0 is never a page
)

// Layout is the shape of the KV memory: it must match the model that
// writes it.
type Layout struct {
	Layers   int
	KVHeads  int
	HeadDim  int
	PageSize int // token positions per page; 0 means DefaultPageSize
	DType    DType
}

// ErrLayout reports a Layout or Config that cannot describe a pool.
var ErrLayout = errors.New("kvcache: invalid layout")

func (l Layout) withDefaults() Layout {
	if l.PageSize == 0 {
		l.PageSize = DefaultPageSize
	}
	return l
}

// KVDim is the number of K (or V) elements of one token position in one
// layer: KVHeads*HeadDim.
func (l Layout) KVDim() int { return l.KVHeads * l.HeadDim }

// PageBytes is the memory of one page: K and V, all layers. It is 0 for a
// layout that does not validate.
func (l Layout) PageBytes() int64 {
	l = l.withDefaults()
	if l.Validate() != nil {
		return 0
	}
	return 2 * int64(l.Layers) * int64(l.PageSize) * int64(l.KVDim()) * int64(l.DType.Size())
}

// Validate reports whether the layout can describe a pool. A zero PageSize
// is accepted (it means DefaultPageSize).
func (l Layout) Validate() error {
	l = l.withDefaults()
	switch {
	case l.Layers < 1 || l.Layers > maxLayers:
		return fmt.Errorf("%w: %d layers (want 1..%d)", ErrLayout, l.Layers, maxLayers)
	case l.KVHeads < 1 || l.HeadDim < 1 || l.KVHeads > maxKVDim || l.HeadDim > maxKVDim || l.KVDim() > maxKVDim:
		return fmt.Errorf("%w: %d KV heads of dimension %d (want a KV dimension of 1..%d)", ErrLayout, l.KVHeads, l.HeadDim, maxKVDim)
	case l.PageSize < 1 || l.PageSize > maxPageSize:
		return fmt.Errorf("%w: page size %d (want 1..%d)", ErrLayout, l.PageSize, maxPageSize)
	case l.DType.Size() == 0:
		return fmt.Errorf("%w: dtype %v", ErrLayout, l.DType)
	}
	return nil
}

// PagesForMemory is how many whole pages of layout l fit in bytes of
// memory; 0 when the layout is invalid or bytes is too small. It never
// exceeds the largest pool a PageID can address.
func PagesForMemory(l Layout, bytes int64) int {
	pb := l.PageBytes()
	if pb <= 0 || bytes <= 0 {
		return 0
	}
	return int(min(bytes/pb, maxPages))
}

// FormatBytes writes a memory size in GiB, with enough digits for the
// small pools of tests.
func FormatBytes(b int64) string {
	g := float64(b) / (1 << 30)
	if g >= 10 {
		return fmt.Sprintf("%.1f GiB", g)
	}
	return fmt.Sprintf("%.3g GiB", g)
}

// ErrBytes reports a memory size that ParseBytes cannot read.
var ErrBytes = errors.New("kvcache: invalid memory size")

var byteUnits = map[string]float64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "tib": 1 << 40, "tb": 1e12,
}

// ParseBytes reads a memory size such as "512MiB", "1.5GiB", "800MB" or
// "1048576" (the --kv-memory flag). Units are case-insensitive: KiB/MiB/GiB/
// TiB and the bare K/M/G/T are powers of 1024, KB/MB/GB/TB powers of 1000.
// The result is a whole number of bytes, at least 0 and at most MaxInt64.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := byteUnits[unit]
	if num == "" || !ok || len(s) > 64 {
		return 0, fmt.Errorf("%w: %q (want a number with an optional unit such as MiB or GB)", ErrBytes, s)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 63)
		if err == nil && (mult == 1 || n <= uint64(math.MaxInt64/int64(mult))) {
			return int64(n) * int64(mult), nil
		}
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, fmt.Errorf("%w: %q", ErrBytes, s)
		}
		return 0, fmt.Errorf("%w: %q is too large", ErrBytes, s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrBytes, s)
	}
	v := math.Floor(f * mult)
	// 2^63 is the first float64 above MaxInt64.
	if math.IsNaN(v) || v >= 1<<63 {
		return 0, fmt.Errorf("%w: %q is too large", ErrBytes, s)
	}
	return int64(v), nil
}
