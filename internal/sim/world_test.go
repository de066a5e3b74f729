package sim

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

type peer = transfer.Peer

const (
	gwName peer = "gateway"
	pfName peer = "prefill-0"
)

// The jobs the gateway and the nodes exchange beside the handoff's
// protocol. They travel on reliable, ordered links (a stream transport:
// they may be late, never lost or reordered); the handoff's messages
// travel on the faulty transport.
type (
	// reserveJob is the gateway's Generate: reserve the prompt's pages
	// on a decode node and decode the request once its KV arrives.
	reserveJob struct {
		transfer.Reserve
		params request.Params
	}
	// prefillJob asks the prefill node to compute a prompt into a grant.
	prefillJob struct {
		grant  transfer.Grant
		params request.Params
		decode peer
	}
	// tokensMsg and resultMsg are a decode node's stream to the gateway.
	tokensMsg struct{ toks []request.Token }
	resultMsg struct{ res request.Result }
)

// envelope is one message on the way.
type envelope struct {
	from, to peer
	body     any
	at       time.Time
	n        uint64
}

// violation is a broken invariant: the simulation stops at the first.
type violation struct {
	invariant string // which promise of the package comment
	detail    string
}

func (v *violation) Error() string { return v.invariant + ": " + v.detail }

// Names of the invariants, as the mutant table expects them.
const (
	invOwner    = "page ownership"
	invRead     = "read of KV not its own"
	invWriter   = "free with a writer in flight"
	invTerminal = "one terminal state"
	invAbort    = "aborted or over-long request succeeded"
	invEcho     = "token differs from the owner-echo expectation"
	invBaseline = "pages back to baseline"
	invHTTP     = "HTTP answer"
	invCore     = "driver contract"
	// A check of a core's own that panicked (package invariants) or that
	// its CheckInvariants reported, by the package that holds it.
	invPool       = "pool invariant (kvcache)"
	invSched      = "scheduler invariant (sched)"
	invHandoff    = "handoff invariant (transfer)"
	invQuiescence = "quiescence"
)

func violated(inv, format string, args ...any) error {
	return &violation{invariant: inv, detail: fmt.Sprintf(format, args...)}
}

// faults are one seed's fault rates, per mille of the messages or steps
// they apply to.
type faults struct {
	loss, dup   int // handoff messages lost, duplicated
	maxDelay    time.Duration
	tear, short int // handoffs whose manifest covers fewer pages / whose last page lost a position
	restart     int // per mille of steps: the prefill node, or a decode node, restarts
	stall       int // per mille of steps: the clock jumps seconds (leases expire)
	slowWrite   int // page writes that take seconds (fenced at the drain deadline)
}

// network carries envelopes between the nodes.
type network struct {
	w     *world
	q     []*envelope
	n     uint64
	links map[[2]peer]time.Time // reliable links: the last delivery time
	// torn and short are the handoffs the transport damages (decided when
	// it sees the grant), and shortDigest the digest of a shortened
	// last page, for the manifest that follows it.
	torn        map[transfer.ReservationID]int
	short       map[transfer.ReservationID]bool
	shortDigest map[transfer.ReservationID][32]byte
}

func (nw *network) delay() time.Duration {
	if nw.w.f.maxDelay <= 0 {
		return 0
	}
	return time.Duration(nw.w.rng.Int64N(int64(nw.w.f.maxDelay)))
}

func (nw *network) push(from, to peer, body any, at time.Time) {
	nw.n++
	nw.q = append(nw.q, &envelope{from: from, to: to, body: body, at: at, n: nw.n})
}

// reliable sends body in order behind everything sent before on the link.
func (nw *network) reliable(from, to peer, body any) {
	k := [2]peer{from, to}
	at := nw.w.now.Add(nw.delay())
	if last := nw.links[k]; at.Before(last) {
		at = last
	}
	nw.links[k] = at
	nw.push(from, to, body, at)
}

// lossy sends a handoff message through the faulty transport: it may be
// lost, duplicated, delayed past later ones, or damaged as the seed's
// torn and short handoffs say.
func (nw *network) lossy(from, to peer, m transfer.Message) {
	w := nw.w
	if !w.quiet && w.rng.IntN(1000) < w.f.loss {
		w.logf("lost %T %s->%s", m, from, to)
		return
	}
	m = nw.damage(m)
	if m == nil {
		return
	}
	nw.push(from, to, m, w.now.Add(nw.delay()))
	if !w.quiet && w.rng.IntN(1000) < w.f.dup {
		nw.push(from, to, m, w.now.Add(nw.delay()))
	}
}

