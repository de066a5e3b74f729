package disagg

import (
	"strings"
	"testing"

	"github.com/pagewarden/pagewarden/internal/model"
)

// TestStartLocalFailsCleanly: a cluster that cannot start (here a KV
// budget too small to split between a prefill and a decode node) is an
// error naming the cause, not a panic: each failed start closes what it
// had built, and returns a nil *Local.
func TestStartLocalFailsCleanly(t *testing.T) {
	for _, tc := range []struct {
		name string
		kv   int64
		want string
	}{
		{"one page of KV for both nodes", 4 << 10, "kv"},
		{"nothing", 1, "kv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
			if err != nil {
				t.Fatal(err)
			}
			o := nodeOptions()
			o.KVMemory = tc.kv
			l, err := StartLocal(m, LocalConfig{Node: o, ShareKV: true})
			if err == nil {
				l.Close()
				t.Fatalf("KV %d bytes: started", tc.kv)
			}
			if l != nil || !strings.Contains(strings.ToLower(err.Error()), tc.want) {
				t.Fatalf("KV %d bytes: %v, %v; want a nil cluster and an error about %q", tc.kv, l, err, tc.want)
			}
		})
	}
}
