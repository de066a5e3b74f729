package cluster

import (
	"context"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// ChangeKind says how a member changed.
type ChangeKind uint8

const (
	// Joined: a node registered (or was listed at the start of a watch).
	Joined ChangeKind = 1 + iota
	// Left: a node's key is gone (Session.Close, lease expiry).
	Left
	// Updated: a node's record changed under the same registration.
	Updated
)

func (k ChangeKind) String() string {
	switch k {
	case Joined:
		return "joined"
	case Left:
		return "left"
	case Updated:
		return "updated"
	}
	return "ChangeKind(?)"
}

// Change is one member's change.
type Change struct {
	Kind   ChangeKind
	Member Member // for Left, the member as last seen
}

// View is the member set as of an etcd revision, and what changed since
// the previous View of the same Watch.
type View struct {
	Members  []Member // sorted by role, then name
	Changes  []Change
	Revision int64
}

// Peers returns the names of the members of role, in Members' order.
func (v View) Peers(role transfer.Role) []transfer.Peer {
	var out []transfer.Peer
	for _, m := range v.Members {
		if m.Role == role {
			out = append(out, m.Name)
		}
	}
	return out
}

// Watch calls fn with the member set, then again after every change,
// until ctx ends (it returns ctx's error). fn runs on Watch's goroutine,
// one call at a time; a slow fn delays later Views, never reorders them.
// If the watch breaks (etcd unreachable, a compaction) Watch lists the
// members again and reports what changed meanwhile; while etcd is
// unreachable the last View stands.
func (c *Client) Watch(ctx context.Context, fn func(View)) error {
	cur := map[string]Member{} // by key
	first := true
	backoff := 50 * time.Millisecond
	for {
		resp, err := c.etcd.Get(ctx, c.nodesPrefix(), clientv3.WithPrefix())
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			c.log.Warn("cluster: listing members failed; retrying", "err", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return ctx.Err()
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		backoff = 50 * time.Millisecond
		next := map[string]Member{}
		for _, kv := range resp.Kvs {
			if m, ok := c.member(kv); ok {
				next[string(kv.Key)] = m
			}
		}
		var changes []Change
		for k, m := range next {
			if o, ok := cur[k]; !ok || o.Revision != m.Revision {
				if ok {
					changes = append(changes, Change{Kind: Left, Member: o})
				}
				changes = append(changes, Change{Kind: Joined, Member: m})
			} else if o != m {
				changes = append(changes, Change{Kind: Updated, Member: m})
			}
		}
		for k, o := range cur {
			if _, ok := next[k]; !ok {
				changes = append(changes, Change{Kind: Left, Member: o})
			}
		}
		cur = next
		rev := resp.Header.Revision
		if first || len(changes) > 0 {
			first = false
			fn(view(cur, changes, rev))
		}

		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		wch := c.etcd.Watch(wctx, c.nodesPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if resp.Canceled || resp.Err() != nil {
				c.log.Info("cluster: watch ended; listing members again", "err", resp.Err())
				break
			}
			var changes []Change
			for _, ev := range resp.Events {
				k := string(ev.Kv.Key)
				o, had := cur[k]
				switch ev.Type {
				case clientv3.EventTypeDelete:
					if had {
						delete(cur, k)
						changes = append(changes, Change{Kind: Left, Member: o})
					}
				case clientv3.EventTypePut:
					m, ok := c.member(ev.Kv)
					switch {
					case !ok && had:
						delete(cur, k)
						changes = append(changes, Change{Kind: Left, Member: o})
					case !ok:
					case had && o.Revision == m.Revision:
						cur[k] = m
						changes = append(changes, Change{Kind: Updated, Member: m})
					default:
						if had {
							changes = append(changes, Change{Kind: Left, Member: o})
						}
						cur[k] = m
						changes = append(changes, Change{Kind: Joined, Member: m})
					}
				}
			}
			if len(changes) > 0 {
				fn(view(cur, changes, resp.Header.Revision))
			}
		}
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// member decodes a watched key, logging a record it cannot read.
func (c *Client) member(kv interface {
	GetKey() []byte
	GetValue() []byte
	GetLease() int64
	GetCreateRevision() int64
}) (Member, bool) {
	m, err := c.decode(kv.GetKey(), kv.GetValue(), kv.GetLease(), kv.GetCreateRevision())
	if err != nil {
		c.log.Warn("cluster: member record left out", "err", err)
		return Member{}, false
	}
	return m, true
}

func view(cur map[string]Member, changes []Change, rev int64) View {
	ms := slices.Collect(maps.Values(cur))
	sortMembers(ms)
	return View{Members: ms, Changes: changes, Revision: rev}
}