// damage applies the seed's handoff damage: a torn handoff loses its
// pages from index k on and its manifest announces only the first k (a
// sender that handed off part of the prompt, as the incident's did); a
// short one loses the last position of its last page, consistently in
// the page and the manifest. Both must be refused by the receiver.
func (nw *network) damage(m transfer.Message) transfer.Message {
	w := nw.w
	switch m := m.(type) {
	case *transfer.Grant:
		_, torn := nw.torn[m.ID]
		if w.quiet || torn || nw.short[m.ID] {
			return m // decided once per handoff, whatever copies follow
		}
		ps := w.layout.PageSize
		last := m.PromptTokens - (m.PageCount-1)*ps
		switch {
		case m.PageCount >= 2 && w.rng.IntN(1000) < w.f.tear:
			nw.torn[m.ID] = 1 + w.rng.IntN(m.PageCount-1)
		case last >= 2 && w.rng.IntN(1000) < w.f.short:
			nw.short[m.ID] = true
		}
	case *transfer.Page:
		if k, ok := nw.torn[m.ID]; ok && m.Index >= k {
			w.logf("tore page %d of %v", m.Index, m.Ref)
			return nil
		}
		if nw.short[m.ID] && m.Index == nw.lastIndex(m.Ref) {
			c := *m
			c.Filled--
			row := len(m.Data) / 2 / m.Filled // bytes of one position's K (or V)
			c.Data = append(slices.Clone(m.Data[:c.Filled*row]), m.Data[m.Filled*row:m.Filled*row+c.Filled*row]...)
			nw.shortDigest[m.ID] = transfer.PageDigest(c.Index, c.Filled, c.Data)
			w.logf("shortened page %d of %v to %d positions", m.Index, m.Ref, c.Filled)
			return &c
		}
	case *transfer.Manifest:
		if k, ok := nw.torn[m.ID]; ok && m.PageCount > k {
			c := *m
			c.PageCount, c.Filled, c.PageDigests = k, m.Filled[:k], m.PageDigests[:k]
			c.TotalTokens = 0
			for _, f := range c.Filled {
				c.TotalTokens += f
			}
			w.logf("tore the manifest of %v to %d pages", m.Ref, k)
			return &c
		}
		if d, ok := nw.shortDigest[m.ID]; ok && m.PageCount > 0 {
			c := *m
			c.Filled, c.PageDigests = slices.Clone(m.Filled), slices.Clone(m.PageDigests)
			c.Filled[c.PageCount-1]--
			c.PageDigests[c.PageCount-1] = d
			c.TotalTokens--
			return &c
		}
	}
	return m
}

// lastIndex is the last page index of a reservation the gateway knows.
func (nw *network) lastIndex(ref transfer.Ref) int {
	c := nw.w.gw.calls[ref.Owner]
	if c == nil || c.grant == nil {
		return -1
	}
	return c.grant.PageCount - 1
}

// due removes and returns the envelopes due now, in delivery order.
func (nw *network) due() []*envelope {
	var out []*envelope
	keep := nw.q[:0]
	for _, e := range nw.q {
		if !e.at.After(nw.w.now) {
			out = append(out, e)
		} else {
			keep = append(keep, e)
		}
	}
	clear(nw.q[len(keep):])
	nw.q = keep
	slices.SortFunc(out, func(a, b *envelope) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return int(a.n - b.n)
	})
	return out
}

// dropTo discards what is on the way to or from a node that restarted:
// its connections broke.
func (nw *network) dropTo(to peer) {
	nw.q = slices.DeleteFunc(nw.q, func(e *envelope) bool { return e.to == to || e.from == to })
	for k := range nw.links {
		if k[1] == to || k[0] == to {
			delete(nw.links, k)
		}
	}
}

// node is what the prefill and decode nodes share: a pool, a core and the
// owner-echo executor.
type node struct {
	w    *world
	name peer
	pool *kvcache.Pool
	core *sched.Core
	lim  sched.Limits
	exec *echoExecutor
	// abortLanded: an abort reached the core while the request was live;
	// from then on nothing may report success for it.
	abortLanded map[request.Owner]bool
	results     map[request.Owner]int
}

