package disagg

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// PrefillConfig configures a prefill node's driver.
type PrefillConfig struct {
	Sched     *sched.Node
	Layout    transfer.Layout
	Transport link.Transport
	// Sender tunes heartbeats and timeouts; its Layout is filled in.
	Sender    transfer.SenderConfig
	TickEvery time.Duration // default 100ms
	Logger    *slog.Logger
	Clock     func() time.Time // default time.Now
	// Load answers a gateway's LoadQuery, as DecodeConfig.Load.
	Load func() transfer.Load

	// corrupt, set only by tests, rewrites an export before it is sent
	// (fault injection: a prefill node that sends what it should not).
	corrupt func(*sched.Export)
}

// PrefillStats are a prefill driver's counters.
type PrefillStats struct {
	Sender  transfer.SenderStats
	Failed  uint64 // prefills that did not produce an export
	Started uint64
}

// Prefill is a prefill node's driver: on Prefill from the gateway it runs
// the prompt in the scheduler (SubmitPrefill) and hands the exported pages,
// the manifest and the commit to the decode node through the sender core.
type Prefill struct {
	*loop
	cfg  PrefillConfig
	send *transfer.Sender

	// owned by the loop
	jobs map[transfer.ReservationID]*prefillJob

	failed, started atomic.Uint64
	statsMu         sync.Mutex
	stats           transfer.SenderStats
}

type prefillJob struct {
	grant   transfer.Grant
	decode  transfer.Peer
	gateway transfer.Peer
	cancel  context.CancelFunc
	pages   [][]byte // the export's pages, until ReleaseSource
}

// NewPrefill builds the driver; Run runs it.
func NewPrefill(cfg PrefillConfig) (*Prefill, error) {
	if cfg.Sched == nil || cfg.Transport == nil {
		return nil, errors.New("disagg: prefill needs a scheduler and a transport")
	}
	lp := newLoop(cfg.TickEvery, cfg.Clock, cfg.Logger)
	cfg.Clock = lp.clock
	sc := cfg.Sender
	sc.Layout = cfg.Layout
	s, err := transfer.NewSender(sc, transfer.Time(cfg.Clock().UnixNano()))
	if err != nil {
		return nil, fmt.Errorf("disagg: prefill: %w", err)
	}
	return &Prefill{loop: lp, cfg: cfg, send: s, jobs: make(map[transfer.ReservationID]*prefillJob)}, nil
}

// Stats returns the driver's counters.
func (p *Prefill) Stats() PrefillStats {
	p.statsMu.Lock()
	defer p.statsMu.Unlock()
	return PrefillStats{Sender: p.stats, Failed: p.failed.Load(), Started: p.started.Load()}
}

// Run is the driver's loop; it returns when ctx ends, after the prefills
// it started have ended.
func (p *Prefill) Run(ctx context.Context) error {
	return p.run(ctx, p.cfg.Transport.Inbox(), handlers{
		inbound: p.inbound,
		tick:    func(now time.Time) { p.send.Tick(transfer.Time(now.UnixNano())) },
		after:   p.effects,
		stop:    p.stop,
	})
}

// stop ends every prefill the driver started.
func (p *Prefill) stop() {
	for _, j := range p.jobs {
		j.cancel()
	}
}

func (p *Prefill) inbound(ctx context.Context, in link.Inbound) {
	from := in.From.Name
	if in.Down != nil {
		for id, j := range p.jobs {
			if j.decode == from || j.gateway == from {
				_ = p.send.Abort(id, transfer.ReasonAborted)
				j.cancel()
			}
		}
		return
	}
	p.send.Tick(transfer.Time(p.cfg.Clock().UnixNano()))
	switch m := in.Msg.(type) {
	case *transfer.Prefill:
		p.start(ctx, from, m)
	case *transfer.Abort:
		if err := p.send.Step(from, m); err != nil {
			p.log.Debug("abort refused", "from", from, "err", err)
		}
		if j := p.jobs[m.ID]; j != nil && j.grant.Ref == m.Ref {
			j.cancel() // stop computing what nobody will take
		}
	case *transfer.AbortAck, *transfer.Committed:
		if err := p.send.Step(from, m); err != nil {
			p.log.Debug("message refused", "from", from, "type", m.Type(), "err", err)
		}
	case *transfer.LoadQuery:
		if p.cfg.Load != nil {
			l := p.cfg.Load()
			l.Seq = m.Seq
			p.sendMsg(ctx, from, &l)
		}
	default:
		p.log.Warn("unexpected message on a prefill node", "from", from, "type", in.Msg.Type())
	}
}

// start begins serving a grant: the sender core first (it checks the
// grant), then the prompt in the scheduler.
func (p *Prefill) start(ctx context.Context, from transfer.Peer, m *transfer.Prefill) {
	g := m.Grant
	if len(m.Job.Prompt) != g.PromptTokens || m.Job.MaxTokens != g.MaxNewTokens {
		p.refuse(ctx, from, g.Ref, fmt.Errorf("%w: a job of %d+%d tokens for a grant of %d+%d", request.ErrInternal, len(m.Job.Prompt), m.Job.MaxTokens, g.PromptTokens, g.MaxNewTokens))
		return
	}
	if err := p.send.Start(g, m.Decode, from); err != nil {
		if !errors.Is(err, transfer.ErrDuplicate) {
			p.refuse(ctx, from, g.Ref, err)
		}
		return
	}
	rctx, cancel := context.WithCancel(ctx)
	j := &prefillJob{grant: g, decode: m.Decode, gateway: from, cancel: cancel}
	p.jobs[g.ID] = j
	p.started.Add(1)
	params := m.Job.Params(g.Owner)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		ex, cached, err := p.prefill(rctx, params)
		p.post(ctx, func() { p.exported(ctx, j, ex, cached, err) })
	}()
}

