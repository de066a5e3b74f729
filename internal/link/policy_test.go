package link

import (
	"testing"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// TestDefaultPolicy checks every (from, to, type) triple, unknown roles
// and all 256 type values included, against the table in DefaultPolicy's
// comment: a new message type is refused until the table names it.
func TestDefaultPolicy(t *testing.T) {
	const (
		g = transfer.RoleGateway
		p = transfer.RolePrefill
		d = transfer.RoleDecode
	)
	type edge struct {
		from, to transfer.Role
		t        transfer.MsgType
	}
	allowed := map[edge]bool{
		{g, d, transfer.MsgReserve}:   true,
		{d, g, transfer.MsgGrant}:     true,
		{g, p, transfer.MsgGrant}:     true,
		{p, d, transfer.MsgPage}:      true,
		{p, d, transfer.MsgManifest}:  true,
		{p, d, transfer.MsgCommit}:    true,
		{p, d, transfer.MsgHeartbeat}: true,
		{d, g, transfer.MsgCommitted}: true,
		{d, p, transfer.MsgCommitted}: true,
		{g, d, transfer.MsgGenerate}:  true,
		{g, p, transfer.MsgPrefill}:   true,
		{d, g, transfer.MsgTokens}:    true,
		{d, g, transfer.MsgResult}:    true,
		{p, g, transfer.MsgResult}:    true,
		{g, p, transfer.MsgLoadQuery}: true,
		{g, d, transfer.MsgLoadQuery}: true,
		{p, g, transfer.MsgLoad}:      true,
		{d, g, transfer.MsgLoad}:      true,
	}
	roles := []transfer.Role{g, p, d}
	for _, from := range roles {
		for _, to := range roles {
			if from != to {
				allowed[edge{from, to, transfer.MsgAbort}] = true
				allowed[edge{from, to, transfer.MsgAbortAck}] = true
			}
		}
	}
	n := 0
	for from := transfer.Role(0); from <= d+1; from++ {
		for to := transfer.Role(0); to <= d+1; to++ {
			for i := range 256 {
				mt := transfer.MsgType(i)
				want := allowed[edge{from, to, mt}]
				if got := DefaultPolicy(from, to, mt); got != want {
					t.Errorf("DefaultPolicy(%v → %v, %v) = %v, want %v", from, to, mt, got, want)
				}
				if want {
					n++
				}
			}
		}
	}
	if n != len(allowed) {
		t.Errorf("%d allowed triples checked, table has %d", n, len(allowed))
	}
}
