package probe

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
)

// upper95 is the one-sided 95% Clopper-Pearson upper bound on a rate of
// which x events were seen in n trials: the p at which seeing x or fewer
// has probability 5%. For x = 0 it is 1 − 0.05^(1/n), about 3/n (the rule
// of three). n = 0 tells nothing: 1.
func upper95(n, x int) float64 {
	const alpha = 0.05
	switch {
	case n <= 0:
		return 1
	case x >= n:
		return 1
	case x == 0:
		return 1 - math.Pow(alpha, 1/float64(n))
	}
	// P(X <= x; n, p) falls as p grows: bisect for alpha.
	lo, hi := float64(x)/float64(n), 1.0
	for range 100 {
		mid := (lo + hi) / 2
		if binomCDF(x, n, mid) > alpha {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}

// binomCDF is P(X <= x) for X ~ Binomial(n, p), summed in log space.
func binomCDF(x, n int, p float64) float64 {
	lp, lq := math.Log(p), math.Log1p(-p)
	ln, _ := math.Lgamma(float64(n + 1))
	s := 0.0
	for k := 0; k <= x; k++ {
		lk, _ := math.Lgamma(float64(k + 1))
		lnk, _ := math.Lgamma(float64(n - k + 1))
		s += math.Exp(ln - lk - lnk + float64(k)*lp + float64(n-k)*lq)
	}
	return s
}

func percent(f float64) string {
	switch {
	case f >= 0.1:
		return fmt.Sprintf("%.0f%%", 100*f)
	case f >= 0.001:
		return fmt.Sprintf("%.2f%%", 100*f)
	}
	return fmt.Sprintf("%.2g%%", 100*f)
}

// WriteSummary writes the report for a person: one line per check, the
// evidence of failures under it, and the verdict.
func (r *Report) WriteSummary(w io.Writer) {
	tok := "no /tokenize"
	if r.Tokenize {
		tok = "/tokenize (" + orElse(r.TokenizeForm, string(tokVLLM)) + " form)"
	}
	keys := fmt.Sprintf("%d keys", r.Keys)
	if r.OneTenant {
		keys += " of one tenant"
	}
	fmt.Fprintf(w, "pagewarden probe of %s (%s): model %q, window %d (%s), %s, %s\n", r.URL, orElse(r.Server, "server not recognized"), r.Model, r.Window, r.WindowSrc, tok, keys)
	fmt.Fprintf(w, "%d requests in %.1f s\n\n", r.Requests, r.Seconds)
	failed := 0
	for _, c := range r.Checks {
		fmt.Fprintf(w, "%-4s  %-13s %s\n", strings.ToUpper(string(c.Verdict)), c.Name, c.Reason)
		if c.Verdict == Fail {
			failed++
		}
		if len(c.Numbers) > 0 && c.Name != "canaries" {
			names := make([]string, 0, len(c.Numbers))
			for k := range c.Numbers {
				names = append(names, k)
			}
			sort.Strings(names)
			var b strings.Builder
			for _, k := range names {
				fmt.Fprintf(&b, " %s=%v", k, c.Numbers[k])
			}
			fmt.Fprintf(w, "      (%d requests;%s)\n", c.Requests, b.String())
		}
		for _, ev := range c.Evidence {
			fmt.Fprintf(w, "      - %s\n", ev.What)
			if ev.Request != "" {
				fmt.Fprintf(w, "        request: key %d, %s\n", ev.Key, ev.Request)
			}
			if ev.Status != 0 || ev.Error != "" {
				fmt.Fprintf(w, "        status: %d %s\n", ev.Status, ev.Error)
			}
			if ev.Bytes != "" {
				fmt.Fprintf(w, "        bytes: %q\n", clip([]byte(ev.Bytes), 300))
			}
		}
	}
	fmt.Fprintf(w, "\nleak rate: %d foreign secrets in %d responses; 95%% upper bound %s\n", r.Leak.Leaks, r.Leak.Trials, percent(r.Leak.Upper95))
	if failed > 0 {
		fmt.Fprintf(w, "verdict: FAIL (%d of %d checks failed)\n", failed, len(r.Checks))
	} else {
		fmt.Fprintf(w, "verdict: PASS (no check failed)\n")
	}
}
