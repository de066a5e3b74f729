package sim

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched/ownerecho"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

var (
	simSeeds = flag.Int("sim.seeds", 0, "number of seeds (default 2000, or $PAGEWARDEN_SIM_SEEDS)")
	simSeed  = flag.Uint64("sim.seed", 0, "run only this seed (replay a failure)")
	simFirst = flag.Uint64("sim.first", 1, "first seed")
	simLog   = flag.Bool("sim.log", false, "print the whole log of -sim.seed")
)

// newWorld builds seed's system: limits, pool sizes, faults and tenants
// drawn from the seed's one random source.
func newWorld(seed uint64) (*world, error) {
	rng := rand.New(rand.NewPCG(seed, 0x5151_7a11))
	ps := []int{1, 2, 4}[rng.IntN(3)]
	window := []int{8, 12, 16, 24}[rng.IntN(4)]
	w := &world{
		seed: seed, rng: rng, now: time.Unix(1_800_000_000, 0),
		window: window, vocab: 64, layout: ownerecho.Layout(ps),
		prefixCache: rng.IntN(2) == 0,
	}
	per := (window + ps - 1) / ps // pages of one request at most
	w.prefillPages = per + rng.IntN(3*per)
	w.decodePages = 2*per + rng.IntN(4*per)
	var digest [32]byte
	digest[0] = 0xec
	w.tlayout = transfer.LayoutOf(w.layout, digest, window)
	w.f = faults{
		loss:      []int{0, 0, 20, 100}[rng.IntN(4)],
		dup:       []int{0, 50, 200}[rng.IntN(3)],
		maxDelay:  time.Duration([]int{0, 5, 40}[rng.IntN(3)]) * time.Millisecond,
		tear:      []int{0, 100, 300}[rng.IntN(3)],
		short:     []int{0, 100, 300}[rng.IntN(3)],
		restart:   []int{0, 0, 3}[rng.IntN(3)],
		stall:     []int{0, 2, 10}[rng.IntN(3)],
		slowWrite: []int{0, 0, 10}[rng.IntN(3)],
	}
	w.net = &network{w: w, links: map[[2]peer]time.Time{}, torn: map[transfer.ReservationID]int{},
		short: map[transfer.ReservationID]bool{}, shortDigest: map[transfer.ReservationID][32]byte{}}
	var err error
	if w.gw, err = w.newGateway(1 + rng.IntN(6)); err != nil {
		return nil, err
	}
	if w.prefill, err = w.newPrefill(); err != nil {
		return nil, err
	}
	for i := range 1 + rng.IntN(2) {
		d, err := w.newDecode(peer(fmt.Sprintf("decode-%d", i)), seed<<8|uint64(i+1))
		if err != nil {
			return nil, err
		}
		w.decodes = append(w.decodes, d)
	}
	return w, nil
}

// length draws a prompt length from the boundary set: 0, 1, a page ±1,
// the window −1/0/+1, twice it, and anything between.
func (w *world) length() int {
	W, ps := w.window, w.layout.PageSize
	set := []int{0, 1, ps - 1, ps, ps + 1, 2*ps - 1, 2 * ps, 2*ps + 1, W - 1, W, W + 1, 2 * W, 1 + w.rng.IntN(W), 1 + w.rng.IntN(W/2+1)}
	return max(0, set[w.rng.IntN(len(set))])
}

// maxTokens draws max_tokens around what the prompt leaves of the window.
func (w *world) maxTokens(prompt int) int {
	room := w.window - prompt
	if room >= 1 && w.rng.IntN(2) == 0 {
		return 1 + w.rng.IntN(room)
	}
	set := []int{0, 1, 2, room - 1, room, room + 1, 1 + w.rng.IntN(4), 1 + w.rng.IntN(w.window)}
	return max(0, set[w.rng.IntN(len(set))])
}

