//go:build pw_mutants

package cli

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/probe"
)

// probeMutantCase is one row of docs/assurance.md's probe column: serve
// started as a mutant (or none), with or without a handoff fault, and
// what the probe must say about it.
type probeMutantCase struct {
	name   string
	mutant string // PAGEWARDEN_MUTANT; "" none
	fault  string // PAGEWARDEN_MUTANT_FAULT; "" none
	// catch is the check that must fail with a 200 as evidence whose
	// "what" holds evidence: the mutant's wrong answer, not the fault's
	// error (for server-counters: the counter that rose, read from the
	// server's /metrics). "" means the probe must pass: a mutant it cannot see (why
	// says so), or the clean server.
	catch, evidence string
	// control names a check that may fail in a fault's control run (the
	// server failing closed) but only with server errors as evidence:
	// never a 200, which would be a wrong answer without any mutant.
	control string
	why     string
}

// probeMutantCases is the probe column of docs/assurance.md, as a test.
var probeMutantCases = []probeMutantCase{
	{name: "no mutant", why: "the clean server passes every check"},
	{name: "a", mutant: "a", catch: "server-counters", evidence: "pagewarden_invariant_violations_total rose by",
		why: "the client that aborted has gone and the placeholder's broken invariant aborts it inside: no client sees it, the server's must-be-zero counter does"},
	{name: "a2", mutant: "a2", catch: "server-counters", evidence: "pagewarden_aborted_but_completed_total rose by",
		why: "the aborted request runs on for a client that has gone and finishes: the client sees nothing, the server's must-be-zero counter does"},
	{name: "b control: torn handoffs, no mutant", fault: "torn=2", control: "determinism"},
	{name: "b with torn handoffs", mutant: "b", fault: "torn=2", catch: "determinism", evidence: "differs"},
	{name: "b without a fault", mutant: "b", why: "not visible: serve's handoffs are never torn on their own"},
	{name: "c", mutant: "c", why: "not visible: serve's in-process link writes pages synchronously, so no writer is ever in flight at a free; " +
		"second layer: SPIN (verify/spin, \"pages freed with a writer in flight\")"},
	{name: "d", mutant: "d", why: "not visible: attention reads only positions its request wrote, so unscrubbed bytes change no answer alone; " +
		"second layer: internal/kvcache TestControlSkipScrub"},
	{name: "e", mutant: "e", why: "not visible: the gateway salts every prefix key with the tenant's cache namespace, so two tenants' keys still differ; " +
		"second layer: pagewarden_isolation_violations_total (internal/disagg TestMutantPrefixKeyWithoutTenantCaughtByCounter)"},
	{name: "e2", mutant: "e2", catch: "server-counters", evidence: "pagewarden_isolation_violations_total rose by",
		why: "with the gateway's salt gone too, the second tenant's identical prompt looks up the first tenant's pages: the pool's ledger refuses the hit and counts it"},
	{name: "f control: handoffs given up, no mutant", fault: "giveup=4", control: "abort-storm"},
	{name: "f with handoffs given up", mutant: "f", fault: "giveup=4", catch: "abort-storm", evidence: `finish_reason "length"`},
	{name: "f without a fault", mutant: "f", why: "not visible: no request is aborted by serve itself without a fault"},
	{name: "g control: short handoffs, no mutant", fault: "short=2", control: "determinism"},
	{name: "g with short handoffs", mutant: "g", fault: "short=2", catch: "determinism", evidence: "differs"},
}

// startMutantServe runs this test binary as `pagewarden serve` (split: a
// prefill and a decode node behind the gateway, the default) with the
// mutant and fault of tc, one tenant per key, and returns its URL.
func startMutantServe(t *testing.T, tc probeMutantCase, keys []string) (string, *proc) {
	t.Helper()
	var cfg strings.Builder
	cfg.WriteString("tenants:\n")
	for i, k := range keys {
		fmt.Fprintf(&cfg, "  - id: t%d\n    api_key_sha256: [\"%s\"]\n    limits: {max_concurrent: 6}\n", i, tenants.HashKey(k))
	}
	path := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{mutantEnv + "=" + tc.mutant, mutantFaultEnv + "=" + tc.fault}
	p := startProcEnv(t, "serve", env, "serve", "--model", "builtin:tiny", "--threads", "1", "--listen", "127.0.0.1:0",
		"--kv-memory", "16MiB", "--metrics-listen", "", "--metrics-on-api", "--max-context", "256", "--config", path)
	waitFor(t, p.out, "listening on http://")
	m := regexp.MustCompile(`listening on (http://\S+)`).FindStringSubmatch(p.out.String())
	if m == nil {
		t.Fatalf("serve output: %s", p.out.String())
	}
	return m[1], p
}

