package cluster

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// Member is one registered node.
type Member struct {
	Name transfer.Peer
	Role transfer.Role
	// Addr is where other nodes open links to it (host:port); empty for
	// a gateway.
	Addr        string
	LayoutHash  transfer.LayoutHash
	Limits      transfer.Limits
	UsablePages int
	// SafetyMargin is the node's --kv-safety-margin: a decode node must
	// hold Limits.MaxContext times the largest margin in the cluster (see
	// Holds). 0 is unknown (a record that does not say), and is checked
	// against nothing.
	SafetyMargin float64
	// CertSHA256 is the SHA-256 of the node's certificate (DER).
	CertSHA256 [32]byte
	Started    time.Time

	// Set from etcd when read: the node's lease, and the revision that
	// created its key (unique to this registration).
	Lease    int64
	Revision int64
}

func (m Member) String() string { return m.Role.String() + "/" + string(m.Name) }

// Validate reports whether m can be registered.
func (m Member) Validate() error {
	if err := (link.Identity{Name: m.Name, Role: m.Role}).Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrRecord, err)
	}
	if m.Role != transfer.RoleGateway || m.Addr != "" {
		if _, _, err := net.SplitHostPort(m.Addr); err != nil {
			return fmt.Errorf("%w: %v: link address %q: %v", ErrRecord, m, m.Addr, err)
		}
	}
	if m.LayoutHash == (transfer.LayoutHash{}) {
		return fmt.Errorf("%w: %v: no layout hash", ErrRecord, m)
	}
	if m.UsablePages < 0 {
		return fmt.Errorf("%w: %v: %d usable pages", ErrRecord, m, m.UsablePages)
	}
	if m.SafetyMargin != 0 && !(m.SafetyMargin >= 1 && m.SafetyMargin <= 1000) {
		return fmt.Errorf("%w: %v: safety margin %g (want 1 to 1000)", ErrRecord, m, m.SafetyMargin)
	}
	return nil
}

// UsableTokens is how many token positions m's KV pool holds.
func (m Member) UsableTokens() int64 {
	return int64(m.UsablePages) * int64(m.Limits.PageSize)
}

// Holds reports whether m, a decode node, can hold the cluster's window
// (Limits.MaxContext, the same on every node) with the safety margin:
// UsableTokens ≥ MaxContext × margin, the rule every node checks of its
// own pool at start-up (sched.ComputeLimits), applied across nodes. A
// node of another role holds no requests' pages: it holds any window.
func (m Member) Holds(margin float64) bool {
	if m.Role != transfer.RoleDecode {
		return true
	}
	return float64(m.UsableTokens()) >= float64(m.Limits.MaxContext)*margin
}

// MaxRecordBytes bounds a member record: a record is a few hundred bytes,
// and one past this is refused before it is parsed.
const MaxRecordBytes = 4 << 10

// record is a Member as stored in etcd.
type record struct {
	Name        string          `json:"name"`
	Role        string          `json:"role"`
	Addr        string          `json:"addr,omitempty"`
	LayoutHash  string          `json:"layout_hash"`
	Limits      transfer.Limits `json:"limits"`
	UsablePages int             `json:"usable_pages"`
	Margin      float64         `json:"safety_margin,omitempty"`
	CertSHA256  string          `json:"cert_sha256"`
	Started     time.Time       `json:"started"`
}

func encodeMember(m Member) ([]byte, error) {
	return json.Marshal(record{
		Name: string(m.Name), Role: m.Role.String(), Addr: m.Addr,
		LayoutHash: hex.EncodeToString(m.LayoutHash[:]), Limits: m.Limits, UsablePages: m.UsablePages, Margin: m.SafetyMargin,
		CertSHA256: hex.EncodeToString(m.CertSHA256[:]), Started: m.Started.UTC(),
	})
}

// decode reads the record at key: bounded, and strict about what
// identifies the node (the key's role and name must be the record's).
// Fields it does not know are ignored, so that a newer node's record
// stays readable.
func (c *Client) decode(key, value []byte, lease, rev int64) (Member, error) {
	fail := func(format string, args ...any) (Member, error) {
		return Member{}, fmt.Errorf("%w: %s: %s", ErrRecord, key, fmt.Sprintf(format, args...))
	}
	rest, ok := bytes.CutPrefix(key, []byte(c.nodesPrefix()))
	if !ok {
		return fail("not under %s", c.nodesPrefix())
	}
	keyRole, keyName, ok := strings.Cut(string(rest), "/")
	if !ok {
		return fail("want %sROLE/NAME", c.nodesPrefix())
	}
	if len(value) > MaxRecordBytes {
		return fail("%d bytes (at most %d)", len(value), MaxRecordBytes)
	}
	var r record
	if err := json.Unmarshal(value, &r); err != nil {
		return fail("%v", err)
	}
	if r.Role != keyRole || r.Name != keyName {
		return fail("record names %s/%s", r.Role, r.Name)
	}
	role, err := link.ParseRole(r.Role)
	if err != nil {
		return fail("%v", err)
	}
	m := Member{Name: transfer.Peer(r.Name), Role: role, Addr: r.Addr, Limits: r.Limits, UsablePages: r.UsablePages,
		SafetyMargin: r.Margin, Started: r.Started, Lease: lease, Revision: rev}
	if err := decodeHex(m.LayoutHash[:], r.LayoutHash); err != nil {
		return fail("layout hash: %v", err)
	}
	if err := decodeHex(m.CertSHA256[:], r.CertSHA256); err != nil {
		return fail("certificate fingerprint: %v", err)
	}
	if err := m.Validate(); err != nil {
		return fail("%v", err)
	}
	return m, nil
}

