package cli

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/cluster"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// TestMembershipHolding: the gateway routes only to decode nodes whose
// pools hold the window with its safety margin, and warns, naming the
// node and the numbers, about each it leaves out (on every View).
func TestMembershipHolding(t *testing.T) {
	lim := transfer.Limits{MaxContext: 1024, MaxPromptTokens: 1023, PageSize: 16}
	mk := func(name string, role transfer.Role, pages int) cluster.Member {
		return cluster.Member{Name: transfer.Peer(name), Role: role, Limits: lim, UsablePages: pages}
	}
	v := cluster.View{Members: []cluster.Member{
		mk("gw", transfer.RoleGateway, 0),
		mk("p0", transfer.RolePrefill, 10),
		mk("d0", transfer.RoleDecode, 128), // 2048 tokens: holds 2×1024
		mk("d1", transfer.RoleDecode, 127), // 2032: does not
		mk("d2", transfer.RoleDecode, 200),
	}}
	var log bytes.Buffer
	got := holding(v, 2, slog.New(slog.NewJSONHandler(&log, nil)))
	if want := []transfer.Peer{"d0", "d2"}; !slices.Equal(got, want) {
		t.Errorf("holding = %v, want %v", got, want)
	}
	out := log.String()
	if strings.Count(out, "left out of rotation") != 1 || !strings.Contains(out, `"member":"decode/d1"`) || !strings.Contains(out, `"usable_kv_tokens":2032`) {
		t.Errorf("warnings:\n%s", out)
	}
	if got := holding(v, 1, slog.New(slog.DiscardHandler)); len(got) != 3 {
		t.Errorf("with margin 1: %v, want every decode node", got)
	}
}