func (w *world) newNode(name peer, pages int, prefix bool) (*node, error) {
	lim, err := sched.ComputeLimits(sched.ModelShape{ContextLength: w.window, Vocab: w.vocab}, w.layout, pages, w.window, 1)
	if err != nil {
		return nil, err
	}
	pool, err := kvcache.NewPool(kvcache.Config{Layout: w.layout, Pages: pages, Scrub: kvcache.ScrubPoison, VerifyScrub: true})
	if err != nil {
		return nil, err
	}
	core, err := sched.NewCore(sched.Config{
		Limits: lim, Pool: pool,
		MaxBatchTokens: []int{2, 8, 64}[w.rng.IntN(3)],
		MaxRunning:     []int{3, 8, 64}[w.rng.IntN(3)],
		WatermarkPages: -1,
		PrefixCache:    prefix,
	})
	if err != nil {
		return nil, err
	}
	return &node{
		w: w, name: name, pool: pool, core: core, lim: lim,
		exec:        &echoExecutor{node: string(name), vocab: w.vocab, salt: w.saltOf},
		abortLanded: map[request.Owner]bool{},
		results:     map[request.Owner]int{},
	}, nil
}

// abort applies a client's abort to the core and records whether it
// landed on a live request.
func (n *node) abort(o request.Owner) {
	st, known := n.core.State(o)
	if err := n.core.Abort(o); err == nil && known && !st.Terminal() {
		n.abortLanded[o] = true
		n.w.logf("%s: abort of %v landed in %v", n.name, o, st)
	}
}

// execute runs the core's batch on the owner-echo model.
func (n *node) execute(b *sched.Batch) error {
	if b == nil {
		return nil
	}
	outs, err := n.exec.Execute(nil, b)
	if len(n.exec.foreign) > 0 {
		return violated(invRead, "%v", n.exec.foreign)
	}
	return n.core.Advance(b, outs, err)
}

// result checks one result the core handed out.
func (n *node) result(res request.Result) error {
	n.results[res.Owner]++
	if n.results[res.Owner] > 1 {
		return violated(invTerminal, "%s: second result for %v (%v)", n.name, res.Owner, res.Reason)
	}
	if n.abortLanded[res.Owner] && res.Reason.Success() {
		return violated(invAbort, "%s: %v was aborted but reports success (%v)", n.name, res.Owner, res.Reason)
	}
	return nil
}

// check audits the node: the core's and the pool's own invariants, and
// that every owned page belongs to a request the core still holds.
func (n *node) check() error {
	if err := n.core.CheckInvariants(); err != nil {
		return violated(invSched, "%s: %v", n.name, err)
	}
	if err := n.pool.CheckInvariants(); err != nil {
		return violated(invOwner, "%s: %v", n.name, err)
	}
	if v := n.pool.Violations(); v != 0 {
		return violated(invOwner, "%s: the pool counted %d isolation violations", n.name, v)
	}
	n.w.snap = n.pool.Snapshot(n.w.snap[:0])
	for i, p := range n.w.snap {
		if p.State != kvcache.PageOwned {
			continue
		}
		if _, ok := n.core.State(p.Owner); !ok {
			return violated(invOwner, "%s: page %d is owned by %v, which the core does not hold", n.name, i+1, p.Owner)
		}
	}
	return nil
}

// prefillNode is the prefill node's driver: SubmitPrefill into its core,
// and the handoff's sender.
type prefillNode struct {
	*node
	gen  int
	send *transfer.Sender
	jobs map[transfer.ReservationID]*pjob
	by   map[request.Owner]transfer.ReservationID
	// reads are page reads in flight (SendPage granted, Sent not yet
	// reported): the page goes on the wire when the read lands.
	reads []*pread
}

type pread struct {
	to   peer
	page transfer.Page
	due  time.Time
}

type pjob struct {
	grant           transfer.Grant
	decode, gateway peer
	params          request.Params
	pages           [][]byte
	exported        bool
}