// TestProbeCatchesMutants runs the probe (quick) against serve built with
// each mutant of docs/assurance.md. The clean server passes. A mutant the
// probe can see fails the check its bug breaks, with the wrong answer as
// evidence, once serve also has the handoff fault that the whole-system
// simulation uses to trigger it; the same fault without the mutant fails
// closed (server errors, never a wrong 200). A mutant the probe cannot see
// passes, and the table says why and which layer catches it instead: if
// the probe ever sees one, this test fails so that the table is updated.
func TestProbeCatchesMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("starts serve 14 times")
	}
	keys := []string{"probe-key-alpha", "probe-key-beta"}
	for _, tc := range probeMutantCases {
		t.Run(tc.name, func(t *testing.T) {
			url, srv := startMutantServe(t, tc, keys)
			t.Cleanup(func() { stopWithin(t, srv, 3*time.Second) })
			if tc.mutant != "" && !strings.Contains(srv.out.String(), "MUTANT "+tc.mutant+" switched on") {
				t.Fatalf("serve did not say it is mutant %s:\n%s", tc.mutant, srv.out.String())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r, err := probe.Run(ctx, probe.Config{URL: url, Keys: keys, Quick: true, Timeout: 30 * time.Second})
			if err != nil {
				t.Fatalf("probe: %v", err)
			}
			var summary bytes.Buffer
			r.WriteSummary(&summary)
			t.Logf("probe: %d requests in %.1f s", r.Requests, r.Seconds)
			switch {
			case tc.catch != "":
				c := r.Check(tc.catch)
				if c == nil || c.Verdict != probe.Fail {
					t.Fatalf("mutant %s with fault %s: the %s check did not fail:\n%s", tc.mutant, tc.fault, tc.catch, summary.String())
				}
				caught := 0
				for _, ev := range c.Evidence {
					// The counters' evidence is the server's own count,
					// not an answer.
					if (ev.Status == http.StatusOK || tc.catch == "server-counters") && strings.Contains(ev.What, tc.evidence) {
						caught++
					}
				}
				if caught == 0 {
					t.Fatalf("mutant %s: %s failed, but no evidence is a 200 whose finding holds %q:\n%s", tc.mutant, tc.catch, tc.evidence, r.JSON())
				}
				t.Logf("caught by %s: %d of %d pieces of evidence hold %q, e.g. %s %s", tc.catch, caught, len(c.Evidence), tc.evidence, c.Evidence[0].What, c.Evidence[0].Bytes)
			case tc.control != "":
				// The fault alone: requests fail, but closed. The
				// check the mutant fails must hold no wrong 200.
				c := r.Check(tc.control)
				if c == nil {
					t.Fatalf("no %s check:\n%s", tc.control, summary.String())
				}
				for _, ev := range c.Evidence {
					if ev.Status == http.StatusOK {
						t.Errorf("fault %s without a mutant: %s has a 200 as evidence (a wrong answer with every check on): %s %s", tc.fault, tc.control, ev.What, ev.Bytes)
					}
				}
				if ab := r.Check("abort-storm"); ab != nil {
					for _, ev := range ab.Evidence {
						if ev.Status == http.StatusOK {
							t.Errorf("fault %s without a mutant: an incomplete 200: %s %s", tc.fault, ev.What, ev.Bytes)
						}
					}
				}
				for _, ch := range r.Checks {
					t.Logf("fault %s alone: %s %s: %s", tc.fault, ch.Name, ch.Verdict, ch.Reason)
				}
				// A control whose fault never fired would prove nothing.
				if n := strings.Count(srv.out.String(), `"msg":"handoff failed"`); n == 0 {
					t.Errorf("fault %s: no handoff failed, so the fault never fired:\n%s", tc.fault, srv.out.String())
				} else {
					t.Logf("fault %s alone: %d handoffs failed; %s %s (%d pieces of evidence, none a 200)", tc.fault, n, c.Name, c.Verdict, len(c.Evidence))
				}
			default:
				if r.Failed() {
					t.Fatalf("%s: the probe failed, but the table says %q; if the probe now sees this mutant, make it a catch here and in docs/assurance.md:\n%s",
						tc.name, tc.why, summary.String())
				}
				t.Logf("probe passes: %s", tc.why)
				if c := r.Check("server-counters"); c != nil {
					t.Logf("server-counters %s: %s %v", c.Verdict, c.Reason, c.Numbers)
				}
			}
		})
	}
}

