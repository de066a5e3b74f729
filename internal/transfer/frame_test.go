package transfer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/pagewarden/pagewarden/internal/request"
)

var equateEmpty = cmpopts.EquateEmpty()

func sampleRef() Ref {
	return Ref{ID: ReservationID{Incarnation: 0xfeedface, Seq: 9}, Owner: owner("org_a", 3), Epoch: 2}
}

// sampleMessages holds one message of every type, with every field set.
func sampleMessages() []Message {
	h := NewHello("prefill-1", RolePrefill, testLayout())
	d := [][32]byte{PageDigest(0, 16, pageBytes(1, 0, 16)), PageDigest(1, 3, pageBytes(1, 1, 3))}
	return []Message{
		&h,
		&Reserve{Owner: owner("org_b", 4), Epoch: 1, PromptTokens: 19, MaxNewTokens: 30, Sender: "prefill-1"},
		&Grant{Ref: sampleRef(), PageCount: 2, PromptTokens: 19, MaxNewTokens: 30, LeaseTTL: 10 * Second},
		&Page{Ref: sampleRef(), Index: 1, Filled: 3, Data: pageBytes(1, 1, 3)},
		&Manifest{Ref: sampleRef(), Layout: testLayout().Hash(), PageCount: 2, Filled: []int{16, 3}, TotalTokens: 19, PageDigests: d, FirstToken: 511},
		&Manifest{Ref: sampleRef(), Layout: testLayout().Hash(), PageCount: 2, Filled: []int{16, 3}, TotalTokens: 19, PageDigests: d, FirstToken: 511,
			FirstLogprobs: &request.Logprobs{Logprob: -0.75, Top: []request.TokenLogprob{{ID: 511, Logprob: -0.75}}}},
		&Manifest{Ref: sampleRef(), FirstToken: 3, FirstLogprobs: &request.Logprobs{Logprob: -2}},
		&Manifest{Ref: sampleRef(), Layout: testLayout().Hash(), PageCount: 2, Filled: []int{16, 3}, TotalTokens: 19, PageDigests: d, FirstToken: 511,
			PromptLogprobs: []request.Logprobs{{Logprob: -3, Top: []request.TokenLogprob{{ID: 1, Logprob: -0.5}}}, {Logprob: -3.4e38, Top: []request.TokenLogprob{{ID: 7, Logprob: 0}}}}},
		&Manifest{Ref: sampleRef(), FirstToken: 3, PromptLogprobs: []request.Logprobs{}},
		&Commit{sampleRef()},
		&Committed{sampleRef()},
		&Abort{Ref: sampleRef(), Reason: ReasonDigestMismatch},
		&AbortAck{Ref: sampleRef(), Drained: true},
		&Heartbeat{sampleRef()},
		&LoadQuery{Seq: 7},
		&Load{Seq: 7, UsablePages: 100, FreePages: 60, CachedPages: 12, Queued: 3, Running: 9},
	}
}

