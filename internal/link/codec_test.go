package link

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/pagewarden/pagewarden/internal/link/linkpb"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// FuzzFrameCodec: frameCodec writes exactly what the protobuf package
// writes for a Frame, and reads any input as the protobuf package does
// (the same error or nil, the same message).
func FuzzFrameCodec(f *testing.F) {
	hb, err := transfer.EncodeFrame(&transfer.Heartbeat{Ref: testRef()})
	if err != nil {
		f.Fatal(err)
	}
	canonical, err := proto.Marshal(&linkpb.Frame{Frame: hb})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(hb)
	f.Add(canonical)
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0x00})                       // an empty frame, written out
	f.Add([]byte{0x0a, 0x01, 'x', 0x0a, 0x01, 'y'}) // the field twice: the last wins
	f.Add([]byte{0x12, 0x01, 'x', 0x0a, 0x01, 'y'}) // an unknown field first
	f.Add([]byte{0x0a, 0x05, 'x'})                  // truncated
	f.Add([]byte{0x0a, 0x81, 0x00, 'x'})            // a non-minimal length
	f.Fuzz(func(t *testing.T, b []byte) {
		// Marshal: byte-identical to protobuf.
		out, err := frameCodec{}.Marshal(&linkpb.Frame{Frame: b})
		if err != nil {
			t.Fatal(err)
		}
		want, err := proto.Marshal(&linkpb.Frame{Frame: b})
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("Marshal(%x) = %x, protobuf writes %x", b, got, want)
		}
		// Unmarshal: the same verdict and message as protobuf.
		var got, ref linkpb.Frame
		errGot := frameCodec{}.Unmarshal(mem.BufferSlice{mem.SliceBuffer(bytes.Clone(b))}, &got)
		errRef := proto.Unmarshal(b, &ref)
		if (errGot == nil) != (errRef == nil) {
			t.Fatalf("Unmarshal(%x): %v, protobuf says %v", b, errGot, errRef)
		}
		if errGot == nil && !proto.Equal(&got, &ref) {
			t.Fatalf("Unmarshal(%x) = %x, protobuf reads %x", b, got.GetFrame(), ref.GetFrame())
		}
	})
}

// TestFrameCodecOtherMessages: anything but a Frame goes to protobuf.
func TestFrameCodecOtherMessages(t *testing.T) {
	if _, err := (frameCodec{}).Marshal("not a message"); err == nil {
		t.Error("marshalled a string")
	}
	if err := (frameCodec{}).Unmarshal(nil, new(int)); err == nil {
		t.Error("unmarshalled into an int")
	}
	if (frameCodec{}).Name() != "proto" {
		t.Error("the codec must keep gRPC's content subtype")
	}
}
