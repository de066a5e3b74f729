package transfer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"math"

	"github.com/pagewarden/pagewarden/internal/request"
)

// Frame limits, declared up front (STYLE: every decoder of outside bytes
// is bounded). A decoder checks each length against them and against the
// bytes remaining before it allocates anything.
const (
	HeaderSize  = 12 // magic, version, type, flags, body length
	TrailerSize = 4  // CRC-32C
	// MaxNameLen bounds tenant and node names.
	MaxNameLen = 255
	// MaxPageBytes bounds one page's payload.
	MaxPageBytes = 32 << 20
	// MaxPages bounds the pages of one handoff (a manifest's lists).
	MaxPages = 1 << 18
	// MaxFrameBody bounds a frame's body: a full page plus its header
	// fields. The largest manifest (MaxPages × 36 bytes) is below it.
	MaxFrameBody = MaxPageBytes + 4096

	frameMagic = 0x50575846 // "PWXF"
	maxInt32   = math.MaxInt32
)

// Errors of the codec.
var (
	// ErrFrame: the bytes are not a well-formed frame (or a message cannot
	// be framed). The link that carried them is not to be trusted.
	ErrFrame = errors.New("transfer: malformed frame")
	// ErrVersion: a well-formed header of another protocol version.
	ErrVersion = errors.New("transfer: unsupported protocol version")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is a frame's fixed-size prefix.
type Header struct {
	Version uint16
	Type    MsgType
	BodyLen int
}

// FrameLen is the length of the whole frame the header starts.
func (h Header) FrameLen() int { return HeaderSize + h.BodyLen + TrailerSize }

// ParseHeader reads and checks the first HeaderSize bytes of a frame, so
// that a stream transport knows how much more to read (at most
// MaxFrameBody+TrailerSize) before it allocates for the body.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: %d-byte header (want %d)", ErrFrame, len(b), HeaderSize)
	}
	if m := binary.BigEndian.Uint32(b); m != frameMagic {
		return Header{}, fmt.Errorf("%w: magic %#08x", ErrFrame, m)
	}
	h := Header{
		Version: binary.BigEndian.Uint16(b[4:]),
		Type:    MsgType(b[6]),
		BodyLen: int(binary.BigEndian.Uint32(b[8:])),
	}
	switch {
	case h.Version != ProtocolVersion:
		return h, fmt.Errorf("%w: %d (this node speaks %d)", ErrVersion, h.Version, ProtocolVersion)
	case h.Type < MsgHello || h.Type >= numMsgTypes:
		return h, fmt.Errorf("%w: message type %d", ErrFrame, b[6])
	case b[7] != 0:
		return h, fmt.Errorf("%w: flags %#02x", ErrFrame, b[7])
	case h.BodyLen > MaxFrameBody:
		return h, fmt.Errorf("%w: %d-byte body (limit %d)", ErrFrame, h.BodyLen, MaxFrameBody)
	}
	return h, nil
}