func (w *world) newPrefill() (*prefillNode, error) {
	n, err := w.newNode(pfName, w.prefillPages, w.prefixCache)
	if err != nil {
		return nil, err
	}
	s, err := transfer.NewSender(transfer.SenderConfig{
		Layout: w.tlayout, HeartbeatEvery: transfer.Second * 3 / 10, DrainTimeout: transfer.Second,
		RetryEvery: transfer.Second / 5, AbortTTL: 5 * transfer.Second,
	}, w.tnow())
	if err != nil {
		return nil, err
	}
	return &prefillNode{node: n, send: s, jobs: map[transfer.ReservationID]*pjob{}, by: map[request.Owner]transfer.ReservationID{}}, nil
}

func (p *prefillNode) deliver(e *envelope) error {
	p.send.Tick(p.w.tnow())
	switch m := e.body.(type) {
	case prefillJob:
		g := m.grant
		if len(m.params.Prompt) != g.PromptTokens || m.params.MaxTokens != g.MaxNewTokens {
			p.w.net.lossy(p.name, e.from, &transfer.Abort{Ref: g.Ref, Reason: transfer.ReasonMalformed})
			return nil
		}
		if err := p.send.Start(g, m.decode, e.from); err != nil {
			if !errors.Is(err, transfer.ErrDuplicate) {
				p.w.net.lossy(p.name, e.from, &transfer.Abort{Ref: g.Ref, Reason: transfer.ReasonMalformed})
			}
			return nil
		}
		j := &pjob{grant: g, decode: m.decode, gateway: e.from, params: m.params}
		p.jobs[g.ID] = j
		p.by[g.Owner] = g.ID
		adm, err := p.lim.Admit(m.params)
		if err == nil {
			err = p.core.SubmitPrefill(adm)
		}
		if err != nil {
			p.w.logf("prefill: %v refused: %v", g.Owner, err)
			_ = p.send.Abort(g.ID, prefillReason(err))
		}
	case *transfer.Abort:
		_ = p.send.Step(e.from, m)
		if j := p.jobs[m.ID]; j != nil && j.grant.Ref == m.Ref {
			p.abort(j.grant.Owner) // stop computing what nobody will take
		}
	case *transfer.AbortAck, *transfer.Committed:
		_ = p.send.Step(e.from, m.(transfer.Message))
	case *transfer.Grant, *transfer.Page, *transfer.Manifest, *transfer.Commit, *transfer.Heartbeat:
		return violated(invCore, "prefill node got %T from %s", m, e.from)
	}
	return nil
}

func prefillReason(err error) transfer.Reason {
	if errors.Is(err, request.ErrOverloaded) {
		return transfer.ReasonOverloaded
	}
	return transfer.ReasonPrefillFailed
}

// step runs the prefill node once: its core's Ready (exports go to the
// sender), the batch, and the sender's effects.
func (p *prefillNode) step() error {
	p.core.Tick(p.w.now)
	p.send.Tick(p.w.tnow())
	p.readsLand()
	rd := p.core.Ready()
	for _, t := range rd.Tokens {
		id, ok := p.by[t.Owner]
		j := p.jobs[id]
		if !ok || j == nil {
			continue // its handoff ended meanwhile
		}
		if want := echoNext(t.Owner, j.params.CacheSalt, j.params.Prompt, p.w.vocab); t.Index != 0 || t.ID != want {
			return violated(invEcho, "prefill: first token of %v is %d (index %d), the owner-echo model gives %d", t.Owner, t.ID, t.Index, want)
		}
	}
	for _, ex := range rd.Exports {
		if p.abortLanded[ex.Owner] {
			return violated(invAbort, "prefill: %v was aborted but its prompt was exported", ex.Owner)
		}
		id, ok := p.by[ex.Owner]
		j := p.jobs[id]
		if !ok || j == nil {
			continue
		}
		if ex.Tokens != len(j.params.Prompt) {
			return violated(invCore, "prefill: export of %v holds %d positions, the prompt has %d", ex.Owner, ex.Tokens, len(j.params.Prompt))
		}
		j.pages, j.exported = ex.Pages, true
		for i := range ex.Pages {
			if err := p.send.PageReady(id, i, ex.Filled[i], transfer.PageDigest(i, ex.Filled[i], ex.Pages[i])); err != nil {
				break
			}
		}
		_ = p.send.PrefillDone(id, ex.Tokens, ex.FirstToken, nil)
	}
	for _, res := range rd.Results {
		if err := p.result(res); err != nil {
			return err
		}
		id, ok := p.by[res.Owner]
		if j := p.jobs[id]; ok && j != nil && !j.exported {
			_ = p.send.Abort(id, prefillReason(res.Err))
		}
		delete(p.by, res.Owner)
	}
	if err := p.execute(rd.Batch); err != nil {
		return err
	}
	return p.effects()
}