// arrive makes one client request.
func (w *world) arrive() error {
	g := w.gw
	g.ids++
	var id request.ID
	for i := range 8 {
		id[i] = byte(g.ids >> (8 * i))
	}
	id[15] = 0x51
	ts := g.tenants()
	p := request.Params{Owner: request.Owner{Tenant: ts[w.rng.IntN(len(ts))], ID: id}}
	if w.rng.IntN(3) == 0 && len(g.order) > 0 {
		// An earlier prompt again: prefix-cache hits for its tenant,
		// near misses for the others.
		p.Prompt = append([]int(nil), g.calls[g.order[w.rng.IntN(len(g.order))]].params.Prompt...)
	} else {
		p.Prompt = make([]int, w.length())
		for i := range p.Prompt {
			p.Prompt[i] = w.rng.IntN(w.vocab)
		}
	}
	p.MaxTokens = w.maxTokens(len(p.Prompt))
	if w.rng.IntN(4) == 0 {
		p.StopTokens = []int{w.rng.IntN(w.vocab)}
	}
	if w.rng.IntN(5) == 0 {
		p.CacheSalt = "salt"
	}
	return g.submit(p)
}

// restartPrefill is a prefill node crash and restart: its process state is
// gone, its connections break (what was on the way to it is lost), and its
// peers are told.
func (w *world) restartPrefill() error {
	w.logf("prefill node restarts")
	old := w.prefill
	w.net.dropTo(pfName)
	p, err := w.newPrefill()
	if err != nil {
		return err
	}
	p.gen = old.gen + 1
	w.prefill = p
	// What the old process was told stays known to the simulation's
	// oracle: an abort that landed there still forbids a success.
	for o := range old.abortLanded {
		p.abortLanded[o] = true
	}
	for _, d := range w.decodes {
		d.peerGone(pfName)
		if err := d.effects(); err != nil {
			return err
		}
	}
	return nil
}

// restartDecode is a decode node crash and restart: its pool, core,
// receiver and writes are gone, its connections break, the gateway fails
// the requests it served (the router's link-down handling) and the prefill
// node aborts the handoffs it was sending there.
func (w *world) restartDecode(i int) error {
	old := w.decodes[i]
	w.logf("%s restarts", old.name)
	w.net.dropTo(old.name)
	d, err := w.newDecode(old.name, w.seed<<8|uint64(i+1)|uint64(old.gen+1)<<4)
	if err != nil {
		return err
	}
	d.gen = old.gen + 1
	for o := range old.abortLanded {
		d.abortLanded[o] = true
	}
	w.decodes[i] = d
	g := w.gw
	for _, o := range g.order {
		if c := g.calls[o]; !c.done() && c.decode == old.name {
			res := request.Result{Owner: o, Reason: request.FinishError,
				Err: fmt.Errorf("%w: decode node %s went down", request.ErrNodeFailed, old.name)}
			if err := g.end(c, res); err != nil {
				return err
			}
		}
	}
	p := w.prefill
	ids := slices.SortedFunc(maps.Keys(p.jobs), func(a, b transfer.ReservationID) int { return cmp.Compare(a.Seq, b.Seq) })
	for _, id := range ids {
		if j := p.jobs[id]; j != nil && j.decode == old.name {
			_ = p.send.Abort(id, transfer.ReasonAborted)
			p.abort(j.grant.Owner)
		}
	}
	return p.effects()
}

// tick runs one step of the whole system.
func (w *world) tick(arrivals bool) error {
	w.step++
	dt := time.Duration(w.rng.IntN(20)) * time.Millisecond
	if !w.quiet && w.rng.IntN(1000) < w.f.stall {
		dt = time.Duration(1+w.rng.IntN(3)) * time.Second
		w.logf("stall of %v", dt)
	}
	if w.quiet {
		dt = 50 * time.Millisecond
	}
	w.now = w.now.Add(dt)
	if arrivals {
		n := 0
		switch x := w.rng.IntN(20); {
		case x == 0:
			n = 3 + w.rng.IntN(8) // a burst
		case x < 8:
			n = 1
		}
		for range n {
			if err := w.arrive(); err != nil {
				return err
			}
		}
	}
	if !w.quiet && len(w.gw.order) > 0 && w.rng.IntN(100) < 8 {
		// A client leaves at a random moment of a random request:
		// queued, reserving, prefilling, in the handoff, decoding, done.
		w.gw.abort(w.gw.order[w.rng.IntN(len(w.gw.order))])
	}
	if !w.quiet && w.rng.IntN(1000) < w.f.restart {
		var err error
		if i := w.rng.IntN(len(w.decodes) + 1); i < len(w.decodes) {
			err = w.restartDecode(i)
		} else {
			err = w.restartPrefill()
		}
		if err != nil {
			return err
		}
	}
	w.gw.tick()
	for _, e := range w.net.due() {
		var err error
		switch e.to {
		case gwName:
			err = w.gw.deliver(e)
		case pfName:
			err = w.prefill.deliver(e)
			if err == nil {
				err = w.prefill.effects()
			}
		default:
			d := w.decode(e.to)
			if d == nil {
				return violated(invCore, "message to unknown node %s", e.to)
			}
			err = d.deliver(e)
			if err == nil {
				err = d.effects()
			}
		}
		if err != nil {
			return err
		}
	}
	if err := w.prefill.step(); err != nil {
		return err
	}
	for _, d := range w.decodes {
		if err := d.step(); err != nil {
			return err
		}
	}
	return w.check()
}