// DecodeFrame decodes exactly one whole frame. It never panics and never
// allocates more than the frame's own length (a Page's Data aliases
// frame). Any trailing byte, unknown flag, out-of-range value or checksum
// mismatch is an ErrFrame.
func DecodeFrame(frame []byte) (Message, error) {
	h, err := ParseHeader(frame)
	if err != nil {
		return nil, err
	}
	if len(frame) != h.FrameLen() {
		return nil, fmt.Errorf("%w: %d bytes for a %d-byte frame", ErrFrame, len(frame), h.FrameLen())
	}
	end := HeaderSize + h.BodyLen
	if got, want := crc32.Checksum(frame[:end], castagnoli), binary.BigEndian.Uint32(frame[end:]); got != want {
		return nil, fmt.Errorf("%w: checksum %#08x, frame says %#08x", ErrFrame, got, want)
	}
	d := &decoder{b: frame[HeaderSize:end]}
	var m Message
	switch h.Type {
	case MsgHello:
		m = d.hello()
	case MsgReserve:
		m = d.reserve()
	case MsgGrant:
		g := d.grant()
		m = &g
	case MsgPage:
		m = &Page{Ref: d.ref(), Index: d.int32("page index", MaxPages-1), Filled: d.int32("filled", maxInt32), Data: d.bytes("page data", MaxPageBytes)}
	case MsgManifest:
		m = d.manifest()
	case MsgCommit:
		m = &Commit{d.ref()}
	case MsgCommitted:
		m = &Committed{d.ref()}
	case MsgAbort:
		m = &Abort{Ref: d.ref(), Reason: Reason(d.u16())}
	case MsgAbortAck:
		m = &AbortAck{Ref: d.ref(), Drained: d.bool("drained")}
	case MsgHeartbeat:
		m = &Heartbeat{d.ref()}
	default:
		var ok bool
		if m, ok = d.loadPlane(h.Type); !ok {
			m = d.requestPlane(h.Type)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d trailing bytes in a %v body", len(d.b), h.Type)
	}
	if d.err != nil {
		return nil, d.err
	}
	return m, nil
}

// AppendFrame appends m's frame to dst. It refuses (ErrFrame) a message
// that DecodeFrame would refuse, so that every frame it makes decodes to a
// message equal to m.
func AppendFrame(dst []byte, m Message) ([]byte, error) {
	if m == nil {
		return dst, fmt.Errorf("%w: nil message", ErrFrame)
	}
	start := len(dst)
	dst = binary.BigEndian.AppendUint32(dst, frameMagic)
	dst = binary.BigEndian.AppendUint16(dst, ProtocolVersion)
	dst = append(dst, byte(m.Type()), 0, 0, 0, 0, 0)
	e := &encoder{b: dst}
	switch m := m.(type) {
	case *Hello:
		e.str("node", string(m.Node))
		e.u8(uint8(m.Role))
		e.layout(m.Layout)
		e.raw(m.Hash[:])
		e.int32("max context", m.Limits.MaxContext, maxInt32)
		e.int32("max prompt tokens", m.Limits.MaxPromptTokens, maxInt32)
		e.int32("page size", m.Limits.PageSize, maxInt32)
		e.int64("page bytes", int64(m.Limits.PageBytes))
	case *Reserve:
		e.reserveBody(m)
	case *Grant:
		e.grantBody(m)
	case *Page:
		e.ref(m.Ref)
		e.int32("page index", m.Index, MaxPages-1)
		e.int32("filled", m.Filled, maxInt32)
		e.bytes("page data", m.Data, MaxPageBytes)
	case *Manifest:
		e.manifest(m)
	case *Commit:
		e.ref(m.Ref)
	case *Committed:
		e.ref(m.Ref)
	case *Abort:
		e.ref(m.Ref)
		e.u16(uint16(m.Reason))
	case *AbortAck:
		e.ref(m.Ref)
		if m.Drained {
			e.u8(1)
		} else {
			e.u8(0)
		}
	case *Heartbeat:
		e.ref(m.Ref)
	default:
		if !e.loadPlane(m) && !e.requestPlane(m) {
			return dst[:start], fmt.Errorf("%w: unknown message %T", ErrFrame, m)
		}
	}
	if e.err != nil {
		return dst[:start], e.err
	}
	body := len(e.b) - start - HeaderSize
	if body > MaxFrameBody {
		return dst[:start], fmt.Errorf("%w: %d-byte body (limit %d)", ErrFrame, body, MaxFrameBody)
	}
	binary.BigEndian.PutUint32(e.b[start+8:], uint32(body))
	return binary.BigEndian.AppendUint32(e.b, crc32.Checksum(e.b[start:], castagnoli)), nil
}

// EncodeFrame returns m's frame.
func EncodeFrame(m Message) ([]byte, error) { return AppendFrame(nil, m) }

// encoder appends fields, remembering the first error.
type encoder struct {
	b   []byte
	err error
}

func (e *encoder) fail(format string, args ...any) {
	if e.err == nil {
		e.err = fmt.Errorf("%w: "+format, append([]any{ErrFrame}, args...)...)
	}
}

func (e *encoder) u8(v uint8)      { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16)    { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32)    { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64)    { e.b = binary.BigEndian.AppendUint64(e.b, v) }
func (e *encoder) raw(v []byte)    { e.b = append(e.b, v...) }
func (e *encoder) id(v [16]byte)   { e.b = append(e.b, v[:]...) }
func (e *encoder) digest(v []byte) { e.b = append(e.b, v...) }

func (e *encoder) int32(field string, v, limit int) {
	if v < 0 || v > limit {
		e.fail("%s %d out of range 0..%d", field, v, limit)
		return
	}
	e.u32(uint32(v))
}

func (e *encoder) int64(field string, v int64) {
	if v < 0 {
		e.fail("%s %d is negative", field, v)
		return
	}
	e.u64(uint64(v))
}

func (e *encoder) bytes(field string, v []byte, limit int) {
	if len(v) > limit {
		e.fail("%s of %d bytes (limit %d)", field, len(v), limit)
		return
	}
	e.u32(uint32(len(v)))
	e.raw(v)
}

func (e *encoder) str(field, v string) {
	if len(v) > MaxNameLen {
		e.fail("%s of %d bytes (limit %d)", field, len(v), MaxNameLen)
		return
	}
	e.u8(uint8(len(v)))
	e.b = append(e.b, v...)
}

func (e *encoder) owner(o request.Owner) {
	e.str("tenant", string(o.Tenant))
	e.id(o.ID)
}

func (e *encoder) ref(r Ref) {
	e.u64(r.ID.Incarnation)
	e.u64(r.ID.Seq)
	e.owner(r.Owner)
	e.u64(r.Epoch)
}

func (e *encoder) layout(l Layout) {
	e.raw(l.ModelDigest[:])
	e.u8(uint8(l.DType))
	e.int32("page size", l.PageSize, maxInt32)
	e.int32("layers", l.Layers, maxInt32)
	e.int32("KV heads", l.KVHeads, maxInt32)
	e.int32("head dim", l.HeadDim, maxInt32)
	e.int32("window", l.MaxContext, maxInt32)
	e.u16(l.Protocol)
}

func (e *encoder) manifest(m *Manifest) {
	e.ref(m.Ref)
	e.raw(m.Layout[:])
	e.int32("page count", m.PageCount, MaxPages)
	e.int32("total tokens", m.TotalTokens, maxInt32)
	e.int32("first token", m.FirstToken, maxInt32)
	if len(m.Filled) != m.PageCount || len(m.PageDigests) != m.PageCount {
		e.fail("manifest of %d pages with %d filled counts and %d digests", m.PageCount, len(m.Filled), len(m.PageDigests))
		return
	}
	for _, f := range m.Filled {
		e.int32("filled", f, maxInt32)
	}
	for i := range m.PageDigests {
		e.digest(m.PageDigests[i][:])
	}
	e.optLogprobs("first token logprobs", m.FirstLogprobs)
	e.promptLogprobs("prompt logprobs", m.PromptLogprobs)
}

// decoder reads fields from a body, checking every length against what
// remains; after the first error every read returns zero.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrFrame}, args...)...)
	}
	d.b = nil
}

