package disagg

import (
	"context"
	"sync"
	"time"

	"github.com/pagewarden/pagewarden/internal/transfer"
)

// What the router knows of each node's load (transfer.Load): the node's
// own figures, asked for every LoadEvery, corrected by what this router
// sent the node since the answer (another gateway's requests show up in
// the next answer). A node that leaves queries unanswered for SilentAfter
// is out of rotation until it answers again, even with its link up: a
// hung process is not picked for new work. Its requests in flight are
// left to their leases and link, which end them with an error if the node
// is really gone; a node that is only slow must not lose them.

// nodeLoad is the router's view of one node. Guarded by Router.mu.
type nodeLoad struct {
	last  transfer.Load
	known bool      // last holds an answer
	asked time.Time // the first query not answered yet (zero: none)
	pages int       // pages promised to the node since last
	reqs  int       // requests sent to the node since last
	// querying: a query to the node is still being written (its link
	// is slow to take frames); the next is not sent until it is.
	querying bool
}

// loadOf returns node's entry, made on first use. Called with rt.mu held.
func (rt *Router) loadOf(node transfer.Peer) *nodeLoad {
	l := rt.loads[node]
	if l == nil {
		l = &nodeLoad{}
		rt.loads[node] = l
	}
	return l
}

// silent reports whether node has left a query unanswered for longer than
// SilentAfter. Called with rt.mu held.
func (rt *Router) silent(node transfer.Peer, now time.Time) bool {
	l := rt.loads[node]
	return l != nil && !l.asked.IsZero() && now.Sub(l.asked) > rt.cfg.SilentAfter
}

// work is how busy a node is: requests queued and running on it, by its
// last answer and what this router sent it since, and never less than
// what this router alone has in flight there. Called with rt.mu held.
func (rt *Router) work(node transfer.Peer, inFlight int) int {
	l := rt.loads[node]
	if l == nil || !l.known {
		return inFlight
	}
	return max(inFlight, l.last.Queued+l.last.Running+l.reqs)
}

// room is how many pages a decode node can give a new request, by its last
// answer less what this router promised it since; ok is false when the
// node has not answered yet. Called with rt.mu held.
func (rt *Router) room(node transfer.Peer) (pages int, ok bool) {
	l := rt.loads[node]
	if l == nil || !l.known {
		return 0, false
	}
	return l.last.Room() - l.pages, true
}

// sentSince is how many requests this router sent node since its last
// answer (all of them, when it has not answered yet). Called with rt.mu
// held.
func (rt *Router) sentSince(node transfer.Peer) int {
	if l := rt.loads[node]; l != nil {
		return l.reqs
	}
	return 0
}

// sent records a request (and its worst-case pages, for a decode node)
// sent to node. Called with rt.mu held.
func (rt *Router) sent(node transfer.Peer, pages int) {
	l := rt.loadOf(node)
	l.reqs++
	l.pages += pages
}

// loaded takes a node's answer. Called on the router's loop.
func (rt *Router) loaded(from transfer.Peer, m *transfer.Load) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	l := rt.loads[from]
	if l == nil || (l.known && m.Seq < l.last.Seq) {
		return // not a node this router asked, or older than what it has
	}
	l.last, l.known, l.asked, l.pages, l.reqs = *m, true, time.Time{}, 0, 0
}

// poll asks every node for its load, every LoadEvery, until ctx ends.
// Each query is written by a goroutine of its own, with sendTimeout like
// every other control message: a Send whose context ends while the link
// is taking the frame closes the link, and a node busy importing pages
// can leave its link full for longer than LoadEvery; the link is shared
// with every request on that node, so a query must not be what tears it
// down. A node whose query is still being written is not asked again
// meanwhile (it falls silent if that lasts, see silent). A send that
// fails is left to the link's own down-marking.
func (rt *Router) poll(ctx context.Context) {
	var writers sync.WaitGroup
	defer writers.Wait()
	tick := time.NewTicker(rt.cfg.LoadEvery)
	defer tick.Stop()
	for {
		rt.mu.Lock()
		nodes := append(append([]transfer.Peer(nil), rt.prefill...), rt.decode...)
		rt.seq++
		seq, now := rt.seq, time.Now()
		var ask []transfer.Peer
		for _, n := range nodes {
			l := rt.loadOf(n)
			if l.asked.IsZero() {
				l.asked = now
			}
			if !l.querying {
				l.querying = true
				ask = append(ask, n)
			}
		}
		rt.mu.Unlock()
		for _, n := range ask {
			writers.Go(func() {
				sctx, cancel := context.WithTimeout(ctx, sendTimeout)
				_ = rt.cfg.Transport.Send(sctx, n, &transfer.LoadQuery{Seq: seq})
				cancel()
				rt.mu.Lock()
				if l := rt.loads[n]; l != nil { // nil: the node left meanwhile
					l.querying = false
				}
				rt.mu.Unlock()
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