// randomMessage builds a message of a random type with random, encodable
// field values.
func randomMessage(rng *rand.Rand) Message {
	str := func() string {
		b := make([]byte, rng.IntN(12))
		for i := range b {
			b[i] = byte(rng.IntN(256))
		}
		return string(b)
	}
	n := func(limit int) int { return rng.IntN(limit + 1) }
	var id request.ID
	for i := range id {
		id[i] = byte(rng.Uint32())
	}
	o := request.Owner{Tenant: request.Tenant(str()), ID: id}
	ref := Ref{ID: ReservationID{Incarnation: rng.Uint64(), Seq: rng.Uint64()}, Owner: o, Epoch: rng.Uint64()}
	var dig [32]byte
	for i := range dig {
		dig[i] = byte(rng.Uint32())
	}
	switch MsgType(1 + rng.IntN(int(numMsgTypes)-1)) {
	case MsgHello:
		l := Layout{ModelDigest: dig, DType: 0, PageSize: n(maxInt32), Layers: n(64), KVHeads: n(64), HeadDim: n(256), MaxContext: n(maxInt32), Protocol: uint16(rng.Uint32())}
		return &Hello{Node: Peer(str()), Role: Role(rng.IntN(256)), Layout: l, Hash: dig,
			Limits: Limits{MaxContext: n(maxInt32), MaxPromptTokens: n(maxInt32), PageSize: n(maxInt32), PageBytes: rng.Int64()}}
	case MsgReserve:
		return &Reserve{Owner: o, Epoch: rng.Uint64(), PromptTokens: n(maxInt32), MaxNewTokens: n(maxInt32), Sender: Peer(str())}
	case MsgGrant:
		return &Grant{Ref: ref, PageCount: n(MaxPages), PromptTokens: n(maxInt32), MaxNewTokens: n(maxInt32), LeaseTTL: Duration(rng.Int64())}
	case MsgPage:
		data := make([]byte, rng.IntN(64))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		return &Page{Ref: ref, Index: n(MaxPages - 1), Filled: n(maxInt32), Data: data}
	case MsgManifest:
		k := rng.IntN(6)
		m := &Manifest{Ref: ref, Layout: dig, PageCount: k, TotalTokens: n(maxInt32), FirstToken: n(maxInt32)}
		for i := range k {
			m.Filled = append(m.Filled, n(maxInt32))
			d := dig
			d[0] = byte(i)
			m.PageDigests = append(m.PageDigests, d)
		}
		if rng.IntN(2) == 0 {
			m.FirstLogprobs = randomLogprobs(rng)
		}
		if rng.IntN(2) == 0 {
			m.PromptLogprobs = randomPromptLogprobs(rng)
		}
		return m
	case MsgCommit:
		return &Commit{ref}
	case MsgCommitted:
		return &Committed{ref}
	case MsgAbort:
		return &Abort{Ref: ref, Reason: Reason(rng.Uint32())}
	case MsgAbortAck:
		return &AbortAck{Ref: ref, Drained: rng.IntN(2) == 0}
	case MsgTokens:
		t := &Tokens{Ref: ref, Start: n(maxInt32)}
		k := rng.IntN(5)
		lp := rng.IntN(2) == 0
		for range k {
			t.IDs = append(t.IDs, n(maxInt32))
			if lp {
				t.Logprobs = append(t.Logprobs, randomLogprobs(rng))
			}
		}
		if rng.IntN(3) == 0 {
			t.Start, t.Prompt = 0, randomPromptLogprobs(rng)
		}
		return t
	case MsgGenerate, MsgPrefill, MsgResult:
		ms := requestPlaneMessages()
		return ms[rng.IntN(len(ms))]
	case MsgLoadQuery:
		return &LoadQuery{Seq: rng.Uint64()}
	case MsgLoad:
		usable := n(MaxPages)
		free := n(usable)
		return &Load{Seq: rng.Uint64(), UsablePages: usable, FreePages: free, CachedPages: n(usable - free), Queued: n(maxInt32), Running: n(maxInt32)}
	default:
		return &Heartbeat{ref}
	}
}

// randomPromptLogprobs is a valid list of prompt logprobs (possibly
// empty, never nil).
func randomPromptLogprobs(rng *rand.Rand) []request.Logprobs {
	v := make([]request.Logprobs, rng.IntN(4))
	for i := range v {
		v[i] = *randomLogprobs(rng)
	}
	return v
}

// randomLogprobs are valid logprobs: values in [-50, 0], best first,
// distinct ids.
func randomLogprobs(rng *rand.Rand) *request.Logprobs {
	l := &request.Logprobs{Logprob: -rng.Float32() * 50}
	k := rng.IntN(request.MaxTopLogprobs + 1)
	v := float32(0)
	for i := range k {
		v -= rng.Float32()
		l.Top = append(l.Top, request.TokenLogprob{ID: i*1000 + rng.IntN(1000), Logprob: v})
	}
	return l
}

// roundTrip checks decode(encode(m)) == m and that the encoding is
// canonical.
func roundTrip(t testing.TB, m Message) []byte {
	t.Helper()
	b, err := EncodeFrame(m)
	if err != nil {
		t.Fatalf("encode %T: %v", m, err)
	}
	got, err := DecodeFrame(b)
	if err != nil {
		t.Fatalf("decode %T: %v", m, err)
	}
	if diff := cmp.Diff(m, got, equateEmpty); diff != "" {
		t.Fatalf("%T round trip (-sent +received):\n%s", m, diff)
	}
	again, err := EncodeFrame(got)
	if err != nil || !bytes.Equal(again, b) {
		t.Fatalf("%T: re-encoding differs (%v)", m, err)
	}
	return b
}

func TestFrameRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		roundTrip(t, m)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		roundTrip(t, randomMessage(rng))
	}
}

