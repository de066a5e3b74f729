//go:build pw_mutants

package disagg

import (
	"fmt"
	"slices"
	"testing"

	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// TestControlIncident is the positive control of the incident test
// ("fewer pages than reserved" in TestFaultsFailClosed): it rebuilds the
// incident by turning off, through build-tagged hooks, every layer that
// stops it — the receiver's exact-match checks, kvcache.CommitImport's
// page check, the scheduler's refusal of a handoff that is not the whole
// prompt, and scrub on release — and shows that the victim's request then
// comes back a success with output computed over another tenant's stale
// pages. Then it turns the layers back on one at a time and shows that
// each alone fails the request closed.
func TestControlIncident(t *testing.T) {
	single := startSingle(t)
	ps := prompts(t, single)
	victimPrompt := ps[6] // 33 tokens: three pages on decode
	// Sampled with a seed, so that the output depends on every logit: a
	// greedy builtin:tiny often repeats one token whatever it reads.
	victim := func() request.Params {
		p := params("victim", victimPrompt, 12)
		p.Sampling = request.Sampling{Temperature: 1, Seed: 7}
		return p
	}
	want := run(t, single, victim())
	incident := faultCases[0]
	if incident.name != "fewer pages than reserved (the incident)" {
		t.Fatalf("faultCases[0] is %q", incident.name)
	}
	type layers struct{ receiver, pool, sched bool }
	for _, tc := range []struct {
		on      layers
		outcome string // "leak": success with other output; "closed": an error
	}{
		{layers{}, "leak"},
		{layers{receiver: true}, "closed"},
		{layers{pool: true}, "closed"},
		{layers{sched: true}, "closed"},
	} {
		t.Run(fmt.Sprintf("%+v", tc.on), func(t *testing.T) {
			var restores []func()
			restores = append(restores, kvcache.SkipScrubForControls())
			if !tc.on.receiver {
				restores = append(restores, transfer.DisableManifestChecks())
			}
			if !tc.on.pool {
				restores = append(restores, kvcache.SkipHandoffCheckForControls())
			}
			if !tc.on.sched {
				restores = append(restores, sched.TrustReservationForControls())
			}
			l := startLocal(t, LocalConfig{Wrap: func(name transfer.Peer, tr link.Transport) link.Transport {
				f := &faulty{Transport: tr, name: name, victim: "victim"}
				if name == "prefill-0" {
					f.mutate = incident.mutate
				}
				return f
			}})
			// Restore only after the cluster is down: the hooks are
			// package state the nodes' goroutines read.
			t.Cleanup(func() {
				for _, r := range restores {
					r()
				}
			})
			t.Cleanup(func() { l.Close() })
			// Another tenant's long request leaves its KV in pages that go
			// back unscrubbed; the victim's reservation takes them next.
			prev := append([]int(nil), ps[2]...)
			slices.Reverse(prev[1:]) // other text than the victim's, whose prompt starts like ps[2]
			other := run(t, l, params("previous-tenant", prev, 40))
			if !other.res.Reason.Success() {
				t.Fatalf("previous tenant: %+v", other.res)
			}
			got := run(t, l, victim())
			same := got.res.Reason == want.res.Reason && fmt.Sprint(got.tokens) == fmt.Sprint(want.tokens)
			switch tc.outcome {
			case "leak":
				if !got.res.Reason.Success() || same {
					t.Fatalf("with every layer off the incident should get through (a success with other output); got %v %v (%v)", got.res.Reason, got.tokens, got.res.Err)
				}
				t.Logf("incident reproduced: HTTP-200-equivalent %v with %v, fault-free output %v", got.res.Reason, got.tokens, want.tokens)
			case "closed":
				if got.res.Reason.Success() || got.res.Err == nil {
					t.Fatalf("the layer alone should fail the request closed; got %v %v", got.res.Reason, got.tokens)
				}
			}
		})
	}
}
