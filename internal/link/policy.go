package link

import "github.com/pagewarden/pagewarden/internal/transfer"

// Policy says whether a node in role from may send a message of type t to
// a node in role to. Links apply it to every message they receive, with
// from taken from the sender's verified certificate; a refused message is
// counted, logged and closes the link (I11: a valid certificate of the
// wrong role cannot reserve, send pages or abort). Hello is never a
// message: it opens a link and a second one is refused whatever the
// policy says.
type Policy func(from, to transfer.Role, t transfer.MsgType) bool

// DefaultPolicy is the handoff of DESIGN.md, "The handoff":
//
//	reserve                              gateway → decode
//	grant                                decode → gateway, gateway → prefill
//	page, manifest, commit, heartbeat    prefill → decode
//	committed                            decode → gateway, decode → prefill
//	abort, abort_ack                     any role → any other role
//	generate                             gateway → decode
//	prefill                              gateway → prefill
//	tokens                               decode → gateway
//	result                               decode → gateway, prefill → gateway
//	load_query                           gateway → prefill, decode
//	load                                 prefill → gateway, decode → gateway
//
// Nothing else is allowed, and nothing between two nodes of one role.
func DefaultPolicy(from, to transfer.Role, t transfer.MsgType) bool {
	const (
		g = transfer.RoleGateway
		p = transfer.RolePrefill
		d = transfer.RoleDecode
	)
	type pair struct{ from, to transfer.Role }
	e := pair{from, to}
	switch t {
	case transfer.MsgReserve:
		return e == pair{g, d}
	case transfer.MsgGrant:
		// The gateway hands decode's grant on to the prefill node that
		// will send the pages (DESIGN.md, handoff step 3).
		return e == pair{d, g} || e == pair{g, p}
	case transfer.MsgPage, transfer.MsgManifest, transfer.MsgCommit, transfer.MsgHeartbeat:
		return e == pair{p, d}
	case transfer.MsgCommitted:
		return e == pair{d, g} || e == pair{d, p}
	case transfer.MsgAbort, transfer.MsgAbortAck:
		return from != to && known(from) && known(to)
	case transfer.MsgGenerate:
		return e == pair{g, d}
	case transfer.MsgPrefill:
		return e == pair{g, p}
	case transfer.MsgTokens:
		return e == pair{d, g}
	case transfer.MsgResult:
		return e == pair{d, g} || e == pair{p, g}
	case transfer.MsgLoadQuery:
		return e == pair{g, p} || e == pair{g, d}
	case transfer.MsgLoad:
		return e == pair{p, g} || e == pair{d, g}
	}
	return false
}

func known(r transfer.Role) bool {
	return r == transfer.RoleGateway || r == transfer.RolePrefill || r == transfer.RoleDecode
}