// TestFrameTruncated: every proper prefix of every frame is refused, and
// so is a frame with bytes appended.
func TestFrameTruncated(t *testing.T) {
	for _, m := range sampleMessages() {
		b, err := EncodeFrame(m)
		if err != nil {
			t.Fatal(err)
		}
		for n := range len(b) {
			if got, err := DecodeFrame(b[:n]); !errors.Is(err, ErrFrame) || got != nil {
				t.Fatalf("%T cut to %d of %d bytes: %v, %v", m, n, len(b), got, err)
			}
		}
		if _, err := DecodeFrame(append(b[:len(b):len(b)], 0)); !errors.Is(err, ErrFrame) {
			t.Fatalf("%T with a byte appended: %v", m, err)
		}
	}
}

// TestFrameCorrupt: the checksum catches every single-bit flip.
func TestFrameCorrupt(t *testing.T) {
	for _, m := range sampleMessages() {
		b, err := EncodeFrame(m)
		if err != nil {
			t.Fatal(err)
		}
		for bit := range 8 * len(b) {
			c := bytes.Clone(b)
			c[bit/8] ^= 1 << (bit % 8)
			if got, err := DecodeFrame(c); err == nil {
				t.Fatalf("%T with bit %d flipped decoded to %+v", m, bit, got)
			}
		}
	}
}

// rawFrame frames body by hand, with a correct checksum, so that the
// decoder's own bounds are what refuses it.
func rawFrame(version uint16, typ MsgType, flags byte, bodyLen int, body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, frameMagic)
	b = binary.BigEndian.AppendUint16(b, version)
	b = append(b, byte(typ), flags)
	b = binary.BigEndian.AppendUint32(b, uint32(bodyLen))
	b = append(b, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func refBytes() []byte {
	e := &encoder{}
	e.ref(sampleRef())
	return e.b
}

func TestFrameBounds(t *testing.T) {
	u32 := func(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	manifestHead := func(pages uint32) []byte {
		return cat(refBytes(), make([]byte, 32), u32(pages), u32(19), u32(5))
	}
	tests := []struct {
		name  string
		frame []byte
		want  error
		text  string
	}{
		{"body over the limit", rawFrame(ProtocolVersion, MsgPage, 0, MaxFrameBody+1, nil), ErrFrame, "body"},
		{"other version", rawFrame(ProtocolVersion+1, MsgCommit, 0, len(refBytes()), refBytes()), ErrVersion, "version"},
		{"unknown type", rawFrame(ProtocolVersion, 0, 0, len(refBytes()), refBytes()), ErrFrame, "type"},
		{"type beyond the last", rawFrame(ProtocolVersion, numMsgTypes, 0, len(refBytes()), refBytes()), ErrFrame, "type"},
		{"flags", rawFrame(ProtocolVersion, MsgCommit, 1, len(refBytes()), refBytes()), ErrFrame, "flags"},
		{"length beyond the frame", rawFrame(ProtocolVersion, MsgCommit, 0, len(refBytes())+4, refBytes()), ErrFrame, "bytes for a"},
		{"trailing bytes", rawFrame(ProtocolVersion, MsgCommit, 0, len(refBytes())+1, cat(refBytes(), []byte{0})), ErrFrame, "trailing"},
		{"page data beyond the limit", rawFrame(ProtocolVersion, MsgPage, 0, len(refBytes())+12, cat(refBytes(), u32(0), u32(1), u32(MaxPageBytes+1))), ErrFrame, "page data of"},
		{"page data beyond the body", rawFrame(ProtocolVersion, MsgPage, 0, len(refBytes())+14, cat(refBytes(), u32(0), u32(1), u32(1000), []byte{1, 2})), ErrFrame, "remain"},
		{"page index beyond the limit", rawFrame(ProtocolVersion, MsgPage, 0, len(refBytes())+12, cat(refBytes(), u32(MaxPages), u32(1), u32(0))), ErrFrame, "page index"},
		{"manifest pages beyond the limit", rawFrame(ProtocolVersion, MsgManifest, 0, len(manifestHead(MaxPages+1)), manifestHead(MaxPages+1)), ErrFrame, "page count"},
		// The lists are checked against the bytes left before they are
		// allocated: MaxPages entries are not made for a 100-byte frame.
		{"manifest lists beyond the body", rawFrame(ProtocolVersion, MsgManifest, 0, len(manifestHead(MaxPages)), manifestHead(MaxPages)), ErrFrame, "needs"},
		{"int over 2^31", rawFrame(ProtocolVersion, MsgGrant, 0, len(refBytes())+20, cat(refBytes(), u32(1), u32(1<<31), u32(1), make([]byte, 8))), ErrFrame, "prompt tokens"},
		{"boolean 2", rawFrame(ProtocolVersion, MsgAbortAck, 0, len(refBytes())+1, cat(refBytes(), []byte{2})), ErrFrame, "drained"},
		{"string beyond the body", rawFrame(ProtocolVersion, MsgCommit, 0, 17, cat(make([]byte, 16), []byte{200})), ErrFrame, "tenant"},
		{"load: more free than usable", rawFrame(ProtocolVersion, MsgLoad, 0, 28, cat(make([]byte, 8), u32(10), u32(8), u32(3), u32(0), u32(0))), ErrFrame, "free and"},
		{"load: pages beyond the limit", rawFrame(ProtocolVersion, MsgLoad, 0, 28, cat(make([]byte, 8), u32(MaxPages+1), u32(0), u32(0), u32(0), u32(0))), ErrFrame, "usable pages"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := DecodeFrame(tc.frame)
			if !errors.Is(err, tc.want) || m != nil || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("DecodeFrame = %v, %v; want %v mentioning %q", m, err, tc.want, tc.text)
			}
		})
	}
	if _, err := ParseHeader(make([]byte, HeaderSize-1)); !errors.Is(err, ErrFrame) {
		t.Fatalf("short header: %v", err)
	}
	h, err := ParseHeader(rawFrame(ProtocolVersion, MsgPage, 0, 40, nil))
	if err != nil || h.FrameLen() != HeaderSize+40+TrailerSize {
		t.Fatalf("header %+v, %v", h, err)
	}
}