// take returns the next n bytes, or nil after an error or when fewer
// remain.
func (d *decoder) take(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > len(d.b) {
		d.fail("%s needs %d bytes, %d remain", what, n, len(d.b))
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u8() uint8 {
	if b := d.take(1, "uint8"); b != nil {
		return b[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.take(2, "uint16"); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if b := d.take(4, "uint32"); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if b := d.take(8, "uint64"); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) int32(field string, limit int) int {
	v := d.u32()
	if int64(v) > int64(limit) {
		d.fail("%s %d out of range 0..%d", field, v, limit)
		return 0
	}
	return int(v)
}

func (d *decoder) int64(field string) int64 {
	v := d.u64()
	if v > math.MaxInt64 {
		d.fail("%s %d out of range", field, v)
		return 0
	}
	return int64(v)
}

func (d *decoder) bool(field string) bool {
	switch v := d.u8(); v {
	case 0:
		return false
	case 1:
		return true
	default:
		d.fail("%s is %d (want 0 or 1)", field, v)
		return false
	}
}

// bytes returns a length-prefixed byte string, aliasing the body; nil
// when empty.
func (d *decoder) bytes(field string, limit int) []byte {
	n := d.u32()
	if int64(n) > int64(limit) {
		d.fail("%s of %d bytes (limit %d)", field, n, limit)
		return nil
	}
	if n == 0 {
		return nil
	}
	return d.take(int(n), field)
}

func (d *decoder) str(field string) string {
	n := int(d.u8()) // at most MaxNameLen by construction
	return string(d.take(n, field))
}

func (d *decoder) array32(what string) (v [32]byte) {
	copy(v[:], d.take(32, what))
	return v
}

func (d *decoder) owner() request.Owner {
	o := request.Owner{Tenant: request.Tenant(d.str("tenant"))}
	copy(o.ID[:], d.take(16, "request id"))
	return o
}

func (d *decoder) ref() Ref {
	var r Ref
	r.ID.Incarnation = d.u64()
	r.ID.Seq = d.u64()
	r.Owner = d.owner()
	r.Epoch = d.u64()
	return r
}

func (d *decoder) layout() Layout {
	var l Layout
	l.ModelDigest = d.array32("model digest")
	l.DType = kvDType(d.u8())
	l.PageSize = d.int32("page size", maxInt32)
	l.Layers = d.int32("layers", maxInt32)
	l.KVHeads = d.int32("KV heads", maxInt32)
	l.HeadDim = d.int32("head dim", maxInt32)
	l.MaxContext = d.int32("window", maxInt32)
	l.Protocol = d.u16()
	return l
}

func (d *decoder) hello() *Hello {
	h := &Hello{Node: Peer(d.str("node")), Role: Role(d.u8())}
	h.Layout = d.layout()
	h.Hash = d.array32("layout hash")
	h.Limits.MaxContext = d.int32("max context", maxInt32)
	h.Limits.MaxPromptTokens = d.int32("max prompt tokens", maxInt32)
	h.Limits.PageSize = d.int32("page size", maxInt32)
	h.Limits.PageBytes = d.int64("page bytes")
	return h
}

func (d *decoder) reserve() *Reserve {
	r := &Reserve{Owner: d.owner(), Epoch: d.u64()}
	r.PromptTokens = d.int32("prompt tokens", maxInt32)
	r.MaxNewTokens = d.int32("max new tokens", maxInt32)
	r.Sender = Peer(d.str("sender"))
	return r
}

func (d *decoder) manifest() *Manifest {
	m := &Manifest{Ref: d.ref()}
	m.Layout = d.array32("layout hash")
	m.PageCount = d.int32("page count", MaxPages)
	m.TotalTokens = d.int32("total tokens", maxInt32)
	m.FirstToken = d.int32("first token", maxInt32)
	if d.err != nil {
		return m
	}
	if m.PageCount == 0 {
		m.FirstLogprobs = d.optLogprobs("first token logprobs")
		m.PromptLogprobs = d.promptLogprobs("prompt logprobs")
		return m
	}
	// Check the lists fit before allocating them.
	if need := m.PageCount * (4 + 32); need > len(d.b) {
		d.fail("manifest of %d pages needs %d bytes, %d remain", m.PageCount, need, len(d.b))
		return m
	}
	m.Filled = make([]int, m.PageCount)
	for i := range m.Filled {
		m.Filled[i] = d.int32("filled", maxInt32)
	}
	m.PageDigests = make([][32]byte, m.PageCount)
	for i := range m.PageDigests {
		m.PageDigests[i] = d.array32("page digest")
	}
	m.FirstLogprobs = d.optLogprobs("first token logprobs")
	m.PromptLogprobs = d.promptLogprobs("prompt logprobs")
	return m
}