// effects carries out the sender's effects until it asks for nothing.
func (p *prefillNode) effects() error {
	for {
		effs := p.send.Ready()
		if len(effs) == 0 {
			return nil
		}
		for _, e := range effs {
			switch e := e.(type) {
			case *transfer.Send:
				p.w.net.lossy(p.name, e.To, e.Msg)
			case *transfer.SendPage:
				j := p.jobs[e.Page.ID]
				if j == nil || e.Page.Index >= len(j.pages) {
					return violated(invCore, "prefill: the sender asked for page %d of %v, which the driver does not hold", e.Page.Index, e.Page.Ref)
				}
				pg := e.Page
				pg.Data = j.pages[pg.Index]
				due := p.w.now
				switch x := p.w.rng.IntN(1000); {
				case x < p.w.f.slowWrite:
					due = due.Add(time.Duration(1+p.w.rng.IntN(3)) * time.Second) // past the drain deadline
				case x < 300:
					due = due.Add(time.Duration(p.w.rng.IntN(30)) * time.Millisecond)
				}
				p.reads = append(p.reads, &pread{to: e.To, page: pg, due: due})
				if !due.After(p.w.now) {
					p.readsLand()
				}
			case *transfer.ReleaseSource:
				for _, r := range p.reads {
					if r.page.ID == e.ID && !e.Quarantine {
						return violated(invWriter, "prefill released the source pages of %v while a read of page %d is in flight", e.Ref, r.page.Index)
					}
				}
				if j := p.jobs[e.ID]; j != nil {
					j.pages = nil
				}
			case *transfer.Ended:
				if j := p.jobs[e.ID]; j != nil {
					if e.Outcome != transfer.OutcomeSent {
						p.abort(j.grant.Owner)
					}
					delete(p.jobs, e.ID)
				}
			}
		}
	}
}

// readsLand completes the page reads that are due, in the order granted:
// the page goes on the wire, and the sender hears it was read.
func (p *prefillNode) readsLand() {
	keep := p.reads[:0]
	var landed []*pread
	for _, r := range p.reads {
		if r.due.After(p.w.now) {
			keep = append(keep, r)
		} else {
			landed = append(landed, r)
		}
	}
	clear(p.reads[len(keep):])
	p.reads = keep
	for _, r := range landed {
		p.w.net.lossy(p.name, r.to, &r.page)
		_ = p.send.Sent(r.page.ID, r.page.Index)
	}
}

func (p *prefillNode) check() error {
	if err := p.node.check(); err != nil {
		return err
	}
	if err := p.send.CheckInvariants(); err != nil {
		return violated(invHandoff, "prefill sender: %v", err)
	}
	return nil
}

// decodeNode is a decode node's driver: reservations in its core and its
// receiver, page writes that complete later, the commit, and the
// request's tokens and result to the gateway.
type decodeNode struct {
	*node
	gen    int // restarts so far
	recv   *transfer.Receiver
	resv   map[transfer.ReservationID]*dresv
	writes []*write
	// fenced counts pages quarantined because a writer was fenced at the
	// drain deadline: the only quarantine a correct run may have.
	fenced int
}

type dresv struct {
	owner   request.Owner
	sender  peer
	gateway peer
	ended   bool
}

// write is a page copy in flight: granted by PageArrived, landing (the
// pool's ImportPage, then WriteDone) at due.
type write struct {
	wp     transfer.WritePage
	owner  request.Owner
	data   []byte
	due    time.Time
	fenced bool
}

func (w *world) newDecode(name peer, incarnation uint64) (*decodeNode, error) {
	n, err := w.newNode(name, w.decodePages, false)
	if err != nil {
		return nil, err
	}
	r, err := transfer.NewReceiver(transfer.ReceiverConfig{
		Layout: w.tlayout, Incarnation: incarnation,
		LeaseTTL: 2 * transfer.Second, DrainTimeout: transfer.Second, TombstoneTTL: 5 * transfer.Second,
		RetryEvery: transfer.Second / 5,
	}, w.tnow())
	if err != nil {
		return nil, err
	}
	return &decodeNode{node: n, recv: r, resv: map[transfer.ReservationID]*dresv{}}, nil
}