func (w *world) decode(name peer) *decodeNode {
	for _, d := range w.decodes {
		if d.name == name {
			return d
		}
	}
	return nil
}

// check is the invariants after every step.
func (w *world) check() error {
	if err := w.prefill.check(); err != nil {
		return err
	}
	for _, d := range w.decodes {
		if err := d.check(); err != nil {
			return err
		}
	}
	return nil
}

// quiescent reports whether everything has ended.
func (w *world) quiescent() bool {
	for _, o := range w.gw.order {
		if !w.gw.calls[o].done() {
			return false
		}
	}
	if !w.prefill.core.Idle() || w.prefill.send.Stats().Active != 0 || len(w.prefill.reads) > 0 {
		return false
	}
	for _, d := range w.decodes {
		if !d.core.Idle() || len(d.writes) > 0 || d.recv.Stats().Live != 0 {
			return false
		}
	}
	return true
}

// run is one seed: arrivals and faults for a while, then quiescence and
// the end-state checks.
func (w *world) run() error {
	steps := 200 + w.rng.IntN(200)
	for range steps {
		if err := w.tick(true); err != nil {
			return err
		}
	}
	w.quiet = true
	for i := 0; !w.quiescent(); i++ {
		if i > 5000 {
			var open []string
			for _, o := range w.gw.order {
				if c := w.gw.calls[o]; !c.done() {
					open = append(open, fmt.Sprintf("%v (grant %v, aborted %v)", o, c.grant != nil, c.aborted))
				}
			}
			return violated(invQuiescence, "no quiescence after %d steps; open: %v", i, open)
		}
		if err := w.tick(false); err != nil {
			return err
		}
	}
	return w.baseline()
}

// baseline checks that every pool is back to its start: every page free
// or cached, none owned, no sequence; quarantined pages only those fenced
// at a drain deadline, which the operator's scrub returns.
func (w *world) baseline() error {
	nodes := []*node{w.prefill.node}
	for _, d := range w.decodes {
		nodes = append(nodes, d.node)
		if q := d.pool.Stats().QuarantinedPages; q > d.fenced {
			return violated(invBaseline, "%s: %d pages quarantined, %d fenced", d.name, q, d.fenced)
		}
		if _, err := d.core.ScrubQuarantined(); err != nil {
			return violated(invBaseline, "%s: scrub: %v", d.name, err)
		}
	}
	for _, n := range nodes {
		st := n.pool.Stats()
		if st.FreePages+st.CachedPages != st.TotalPages || st.OwnedPages != 0 || st.Sequences != 0 || st.QuarantinedPages != 0 || st.Violations != 0 {
			return violated(invBaseline, "%s: the pool is not back to free: %+v", n.name, st)
		}
		if s := n.core.Stats(); s.AbortedButCompleted != 0 || s.OwnerMismatches != 0 {
			return violated(invBaseline, "%s: %d aborted requests completed, %d owner mismatches", n.name, s.AbortedButCompleted, s.OwnerMismatches)
		}
	}
	return nil
}

// runSeed runs one seed; a broken invariant panic (package invariants) is
// a failure like any other.
func runSeed(seed uint64) (w *world, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = panicked(p)
		}
	}()
	w, err = newWorld(seed)
	if err != nil {
		return nil, err
	}
	return w, w.run()
}

// panicked turns a core's invariant panic into the violation of the
// package that holds the check.
func panicked(p any) error {
	msg := fmt.Sprint(p)
	// The first package named is the one whose check fired.
	inv, at := invCore, len(msg)
	for _, c := range [...]struct{ prefix, inv string }{{"kvcache:", invPool}, {"sched:", invSched}, {"transfer:", invHandoff}} {
		if i := strings.Index(msg, c.prefix); i >= 0 && i < at {
			inv, at = c.inv, i
		}
	}
	return violated(inv, "panic: %s", msg)
}

