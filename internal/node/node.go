// Package node wires one model, its engine, a KV page pool and the
// scheduler into a serving node, and presents it to the gateway as a
// gateway.Backend. The gateway, admission and the scheduler all check the
// one sched.Limits computed here at start-up (invariant I5).
package node

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/pagewarden/pagewarden/internal/engine"
	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/resources"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// Options configure a Node. Zero values take the defaults noted.
type Options struct {
	Threads  int           // compute threads (default 1)
	PageSize int           // tokens per KV page (default 16)
	KVType   kvcache.DType // F32 (default) or F16
	// KVMemory is the KV cache budget in bytes. 0 sizes it from the
	// machine: a quarter of available memory, but no more than 16 full
	// context windows.
	KVMemory int64
	// MaxContext is the advertised window; 0 means the model's.
	MaxContext   int
	SafetyMargin float64 // default sched.DefaultSafetyMargin
	Scrub        kvcache.ScrubPolicy
	AllowNoScrub bool
	PrefixCache  bool
	// MaxBatchTokens, MaxRunning, MaxQueued, MaxQueuedPerTenant and
	// MaxQueueWait pass through to the scheduler.
	MaxBatchTokens     int
	MaxRunning         int
	MaxQueued          int
	MaxQueuedPerTenant int
	MaxQueueWait       time.Duration
	// Policy gives each tenant's share of the node (nil: none).
	Policy func(request.Tenant) sched.TenantPolicy
	// PolicyGeneration is the version of what Policy returns: when it
	// changes, the scheduler re-reads the policy of every active tenant
	// (nil: it never does). See sched.NodeConfig.PolicyGeneration.
	PolicyGeneration func() uint64
	// Logger receives the node's audit trail (isolation violations,
	// internal failures); nil discards.
	Logger *slog.Logger
	// KeepModel leaves the model open on Close, for a model shared by
	// several nodes of one process (the prefill and decode roles of
	// `serve`); its owner closes it after every node.
	KeepModel bool
	// QuarantineReapAfter frees KV pages quarantined after an isolation
	// violation once they have been quarantined this long (scrubbed
	// first); 0 leaves them to the operator's ScrubQuarantined.
	QuarantineReapAfter time.Duration
	// ServedModelName is the model id the API shows ("" for the model's
	// name) and ChatTemplate the chat template it applies ("" for the
	// model's own): see Vocab.Serving.
	ServedModelName string
	ChatTemplate    string

	// wrapExecutor, set only by tests (export_test.go), wraps the
	// engine's executor, e.g. to hold the scheduler loop inside a step.
	wrapExecutor func(sched.Executor) sched.Executor
	// statsTimeout, set only by tests, replaces statsTimeout.
	statsTimeout time.Duration
}

// Node is a running all-in-one node. It implements gateway.Backend and
// gateway.StatsSource.
type Node struct {
	Vocab  // what the gateway asks of the model: tokenizer, template, limits
	model  *model.Model
	engine *engine.Engine
	sched  *sched.Node
	limits sched.Limits
	ctx    context.Context // ends with Close
	done   chan error
	cancel context.CancelFunc

	// pub is what metrics read (metrics.go): the loop publishes its
	// counts into it at every turn, so a scrape never waits for a step.
	pubMu sync.Mutex // held only to copy pub
	pub   published

	statsTimeout time.Duration
	keepModel    bool
	refreshMu    sync.Mutex // serialises refresh; guards the two below
	refreshAt    time.Time  // when the loop last answered a refresh
	pending      chan fullSnapshot
}

var (
	_ gateway.Backend     = (*Node)(nil)
	_ gateway.StatsSource = (*Node)(nil)
)

// Capacity is what start-up computes, printed by `pagewarden capacity`.
type Capacity struct {
	KVMemory int64
	// KVMemorySource says where KVMemory came from: the flag, or which
	// default (a share of the container's or the host's memory, or the
	// 16-window cap).
	KVMemorySource string
	Pages          int
	Limits         sched.Limits
}

// Plan computes the pool size and the limits for m under o without
// allocating the pool. It fails, with the numbers and the flag to change,
// when the advertised window does not fit the KV budget with the margin.
func Plan(m *model.Model, o Options) (Capacity, error) {
	o = o.withDefaults()
	c := m.Config
	layout := kvcache.Layout{Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: o.PageSize, DType: o.KVType}
	if err := layout.Validate(); err != nil {
		return Capacity{}, err
	}
	mem, src := o.KVMemory, "--kv-memory"
	if mem <= 0 {
		mem, src = defaultKVMemory(layout, c.ContextLength)
	}
	pages := kvcache.PagesForMemory(layout, mem)
	lim, err := sched.ComputeLimits(sched.ModelShape{ContextLength: c.ContextLength, Vocab: c.Vocab}, layout, pages, o.MaxContext, o.SafetyMargin)
	if err != nil {
		return Capacity{KVMemory: mem, KVMemorySource: src, Pages: pages}, err
	}
	return Capacity{KVMemory: mem, KVMemorySource: src, Pages: pages, Limits: lim}, nil
}

func (o Options) withDefaults() Options {
	if o.Threads <= 0 {
		o.Threads = 1
	}
	if o.PageSize <= 0 {
		o.PageSize = kvcache.DefaultPageSize
	}
	if o.statsTimeout <= 0 {
		o.statsTimeout = statsTimeout
	}
	if o.SafetyMargin == 0 {
		o.SafetyMargin = sched.DefaultSafetyMargin
	}
	return o
}