func (d *decodeNode) deliver(e *envelope) error {
	d.recv.Tick(d.w.tnow())
	switch m := e.body.(type) {
	case reserveJob:
		if _, err := d.recv.PagesNeeded(e.from, m.Reserve); err != nil {
			if !errors.Is(err, transfer.ErrDuplicate) {
				d.w.net.reliable(d.name, e.from, resultMsg{request.Result{Owner: m.Owner, Reason: request.FinishError, Err: err}})
			}
			return nil
		}
		adm, err := d.lim.Admit(m.params)
		var pages []kvcache.PageID
		if err == nil {
			pages, err = d.core.Reserve(adm)
		}
		if err != nil {
			d.w.net.reliable(d.name, e.from, resultMsg{request.Result{Owner: m.Owner, Reason: request.FinishError, Err: err}})
			return nil
		}
		res, err := d.recv.Reserve(e.from, m.Reserve, pages)
		if err != nil {
			// The core ends the request and frees its pages; its result
			// goes to the gateway.
			_ = d.core.Fail(m.Owner, fmt.Errorf("%w: %w", request.ErrInternal, err))
			return nil
		}
		d.resv[res.ID] = &dresv{owner: res.Owner, sender: m.Sender, gateway: e.from}
	case *transfer.Page:
		wp, err := d.recv.PageArrived(e.from, transfer.PageArrived{Ref: m.Ref, Index: m.Index, Filled: m.Filled,
			Digest: transfer.PageDigest(m.Index, m.Filled, m.Data)})
		if err != nil {
			return nil
		}
		due := d.w.now
		switch x := d.w.rng.IntN(1000); {
		case x < d.w.f.slowWrite:
			due = due.Add(time.Duration(1+d.w.rng.IntN(3)) * time.Second)
		case x < 500:
			due = due.Add(time.Duration(d.w.rng.IntN(30)) * time.Millisecond)
		}
		d.writes = append(d.writes, &write{wp: wp, owner: m.Owner, data: slices.Clone(m.Data), due: due})
		d.land()
	case *transfer.Manifest, *transfer.Commit, *transfer.Heartbeat, *transfer.AbortAck, *transfer.Abort:
		_ = d.recv.Step(e.from, m.(transfer.Message))
	default:
		return violated(invCore, "%s got %T from %s", d.name, m, e.from)
	}
	return nil
}

// land completes the page writes that are due, in the order granted.
func (d *decodeNode) land() {
	keep := d.writes[:0]
	for _, wr := range d.writes {
		if wr.due.After(d.w.now) {
			keep = append(keep, wr)
			continue
		}
		if wr.fenced {
			_ = d.recv.WriteDone(wr.wp.ID, wr.wp.Index) // void
			continue
		}
		ierr := d.core.ImportPage(wr.owner, wr.wp.Index, wr.wp.Filled, wr.data)
		_ = d.recv.WriteDone(wr.wp.ID, wr.wp.Index)
		if ierr != nil {
			_ = d.recv.Abort(wr.wp.ID, transfer.ReasonMalformed)
		}
	}
	clear(d.writes[len(keep):])
	d.writes = keep
}

// step runs the decode node once: due writes, the receiver's effects, the
// core's Ready (tokens and results to the gateway) and its batch.
func (d *decodeNode) step() error {
	d.recv.Tick(d.w.tnow())
	d.land()
	if err := d.effects(); err != nil {
		return err
	}
	d.core.Tick(d.w.now)
	rd := d.core.Ready()
	if len(rd.Exports) > 0 {
		return violated(invCore, "%s exported a prompt", d.name)
	}
	var toks []request.Token
	for _, t := range rd.Tokens {
		toks = append(toks, t)
	}
	if len(toks) > 0 {
		d.w.net.reliable(d.name, gwName, tokensMsg{toks})
	}
	for _, res := range rd.Results {
		if err := d.result(res); err != nil {
			return err
		}
		d.w.net.reliable(d.name, gwName, resultMsg{res})
	}
	if err := d.execute(rd.Batch); err != nil {
		return err
	}
	return d.effects()
}

