package transfer

// The load plane: a gateway asks each node how much room and work it has,
// and routes on the answers (DESIGN.md, "Routing"). A node that stops
// answering is taken out of rotation by the gateway even while its link
// is up (a hung process, a stuck loop): the answers are also its
// liveness. Nothing here carries a tenant, a prompt or a page.

// LoadQuery asks a node for its Load (gateway → prefill, decode). Seq
// lets the gateway drop an answer older than one it already has.
type LoadQuery struct{ Seq uint64 }

// Load is a node's answer to a LoadQuery: its scheduler's figures as it
// last published them.
type Load struct {
	Seq         uint64
	UsablePages int // the pool's pages
	FreePages   int // free now, not counting evictable prefix-cache pages
	CachedPages int // prefix-cache pages a new request may evict
	Queued      int // requests waiting for admission
	Running     int // sequences admitted
}

// Room is how many pages a new request can have on the node now.
func (l *Load) Room() int { return l.FreePages + l.CachedPages }

func (*LoadQuery) Type() MsgType { return MsgLoadQuery }
func (*Load) Type() MsgType      { return MsgLoad }

func (e *encoder) loadPlane(m Message) bool {
	switch m := m.(type) {
	case *LoadQuery:
		e.u64(m.Seq)
	case *Load:
		e.u64(m.Seq)
		e.int32("usable pages", m.UsablePages, MaxPages)
		e.int32("free pages", m.FreePages, MaxPages)
		e.int32("cached pages", m.CachedPages, MaxPages)
		e.int32("queued", m.Queued, maxInt32)
		e.int32("running", m.Running, maxInt32)
		if m.FreePages+m.CachedPages > m.UsablePages {
			e.fail("load: %d free and %d cached of %d pages", m.FreePages, m.CachedPages, m.UsablePages)
		}
	default:
		return false
	}
	return true
}

func (d *decoder) loadPlane(t MsgType) (Message, bool) {
	switch t {
	case MsgLoadQuery:
		return &LoadQuery{Seq: d.u64()}, true
	case MsgLoad:
		l := &Load{Seq: d.u64()}
		l.UsablePages = d.int32("usable pages", MaxPages)
		l.FreePages = d.int32("free pages", MaxPages)
		l.CachedPages = d.int32("cached pages", MaxPages)
		l.Queued = d.int32("queued", maxInt32)
		l.Running = d.int32("running", maxInt32)
		if d.err == nil && l.FreePages+l.CachedPages > l.UsablePages {
			d.fail("load: %d free and %d cached of %d pages", l.FreePages, l.CachedPages, l.UsablePages)
		}
		return l, true
	}
	return nil, false
}
