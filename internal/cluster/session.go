package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// Session is a node's registration: its key, attached to a lease that the
// session keeps alive until Close or until it is lost.
type Session struct {
	c      *Client
	key    string
	member Member
	cancel context.CancelFunc // ends the keep-alive and the key watch
	done   chan struct{}
	err    error // set before done closes
	once   sync.Once
	closed chan struct{} // Close began
	closer sync.Once
	// renewed is when etcd last confirmed the lease (unix nanoseconds):
	// the keep-alive's last answer, or, before the first, when the lease
	// was asked for.
	renewed atomic.Int64
}

// registerAttempts bounds how often Register retries when the member set
// changed between its read and its write.
const registerAttempts = 8

// Register checks m against the registered nodes (ErrConfigMismatch: the
// layout, the limits, and each decode node's capacity against every
// node's safety margin) and
// registers it under a new lease that the returned Session keeps alive.
// It refuses a name that a live node holds in any role (ErrNameTaken).
// An empty m.Started is set to now.
func (c *Client) Register(ctx context.Context, m Member) (*Session, error) {
	if m.Started.IsZero() {
		m.Started = time.Now()
	}
	m.Started = m.Started.UTC().Round(time.Millisecond)
	if err := m.Validate(); err != nil {
		return nil, err
	}
	val, err := encodeMember(m)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, c.cfg.DialTimeout)
	defer cancel()
	asked := time.Now() // etcd grants the lease after this: it lives at least TTL from here
	lease, err := c.etcd.Grant(rctx, int64(c.cfg.TTL/time.Second))
	if err != nil {
		return nil, fmt.Errorf("%w: lease: %v", ErrUnavailable, err)
	}
	registered := false
	defer func() {
		if !registered {
			// Not registered: the lease holds nothing; give it back now
			// rather than at its expiry.
			rctx, cancel := context.WithTimeout(context.Background(), c.cfg.DialTimeout)
			_, _ = c.etcd.Revoke(rctx, lease.ID)
			cancel()
		}
	}()
	key := c.key(m.Role, m.Name)
	var nameKeys []clientv3.Cmp
	var gets []clientv3.Op
	for _, r := range []transfer.Role{transfer.RoleGateway, transfer.RolePrefill, transfer.RoleDecode} {
		k := c.key(r, m.Name)
		nameKeys = append(nameKeys, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
		gets = append(gets, clientv3.OpGet(k))
	}
	for range registerAttempts {
		members, rev, bad, err := c.Members(rctx)
		if err != nil {
			return nil, err
		}
		if len(bad) > 0 {
			// A record that cannot be read could hide a mismatch.
			return nil, fmt.Errorf("cannot check the cluster's configuration: %w", errors.Join(bad...))
		}
		others := members[:0:0]
		for _, o := range members {
			if o.Name == m.Name {
				return nil, taken(m, o, c.cfg.TTL)
			}
			others = append(others, o)
		}
		if err := checkConfig(m, others); err != nil {
			return nil, err
		}
		if err := checkCapacity(m, others); err != nil {
			return nil, err
		}
		// Write only if the name is free in every role and no member
		// changed since the read: the check above still holds.
		conds := append(nameKeys[:len(nameKeys):len(nameKeys)],
			clientv3.Compare(clientv3.ModRevision(c.nodesPrefix()).WithPrefix(), "<", rev+1))
		resp, err := c.etcd.Txn(rctx).If(conds...).
			Then(clientv3.OpPut(key, string(val), clientv3.WithLease(lease.ID))).
			Else(gets...).Commit()
		if err != nil {
			return nil, fmt.Errorf("%w: registering %v: %v", ErrUnavailable, m, err)
		}
		if resp.Succeeded {
			registered = true
			m.Lease, m.Revision = int64(lease.ID), resp.Header.Revision
			return c.keepAlive(key, m, asked)
		}
		for _, r := range resp.Responses {
			if kvs := r.GetResponseRange().GetKvs(); len(kvs) > 0 {
				o, err := c.decode(kvs[0].Key, kvs[0].Value, kvs[0].Lease, kvs[0].CreateRevision)
				if err != nil {
					return nil, fmt.Errorf("%w: %v", ErrNameTaken, err)
				}
				return nil, taken(m, o, c.cfg.TTL)
			}
		}
		// Another node joined or left meanwhile: check again.
	}
	return nil, fmt.Errorf("%w: the member set kept changing while %v registered", ErrUnavailable, m)
}

