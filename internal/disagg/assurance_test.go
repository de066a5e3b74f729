//go:build pw_mutants

package disagg

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// The second layers of the whole-system simulation's mutants
// (internal/sim TestMutantsCaught; docs/assurance.md has the whole table):
// the same build-tagged hook, switched on in the real in-process split
// cluster (gateway, prefill and decode nodes over link.Network, the
// builtin:tiny model), must be caught by a check that is not the
// simulation's. Each test first runs the fault-free path, so that it
// fails if the check it relies on would fire without the mutant.

// nonStrict turns invariant panics into counted errors for the rest of
// the test, as in production: a node's loop must keep running so that the
// must-be-zero counters can be read.
func nonStrict(t *testing.T) {
	old := invariants.SetStrict(false)
	t.Cleanup(func() { invariants.SetStrict(old) })
}

// awaitCounter polls f until it is non-zero or d passes.
func awaitCounter(d time.Duration, f func() uint64) uint64 {
	deadline := time.Now().Add(d)
	for {
		if v := f(); v != 0 || time.Now().After(deadline) {
			return v
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMutantIncidentCaughtByCounters: mutants (a) and (a2), a client abort
// handled as the incident's engine did (the abort in a side table, the
// running request shrunk to a 1-token placeholder and queued again with
// its state untouched; or only the side table, the request running on), are
// caught by the must-be-zero counters that the canary soak (internal/cli
// TestCanarySoak) and production alerts check on every node:
// pagewarden_invariant_violations_total (the queue refuses a request that
// is not Admitted) or pagewarden_aborted_but_completed_total (a request
// finished after its abort).
func TestMutantIncidentCaughtByCounters(t *testing.T) {
	nonStrict(t)
	single := startSingle(t)
	ps := prompts(t, single)
	for _, tc := range []struct {
		name string
		set  func() (restore func())
	}{
		{"no mutant", nil},
		{"placeholder queued", sched.IncidentForControls},
		{"abort in a side table", sched.AbortSideTableForControls},
	} {
		mutated := tc.set != nil
		t.Run(tc.name, func(t *testing.T) {
			if mutated {
				t.Cleanup(tc.set()) // after the cluster closes
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var once sync.Once
			l := startLocal(t, LocalConfig{Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
				f := &faulty{Transport: tr, name: name, victim: "victim"}
				if name == "decode-0" {
					f.mutate = func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
						if m.Type() == transfer.MsgTokens {
							once.Do(cancel) // the client leaves once decoding has started
						}
						return keep(m)
					}
				}
				return f
			}})
			before := invariants.Count()
			counters := func() uint64 { return invariants.Count() - before + l.AbortedButCompleted() }
			// Long enough, and never ended by an end-of-text token, that
			// the client's abort reaches a request still decoding.
			p := params("victim", ps[6], 1000)
			p.IgnoreEOS = true
			st, err := l.Submit(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			for range st.Tokens() {
			}
			st.Result()
			if !mutated {
				checkBaseline(t, l)
				if n := counters(); n != 0 {
					t.Fatalf("must-be-zero counters at %d without the mutant", n)
				}
				return
			}
			n := awaitCounter(10*time.Second, counters)
			// The placeholder is a request no loop ends any more: end it
			// (a cause other than a client's abort, which the mutant
			// would swallow again) so that the cluster can close.
			for _, d := range l.Decodes {
				_ = d.Sched().Fail(p.Owner, fmt.Errorf("%w: the test ends the incident's placeholder", request.ErrInternal))
			}
			if n == 0 {
				t.Fatal("the incident went unseen: invariant violations and aborted-but-completed stayed 0")
			}
			t.Logf("caught: invariant violations +%d, aborted but completed %d", invariants.Count()-before, l.AbortedButCompleted())
		})
	}
}

// TestMutantPrefixKeyWithoutTenantCaughtByCounter: mutant (e), prefix-cache
// keys without the tenant, lets a second tenant's identical prompt find the
// first tenant's pages. The pool's ledger check on every cache hit refuses
// them and counts pagewarden_isolation_violations_total, the must-be-zero
// counter the canary soak and the alerts watch.
func TestMutantPrefixKeyWithoutTenantCaughtByCounter(t *testing.T) {
	nonStrict(t)
	single := startSingle(t)
	ps := prompts(t, single)
	for _, mutated := range []bool{false, true} {
		t.Run(fmt.Sprintf("mutant=%v", mutated), func(t *testing.T) {
			if mutated {
				t.Cleanup(kvcache.KeyOmitsTenantForControls())
			}
			o := nodeOptions()
			o.PrefixCache = true
			l := startLocal(t, LocalConfig{Node: o})
			for _, tenant := range []string{"first", "first", "second"} {
				if out := run(t, l, params(tenant, ps[6], 4)); !out.res.Reason.Success() && !mutated {
					t.Fatalf("%s: %v (%v)", tenant, out.res.Reason, out.res.Err)
				}
			}
			v := l.IsolationViolations()
			if !mutated {
				if v != 0 {
					t.Fatalf("%d isolation violations without the mutant", v)
				}
				return
			}
			if v == 0 {
				t.Fatal("a cache key without the tenant went unseen: isolation violations stayed 0")
			}
			t.Logf("caught: %d isolation violations", v)
		})
	}
}

// TestMutantOKOnAbortCaughtByProbeRule: mutant (f), the gateway answering
// an aborted request as a success, is what the probe's #33507 rule
// (internal/probe, exchange.incomplete, its abort-storm check) looks for
// in every 200: finish_reason "length" with fewer than max_tokens tokens.
// Here the server aborts the request itself (the prefill node gives up on
// the handoff), answered through the real HTTP handler.
func TestMutantOKOnAbortCaughtByProbeRule(t *testing.T) {
	single := startSingle(t)
	ps := prompts(t, single)
	// The prefill node gives up on the handoff instead of sealing it:
	// the receiver aborts the reservation and the gateway's request ends
	// aborted by the server.
	giveUp := func(f *faulty, to transfer.Peer, m transfer.Message) []transfer.Message {
		if mf, ok := m.(*transfer.Manifest); ok {
			return keep(&transfer.Abort{Ref: mf.Ref, Reason: transfer.ReasonAborted})
		}
		if _, ok := m.(*transfer.Commit); ok {
			return nil
		}
		return keep(m)
	}
	for _, mutated := range []bool{false, true} {
		t.Run(fmt.Sprintf("mutant=%v", mutated), func(t *testing.T) {
			if mutated {
				t.Cleanup(gateway.OKOnAbortForControls())
			}
			l := startLocal(t, LocalConfig{Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
				f := &faulty{Transport: tr, name: name, victim: "acme"}
				if name == "prefill-0" {
					f.mutate = giveUp
				}
				return f
			}})
			post := apiClient(t, l)
			const maxTokens = 12
			status, body := post("/v1/completions", map[string]any{"prompt": ps[6], "max_tokens": maxTokens})
			var out struct {
				Choices []struct {
					FinishReason string `json:"finish_reason"`
				} `json:"choices"`
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			_ = json.Unmarshal(body, &out)
			// The probe's rule for a 200 the client did not leave.
			tell := status == http.StatusOK && len(out.Choices) == 1 && out.Choices[0].FinishReason == "length" && out.Usage.CompletionTokens < maxTokens
			switch {
			case !mutated && status < 500:
				t.Fatalf("a request whose handoff was refused was answered %d, want a server error: %s", status, body)
			case !mutated:
				t.Logf("without the mutant: %d %s", status, body)
			case !tell:
				t.Fatalf("with the mutant the probe's rule did not fire: %d %s", status, body)
			default:
				t.Logf("caught: %d with finish_reason length after %d of %d tokens", status, out.Usage.CompletionTokens, maxTokens)
			}
		})
	}
}