func decodeHex(dst []byte, s string) error {
	if len(s) != hex.EncodedLen(len(dst)) {
		return fmt.Errorf("%d hex digits, want %d", len(s), hex.EncodedLen(len(dst)))
	}
	_, err := hex.Decode(dst, []byte(s))
	return err
}

// key is where m is registered.
func (c *Client) key(role transfer.Role, name transfer.Peer) string {
	return c.nodesPrefix() + role.String() + "/" + string(name)
}

func sortMembers(ms []Member) {
	slices.SortFunc(ms, func(a, b Member) int {
		return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.Name, b.Name))
	})
}

// ConfigMismatch is the error Register returns when the node's layout
// or limits differ from those of a registered node. It wraps
// ErrConfigMismatch.
type ConfigMismatch struct {
	Field       string // "layout hash", "limits: max context", ...
	Local       string // this node's value
	Other       Member // the registered node that differs
	OtherValue  string
	Registering Member
}

func (e *ConfigMismatch) Error() string {
	return fmt.Sprintf("%v: %s: this node (%v) has %s, registered node %v (at %s, started %s) has %s; every node of a cluster must be started with the same model, page size, KV type and window",
		ErrConfigMismatch, e.Field, e.Registering, e.Local, e.Other, cmp.Or(e.Other.Addr, "no address"), e.Other.Started.Format(time.RFC3339), e.OtherValue)
}

func (e *ConfigMismatch) Unwrap() error { return ErrConfigMismatch }

// checkConfig compares m with every registered node and returns the first
// difference.
func checkConfig(m Member, registered []Member) error {
	for _, o := range registered {
		if o.LayoutHash != m.LayoutHash {
			return &ConfigMismatch{Field: "layout hash", Registering: m, Other: o,
				Local: hex.EncodeToString(m.LayoutHash[:]), OtherValue: hex.EncodeToString(o.LayoutHash[:])}
		}
		fields := []struct {
			name string
			l, r int64
		}{
			{"limits: max context", int64(m.Limits.MaxContext), int64(o.Limits.MaxContext)},
			{"limits: max prompt tokens", int64(m.Limits.MaxPromptTokens), int64(o.Limits.MaxPromptTokens)},
			{"limits: page size", int64(m.Limits.PageSize), int64(o.Limits.PageSize)},
			{"limits: page bytes", m.Limits.PageBytes, o.Limits.PageBytes},
		}
		for _, f := range fields {
			if f.l != f.r {
				return &ConfigMismatch{Field: f.name, Registering: m, Other: o,
					Local: strconv.FormatInt(f.l, 10), OtherValue: strconv.FormatInt(f.r, 10)}
			}
		}
		if o.Limits != m.Limits {
			// A field added to Limits and not listed above.
			return &ConfigMismatch{Field: "limits", Registering: m, Other: o,
				Local: fmt.Sprintf("%+v", m.Limits), OtherValue: fmt.Sprintf("%+v", o.Limits)}
		}
	}
	return nil
}

// CapacityMismatch is the error Register returns when a decode node's KV
// pool cannot hold the cluster's window with a registered (or the
// registering) node's safety margin: the incident's capacity mismatch,
// across nodes. It wraps ErrConfigMismatch.
type CapacityMismatch struct {
	Decode Member  // the node whose pool is too small
	Margin float64 // the margin it cannot hold the window with
	Of     Member  // the node whose margin that is
	// Registering says which of the two is the registering node.
	Registering Member
}

func (e *CapacityMismatch) Error() string {
	d := e.Decode
	need := int64(math.Ceil(float64(d.Limits.MaxContext) * e.Margin))
	whose := "its own"
	if e.Of.Name != d.Name {
		whose = "that of " + e.Of.String()
	}
	return fmt.Sprintf("%v: capacity: decode node %v holds %d KV tokens (%d pages of %d), below the window %d × safety margin %g (%s) = %d tokens; "+
		"give %v more --kv-memory, or run every node with a --kv-safety-margin of at most %.2f",
		ErrConfigMismatch, d, d.UsableTokens(), d.UsablePages, d.Limits.PageSize, d.Limits.MaxContext, e.Margin, whose, need,
		d, float64(d.UsableTokens())/float64(max(d.Limits.MaxContext, 1)))
}

func (e *CapacityMismatch) Unwrap() error { return ErrConfigMismatch }

// checkCapacity refuses m if a decode node, m or a registered one, could
// not hold the window with m's margin or a registered node's: with the
// window the same on every node (checkConfig), every request the gateway
// admits then fits every decode node it may be sent to, with the margin.
func checkCapacity(m Member, registered []Member) error {
	short := func(d, of Member) error {
		if of.SafetyMargin == 0 || d.Holds(of.SafetyMargin) {
			return nil
		}
		return &CapacityMismatch{Decode: d, Margin: of.SafetyMargin, Of: of, Registering: m}
	}
	if err := short(m, m); err != nil {
		return err
	}
	for _, o := range registered {
		if err := short(m, o); err != nil {
			return err
		}
		if err := short(o, m); err != nil {
			return err
		}
	}
	return nil
}
