package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pagewarden/pagewarden/internal/cluster/etcdtest"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

var (
	hashA = transfer.LayoutHash(sha256.Sum256([]byte("layout A")))
	hashB = transfer.LayoutHash(sha256.Sum256([]byte("layout B")))
	lim   = transfer.Limits{MaxContext: 1024, MaxPromptTokens: 1023, PageSize: 16, PageBytes: 4096}
)

func dial(t *testing.T, endpoint string, ttl time.Duration) *Client {
	t.Helper()
	c, err := Dial(t.Context(), Config{Endpoints: []string{endpoint}, TTL: ttl, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func node(name string, role transfer.Role) Member {
	m := Member{Name: transfer.Peer(name), Role: role, LayoutHash: hashA, Limits: lim, UsablePages: 100,
		CertSHA256: sha256.Sum256([]byte(name))}
	if role != transfer.RoleGateway {
		m.Addr = "127.0.0.1:7000"
	}
	return m
}

func register(t *testing.T, c *Client, m Member) *Session {
	t.Helper()
	s, err := c.Register(t.Context(), m)
	if err != nil {
		t.Fatalf("register %v: %v", m, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// watch runs c.Watch for the test and returns its Views.
func watch(t *testing.T, c *Client) <-chan View {
	t.Helper()
	ch := make(chan View, 256)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Watch(ctx, func(v View) { ch <- v }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v", err)
		}
	})
	return ch
}

// await returns the first View that satisfies ok, failing after within.
func await(t *testing.T, views <-chan View, within time.Duration, what string, ok func(View) bool) View {
	t.Helper()
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case v := <-views:
			if ok(v) {
				return v
			}
		case <-timer.C:
			t.Fatalf("no view with %s within %v", what, within)
		}
	}
}

func clientLease(s *Session) clientv3.LeaseID { return clientv3.LeaseID(s.Member().Lease) }

func names(v View) []string {
	var out []string
	for _, m := range v.Members {
		out = append(out, m.String())
	}
	return out
}

func has(v View, want ...string) bool { return slices.Equal(names(v), want) }

// TestRegisterAndWatch: a watcher gets the member set, then every change;
// the record under PREFIX/nodes/ROLE/NAME holds what the node registered;
// Close removes a node at once.
func TestRegisterAndWatch(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	gw := dial(t, srv.Endpoint, 0)
	views := watch(t, gw)
	if v := <-views; len(v.Members) != 0 || len(v.Changes) != 0 {
		t.Fatalf("first view %+v, want empty", v)
	}

	d0 := node("d0", transfer.RoleDecode)
	d0.Started = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	sd := register(t, dial(t, srv.Endpoint, 0), d0)
	v := await(t, views, 5*time.Second, "d0", func(v View) bool { return has(v, "decode/d0") })
	got := v.Members[0]
	if got.Lease == 0 || got.Revision == 0 || got != sd.Member() {
		t.Errorf("watched %+v, session says %+v", got, sd.Member())
	}
	if diff := cmp.Diff(d0, got, cmpopts.IgnoreFields(Member{}, "Lease", "Revision")); diff != "" {
		t.Errorf("watched member (-registered +watched):\n%s", diff)
	}
	if diff := cmp.Diff([]Change{{Kind: Joined, Member: got}}, v.Changes); diff != "" {
		t.Errorf("changes:\n%s", diff)
	}

	// The key layout, as an operator reads it with etcdctl.
	resp, err := gw.etcd.Get(t.Context(), "/pagewarden/nodes/decode/d0")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("raw get: %v %v", resp, err)
	}
	var raw map[string]any
	if err := json.Unmarshal(resp.Kvs[0].Value, &raw); err != nil {
		t.Fatal(err)
	}
	wantRaw := map[string]any{
		"name": "d0", "role": "decode", "addr": "127.0.0.1:7000", "layout_hash": hex.EncodeToString(hashA[:]),
		"limits":       map[string]any{"MaxContext": 1024.0, "MaxPromptTokens": 1023.0, "PageSize": 16.0, "PageBytes": 4096.0},
		"usable_pages": 100.0, "cert_sha256": hex.EncodeToString(d0.CertSHA256[:]), "started": "2026-01-02T03:04:05Z",
	}
	if diff := cmp.Diff(wantRaw, raw); diff != "" {
		t.Errorf("record at /pagewarden/nodes/decode/d0 (-want +got):\n%s", diff)
	}
	if resp.Kvs[0].Lease != sd.Member().Lease {
		t.Errorf("key on lease %x, session's is %x", resp.Kvs[0].Lease, sd.Member().Lease)
	}

	sp := register(t, dial(t, srv.Endpoint, 0), node("p0", transfer.RolePrefill))
	register(t, gw, node("gw", transfer.RoleGateway))
	v = await(t, views, 5*time.Second, "three members", func(v View) bool { return has(v, "gateway/gw", "prefill/p0", "decode/d0") })
	if p := v.Peers(transfer.RolePrefill); !slices.Equal(p, []transfer.Peer{"p0"}) {
		t.Errorf("Peers(prefill) = %v", p)
	}
	members, _, bad, err := gw.Members(t.Context())
	if err != nil || len(bad) != 0 || len(members) != 3 {
		t.Errorf("Members: %v %v %v", members, bad, err)
	}

	start := time.Now()
	if err := sp.Close(); err != nil {
		t.Fatal(err)
	}
	v = await(t, views, 10*time.Second, "p0 gone", func(v View) bool { return has(v, "gateway/gw", "decode/d0") })
	if len(v.Changes) != 1 || v.Changes[0].Kind != Left || v.Changes[0].Member.Name != "p0" {
		t.Errorf("changes %+v, want p0 left", v.Changes)
	}
	t.Logf("a closed session left the set in %v", time.Since(start))
	select {
	case <-sp.Done():
		if sp.Err() != nil {
			t.Errorf("closed session's Err = %v, want nil", sp.Err())
		}
	default:
		t.Error("closed session not done")
	}
}

// TestExpiry: a node that stops keeping its lease alive (its process and
// connection are gone) leaves the set when the lease expires, within
// about a TTL, and its session says it was lost.
func TestExpiry(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	views := watch(t, dial(t, srv.Endpoint, 0))
	nc := dial(t, srv.Endpoint, time.Second)
	s := register(t, nc, node("d1", transfer.RoleDecode))
	register(t, dial(t, srv.Endpoint, 0), node("d0", transfer.RoleDecode))
	await(t, views, 5*time.Second, "both", func(v View) bool { return has(v, "decode/d0", "decode/d1") })
	start := time.Now()
	nc.Close() // no Revoke: the lease is left to expire
	<-s.Done()
	if !errors.Is(s.Err(), ErrSessionLost) {
		t.Errorf("session Err %v, want ErrSessionLost", s.Err())
	}
	await(t, views, 5*time.Second, "d1 expired", func(v View) bool { return has(v, "decode/d0") })
	took := time.Since(start)
	t.Logf("left the set %v after it stopped keeping alive (TTL 1s)", took)
	if took < 500*time.Millisecond {
		t.Errorf("left after %v: before its lease could expire", took)
	}
}

// TestSessionLost: a node cut off from etcd (a partition: every
// connection through a proxy cut) sees its session lost within about a
// TTL, while the others see it leave; a node whose lease is revoked by
// someone else, or whose key is deleted, sees it at once.
func TestSessionLost(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	views := watch(t, dial(t, srv.Endpoint, 0))
	admin := dial(t, srv.Endpoint, 0)

	t.Run("partition", func(t *testing.T) {
		proxy := srv.NewProxy(t)
		s := register(t, dial(t, proxy.Endpoint, time.Second), node("d1", transfer.RoleDecode))
		await(t, views, 5*time.Second, "d1", func(v View) bool { return has(v, "decode/d1") })
		// Renewed: etcd confirms the lease every TTL/3.
		first := s.Renewed()
		for deadline := time.Now().Add(5 * time.Second); !s.Renewed().After(first); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("connected, but not renewed in 5s (TTL 1s): still %v", first)
			}
		}
		start := time.Now()
		proxy.Cut()
		select {
		case <-s.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("session not lost 10s after the partition")
		}
		lostAt := time.Now()
		if !errors.Is(s.Err(), ErrSessionLost) {
			t.Errorf("Err %v", s.Err())
		}
		// Stale comes first: two thirds of a TTL after the last renewal,
		// before the keep-alive gives up (which can be after etcd expired
		// the lease). Stale is a function of the time, so it is checked
		// at the times that matter rather than by polling it (a poll
		// delayed by load saw the loss first).
		last, staleAfter := s.Renewed(), 2*time.Second/3
		if s.Stale(last.Add(staleAfter-time.Millisecond)) || !s.Stale(last.Add(staleAfter+time.Millisecond)) {
			t.Errorf("stale is not two thirds of the TTL (1s) after the last renewal %v", last)
		}
		if d := lostAt.Sub(last); d <= staleAfter {
			t.Errorf("session lost %v after the last renewal, before it was stale (%v)", d, staleAfter)
		}
		staleAt := last.Add(staleAfter)
		t.Logf("stale %v and lost %v after the partition: %v", staleAt.Sub(start), time.Since(start), s.Err())
		await(t, views, 5*time.Second, "d1 gone", func(v View) bool { return len(v.Members) == 0 })
	})
	t.Run("revoked", func(t *testing.T) {
		s := register(t, dial(t, srv.Endpoint, 0), node("d2", transfer.RoleDecode))
		if _, err := admin.etcd.Revoke(t.Context(), clientLease(s)); err != nil {
			t.Fatal(err)
		}
		select {
		case <-s.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("session not lost after its lease was revoked")
		}
		if !errors.Is(s.Err(), ErrSessionLost) {
			t.Errorf("Err %v", s.Err())
		}
	})
	t.Run("deleted", func(t *testing.T) {
		s := register(t, dial(t, srv.Endpoint, 0), node("d3", transfer.RoleDecode))
		if _, err := admin.etcd.Delete(t.Context(), "/pagewarden/nodes/decode/d3"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-s.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("session not lost after its key was deleted")
		}
		if !errors.Is(s.Err(), ErrSessionLost) || !strings.Contains(s.Err().Error(), "deleted") {
			t.Errorf("Err %v", s.Err())
		}
	})
}

