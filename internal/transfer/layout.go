package transfer

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// ProtocolVersion is the version of the handoff protocol and of its frame
// format. It is part of every LayoutHash and every frame header.
const ProtocolVersion uint16 = 4 // 2: the load plane (LoadQuery, Load); 3: logprobs and teacher forcing (logprobs.go); 4: prompt logprobs (a job's flags, the manifest's and the first Tokens' lists)

// Bounds on layout dimensions, as in kvcache: far above any real model,
// and they keep every size computation inside int64.
const (
	maxLayers     = 1 << 12
	maxKVDim      = 1 << 16
	maxPageSize   = 1 << 12
	maxMaxContext = 1 << 30
)

// ErrLayout reports a Layout that cannot describe a KV handoff.
var ErrLayout = errors.New("transfer: invalid layout")

// Layout is everything that must be equal on both ends of a handoff for a
// page written by one node to mean the same thing on the other: the model
// (by digest), the KV element type, the page and head shapes, the context
// window and the protocol version.
type Layout struct {
	ModelDigest [32]byte
	DType       kvcache.DType
	PageSize    int // token positions per page
	Layers      int
	KVHeads     int
	HeadDim     int
	MaxContext  int // the advertised window W (I5)
	// Protocol is the handoff protocol version; 0 means ProtocolVersion.
	Protocol uint16
}

// LayoutOf is the Layout of a node whose pool has layout kv, serving the
// model with digest modelDigest under the window maxContext.
func LayoutOf(kv kvcache.Layout, modelDigest [32]byte, maxContext int) Layout {
	ps := kv.PageSize
	if ps == 0 {
		ps = kvcache.DefaultPageSize
	}
	return Layout{
		ModelDigest: modelDigest,
		DType:       kv.DType,
		PageSize:    ps,
		Layers:      kv.Layers,
		KVHeads:     kv.KVHeads,
		HeadDim:     kv.HeadDim,
		MaxContext:  maxContext,
		Protocol:    ProtocolVersion,
	}
}

func (l Layout) withDefaults() Layout {
	if l.Protocol == 0 {
		l.Protocol = ProtocolVersion
	}
	return l
}

// Validate reports whether l can describe a handoff.
func (l Layout) Validate() error {
	switch {
	case l.Layers < 1 || l.Layers > maxLayers:
		return fmt.Errorf("%w: %d layers (want 1..%d)", ErrLayout, l.Layers, maxLayers)
	case l.KVHeads < 1 || l.HeadDim < 1 || l.KVHeads > maxKVDim || l.HeadDim > maxKVDim || l.KVHeads*l.HeadDim > maxKVDim:
		return fmt.Errorf("%w: %d KV heads of dimension %d", ErrLayout, l.KVHeads, l.HeadDim)
	case l.PageSize < 1 || l.PageSize > maxPageSize:
		return fmt.Errorf("%w: page size %d (want 1..%d)", ErrLayout, l.PageSize, maxPageSize)
	case l.DType.Size() == 0:
		return fmt.Errorf("%w: dtype %v", ErrLayout, l.DType)
	case l.MaxContext < 2 || l.MaxContext > maxMaxContext:
		return fmt.Errorf("%w: window %d (want 2..%d)", ErrLayout, l.MaxContext, maxMaxContext)
	case l.PageBytes() > MaxPageBytes:
		return fmt.Errorf("%w: pages of %d bytes exceed the frame limit of %d", ErrLayout, l.PageBytes(), MaxPageBytes)
	case pagesFor(l.MaxContext, l.PageSize) > MaxPages:
		return fmt.Errorf("%w: a window of %d positions takes more than %d pages", ErrLayout, l.MaxContext, MaxPages)
	}
	return nil
}

// PageBytes is the size of one page's K and V over all layers, the most a
// page frame carries.
func (l Layout) PageBytes() int64 {
	return 2 * int64(l.Layers) * int64(l.PageSize) * int64(l.KVHeads) * int64(l.HeadDim) * int64(l.DType.Size())
}

// LayoutHash identifies a Layout: SHA-256 over its fields, typed and
// length-prefixed (see Hash).
type LayoutHash [32]byte

func (h LayoutHash) String() string { return hex.EncodeToString(h[:8]) }

// NewLayoutHash returns l.Hash().
func NewLayoutHash(l Layout) LayoutHash { return l.Hash() }

// Hash framing. Every field is tag:uint8 length:uint64be bytes, integers
// are int64be, and the domain string comes first, so no two layouts (and
// no other pagewarden hash) frame to the same bytes:
//
//	hash := SHA-256( field(0, domain) field(1, model digest) field(2, dtype:uint8)
//	                 field(3, page size) field(4, layers) field(5, KV heads)
//	                 field(6, head dim) field(7, window) field(8, protocol:uint16be) )
const layoutDomain = "pagewarden/transfer/layout/v1"

const (
	lfDomain = iota
	lfModel
	lfDType
	lfPageSize
	lfLayers
	lfKVHeads
	lfHeadDim
	lfWindow
	lfProtocol
)

func appendHashField(b []byte, tag byte, v []byte) []byte {
	b = append(b, tag)
	b = binary.BigEndian.AppendUint64(b, uint64(len(v)))
	return append(b, v...)
}

func appendHashInt(b []byte, tag byte, v int64) []byte {
	return appendHashField(b, tag, binary.BigEndian.AppendUint64(nil, uint64(v)))
}

// Hash is the layout's identity. Two nodes may exchange pages only when
// their hashes are equal.
func (l Layout) Hash() LayoutHash {
	l = l.withDefaults()
	b := make([]byte, 0, 256)
	b = appendHashField(b, lfDomain, []byte(layoutDomain))
	b = appendHashField(b, lfModel, l.ModelDigest[:])
	b = appendHashField(b, lfDType, []byte{byte(l.DType)})
	b = appendHashInt(b, lfPageSize, int64(l.PageSize))
	b = appendHashInt(b, lfLayers, int64(l.Layers))
	b = appendHashInt(b, lfKVHeads, int64(l.KVHeads))
	b = appendHashInt(b, lfHeadDim, int64(l.HeadDim))
	b = appendHashInt(b, lfWindow, int64(l.MaxContext))
	b = appendHashField(b, lfProtocol, binary.BigEndian.AppendUint16(nil, l.Protocol))
	return sha256.Sum256(b)
}

// PageDigest is the content digest of one page of a handoff: SHA-256 over
// the domain, the page's logical index, how many positions it holds and
// its bytes, each length-prefixed. The index is inside the digest, so two
// pages whose bytes were swapped in transit do not match the manifest even
// though both digests appear in it.
func PageDigest(index, filled int, data []byte) [32]byte {
	h := sha256.New()
	var b [128]byte
	p := appendHashField(b[:0], 0, []byte(pageDomain))
	p = appendHashInt(p, 1, int64(index))
	p = appendHashInt(p, 2, int64(filled))
	p = append(p, 3)
	p = binary.BigEndian.AppendUint64(p, uint64(len(data)))
	h.Write(p)
	h.Write(data)
	var d [32]byte
	h.Sum(d[:0])
	return d
}

const pageDomain = "pagewarden/transfer/page/v1"

func kvDType(v uint8) kvcache.DType { return kvcache.DType(v) }
