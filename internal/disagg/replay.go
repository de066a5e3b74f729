package disagg

import (
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// servedRemembered bounds how many finished requests' nodes the router
// remembers for their audit re-scores (a re-score runs soon after its
// answer; one that comes later runs wherever the load says).
const servedRemembered = 4096

// servedBy is a ring of finished requests' prefill and decode nodes.
// Guarded by Router.mu.
type servedBy struct {
	by   map[request.Owner][2]transfer.Peer
	ring []request.Owner
	next int
}

func (s *servedBy) note(o request.Owner, prefill, decode transfer.Peer) {
	if s.by == nil {
		s.by = make(map[request.Owner][2]transfer.Peer)
	}
	if _, ok := s.by[o]; !ok {
		if len(s.ring) < servedRemembered {
			s.ring = append(s.ring, o)
		} else {
			delete(s.by, s.ring[s.next])
			s.ring[s.next] = o
			s.next = (s.next + 1) % servedRemembered
		}
	}
	s.by[o] = [2]transfer.Peer{prefill, decode}
}

// elsewhere says where orig's re-score should not run: the prefill node
// that computed orig's prompt (as a skip set for pickPrefill) if another
// prefill node is in rotation, and the decode node that generated it if
// another decode node is. Called with rt.mu held.
func (rt *Router) elsewhere(orig request.Owner) (skipPrefill map[transfer.Peer]bool, avoidDecode transfer.Peer) {
	nodes, ok := rt.served.by[orig]
	if !ok {
		return nil, ""
	}
	up := func(list []transfer.Peer, n transfer.Peer) bool {
		for _, m := range list {
			if m != n && !rt.isDown(m) {
				return true
			}
		}
		return false
	}
	if nodes[0] != "" && up(rt.prefill, nodes[0]) {
		skipPrefill = map[transfer.Peer]bool{nodes[0]: true}
	}
	if nodes[1] != "" && up(rt.decode, nodes[1]) {
		avoidDecode = nodes[1]
	}
	return skipPrefill, avoidDecode
}

// servedOf reports the nodes that ran o, for tests.
func (rt *Router) servedOf(o request.Owner) (prefill, decode transfer.Peer, ok bool) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	n, ok := rt.served.by[o]
	return n[0], n[1], ok
}