// TestNameTaken: a name held by a live node is refused, in any role,
// naming the holder; it is free again once that node leaves.
func TestNameTaken(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	c := dial(t, srv.Endpoint, 0)
	first := register(t, c, node("d0", transfer.RoleDecode))
	for _, role := range []transfer.Role{transfer.RoleDecode, transfer.RolePrefill} {
		_, err := dial(t, srv.Endpoint, 0).Register(t.Context(), node("d0", role))
		if !errors.Is(err, ErrNameTaken) || !strings.Contains(err.Error(), "d0 is registered as decode/d0 (at 127.0.0.1:7000") {
			t.Errorf("as %v: %v, want ErrNameTaken naming decode/d0", role, err)
		}
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	register(t, c, node("d0", transfer.RolePrefill))
	// Refused registrations leave no lease behind.
	leases, err := c.etcd.Leases(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(leases.Leases) != 1 {
		t.Errorf("%d leases, want 1 (the registered node's)", len(leases.Leases))
	}
}

// TestConfigMismatch: a node whose layout hash or limits differ from a
// registered node's is refused, and the error names both values and the
// other node; nodes that agree register.
func TestConfigMismatch(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	c := dial(t, srv.Endpoint, 0)
	register(t, c, node("d0", transfer.RoleDecode))
	otherHash := node("d1", transfer.RoleDecode)
	otherHash.LayoutHash = hashB
	otherWindow := node("p1", transfer.RolePrefill)
	otherWindow.Limits.MaxContext = 2048
	otherBytes := node("gw", transfer.RoleGateway)
	otherBytes.Limits.PageBytes = 8192
	for _, tc := range []struct {
		m    Member
		says []string
	}{
		{otherHash, []string{"layout hash", "this node (decode/d1) has " + hex.EncodeToString(hashB[:]), "decode/d0 (at 127.0.0.1:7000", "has " + hex.EncodeToString(hashA[:])}},
		{otherWindow, []string{"limits: max context", "this node (prefill/p1) has 2048", "registered node decode/d0", "has 1024"}},
		{otherBytes, []string{"limits: page bytes", "has 8192", "has 4096"}},
	} {
		_, err := c.Register(t.Context(), tc.m)
		var mm *ConfigMismatch
		if !errors.Is(err, ErrConfigMismatch) || !errors.As(err, &mm) || mm.Other.Name != "d0" {
			t.Errorf("%v: %v, want a ConfigMismatch with d0", tc.m, err)
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%v: %q does not say %q", tc.m, err, s)
			}
		}
	}
	register(t, c, node("p0", transfer.RolePrefill))
	members, _, _, err := c.Members(t.Context())
	if err != nil || len(members) != 2 {
		t.Errorf("members %v %v", members, err)
	}
}

// TestCapacityMismatch: a decode node whose pool cannot hold the window
// (1024 tokens) with the safety margin of a registered node, or its own,
// is refused, and a node whose margin a registered decode node cannot
// hold is refused too, naming the numbers and both nodes; nodes whose
// margins every decode node holds register. A record with no margin (an
// older node) imposes none, but its pool is checked against the others'.
func TestCapacityMismatch(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	c := dial(t, srv.Endpoint, 0)
	with := func(name string, role transfer.Role, pages int, margin float64) Member {
		m := node(name, role)
		m.UsablePages, m.SafetyMargin = pages, margin
		return m
	}
	// d0: 100 pages of 16 = 1600 tokens ≥ 1024 × 1.5.
	register(t, c, with("d0", transfer.RoleDecode, 100, 1.5))
	register(t, c, with("gw", transfer.RoleGateway, 0, 1.5))
	for _, tc := range []struct {
		m    Member
		of   transfer.Peer
		says []string
	}{
		// 80 pages = 1280 tokens < 1024 × 1.5 (gw's and d0's margin).
		{with("d1", transfer.RoleDecode, 80, 1.2), "gw", []string{"decode node decode/d1 holds 1280 KV tokens (80 pages of 16)", "1024 × safety margin 1.5 (that of gateway/gw) = 1536 tokens", "at most 1.25"}},
		// A record with no margin still has its pool checked.
		{with("d5", transfer.RoleDecode, 64, 0), "gw", []string{"decode node decode/d5 holds 1024 KV tokens"}},
		// A prefill node with margin 2: d0's 1600 tokens < 2048.
		{with("p0", transfer.RolePrefill, 100, 2), "p0", []string{"decode node decode/d0 holds 1600 KV tokens", "safety margin 2 (that of prefill/p0) = 2048 tokens"}},
		// A decode node that cannot hold its own margin (an older or
		// hand-written record: the node's own start-up refuses this).
		{with("d2", transfer.RoleDecode, 120, 2), "d2", []string{"decode node decode/d2 holds 1920 KV tokens", "(its own) = 2048"}},
	} {
		_, err := c.Register(t.Context(), tc.m)
		var mm *CapacityMismatch
		if !errors.Is(err, ErrConfigMismatch) || !errors.As(err, &mm) || mm.Of.Name != tc.of || mm.Registering.Name != tc.m.Name {
			t.Errorf("%v: %v, want a CapacityMismatch of %s's margin", tc.m, err, tc.of)
			continue
		}
		for _, s := range tc.says {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%v: %q does not say %q", tc.m, err, s)
			}
		}
	}
	register(t, c, with("d3", transfer.RoleDecode, 96, 1.5)) // 1536: just holds
	register(t, c, with("p1", transfer.RolePrefill, 100, 1)) // a smaller margin is fine
	register(t, c, with("d4", transfer.RoleDecode, 100, 0))  // margin unknown, pool large enough
	members, _, _, err := c.Members(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got := len(members); got != 5 {
		t.Errorf("%d members, want 5: %v", got, members)
	}
	for _, m := range members {
		if m.Name == "d0" && m.SafetyMargin != 1.5 {
			t.Errorf("d0's record has margin %g, want 1.5", m.SafetyMargin)
		}
	}
}

// TestConcurrentMismatch: nodes of two configurations registering at
// once never both get in: the write is conditional on the set the check
// read.
func TestConcurrentMismatch(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	for round := range 3 {
		prefix := fmt.Sprintf("/race%d", round)
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				c, err := Dial(t.Context(), Config{Endpoints: []string{srv.Endpoint}, Prefix: prefix})
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				m := node(fmt.Sprint("d", i), transfer.RoleDecode)
				if i%2 == 1 {
					m.LayoutHash = hashB
				}
				_, err = c.Register(t.Context(), m)
				if err != nil && !errors.Is(err, ErrConfigMismatch) {
					t.Errorf("d%d: %v", i, err)
				}
				// The session is left to the client's Close: the lease
				// expires after the test.
			})
		}
		wg.Wait()
		c, err := Dial(t.Context(), Config{Endpoints: []string{srv.Endpoint}, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		members, _, _, err := c.Members(t.Context())
		c.Close()
		if err != nil || len(members) == 0 {
			t.Fatalf("round %d: %v %v", round, members, err)
		}
		for _, m := range members {
			if m.LayoutHash != members[0].LayoutHash {
				t.Fatalf("round %d: registered with two layouts: %v", round, members)
			}
		}
	}
}

