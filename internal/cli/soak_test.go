package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/link"
	"github.com/pagewarden/pagewarden/internal/probe"
	"github.com/pagewarden/pagewarden/internal/transfer"
)

// soakEnv sets the canary soak's canary trials per tenant (default 30 in
// the normal suite; PAGEWARDEN_SOAK=500 is a long run on demand).
const soakEnv = "PAGEWARDEN_SOAK"

// TestCanarySoak is the canary soak against the real multi-process system:
// a gateway replaying every answer (--audit-rate 1, a queue that holds
// them all), two prefill and two
// decode nodes as OS processes on loopback with mutual TLS, eight tenants,
// and the black-box probe's whole run against it — canaries in concurrent
// copy tasks, window boundaries, an abort storm, determinism under load,
// prefix-cache isolation, error hygiene and overload — then handoff
// faults (soak_faults_test.go): page frames dropped, duplicated and
// delayed, prefill→decode links cut mid-handoff (the links go through a
// proxy in this process), clients leaving, and a prefill node killed
// mid-handoff. It must end with no failed check and no foreign canary,
// every faulted request a clean error or serve's exact answer, the replay
// audit finding nothing, every must-be-zero counter at 0, and every
// surviving node's pages back to baseline.
func TestCanarySoak(t *testing.T) {
	if testing.Short() {
		t.Skip("starts five processes and runs the probe")
	}
	trials := 30
	if v := os.Getenv(soakEnv); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of trials per tenant", soakEnv, v)
		}
		trials = n
	}
	dir := t.TempDir()
	writeCerts(t, dir,
		link.Identity{Name: "gw", Role: transfer.RoleGateway},
		link.Identity{Name: "p0", Role: transfer.RolePrefill}, link.Identity{Name: "p1", Role: transfer.RolePrefill},
		link.Identity{Name: "d0", Role: transfer.RoleDecode}, link.Identity{Name: "d1", Role: transfer.RoleDecode})
	var keys []string
	var cfg strings.Builder
	cfg.WriteString("tenants:\n")
	for i := range 8 {
		k := fmt.Sprintf("soak-key-%d-%x", i, time.Now().UnixNano())
		keys = append(keys, k)
		fmt.Fprintf(&cfg, "  - id: t%d\n    api_key_sha256: [\"%s\"]\n    limits: {max_concurrent: 6}\n", i, tenants.HashKey(k))
	}
	config := filepath.Join(dir, "tenants.yaml")
	if err := os.WriteFile(config, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--model", "builtin:tiny", "--threads", "1", "--kv-memory", "16MiB", "--max-context", "256", "--tls-ca", filepath.Join(dir, "ca.pem")}
	ident := func(name string) []string {
		return []string{"--name", name, "--tls-cert", filepath.Join(dir, name+".pem"), "--tls-key", filepath.Join(dir, name+"-key.pem")}
	}
	node := func(role, name string, extra ...string) *proc {
		args := append(append(append([]string{role}, common...), ident(name)...), "--link-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0")
		return startProc(t, name, append(args, extra...)...)
	}
	linked := `linked on (127\.0\.0\.1:\d+)`
	metricsAt := `metrics on http://(127\.0\.0\.1:\d+)/metrics`
	d0, d1 := node("decode", "d0"), node("decode", "d1")
	decodes := "d0=" + d0.await(t, linked) + ",d1=" + d1.await(t, linked)
	// The prefill nodes reach the decode nodes through cuttable proxies,
	// and follow a frame-fault plan (off until the fault phase).
	proxies := []*faultProxy{startFaultProxy(t, d0.await(t, linked)), startFaultProxy(t, d1.await(t, linked))}
	plan := filepath.Join(dir, "faults")
	if err := os.WriteFile(plan, []byte("off"), 0o600); err != nil {
		t.Fatal(err)
	}
	viaProxies := "d0=" + proxies[0].addr() + ",d1=" + proxies[1].addr()
	faulty := func(name string) *proc {
		args := append(append(append([]string{"prefill"}, common...), ident(name)...), "--link-listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--decode", viaProxies)
		return startProcEnv(t, name, []string{faultEnv + "=" + plan}, args...)
	}
	p0, p1 := faulty("p0"), faulty("p1")
	prefills := "p0=" + p0.await(t, linked) + ",p1=" + p1.await(t, linked)
	gw := startProc(t, "gw", append(append(append([]string{"gateway"}, common...), ident("gw")...),
		"--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--audit-rate", "1", "--audit-queue", "100000", "--config", config,
		"--prefill", prefills, "--decode", decodes)...)
	url := "http://" + gw.await(t, `listening on http://(127\.0\.0\.1:\d+)`)

	var progress bytes.Buffer
	r, err := probe.Run(context.Background(), probe.Config{URL: url, Keys: keys, Trials: trials, Progress: &progress})
	if err != nil {
		t.Fatalf("probe: %v\n%s", err, progress.String())
	}
	for _, c := range r.Checks {
		if c.Verdict == probe.Fail {
			t.Errorf("probe check %s failed: %+v", c.Name, c)
		}
	}
	if r.Leak.Leaks != 0 || r.Leak.Trials < 8*trials {
		t.Errorf("canaries: %+v, want no leak over at least %d trials", r.Leak, 8*trials)
	}
	t.Logf("probe: %d requests in %.1fs; leak %d/%d, 95%% upper bound %.4f", r.Requests, r.Seconds, r.Leak.Leaks, r.Leak.Trials, r.Leak.Upper95)

	// The replays run after the answers they check, at low priority:
	// settle waits until they stop and says how many ended each way.
	gwMetrics := gw.await(t, metricsAt)
	replays := func(result string) float64 {
		v, _ := strconv.ParseFloat(metric(t, gwMetrics, `pagewarden_audit_replays_total{result="`+result+`"}`), 64)
		return v
	}
	settle := func() (match, failed float64) {
		deadline := time.Now().Add(3 * time.Minute)
		for last, still := -1.0, 0; still < 20; time.Sleep(100 * time.Millisecond) {
			n := replays("match") + replays("mismatch") + replays("failed")
			if n != last {
				last, still = n, 0
			} else {
				still++
			}
			if time.Now().After(deadline) {
				t.Fatal("the replays did not settle")
			}
		}
		if v := metric(t, gwMetrics, "pagewarden_audit_mismatches_total"); v != "0" || replays("dropped") != 0 {
			t.Errorf("replay audit: %s mismatches, %v dropped; want every answer replayed and matching", v, replays("dropped"))
		}
		return replays("match"), replays("failed")
	}
	// The probe's answers are replayed before the faults begin: a replay
	// the faults break fails (it is counted, not compared), and the
	// probe's must all match.
	match, _ := settle()
	if match < float64(8*trials) {
		t.Errorf("replay audit: %v matches; want every one of the probe's %d canary answers (at least) replayed and matching", match, 8*trials)
	}
	t.Logf("replay audit of the probe's answers: %v replayed, all matching", match)

	// Handoff faults, with the same tenants; p1 is killed on the way.
	handoffFaults{url: url, keys: keys, plan: plan, proxies: proxies, prefills: []*proc{p0, p1}, victim: p1,
		decodes: []string{d0.await(t, metricsAt), d1.await(t, metricsAt)}, requests: max(10, trials)}.run(t)
	after, failed := settle()
	t.Logf("replay audit after the faults: %v more answers replayed, all matching; %v replays failed (their handoff was faulted: no comparison)", after-match, failed)
	for _, name := range []string{"pagewarden_response_owner_mismatch_total", "pagewarden_gateway_inconsistent_results_total", "pagewarden_gateway_stream_contract_violations_total"} {
		if v := metric(t, gwMetrics, name); v != "0" {
			t.Errorf("gateway %s = %s", name, v)
		}
	}
	for _, n := range []*proc{d0, d1, p0} { // p1 was killed
		addr := n.await(t, metricsAt)
		waitPoolBack(t, n.name, addr, 30*time.Second)
		for _, name := range []string{"pagewarden_aborted_but_completed_total", "pagewarden_sched_owner_mismatches_total", "pagewarden_invariant_violations_total"} {
			if v := metric(t, addr, name); v != "0" {
				t.Errorf("%s: %s = %s", n.name, name, v)
			}
		}
	}
}