// stopWithin stops p with SIGTERM and kills it if it has not exited
// after grace: mutant a's serve never drains (its aborted request is
// stuck as a placeholder), and waiting for startProcEnv's 20 s would be
// most of this test's CI time. Registered after startProcEnv's cleanup,
// it runs first, and that one then finds the process gone.
func stopWithin(t *testing.T, p *proc, grace time.Duration) {
	if p.cmd.ProcessState != nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		t.Logf("serve did not exit within %v of SIGTERM; killed", grace)
		p.cmd.Process.Kill()
		<-done
	}
}

// TestMutantEnvRefusesUnknown: a typo in PAGEWARDEN_MUTANT or its fault
// stops the process (exit 2) naming what is known, rather than starting a
// correct server that a control would take for a mutant that escaped.
func TestMutantEnvRefusesUnknown(t *testing.T) {
	for _, tc := range []struct {
		env, want string
	}{
		{mutantEnv + "=h", `unknown mutant "h": want one of a, a2, b, c, d, e, e2, f, g`},
		{mutantEnv + "=A", `unknown mutant "A"`},
		{mutantFaultEnv + "=torn=0", "want giveup=N, torn=N or short=N"},
		{mutantFaultEnv + "=drop=3", "want giveup=N, torn=N or short=N"},
		{mutantFaultEnv + "=giveup", "want giveup=N, torn=N or short=N"},
	} {
		cmd := exec.Command(os.Args[0], "version")
		cmd.Env = append(os.Environ(), childEnv+"=1", tc.env)
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), tc.want) {
			t.Errorf("%s: %v, output %q; want exit 2 and %q", tc.env, err, out, tc.want)
		}
	}
}

// TestReleaseBinaryHasNoMutants: pagewarden built without the tag holds
// none of the mutant code: no symbol of a hook, the switch or the fault
// (go tool nm), and not the names of the variables that would switch them
// on. This tagged test binary (stripped of symbols, so only its bytes are
// read) holds those names, so the byte check can fail.
func TestReleaseBinaryHasNoMutants(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the pagewarden binary")
	}
	bin := filepath.Join(t.TempDir(), "pagewarden")
	build := exec.Command("go", "build", "-o", bin, "github.com/pagewarden/pagewarden/cmd/pagewarden")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	nm, err := exec.Command("go", "tool", "nm", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	if !bytes.Contains(nm, []byte("cli.MainEnv")) {
		t.Fatalf("go tool nm shows no cli.MainEnv: the symbol check would be blind")
	}
	// The names of every hook and of this package's switch and fault.
	forbidden := regexp.MustCompile(`ForControls|cli\.switchOnMutant|cli\.\(\*handoffFault\)|gateway\.okOnAbort|sched\.controlMutant`)
	if hits := forbidden.FindAll(nm, 5); len(hits) > 0 {
		t.Errorf("the release binary holds mutant code: %q", hits)
	}
	names := [][]byte{[]byte(mutantEnv), []byte(mutantFaultEnv + "="), []byte("switched on (")}
	release, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	tagged, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if bytes.Contains(release, n) {
			t.Errorf("the release binary holds %q", n)
		}
		if !bytes.Contains(tagged, n) {
			t.Errorf("the tagged test binary lacks %q: the byte check is blind", n)
		}
	}
}
