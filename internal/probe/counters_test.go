package probe

import (
	"errors"
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]float64
		err      string
	}{
		{name: "empty", in: "", want: map[string]float64{}},
		{name: "comments and a counter", in: "# HELP x_total a\n# TYPE x_total counter\nx_total 3\n", want: map[string]float64{"x_total": 3}},
		{name: "label sets are summed", in: "r_total{code=\"200\"} 2\nr_total{code=\"503\",t=\"a}b\"} 5 1700000000\n", want: map[string]float64{"r_total": 7}},
		{name: "escaped quote in a label", in: "r{a=\"x\\\"}\"} 1\n", want: map[string]float64{"r": 1}},
		{name: "special values", in: "a +Inf\nb NaN\nc 1e3\n", want: map[string]float64{"c": 1000}},
		{name: "no value", in: "x_total\n", err: "line 1"},
		{name: "bad value", in: "ok 1\nx_total three\n", err: "line 2"},
		{name: "bad name", in: "9x 1\n", err: "metric name"},
		{name: "unterminated labels", in: "x{a=\"1\" 1\n", err: "unterminated"},
		{name: "too many fields", in: "x 1 2 3\n", err: "at most a timestamp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseMetrics(strings.NewReader(tc.in))
			if tc.err != "" {
				if err == nil || !errors.Is(err, errMetricsLine) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one holding %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s = %v, want %v", k, got[k], v)
				}
			}
			if _, ok := got["b"]; tc.name == "special values" && !ok {
				t.Errorf("NaN sample dropped")
			}
		})
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add("# TYPE x counter\nx_total{a=\"b\"} 1 17\n")
	f.Add("x{a=\"\\\"}\"} NaN\n")
	f.Fuzz(func(t *testing.T, in string) {
		m, err := parseMetrics(strings.NewReader(in))
		if err == nil {
			for k := range m {
				if !validMetricName(k) {
					t.Fatalf("accepted name %q", k)
				}
			}
		}
	})
}

func TestCounterCheck(t *testing.T) {
	const abort = "pagewarden_aborted_but_completed_total"
	for _, tc := range []struct {
		name          string
		extra         []string
		before, after map[string]float64
		errBefore     error
		want          Verdict
		reason        string // a piece of the reason or the first evidence
	}{
		{name: "clean", before: map[string]float64{abort: 0}, after: map[string]float64{abort: 0}, want: Pass, reason: "did not rise"},
		{name: "risen", before: map[string]float64{abort: 1}, after: map[string]float64{abort: 4}, want: Fail, reason: abort + " rose by 3 during the run (1 before, 4 after)"},
		{name: "appears during the run", before: map[string]float64{}, after: map[string]float64{abort: 2}, want: Fail, reason: "rose by 2"},
		{name: "nonzero but steady", before: map[string]float64{abort: 5}, after: map[string]float64{abort: 5}, want: Pass, reason: abort},
		{name: "none exposed", before: map[string]float64{"llamacpp:tokens_predicted_total": 1}, after: map[string]float64{"llamacpp:tokens_predicted_total": 9}, want: Skip, reason: "not applicable"},
		{name: "unreadable", errBefore: errors.New("GET /metrics answered 404"), want: Skip, reason: "404"},
		{name: "user's counter", extra: []string{"my_leaks_total"}, before: map[string]float64{"my_leaks_total": 0}, after: map[string]float64{"my_leaks_total": 1}, want: Fail, reason: "my_leaks_total rose by 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &prober{cfg: Config{URL: "http://h", ZeroMetrics: tc.extra}}
			c := p.counterCheck(tc.before, tc.errBefore, tc.after, nil)
			text := c.Reason
			if len(c.Evidence) > 0 {
				text = c.Evidence[0].What
			}
			if c.Verdict != tc.want || !strings.Contains(text, tc.reason) {
				t.Errorf("%s: %q, want %s with %q", c.Verdict, text, tc.want, tc.reason)
			}
		})
	}
}