// effects carries out the receiver's effects in order.
func (d *decodeNode) effects() error {
	for {
		effs := d.recv.Ready()
		if len(effs) == 0 {
			return nil
		}
		for _, e := range effs {
			switch e := e.(type) {
			case *transfer.Send:
				d.w.net.lossy(d.name, e.To, e.Msg)
			case *transfer.Deliver:
				if err := d.core.CommitImport(e.Owner, e.TotalTokens, e.FirstToken, e.FirstLogprobs); err != nil {
					d.w.logf("%s: commit of %v refused by the pool: %v", d.name, e.Owner, err)
				}
			case *transfer.Release:
				for _, wr := range d.writes {
					if wr.wp.ID == e.ID && !wr.fenced {
						return violated(invWriter, "%s released the pages %v of %v while a write of page %d is in flight", d.name, e.Pages, e.Owner, wr.wp.Index)
					}
				}
				d.endRequest(e.ID, e.Owner, e.Reason, false)
			case *transfer.Quarantine:
				d.fenced += len(e.Pages)
				d.endRequest(e.ID, e.Owner, e.Reason, true)
			case *transfer.Fence:
				for _, wr := range d.writes {
					if wr.wp.ID == e.ID && slices.Contains(e.Indexes, wr.wp.Index) {
						wr.fenced = true
					}
				}
			case *transfer.Ended:
				if r := d.resv[e.ID]; r != nil {
					r.ended = true
				}
			case *transfer.AbortDelivered:
				d.abort(e.Owner)
				d.w.net.lossy(d.name, e.From, &transfer.AbortAck{Ref: e.Ref, Drained: true})
			}
		}
	}
}

// endRequest ends the request of a reservation that will not commit, as
// the disagg driver does: scrubbed, or quarantined when a writer could not
// be drained.
func (d *decodeNode) endRequest(id transfer.ReservationID, owner request.Owner, reason transfer.Reason, quarantine bool) {
	cause := error(&transfer.Failure{Kind: transfer.ErrAborted, Reason: reason, ID: id})
	if reason == transfer.ReasonAborted {
		cause = fmt.Errorf("%w: %w", request.ErrAborted, cause)
	}
	if quarantine {
		cause = fmt.Errorf("%w: a writer of the handoff could not be drained: %w", kvcache.ErrViolation, cause)
	}
	_ = d.core.Fail(owner, cause)
}

// peerGone aborts every reservation a restarted node took part in.
func (d *decodeNode) peerGone(p peer) {
	// In reservation order: the simulation must replay exactly.
	ids := slices.SortedFunc(maps.Keys(d.resv), func(a, b transfer.ReservationID) int { return cmp.Compare(a.Seq, b.Seq) })
	for _, id := range ids {
		if r := d.resv[id]; !r.ended && (r.sender == p || r.gateway == p) {
			_ = d.recv.Abort(id, transfer.ReasonAborted)
		}
	}
}

func (d *decodeNode) check() error {
	if err := d.node.check(); err != nil {
		return err
	}
	if err := d.recv.CheckInvariants(); err != nil {
		return violated(invHandoff, "%s receiver: %v", d.name, err)
	}
	return nil
}

// saltOf is a request's cache salt (part of what its KV depends on).
func (w *world) saltOf(o request.Owner) string {
	if c := w.gw.calls[o]; c != nil {
		return c.params.CacheSalt
	}
	return ""
}

// world is one seed's system.
type world struct {
	seed    uint64
	rng     *rand.Rand
	now     time.Time
	f       faults
	quiet   bool // quiescence: no new faults, so that everything can end
	window  int
	vocab   int
	layout  kvcache.Layout
	tlayout transfer.Layout

	prefillPages, decodePages int
	prefixCache               bool

	net     *network
	gw      *gatewayNode
	prefill *prefillNode
	decodes []*decodeNode
	snap    []kvcache.PageInfo

	log  []string
	step int
}

func (w *world) tnow() transfer.Time { return transfer.Time(w.now.UnixNano()) }

func (w *world) logf(format string, args ...any) {
	if len(w.log) >= 400 {
		w.log = w.log[1:]
	}
	w.log = append(w.log, fmt.Sprintf("[%d] ", w.step)+fmt.Sprintf(format, args...))
}
