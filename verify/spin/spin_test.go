package spin

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// check is one exhaustive run of the model: the -D defines that choose
// its bounds or break it, and whether it is the liveness search.
type check struct {
	name    string
	defines []string
	// live is the liveness search: pan -a, acceptance cycles, with no
	// fairness assumption. Not -f: under weak fairness pan 6.5.2 finds no
	// cycle in a run that ends with every process blocked — a request
	// stuck for ever holding its pages, the very failure looked for — and
	// passes it (the control "broken: no lease" below guards that).
	live   bool
	broken bool // must yield a counterexample
	// shows is what a broken variant's counterexample must show (a line
	// of the model's own account of the run).
	shows string
}

// The CI bounds (docs/spin.md says what each covers and leaves out). Two
// tenants exhaustively with every fault at once is out of reach of a CI
// run, so the faults are split over runs that each finish in seconds.
var checks = []check{
	// Two handed-off requests (A: 3 tokens, 2 pages; B: 2 tokens, 1 page)
	// share the decode pool: the pages one gives back are the other's
	// next, and the late messages of one find the other in its pages.
	// Every abort of both at once is beyond a CI run (docs/spin.md), so
	// each run gives one request its aborts and keeps the other plain.
	{name: "two requests: A aborted at any step (lease, prefill failure, placeholder), B plain", defines: []string{"TWO_REQUESTS", "A_NO_CLIENT_ABORT", "B_PLAIN"}},
	{name: "two requests: A's client leaves at any step, B plain", defines: []string{"TWO_REQUESTS", "A_NO_LEASE_EXPIRY", "A_CORRECT_PREFILL", "B_PLAIN"}},
	{name: "two requests: B aborted at any step (lease, prefill failure, placeholder), A plain", defines: []string{"TWO_REQUESTS", "A_PLAIN", "B_NO_CLIENT_ABORT"}},
	{name: "two requests, a lost message", defines: []string{"TWO_REQUESTS", "A_NO_CLIENT_ABORT", "B_PLAIN", "MAXLOSS=1"}},
	// Both at once: either request's reservation ends at any step (a lease
	// expiring stands for every abort decode makes itself), with smaller
	// gateway and prefill inboxes (2 and 1 messages: more of them lost
	// when full) to fit a CI run.
	{name: "two requests, both aborted at any step by their leases", defines: []string{"TWO_REQUESTS", "A_NO_CLIENT_ABORT", "A_CORRECT_PREFILL", "B_NO_CLIENT_ABORT", "B_CORRECT_PREFILL", "CAPG=2", "CAPP=1"}},
	// Both requests may end at any step by their leases, as in the
	// safety run above: any message lost to a full inbox is then
	// recovered from.
	{name: "two requests, liveness: every page ends free or quarantined, both requests end in the scheduler",
		defines: []string{"TWO_REQUESTS", "A_NO_CLIENT_ABORT", "A_CORRECT_PREFILL", "B_NO_CLIENT_ABORT", "B_CORRECT_PREFILL", "CAPG=2", "CAPP=1", "LIVENESS"}, live: true},
	{name: "two tenants, reordering and full inboxes", defines: []string{"LOCAL_TENANT"}},
	{name: "two tenants, asynchronous page writers", defines: []string{"LOCAL_TENANT", "ASYNC_WRITES"}},
	{name: "one request, a lost message", defines: []string{"MAXLOSS=1"}},
	{name: "one request, a duplicated message", defines: []string{"MAXDUP=1"}},
	{name: "liveness: every page ends free or quarantined", defines: []string{"MAXLOSS=1", "LIVENESS"}, live: true},
	// Defence in depth: without the receiver's manifest checks, sched and
	// kvcache's own checks of the commit still stop the placeholder.
	{name: "receiver's manifest checks off, the pool's check holds", defines: []string{"LOCAL_TENANT", "NO_MANIFEST_CHECKS"}},
	// Positive controls: each must produce a counterexample.
	// The incident: no page-count check, no scrub. Checked for the
	// cross-tenant property alone (FOREIGN_ONLY), so that the
	// counterexample goes on to what attention reads: the other request's
	// bytes in a page the placeholder left unwritten. A's other aborts are
	// off so that the depth-first search reaches B's whole life before
	// A's reservation in thousands of states (with them: 2 million).
	{name: "broken: the incident, two handed-off requests (decode trusts the reservation's page count, no scrub)",
		defines: []string{"TWO_REQUESTS", "B_PLAIN", "A_NO_CLIENT_ABORT", "A_NO_LEASE_EXPIRY", "BROKEN_INCIDENT", "FOREIGN_ONLY"}, broken: true, shows: "FOREIGN READ"},
	{name: "broken: the incident, a local tenant's page", defines: []string{"LOCAL_TENANT", "BROKEN_INCIDENT", "FOREIGN_ONLY"}, broken: true, shows: "FOREIGN READ"},
	{name: "broken: pages freed with a writer in flight", defines: []string{"LOCAL_TENANT", "ASYNC_WRITES", "NO_DRAIN"}, broken: true},
	// The liveness search's own control: B without a lease waits for
	// ever on a message a full inbox lost, holding its page.
	{name: "broken: a reservation with no lease holds its page for ever (liveness)",
		defines: []string{"TWO_REQUESTS", "A_NO_CLIENT_ABORT", "A_CORRECT_PREFILL", "B_NO_CLIENT_ABORT", "B_CORRECT_PREFILL", "B_NO_LEASE_EXPIRY", "CAPG=2", "CAPP=1", "LIVENESS"},
		live:    true, broken: true, shows: "START OF CYCLE"},
}