// prefill computes params' prompt and returns its export.
func (p *Prefill) prefill(ctx context.Context, params request.Params) (ex sched.Export, cached int, err error) {
	st, err := p.cfg.Sched.SubmitPrefill(ctx, params)
	if err != nil {
		return sched.Export{}, 0, err
	}
	for {
		if _, err := st.Recv(context.Background()); err != nil {
			break
		}
	}
	res := st.Result()
	ex, ok := st.Export()
	if !ok || !res.Reason.Success() {
		return sched.Export{}, 0, fmt.Errorf("prefill ended %s: %w", res.Reason, cmp.Or(res.Err, request.ErrInternal))
	}
	if ex.Owner != params.Owner {
		return sched.Export{}, 0, fmt.Errorf("%w: export of %v for %v", request.ErrInternal, ex.Owner, params.Owner)
	}
	return ex, res.Usage.CachedTokens, nil
}

// exported hands a finished prefill to the sender, or aborts its handoff.
func (p *Prefill) exported(ctx context.Context, j *prefillJob, ex sched.Export, cached int, err error) {
	id := j.grant.ID
	if p.jobs[id] != j {
		return // ended meanwhile
	}
	if err != nil {
		p.failed.Add(1)
		p.log.Warn("prefill failed; aborting its handoff", "ref", j.grant.Ref, "err", err)
		_ = p.send.Abort(id, prefillReason(err))
		return
	}
	if p.cfg.corrupt != nil {
		p.cfg.corrupt(&ex)
	}
	j.pages = ex.Pages
	for i := range ex.Pages {
		if err := p.send.PageReady(id, i, ex.Filled[i], transfer.PageDigest(i, ex.Filled[i], ex.Pages[i])); err != nil {
			p.log.Warn("page refused by the sender", "ref", j.grant.Ref, "index", i, "err", err)
			return
		}
	}
	if err := p.send.PrefillDonePrompt(id, ex.Tokens, ex.FirstToken, ex.FirstLogprobs, ex.PromptLogprobs); err != nil {
		p.log.Warn("prefill refused by the sender", "ref", j.grant.Ref, "err", err)
		return
	}
	// The gateway's usage counts what this node's prefix cache served.
	p.sendMsg(ctx, j.gateway, &transfer.Result{Ref: j.grant.Ref, Reason: request.FinishLength,
		Usage: request.Usage{PromptTokens: ex.Tokens, CachedTokens: cached}})
}

// effects carries out what the sender asks, in order, until it asks for
// nothing more (a page sent is an input that may produce the next step).
func (p *Prefill) effects(ctx context.Context) {
	for {
		effs := p.send.Ready()
		if len(effs) == 0 {
			break
		}
		for _, e := range effs {
			switch e := e.(type) {
			case *transfer.Send:
				p.sendMsg(ctx, e.To, e.Msg)
			case *transfer.SendPage:
				j := p.jobs[e.Page.ID]
				if j == nil || e.Page.Index >= len(j.pages) {
					p.log.Error("sender asked for a page the driver does not hold", "ref", e.Page.Ref, "index", e.Page.Index)
					continue
				}
				pg := e.Page
				pg.Data = j.pages[pg.Index]
				p.sendMsg(ctx, e.To, &pg)
				if err := p.send.Sent(pg.ID, pg.Index); err != nil {
					p.log.Debug("sent refused", "ref", pg.Ref, "err", err)
				}
			case *transfer.ReleaseSource:
				if j := p.jobs[e.ID]; j != nil {
					j.pages = nil
				}
			case *transfer.Ended:
				if j := p.jobs[e.ID]; j != nil {
					j.cancel()
					delete(p.jobs, e.ID)
				}
				if e.Outcome != transfer.OutcomeSent {
					p.log.Warn("handoff ended without being sent", "ref", e.Ref, "outcome", e.Outcome, "reason", e.Reason, "detail", e.Detail)
				}
			}
		}
	}
	p.statsMu.Lock()
	p.stats = p.send.Stats()
	p.statsMu.Unlock()
}

// prefillReason is why a prefill that did not produce an export ends its
// handoff: overloaded when this node had no room for the prompt in time
// (the gateway moves it or answers 503), failed otherwise.
func prefillReason(err error) transfer.Reason {
	if errors.Is(err, request.ErrOverloaded) {
		return transfer.ReasonOverloaded
	}
	return transfer.ReasonPrefillFailed
}

// refuse tells the gateway that a Prefill could not start.
func (p *Prefill) refuse(ctx context.Context, to transfer.Peer, ref transfer.Ref, err error) {
	p.failed.Add(1)
	p.log.Warn("prefill refused", "ref", ref, "err", err)
	p.sendMsg(ctx, to, &transfer.Abort{Ref: ref, Reason: prefillReason(err)})
}

func (p *Prefill) sendMsg(ctx context.Context, to transfer.Peer, m transfer.Message) {
	if err := p.cfg.Transport.Send(ctx, to, m); err != nil {
		p.log.Debug("send failed", "to", to, "type", m.Type(), "err", err)
	}
}