func seedCount() int {
	if *simSeeds > 0 {
		return *simSeeds
	}
	if v, err := strconv.Atoi(os.Getenv("PAGEWARDEN_SIM_SEEDS")); err == nil && v > 0 {
		return v
	}
	if testing.Short() {
		return 200
	}
	return 1500
}

// replayCommand is how to rerun one failing seed.
func replayCommand(test string, seed uint64, tags string) string {
	if tags != "" {
		tags = " -tags " + tags
	}
	return fmt.Sprintf("go test%s ./internal/sim -run '%s' -sim.seed=%d -sim.log -v", tags, test, seed)
}

// runSeeds runs seeds first..first+n-1 on every CPU and returns the
// lowest failing seed's world and error (nil if none failed), and the
// tally of the seeds that passed.
func runSeeds(first, n uint64, stop bool) (failed uint64, fw *world, ferr error, stats map[string]int) {
	var (
		mu   sync.Mutex
		next = first
		wg   sync.WaitGroup
	)
	stats = map[string]int{}
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				seed := next
				next++
				done := seed >= first+n || stop && ferr != nil && seed > failed
				mu.Unlock()
				if done {
					return
				}
				w, err := runSeed(seed)
				mu.Lock()
				if err != nil && (ferr == nil || seed < failed) {
					failed, fw, ferr = seed, w, err
				}
				if err == nil {
					w.tally(stats)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return failed, fw, ferr, stats
}

// TestSimulation runs the whole system over many seeds with every fault
// the transport and the nodes can have, checking the invariants after
// every step. A failure prints its seed and the command that replays it.
func TestSimulation(t *testing.T) {
	first, n := *simFirst, uint64(seedCount())
	if *simSeed != 0 {
		first, n = *simSeed, 1
	}
	before := invariants.Count()
	seed, w, err, stats := runSeeds(first, n, true)
	if err != nil {
		if w != nil {
			lines := w.log
			if !*simLog {
				lines = lines[max(0, len(lines)-40):]
			}
			t.Log(strings.Join(lines, "\n"))
		}
		t.Fatalf("seed %d: %v\nreplay: %s", seed, err, replayCommand("TestSimulation$", seed, ""))
	}
	if got := invariants.Count() - before; got != 0 {
		t.Fatalf("%d invariant violations reported", got)
	}
	t.Logf("%d seeds: %v", n, stats)
	// The faults must have happened, or the run proves little.
	if n >= 500 {
		for _, k := range []string{"success", "client abort", "handoff failed", "refused 4xx", "prefill restart", "decode restart", "fenced pages", "prefix hits", "reaped"} {
			if stats[k] == 0 {
				t.Errorf("no %q in %d seeds", k, n)
			}
		}
	}
}

// tally counts what a seed exercised.
func (w *world) tally(m map[string]int) {
	m["seeds passed"]++
	for _, o := range w.gw.order {
		c := w.gw.calls[o]
		switch {
		case c.aborted:
			m["client abort"]++
		case c.result.Reason.Success():
			m["success"]++
		case errors.Is(c.result.Err, transfer.ErrAborted):
			m["handoff failed"]++
		case errors.Is(c.result.Err, request.ErrOverloaded):
			m["overloaded"]++
		default:
			m["other failure"]++
			if *simLog {
				fmt.Println(c.result.Reason, c.result.Err)
			}
		}
	}
	m["refused 4xx"] += int(w.gw.ids) - len(w.gw.order)
	m["prefill restart"] += w.prefill.gen
	for _, d := range w.decodes {
		m["decode restart"] += d.gen
		m["fenced pages"] += d.fenced
		m["reaped"] += int(d.recv.Stats().Reaped)
	}
	m["prefix hits"] += int(w.prefill.pool.Stats().PrefixHitPages)
}

// TestSimulationReplays checks that a seed replays identically.
func TestSimulationReplays(t *testing.T) {
	for _, seed := range []uint64{3, 17, 99} {
		a, err1 := runSeed(seed)
		b, err2 := runSeed(seed)
		if err1 != nil || err2 != nil {
			t.Fatalf("seed %d: %v / %v", seed, err1, err2)
		}
		if strings.Join(a.log, "\n") != strings.Join(b.log, "\n") || a.step != b.step {
			t.Errorf("seed %d does not replay identically", seed)
		}
	}
}
