package disagg

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// LocalConfig configures a cluster in one process.
type LocalConfig struct {
	Prefill, Decode int          // nodes of each role (default 1 each)
	Node            node.Options // every node's options (KeepModel is set)
	// ShareKV makes Node.KVMemory (or its default) the budget of all the
	// nodes together rather than of each (SplitKV); serve sets it, so
	// that running the split in one process does not double the memory
	// the operator gave.
	ShareKV   bool
	Logger    *slog.Logger
	Decoder   DecodeConfig  // leases and timeouts (Sched, Layout, Transport are set)
	Prefiller PrefillConfig // heartbeats and timeouts (likewise)
	Router    RouterConfig  // abort timing (Vocabulary, Transport and the node lists are set)

	// Transport makes a node's transport (nil: an in-process
	// link.Network). The demo passes gRPC over mutual TLS on loopback.
	Transport func(hello transfer.Hello) (link.Transport, error)
	// Wrap, for tests and the demo only, wraps each node's transport:
	// fault injection between a driver and its link.
	Wrap func(name transfer.Peer, t link.Transport) link.Transport
}

// Local is a gateway's router, prefill and decode nodes in one process,
// linked by link.Network: every message is framed, handshaken and
// policed as between processes.
type Local struct {
	*Router
	Prefills, Decodes []*node.Node
	PrefillDrivers    []*Prefill
	DecodeDrivers     []*Decode

	model      *model.Model
	transports []link.Transport
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	errs       chan error
	closeOnce  sync.Once
	closeErr   error
}

