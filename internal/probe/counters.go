package probe

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
)

// DefaultZeroMetrics are pagewarden's must-be-zero counters (see
// docs/operations.md): each counts a broken promise, so any increase
// while the probe runs is a failure the server itself has seen, even
// when no wrong byte reached a client (an abort that still finished, an
// attention step refused by the ownership check).
var DefaultZeroMetrics = []string{
	"pagewarden_isolation_violations_total",
	"pagewarden_aborted_but_completed_total",
	"pagewarden_invariant_violations_total",
	"pagewarden_sched_owner_mismatches_total",
	"pagewarden_audit_mismatches_total",
}

// errMetricsLine is wrapped by parseMetrics for a sample line it cannot
// read.
var errMetricsLine = errors.New("bad sample line")

// parseMetrics reads Prometheus' text exposition format and returns the
// sum of each metric name's samples over its label sets. Comments and
// blank lines are skipped; a sample line that is not `name[{labels}]
// value [timestamp]` is an error naming its line, since a counter read
// wrongly would make the check's verdict wrong.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ \t"); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if !validMetricName(name) {
			return nil, fmt.Errorf("%w %d: metric name %q", errMetricsLine, n, name)
		}
		if strings.HasPrefix(rest, "{") {
			// Label values are quoted and may hold '}' or escaped quotes.
			end, inQuote := -1, false
			for i := 1; i < len(rest) && end < 0; i++ {
				switch {
				case inQuote && rest[i] == '\\':
					i++
				case rest[i] == '"':
					inQuote = !inQuote
				case !inQuote && rest[i] == '}':
					end = i
				}
			}
			if end < 0 {
				return nil, fmt.Errorf("%w %d: unterminated labels", errMetricsLine, n)
			}
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) < 1 || len(fields) > 2 {
			return nil, fmt.Errorf("%w %d: want a value and at most a timestamp, got %q", errMetricsLine, n, rest)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%w %d: value %q", errMetricsLine, n, fields[0])
		}
		out[name] += v
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// validMetricName is Prometheus' [a-zA-Z_:][a-zA-Z0-9_:]*.
func validMetricName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		ok := r == '_' || r == ':' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (i > 0 && r >= '0' && r <= '9')
		if !ok {
			return false
		}
	}
	return true
}

// metricsURL is where the counters are read: Config.MetricsURL, or
// /metrics on the API's address (vLLM's and llama.cpp's place;
// pagewarden serves it on a private address unless --metrics-on-api).
func (p *prober) metricsURL() string {
	if p.cfg.MetricsURL != "" {
		return p.cfg.MetricsURL
	}
	return p.cfg.URL + "/metrics"
}

// scrape reads the metrics once; the error says why there are none.
func (p *prober) scrape(ctx context.Context) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, min(p.cfg.Timeout, 30e9))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.metricsURL(), nil)
	if err != nil {
		return nil, err
	}
	// The first key: a server that guards /metrics with its API keys
	// opens it to a valid one; a private metrics address ignores it.
	req.Header.Set("Authorization", "Bearer "+p.cfg.Keys[0])
	resp, err := p.c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s answered %d", p.metricsURL(), resp.StatusCode)
	}
	return parseMetrics(bytes.NewReader(body))
}

// zeroMetrics is the names watched: the defaults and the user's.
func (p *prober) zeroMetrics() []string {
	names := append([]string{}, DefaultZeroMetrics...)
	for _, n := range p.cfg.ZeroMetrics {
		if !containsString(names, n) {
			names = append(names, n)
		}
	}
	return names
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// counterCheck judges the must-be-zero counters read before the run
// (before, or errBefore) and after it. Any increase fails with the
// counter and its increase; a server that exposes none of them makes the
// check not applicable, never passed.
func (p *prober) counterCheck(before map[string]float64, errBefore error, after map[string]float64, errAfter error) Check {
	c := Check{Name: "server-counters", Verdict: Pass}
	names := p.zeroMetrics()
	if errBefore != nil || errAfter != nil {
		c.Verdict = Skip
		c.Reason = fmt.Sprintf("not applicable: the server's metrics could not be read (%v); give --metrics-url where it serves them", errors.Join(errBefore, errAfter))
		return c
	}
	nums := map[string]any{}
	var seen, missing []string
	for _, n := range names {
		b, okB := before[n]
		a, okA := after[n]
		if !okB && !okA {
			missing = append(missing, n)
			continue
		}
		seen = append(seen, n)
		nums[n+"_before"], nums[n+"_after"] = b, a
		if d := a - b; d > 0 || math.IsNaN(d) {
			c.fail(Evidence{What: fmt.Sprintf("%s rose by %g during the run (%g before, %g after); it must stay 0", n, d, b, a), Key: -1, Request: "GET " + p.metricsURL()})
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		nums["not_exposed"] = missing
	}
	c.Numbers = nums
	switch {
	case c.Verdict == Fail:
		c.Reason = fmt.Sprintf("%d must-be-zero counters rose while the probe ran: the server saw a broken promise", len(c.Evidence))
	case len(seen) == 0:
		c.Verdict = Skip
		c.Reason = fmt.Sprintf("not applicable: the server's metrics hold none of the must-be-zero counters (%s)", strings.Join(names, ", "))
	default:
		c.Reason = fmt.Sprintf("%d must-be-zero counters did not rise during the run (%s)", len(seen), strings.Join(seen, ", "))
		if len(missing) > 0 {
			c.Reason += "; not exposed: " + strings.Join(missing, ", ")
		}
	}
	return c
}
