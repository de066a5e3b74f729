package link

import (
	"google.golang.org/grpc/encoding"
	encproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/pagewarden/pagewarden/internal/link/linkpb"
)

// frameCodec is gRPC's protobuf codec, made to move a linkpb.Frame's
// bytes once fewer each way: Marshal emits the field's tag and length
// followed by the frame itself rather than a copy, and Unmarshal takes
// the frame as a slice of the one contiguous copy of the message rather
// than copying it out again. The bytes on the wire are the protobuf
// encoding of linkpb.Frame (FuzzFrameCodec checks both directions against
// the protobuf package); any other message, and any encoding of a Frame
// but the canonical one, goes to the protobuf codec. BenchmarkPages shows
// what the copies cost.
type frameCodec struct{}

var protoCodec = encoding.GetCodecV2(encproto.Name)

func (frameCodec) Name() string { return encproto.Name }

func (frameCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*linkpb.Frame)
	if !ok || len(f.GetFrame()) == 0 {
		return protoCodec.Marshal(v)
	}
	hdr := protowire.AppendTag(make([]byte, 0, 1+protowire.SizeVarint(uint64(len(f.Frame)))), 1, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(len(f.Frame)))
	// The frame is never written to after Send (node.Send makes a fresh
	// one per message), so it can go to the wire as it is.
	return mem.BufferSlice{mem.SliceBuffer(hdr), mem.SliceBuffer(f.Frame)}, nil
}

func (frameCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*linkpb.Frame)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	return unmarshalFrame(data.Materialize(), f)
}

// unmarshalFrame decodes b into f; f.Frame aliases b on the canonical
// path.
func unmarshalFrame(b []byte, f *linkpb.Frame) error {
	if num, typ, n := protowire.ConsumeTag(b); n > 0 && num == 1 && typ == protowire.BytesType {
		if v, m := protowire.ConsumeBytes(b[n:]); m > 0 && n+m == len(b) && len(v) > 0 {
			proto.Reset(f)
			f.Frame = v
			return nil
		}
	}
	return proto.Unmarshal(b, f)
}