// TestEncodeRefuses: the encoder refuses what the decoder would, so every
// frame it makes decodes.
func TestEncodeRefuses(t *testing.T) {
	long := request.Tenant(strings.Repeat("x", MaxNameLen+1))
	for name, m := range map[string]Message{
		"negative index":    &Page{Ref: sampleRef(), Index: -1},
		"index at the max":  &Page{Ref: sampleRef(), Index: MaxPages},
		"long tenant":       &Commit{Ref{Owner: request.Owner{Tenant: long}}},
		"long sender":       &Reserve{Owner: owner("a", 1), Sender: Peer(long)},
		"huge page":         &Page{Ref: sampleRef(), Data: make([]byte, MaxPageBytes+1)},
		"lists too short":   &Manifest{Ref: sampleRef(), PageCount: 2, Filled: []int{1}, PageDigests: make([][32]byte, 2)},
		"too many pages":    &Manifest{Ref: sampleRef(), PageCount: MaxPages + 1},
		"negative lease":    &Grant{Ref: sampleRef(), LeaseTTL: -1},
		"token over 2^31-1": &Manifest{Ref: sampleRef(), FirstToken: 1 << 31},
		"nil":               nil,
	} {
		if b, err := EncodeFrame(m); !errors.Is(err, ErrFrame) || len(b) != 0 {
			t.Errorf("%s: %d bytes, %v", name, len(b), err)
		}
	}
	// AppendFrame leaves dst as it was on error.
	dst := []byte("keep")
	if out, err := AppendFrame(dst, &Page{Ref: sampleRef(), Index: -1}); err == nil || string(out) != "keep" {
		t.Errorf("AppendFrame on error: %q, %v", out, err)
	}
}

// FuzzFrame: decoding never panics; whatever decodes is the canonical
// encoding of a message that round-trips; and a message built from the
// input round-trips through encode and decode.
func FuzzFrame(f *testing.F) {
	for _, m := range append(sampleMessages(), requestPlaneMessages()...) {
		b, err := EncodeFrame(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte("PWXF"))
	f.Add(rawFrame(1, MsgManifest, 0, 200, make([]byte, 200)))
	f.Fuzz(func(t *testing.T, data []byte) {
		if m, err := DecodeFrame(data); err == nil {
			b, err := EncodeFrame(m)
			if err != nil {
				t.Fatalf("decoded %T does not encode: %v", m, err)
			}
			if !bytes.Equal(b, data) {
				t.Fatalf("decoded %T re-encodes to other bytes", m)
			}
			roundTrip(t, m)
		} else if m != nil {
			t.Fatalf("error %v with a message", err)
		}
		var seed [2]uint64
		for i, c := range data {
			seed[i%2] = seed[i%2]*131 + uint64(c)
		}
		roundTrip(t, randomMessage(rand.New(rand.NewPCG(seed[0], seed[1]))))
	})
}
