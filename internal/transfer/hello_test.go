package transfer

import (
	"errors"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
)

// TestCheckPeer: a matching peer passes; every difference is reported by
// name, the first one in protocol, layout, hash, limits order.
func TestCheckPeer(t *testing.T) {
	local := NewHello("decode-1", RoleDecode, testLayout())
	if err := CheckPeer(local, NewHello("prefill-1", RolePrefill, testLayout())); err != nil {
		t.Fatalf("matching peer: %v", err)
	}
	tests := []struct {
		name       string
		remote     func() Hello
		field      string
		wantLocal  string
		wantRemote string
	}{
		{"protocol", func() Hello { l := testLayout(); l.Protocol = 1; return NewHello("p", RolePrefill, l) }, "protocol version", "4", "1"},
		// A node of the previous version (no logprobs on the wire) is
		// refused at the handshake, not misread frame by frame.
		{"protocol 2", func() Hello { l := testLayout(); l.Protocol = 2; return NewHello("p", RolePrefill, l) }, "protocol version", "4", "2"},
		// Nor is one of protocol 3 (no prompt logprobs in jobs, the
		// manifest or Tokens).
		{"protocol 3", func() Hello { l := testLayout(); l.Protocol = 3; return NewHello("p", RolePrefill, l) }, "protocol version", "4", "3"},
		{"model", func() Hello { l := testLayout(); l.ModelDigest[0] ^= 0xff; return NewHello("p", RolePrefill, l) }, "model digest", "", ""},
		{"dtype", func() Hello { l := testLayout(); l.DType = kvcache.F32; return NewHello("p", RolePrefill, l) }, "dtype", "f16", "f32"},
		{"page size", func() Hello { l := testLayout(); l.PageSize = 32; return NewHello("p", RolePrefill, l) }, "page size", "16", "32"},
		{"layers", func() Hello { l := testLayout(); l.Layers = 4; return NewHello("p", RolePrefill, l) }, "layers", "2", "4"},
		{"heads", func() Hello { l := testLayout(); l.KVHeads = 1; return NewHello("p", RolePrefill, l) }, "KV heads", "2", "1"},
		{"head dim", func() Hello { l := testLayout(); l.HeadDim = 8; return NewHello("p", RolePrefill, l) }, "head dim", "4", "8"},
		{"window", func() Hello { l := testLayout(); l.MaxContext = 2048; return NewHello("p", RolePrefill, l) }, "window", "1024", "2048"},
		{"forged hash", func() Hello { h := NewHello("p", RolePrefill, testLayout()); h.Hash[0] ^= 1; return h }, "layout hash of the remote's own fields", "", ""},
		{"limits", func() Hello { h := NewHello("p", RolePrefill, testLayout()); h.Limits.MaxPromptTokens = 1000; return h }, "limits: max prompt tokens", "1023", "1000"},
		{"page bytes", func() Hello { h := NewHello("p", RolePrefill, testLayout()); h.Limits.PageBytes++; return h }, "limits: page bytes", "1024", "1025"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckPeer(local, tc.remote())
			var pm *PeerMismatch
			if !errors.Is(err, ErrPeer) || !errors.As(err, &pm) {
				t.Fatalf("CheckPeer = %v, want a *PeerMismatch", err)
			}
			if pm.Field != tc.field || tc.wantLocal != "" && (pm.Local != tc.wantLocal || pm.Remote != tc.wantRemote) {
				t.Fatalf("mismatch %q: local %s remote %s; want %q: %s, %s", pm.Field, pm.Local, pm.Remote, tc.field, tc.wantLocal, tc.wantRemote)
			}
			t.Log(err)
		})
	}
}

// TestHelloOverTheWire: a Hello survives the codec and still checks.
func TestHelloOverTheWire(t *testing.T) {
	h := NewHello("prefill-1", RolePrefill, testLayout())
	b, err := EncodeFrame(&h)
	if err != nil {
		t.Fatal(err)
	}
	m, err := DecodeFrame(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckPeer(NewHello("decode-1", RoleDecode, testLayout()), *m.(*Hello)); err != nil {
		t.Fatal(err)
	}
}