// defaultKVMemory is a quarter of the memory this process may still use
// (the container's limit when it has one: package resources), capped at 16
// full context windows (more is wasted on a CPU node), and at least one
// page.
func defaultKVMemory(l kvcache.Layout, ctx int) (int64, string) {
	perWindow := int64((ctx+l.PageSize-1)/l.PageSize) * l.PageBytes()
	want, src := 16*perWindow, "16 context windows"
	if avail := resources.AvailableMemory(); avail.Bytes > 0 && avail.Bytes/4 < want {
		want, src = avail.Bytes/4, "a quarter of "+avail.Source
	}
	return max(want, l.PageBytes()), src
}

// Start builds the pool, the engine and the scheduler for m and starts the
// scheduler loop. The node owns m from now on and closes it in Close.
func Start(m *model.Model, o Options) (*Node, error) {
	o = o.withDefaults()
	capa, err := Plan(m, o)
	if err != nil {
		return nil, err
	}
	eng, err := engine.New(m, engine.Options{
		Threads: o.Threads, PageSize: o.PageSize, Pages: capa.Pages, KVType: o.KVType,
		Scrub: o.Scrub, AllowNoScrub: o.AllowNoScrub,
	})
	if err != nil {
		return nil, err
	}
	var end []int
	for id := 0; id < m.Tokenizer.VocabSize(); id++ {
		if m.Tokenizer.IsEOG(id) {
			end = append(end, id)
		}
	}
	var exec sched.Executor = eng.Executor()
	if o.wrapExecutor != nil {
		exec = o.wrapExecutor(exec)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{Vocab: NewVocab(m, capa.Limits).Serving(o), model: m, engine: eng, limits: capa.Limits, ctx: ctx, done: make(chan error, 1), cancel: cancel, statsTimeout: o.statsTimeout, keepModel: o.KeepModel}
	// What metrics show until the loop's first turn: an empty pool.
	n.pub = published{st: sched.NodeStats{Pool: kvcache.Stats{TotalPages: capa.Pages, FreePages: capa.Pages}}, at: time.Now()}
	sn, err := sched.NewNode(sched.NodeConfig{
		PolicyGeneration: o.PolicyGeneration,
		Core: sched.Config{
			Limits: capa.Limits, Pool: eng.KV,
			MaxBatchTokens: o.MaxBatchTokens, MaxRunning: o.MaxRunning,
			MaxQueued: o.MaxQueued, MaxQueuedPerTenant: o.MaxQueuedPerTenant, MaxQueueWait: o.MaxQueueWait,
			EndTokens: end, PrefixCache: o.PrefixCache, Policy: o.Policy,
			QuarantineReapAfter: o.QuarantineReapAfter,
			// A model windowed on every layer gives back the pages
			// behind its window as a sequence moves on.
			Window: m.Config.EveryLayerWindow(),
		},
		Executor: exec,
		Observe:  n.observe,
		Logger:   o.Logger,
	})
	if err != nil {
		cancel()
		eng.Close()
		return nil, err
	}
	n.sched = sn
	go func() { n.done <- sn.Run(ctx) }()
	return n, nil
}

// Close stops the scheduler (aborting what is still running), then frees
// the engine and the model.
func (n *Node) Close() error {
	n.cancel()
	err := <-n.done
	n.engine.Close()
	if !n.keepModel {
		if cerr := n.model.Close(); err == nil {
			err = cerr
		}
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// SchedLimits is the node's one set of limits.
func (n *Node) SchedLimits() sched.Limits { return n.limits }

// Model is the served model.
func (n *Node) Model() *model.Model { return n.model }

// Stats snapshots the scheduler and pool through the scheduler loop.
func (n *Node) Stats(ctx context.Context) (sched.NodeStats, error) { return n.sched.Stats(ctx) }

// PageMap is the scheduler loop's picture of the pool's pages and the
// tenants' queues, taken between two steps (sched.Node.PageMap).
func (n *Node) PageMap(ctx context.Context) (sched.PageMap, error) { return n.sched.PageMap(ctx) }

// ScrubQuarantined is the operator's release of the KV quarantine: the
// scheduler loop scrubs and frees every quarantined page between two steps
// and it returns how many.
func (n *Node) ScrubQuarantined(ctx context.Context) (int, error) {
	return n.sched.ScrubQuarantined(ctx)
}

// Submit implements gateway.Backend.
// Sched is the node's scheduler, for the handoff drivers (package disagg).
func (n *Node) Sched() *sched.Node { return n.sched }

// HandoffLayout is what a node must share with this one to exchange KV
// pages with it: the model digest, the pool's layout and the window.
func (n *Node) HandoffLayout() transfer.Layout {
	return transfer.LayoutOf(n.engine.KV.Layout(), n.model.Digest, n.limits.MaxContext)
}

func (n *Node) Submit(ctx context.Context, p request.Params) (gateway.Stream, error) {
	s, err := n.sched.Submit(ctx, p)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Abort implements gateway.Backend.
func (n *Node) Abort(tenant request.Tenant, id request.ID) error { return n.sched.Abort(tenant, id) }
