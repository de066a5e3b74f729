package transfer

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
)

// ErrPeer reports a peer whose handshake does not match this node's: the
// link must not be used. The error is a *PeerMismatch naming the first
// field that differs.
var ErrPeer = errors.New("transfer: peer does not match")

// PeerMismatch names the first difference CheckPeer found.
type PeerMismatch struct {
	Field         string // "protocol version", "model digest", "dtype", "page size", "window", ...
	Local, Remote string
}

func (e *PeerMismatch) Error() string {
	return fmt.Sprintf("%v: %s: local %s, remote %s", ErrPeer, e.Field, e.Local, e.Remote)
}

func (e *PeerMismatch) Unwrap() error { return ErrPeer }

// NewHello is the Hello of a node named node in role role, computing KV in
// layout l.
func NewHello(node Peer, role Role, l Layout) Hello {
	l = l.withDefaults()
	return Hello{Node: node, Role: role, Layout: l, Hash: l.Hash(), Limits: LimitsOf(l)}
}

// CheckPeer compares a peer's Hello with this node's and returns nil only
// when the two may exchange KV: the same protocol version, the same layout
// field by field, a remote hash that is the hash of the remote's own
// fields and equals the local one, and the same limits (I5: prefill and
// decode check one set of limits). Otherwise it returns a *PeerMismatch
// naming the first difference, in the order listed, so that an operator
// reads "page size: local 16, remote 32" rather than two hashes.
func CheckPeer(local, remote Hello) error {
	mismatch := func(field string, l, r any) error {
		return &PeerMismatch{Field: field, Local: fmt.Sprint(l), Remote: fmt.Sprint(r)}
	}
	ll, rl := local.Layout.withDefaults(), remote.Layout
	if rl.Protocol != ll.Protocol {
		return mismatch("protocol version", ll.Protocol, rl.Protocol)
	}
	if rl.ModelDigest != ll.ModelDigest {
		return mismatch("model digest", hex.EncodeToString(ll.ModelDigest[:]), hex.EncodeToString(rl.ModelDigest[:]))
	}
	fields := []struct {
		name string
		l, r any
	}{
		{"dtype", ll.DType, rl.DType},
		{"page size", ll.PageSize, rl.PageSize},
		{"layers", ll.Layers, rl.Layers},
		{"KV heads", ll.KVHeads, rl.KVHeads},
		{"head dim", ll.HeadDim, rl.HeadDim},
		{"window", ll.MaxContext, rl.MaxContext},
	}
	for _, f := range fields {
		if f.l != f.r {
			return mismatch(f.name, f.l, f.r)
		}
	}
	if h := rl.Hash(); remote.Hash != h {
		// Same fields, different hash: the peer hashes differently (a
		// bug or a forgery); its manifests would never match.
		return mismatch("layout hash of the remote's own fields", h, remote.Hash)
	}
	if h := ll.Hash(); remote.Hash != h {
		return mismatch("layout hash", h, remote.Hash)
	}
	lim := []struct {
		name string
		l, r int64
	}{
		{"limits: max context", int64(local.Limits.MaxContext), int64(remote.Limits.MaxContext)},
		{"limits: max prompt tokens", int64(local.Limits.MaxPromptTokens), int64(remote.Limits.MaxPromptTokens)},
		{"limits: page size", int64(local.Limits.PageSize), int64(remote.Limits.PageSize)},
		{"limits: page bytes", local.Limits.PageBytes, remote.Limits.PageBytes},
	}
	for _, f := range lim {
		if f.l != f.r {
			return mismatch(f.name, strconv.FormatInt(f.l, 10), strconv.FormatInt(f.r, 10))
		}
	}
	return nil
}