// StartLocal builds and starts the cluster on m. It owns m from now on
// and closes it in Close.
func StartLocal(m *model.Model, cfg LocalConfig) (l *Local, err error) {
	if cfg.Prefill <= 0 {
		cfg.Prefill = 1
	}
	if cfg.Decode <= 0 {
		cfg.Decode = 1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	built := &Local{model: m, cancel: cancel, errs: make(chan error, cfg.Prefill+cfg.Decode+1)}
	l = built
	defer func() {
		// built, not l: a failed start returns a nil l, but what was
		// built (the model included, which StartLocal owns) must close.
		if err != nil {
			built.Close()
		}
	}()
	o := cfg.Node
	o.KeepModel = true
	po, do := o, o
	if cfg.ShareKV {
		if po.KVMemory, do.KVMemory, err = SplitKV(m, o, cfg.Prefill, cfg.Decode); err != nil {
			return nil, err
		}
	}
	nw := link.NewNetwork()
	if cfg.Transport == nil {
		cfg.Transport = func(h transfer.Hello) (link.Transport, error) {
			return nw.Join(h, link.Options{Logger: cfg.Logger})
		}
	}
	join := func(name transfer.Peer, role transfer.Role, layout transfer.Layout) (link.Transport, error) {
		t, err := cfg.Transport(transfer.NewHello(name, role, layout))
		if err != nil {
			return nil, err
		}
		l.transports = append(l.transports, t)
		if cfg.Wrap != nil {
			t = cfg.Wrap(name, t)
		}
		return t, nil
	}
	var prefills, decodes []transfer.Peer
	var layout transfer.Layout
	for i := range cfg.Prefill + cfg.Decode {
		no := do
		if i < cfg.Prefill {
			no = po
		}
		n, err := node.Start(m, no)
		if err != nil {
			return nil, err
		}
		layout = n.HandoffLayout()
		if i < cfg.Prefill {
			name := transfer.Peer(fmt.Sprintf("prefill-%d", i))
			l.Prefills = append(l.Prefills, n)
			t, err := join(name, transfer.RolePrefill, layout)
			if err != nil {
				return nil, err
			}
			pc := cfg.Prefiller
			pc.Sched, pc.Layout, pc.Transport, pc.Logger, pc.Load = n.Sched(), layout, t, cfg.Logger.With("node", name), LoadOf(n)
			d, err := NewPrefill(pc)
			if err != nil {
				return nil, err
			}
			l.PrefillDrivers = append(l.PrefillDrivers, d)
			l.run(func() error { return d.Run(ctx) })
			prefills = append(prefills, name)
			continue
		}
		name := transfer.Peer(fmt.Sprintf("decode-%d", i-cfg.Prefill))
		l.Decodes = append(l.Decodes, n)
		t, err := join(name, transfer.RoleDecode, layout)
		if err != nil {
			return nil, err
		}
		dc := cfg.Decoder
		dc.Sched, dc.Layout, dc.Transport, dc.Logger, dc.Load = n.Sched(), layout, t, cfg.Logger.With("node", name), LoadOf(n)
		d, err := NewDecode(dc)
		if err != nil {
			return nil, err
		}
		l.DecodeDrivers = append(l.DecodeDrivers, d)
		l.run(func() error { return d.Run(ctx) })
		decodes = append(decodes, name)
	}
	t, err := join("gateway", transfer.RoleGateway, layout)
	if err != nil {
		return nil, err
	}
	rc := cfg.Router
	rc.Vocabulary, rc.Transport, rc.Prefill, rc.Decode, rc.Logger = l.Decodes[0], t, prefills, decodes, cfg.Logger.With("node", "gateway")
	rt, err := NewRouter(rc)
	if err != nil {
		return nil, err
	}
	l.Router = rt
	l.run(func() error { return rt.Run(ctx) })
	return l, nil
}

// LoadOf is what a node's driver answers a gateway's LoadQuery with: the
// figures its scheduler loop last published.
func LoadOf(n *node.Node) func() transfer.Load {
	return func() transfer.Load {
		s := n.PoolStats()
		return transfer.Load{UsablePages: n.SchedLimits().UsablePages, FreePages: s.PagesFree, CachedPages: s.PagesCached, Queued: s.QueueDepth, Running: s.Running}
	}
}

// SplitKV divides the KV budget of o (KVMemory, or the default a single
// node would take) between prefill and decode nodes, returning each
// prefill and each decode node's share. A prefill node holds prompts only
// until their handoff (and its prefix cache), a decode node holds them
// for their whole generation, so prefill nodes get a quarter of the budget
// and decode nodes the rest; but every node must hold the advertised
// window with its safety margin, since every paired node must accept the
// same requests. A budget too small for that is refused with the numbers.
func SplitKV(m *model.Model, o node.Options, prefills, decodes int) (prefill, decode int64, err error) {
	capa, err := node.Plan(m, o)
	if err != nil {
		return 0, 0, err
	}
	lim := capa.Limits
	pageBytes := lim.PageBytes
	needPages := int64(math.Ceil(float64(lim.MaxContext) * lim.SafetyMargin / float64(lim.PageSize)))
	need := needPages * pageBytes
	prefill = max(need, capa.KVMemory/4/int64(prefills))
	decode = (capa.KVMemory - int64(prefills)*prefill) / int64(decodes)
	if decode < need {
		least := int64(prefills+decodes) * need
		return 0, 0, fmt.Errorf("the KV budget %s (%s) is split between %d prefill and %d decode nodes, and each must hold the %d-token window "+
			"with --kv-safety-margin %g (%d pages, %s): raise --kv-memory to at least %s, lower --max-context, or run --colocated (one node, no handoff)",
			kvcache.FormatBytes(capa.KVMemory), capa.KVMemorySource, prefills, decodes, lim.MaxContext, lim.SafetyMargin, needPages,
			kvcache.FormatBytes(need), kvcache.FormatBytes(least))
	}
	return prefill, decode, nil
}

func (l *Local) run(f func() error) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		if err := f(); err != nil {
			l.errs <- err
		}
	}()
}