func taken(m, o Member, ttl time.Duration) error {
	return fmt.Errorf("%w: %s is registered as %v (at %s, started %s, lease %x); if that node is gone, its lease expires within %v",
		ErrNameTaken, m.Name, o, cmp.Or(o.Addr, "no address"), o.Started.Format(time.RFC3339), o.Lease, ttl)
}

// keepAlive starts the session of a registered node.
func (c *Client) keepAlive(key string, m Member, asked time.Time) (*Session, error) {
	ctx, cancel := context.WithCancel(context.Background())
	ka, err := c.etcd.KeepAlive(ctx, clientv3.LeaseID(m.Lease))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("%w: keep-alive: %v", ErrUnavailable, err)
	}
	s := &Session{c: c, key: key, member: m, cancel: cancel, done: make(chan struct{}), closed: make(chan struct{})}
	s.renewed.Store(asked.UnixNano())
	// The key is watched too: deleted by hand, or taken over after a
	// deletion, it no longer lists this node.
	wch := c.etcd.Watch(ctx, key, clientv3.WithRev(m.Revision+1))
	go s.run(ctx, ka, wch)
	return s, nil
}

func (s *Session) run(ctx context.Context, ka <-chan *clientv3.LeaseKeepAliveResponse, wch clientv3.WatchChan) {
	for {
		select {
		case resp, ok := <-ka:
			if ok && resp != nil && resp.TTL > 0 {
				s.renewed.Store(time.Now().UnixNano())
			}
			if !ok {
				s.lose(fmt.Errorf("%w: %v: the lease's keep-alive ended (the lease expired or was revoked, or etcd did not answer for %v)", ErrSessionLost, s.member, s.c.cfg.TTL))
				return
			}
		case resp, ok := <-wch:
			if !ok || resp.Canceled {
				if ctx.Err() != nil {
					s.lose(nil)
					return
				}
				// The watch ended (a compaction): the keep-alive still
				// says whether the lease lives.
				wch = nil
				continue
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete || ev.Kv.CreateRevision != s.member.Revision {
					s.lose(fmt.Errorf("%w: %v: its registration was deleted at revision %d (its lease expired or was revoked, or the key was deleted)", ErrSessionLost, s.member, resp.Header.Revision))
					return
				}
			}
		case <-ctx.Done():
			s.lose(nil)
			return
		}
	}
}

// lose ends the session with err (nil: closed), once.
func (s *Session) lose(err error) {
	s.once.Do(func() {
		select {
		case <-s.closed:
			err = nil
		default:
		}
		if err != nil {
			s.c.log.Error("cluster membership lost", "member", s.member.String(), "err", err)
		}
		s.err = err
		s.cancel()
		close(s.done)
	})
}

// Renewed is when etcd last confirmed the session's lease. etcd renewed
// it no earlier than the request for that confirmation left, so the lease
// lives until at least Renewed + TTL − the round trip.
func (s *Session) Renewed() time.Time { return time.Unix(0, s.renewed.Load()) }

// Stale reports whether etcd has not confirmed the lease for two thirds
// of its TTL. The keep-alive renews every TTL/3, so that is one renewal
// missed by more than a round trip; and the lease, renewed no earlier
// than Renewed − the round trip, still lives for TTL/3 less that round
// trip. A stale node stops taking new work then — before etcd, and every
// node watching it, can hold it gone — rather than when its own
// keep-alive gives up, which can be after the expiry (fencing).
func (s *Session) Stale(now time.Time) bool { return now.Sub(s.Renewed()) > 2*s.c.cfg.TTL/3 }

// Member is the node as registered, with its lease and revision.
func (s *Session) Member() Member { return s.member }

// Done is closed when the session ends: lost, or closed.
func (s *Session) Done() <-chan struct{} { return s.done }

// Err says why the session ended: an ErrSessionLost, or nil after Close
// (or while it lives).
func (s *Session) Err() error {
	select {
	case <-s.done:
		return s.err
	default:
		return nil
	}
}

// Close leaves the cluster at once: the lease is revoked, which deletes
// the node's key (watchers see it go), rather than left to expire. After
// the session was lost there is nothing to revoke.
func (s *Session) Close() error {
	first := false
	s.closer.Do(func() { first = true; close(s.closed) })
	if !first {
		<-s.done
		return nil
	}
	select {
	case <-s.done:
		return nil
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.c.cfg.DialTimeout)
	defer cancel()
	_, err := s.c.etcd.Revoke(ctx, clientv3.LeaseID(s.member.Lease))
	s.lose(nil)
	if err != nil {
		return fmt.Errorf("%w: revoking %v's lease (it expires within %v): %v", ErrUnavailable, s.member, s.c.cfg.TTL, err)
	}
	return nil
}