// TestModel checks handoff.pml exhaustively in each configuration:
// safety (assertions, invalid end states) with pan's default search,
// liveness with -a. A correct model must have no error; a broken
// variant must have one, and its trail is replayed and summarised.
func TestModel(t *testing.T) {
	if testing.Short() {
		t.Skip("the SPIN model is checked by the full (non -short) run")
	}
	spin, err := exec.LookPath("spin")
	if err != nil {
		t.Skip("SKIPPED: SPIN model NOT CHECKED: spin is not installed (apt-get install spin)")
	}
	cc, err := exec.LookPath("gcc")
	if err != nil {
		if cc, err = exec.LookPath("cc"); err != nil {
			t.Skip("SKIPPED: SPIN model NOT CHECKED: no C compiler (gcc or cc) for pan")
		}
	}
	model, err := os.ReadFile("handoff.pml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			res := run(t, spin, cc, model, c)
			t.Logf("%s: %d states stored, depth %d, %d errors, %.0f MB, pan %.1fs (-D%s)",
				c.name, res.states, res.depth, res.errors, res.memMB, res.elapsed.Seconds(), strings.Join(c.defines, " -D"))
			switch {
			case !res.complete:
				t.Fatalf("the search did not finish (a depth or memory bound was hit):\n%s", res.out)
			case c.broken && res.errors == 0:
				t.Fatalf("the broken variant passed: the model no longer catches the bug it re-introduces\n%s", res.out)
			case c.broken && !strings.Contains(res.trail, c.shows):
				t.Fatalf("the counterexample does not show %q:\n%s", c.shows, res.trail)
			case c.broken:
				t.Logf("counterexample, as expected:\n%s", res.trail)
			case res.errors > 0:
				t.Fatalf("%d errors:\n%s\ntrail:\n%s", res.errors, res.out, res.trail)
			}
		})
	}
}

type result struct {
	errors, depth int
	states        int64
	memMB         float64
	complete      bool
	elapsed       time.Duration
	out, trail    string
}

var (
	reErrors = regexp.MustCompile(`depth reached (\d+), errors: (\d+)`)
	reStates = regexp.MustCompile(`(\d+) states, stored`)
	reMemory = regexp.MustCompile(`([\d.]+)\s+total actual memory usage`)
	reProc   = regexp.MustCompile(`^\d+:\s+proc\s`)
)

// run generates, compiles and runs pan for c in a fresh directory.
func run(t *testing.T, spin, cc string, model []byte, c check) result {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "handoff.pml"), model, 0o644); err != nil {
		t.Fatal(err)
	}
	var defs []string
	for _, d := range c.defines {
		defs = append(defs, "-D"+d)
	}
	sh := func(name string, args ...string) string {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			// pan exits 0 even when it finds errors; anything else failing
			// is the tools' problem, not a verdict.
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out.String())
		}
		return out.String()
	}
	sh(spin, append(append([]string{"-a"}, defs...), "handoff.pml")...)
	// Safety: COLLAPSE compresses the state vector (most of it is the
	// network's bags); liveness keeps the default store.
	cflags := []string{"-O1", "-o", "pan", "pan.c"}
	if !c.live {
		cflags = append([]string{"-DSAFETY", "-DCOLLAPSE"}, cflags...)
	}
	sh(cc, cflags...)
	args := []string{"-m10000"} // deeper than any run (about 150 steps)
	if c.live {
		args = append(args, "-a")
	}
	start := time.Now()
	out := sh(filepath.Join(dir, "pan"), args...)
	res := result{out: out, elapsed: time.Since(start)}
	m := reErrors.FindStringSubmatch(out)
	s := reStates.FindStringSubmatch(out)
	if m == nil || s == nil {
		t.Fatalf("cannot read pan's verdict:\n%s", out)
	}
	res.depth, _ = strconv.Atoi(m[1])
	res.errors, _ = strconv.Atoi(m[2])
	res.states, _ = strconv.ParseInt(s[1], 10, 64)
	if m := reMemory.FindStringSubmatch(out); m != nil {
		res.memMB, _ = strconv.ParseFloat(m[1], 64)
	}
	// pan warns when the search was cut short by its depth bound (-m) or
	// ran out of memory; then "no errors" proves nothing.
	res.complete = !strings.Contains(out, "max search depth too small") && !strings.Contains(out, "out of memory")
	if res.errors > 0 {
		res.trail = summarize(sh(spin, append(append([]string{"-t", "-k", "handoff.pml.trail"}, defs...), "handoff.pml")...))
	}
	return res
}

// summarize keeps what a reader of a CI log needs from a replayed trail:
// the model's own account of the run (its printf lines: messages received,
// what prefill computed, commits, expired leases) and the violation.
func summarize(replay string) string {
	var keep []string
	steps := ""
	for _, l := range strings.Split(strings.TrimSpace(replay), "\n") {
		t := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(t, "spin: trail ends after"):
			steps = t
		case t == "" || strings.HasPrefix(t, "#processes") || strings.Contains(t, "processes created") ||
			strings.HasPrefix(t, "ltl ") || strings.HasPrefix(t, "Never claim"):
		case strings.HasPrefix(l, "\t\t") || strings.Contains(t, " = ") || reProc.MatchString(t):
			// the final values of variables and processes, printed after the violation
		default:
			keep = append(keep, t)
		}
	}
	if len(keep) > 40 {
		keep = append(keep[:5], append([]string{"..."}, keep[len(keep)-35:]...)...)
	}
	return strings.Join(keep, "\n") + "\n" + steps
}