// Close stops the drivers, the links and the nodes, then closes the model.
func (l *Local) Close() error {
	l.closeOnce.Do(func() {
		var errs []error
		l.cancel()
		for _, t := range l.transports {
			errs = append(errs, t.Close())
		}
		for _, n := range append(append([]*node.Node(nil), l.Prefills...), l.Decodes...) {
			errs = append(errs, n.Close())
		}
		l.wg.Wait()
		close(l.errs)
		for err := range l.errs {
			errs = append(errs, err)
		}
		errs = append(errs, l.model.Close())
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// Members is every node of the cluster, named.
func (l *Local) Members() NodeSet {
	var s NodeSet
	for i, n := range l.Prefills {
		s.Names, s.Nodes = append(s.Names, fmt.Sprintf("prefill-%d", i)), append(s.Nodes, n)
	}
	for i, n := range l.Decodes {
		s.Names, s.Nodes = append(s.Names, fmt.Sprintf("decode-%d", i)), append(s.Nodes, n)
	}
	return s
}

// PoolStats sums the nodes' pools (gateway.StatsSource).
func (l *Local) PoolStats() gateway.PoolStats { return l.Members().PoolStats() }

// IsolationViolations sums the nodes' (gateway.StatsSource).
func (l *Local) IsolationViolations() uint64 { return l.Members().IsolationViolations() }

// AbortedButCompleted sums the nodes' (gateway.StatsSource).
func (l *Local) AbortedButCompleted() uint64 { return l.Members().AbortedButCompleted() }

// RegisterMetrics registers every node's collector on reg, each series
// labelled with its node.
func (l *Local) RegisterMetrics(reg prometheus.Registerer) error {
	return l.Members().RegisterMetrics(reg)
}

// ScrubQuarantined scrubs and frees every node's quarantined pages.
func (l *Local) ScrubQuarantined(ctx context.Context) (int, error) {
	return l.Members().ScrubQuarantined(ctx)
}

var _ gateway.StatsSource = (*Local)(nil)

// NodeSet is the nodes one process runs (serve's prefill and decode, a
// role that also takes the other role), named as their metrics label
// them: what an operator sees and does to the process applies to all.
type NodeSet struct {
	Names []string
	Nodes []*node.Node
}

// PoolStats sums the nodes' pools (gateway.StatsSource).
func (s NodeSet) PoolStats() gateway.PoolStats {
	var t gateway.PoolStats
	for _, n := range s.Nodes {
		p := n.PoolStats()
		t.PagesTotal += p.PagesTotal
		t.PagesFree += p.PagesFree
		t.PagesCached += p.PagesCached
		t.PagesUsed += p.PagesUsed
		t.PagesQuarantined += p.PagesQuarantined
		t.QueueDepth += p.QueueDepth
		t.Running += p.Running
	}
	return t
}

// IsolationViolations sums the nodes' (gateway.StatsSource).
func (s NodeSet) IsolationViolations() uint64 {
	var v uint64
	for _, n := range s.Nodes {
		v += n.IsolationViolations()
	}
	return v
}

// AbortedButCompleted sums the nodes' (gateway.StatsSource).
func (s NodeSet) AbortedButCompleted() uint64 {
	var v uint64
	for _, n := range s.Nodes {
		v += n.AbortedButCompleted()
	}
	return v
}

// RegisterMetrics registers every node's collector on reg, each series
// labelled with its node.
func (s NodeSet) RegisterMetrics(reg prometheus.Registerer) error {
	for i, n := range s.Nodes {
		if err := prometheus.WrapRegistererWith(prometheus.Labels{"node": s.Names[i]}, reg).Register(n.Collector()); err != nil {
			return err
		}
	}
	return nil
}

// ScrubQuarantined scrubs and frees every node's quarantined pages.
func (s NodeSet) ScrubQuarantined(ctx context.Context) (int, error) {
	total := 0
	var errs []error
	for _, n := range s.Nodes {
		k, err := n.ScrubQuarantined(ctx)
		total += k
		errs = append(errs, err)
	}
	return total, errors.Join(errs...)
}

var _ gateway.StatsSource = NodeSet{}