// TestBadRecords: a record that cannot be read is left out of the view
// (logged), and Register refuses to check a cluster it cannot read.
func TestBadRecords(t *testing.T) {
	srv := etcdtest.Start(t, etcdtest.Options{})
	c := dial(t, srv.Endpoint, 0)
	views := watch(t, c)
	<-views
	register(t, c, node("d0", transfer.RoleDecode))
	await(t, views, 5*time.Second, "d0", func(v View) bool { return has(v, "decode/d0") })
	good, _ := encodeMember(node("x1", transfer.RoleDecode))
	for key, val := range map[string]string{
		"/pagewarden/nodes/decode/junk":      "{not json",
		"/pagewarden/nodes/decode/big":       `{"name":"big","pad":"` + strings.Repeat("x", MaxRecordBytes) + `"}`,
		"/pagewarden/nodes/decode/other":     string(good), // names x1
		"/pagewarden/nodes/tenant/x1":        string(good),
		"/pagewarden/nodes/decode/x1/extra":  string(good),
		"/pagewarden/nodes/decode/shorthash": strings.Replace(string(good), `"layout_hash":"`, `"layout_hash":"ab`, 1),
	} {
		if _, err := c.etcd.Put(t.Context(), key, val); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.etcd.Put(t.Context(), "/pagewarden/nodes/decode/x1", string(good)); err != nil {
		t.Fatal(err)
	}
	v := await(t, views, 5*time.Second, "x1", func(v View) bool { return has(v, "decode/d0", "decode/x1") })
	if len(v.Members) != 2 {
		t.Errorf("view %v", names(v))
	}
	_, _, bad, err := c.Members(t.Context())
	if err != nil || len(bad) != 6 {
		t.Errorf("Members: %d bad records (%v), %v; want 6", len(bad), bad, err)
	}
	if _, err := c.Register(t.Context(), node("d2", transfer.RoleDecode)); !errors.Is(err, ErrRecord) {
		t.Errorf("Register over unreadable records: %v, want ErrRecord", err)
	}
}

// TestTLS: with etcd serving mutual TLS, a node with the CA and a client
// certificate registers; one without a certificate is refused at Dial.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := link.NewCA("etcd test CA", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile := write("ca.pem", ca.CertPEM)
	issue := func(name string) (cert, key string) {
		nc, err := ca.Issue(link.Identity{Name: transfer.Peer(name), Role: transfer.RoleDecode}, []string{"127.0.0.1"}, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", nc.CertPEM), write(name+"-key.pem", nc.KeyPEM)
	}
	srvCert, srvKey := issue("etcd")
	srv := etcdtest.Start(t, etcdtest.Options{TLS: &etcdtest.TLS{Cert: srvCert, Key: srvKey, ClientCA: caFile}})
	cert, key := issue("d0")
	c, err := Dial(t.Context(), Config{Endpoints: []string{srv.Endpoint}, TLS: TLSFiles{CA: caFile, Cert: cert, Key: key}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	register(t, c, node("d0", transfer.RoleDecode))

	_, err = Dial(t.Context(), Config{Endpoints: []string{srv.Endpoint}, DialTimeout: time.Second, TLS: TLSFiles{CA: caFile}})
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("dial without a client certificate: %v, want ErrUnavailable", err)
	}
	if _, err := Dial(t.Context(), Config{Endpoints: []string{srv.Endpoint}, TLS: TLSFiles{CA: caFile, Cert: cert}}); !errors.Is(err, ErrConfig) {
		t.Errorf("certificate without a key: %v, want ErrConfig", err)
	}
	if _, err := Dial(t.Context(), Config{Endpoints: []string{srv.Endpoint}, TLS: TLSFiles{CA: filepath.Join(dir, "missing.pem")}}); !errors.Is(err, ErrConfig) {
		t.Errorf("missing CA file: %v, want ErrConfig", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Endpoints: []string{"127.0.0.1:2379"}}, true},
		{"no endpoint", Config{}, false},
		{"blank endpoint", Config{Endpoints: []string{" "}}, false},
		{"fractional TTL", Config{Endpoints: []string{"e"}, TTL: 1500 * time.Millisecond}, false},
		{"sub-second TTL", Config{Endpoints: []string{"e"}, TTL: time.Millisecond * 500}, false},
		{"root prefix", Config{Endpoints: []string{"e"}, Prefix: "/"}, false},
		{"key without certificate", Config{Endpoints: []string{"e"}, TLS: TLSFiles{Key: "k"}}, false},
	} {
		err := tc.cfg.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrConfig)) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	c := Config{Endpoints: []string{"e"}, Prefix: "/x/"}
	if err := c.Validate(); err != nil || c.Prefix != "/x" || c.TTL != DefaultTTL || c.DialTimeout != 5*time.Second {
		t.Errorf("defaults: %+v %v", c, err)
	}
	for _, m := range []Member{
		{Name: "d0", Role: transfer.RoleDecode, LayoutHash: hashA},                               // no address
		{Name: "bad name", Role: transfer.RoleDecode, Addr: "h:1", LayoutHash: hashA},            // name
		{Name: "d0", Role: 0, Addr: "h:1", LayoutHash: hashA},                                    // role
		{Name: "d0", Role: transfer.RoleDecode, Addr: "h:1"},                                     // hash
		{Name: "d0", Role: transfer.RoleDecode, Addr: "h:1", LayoutHash: hashA, UsablePages: -1}, // pages
	} {
		if err := m.Validate(); !errors.Is(err, ErrRecord) {
			t.Errorf("%+v: %v, want ErrRecord", m, err)
		}
	}
}
