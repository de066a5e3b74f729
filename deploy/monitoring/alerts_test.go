// Package monitoring holds the alert rules and the Grafana dashboard; its
// tests check that every metric they name is one pagewarden exports.
package monitoring

import (
	"os"
	"regexp"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pagewarden/pagewarden/internal/gateway"
	"github.com/pagewarden/pagewarden/internal/gateway/tenants"
	"github.com/pagewarden/pagewarden/internal/model"
	"github.com/pagewarden/pagewarden/internal/node"
)

// TestRulesNameExportedMetrics: a rule over a metric nobody exports never
// fires, which is worse than no rule. Every pagewarden_* name in the
// rules must be exported by a serving process (gateway and node).
func TestRulesNameExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &rules); err != nil {
		t.Fatal(err)
	}
	exported := exportedMetrics(t)
	metricRe := regexp.MustCompile(`pagewarden_[a-z_]+`)
	count := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, name := range metricRe.FindAllString(r.Expr, -1) {
				count++
				if !exported[name] {
					t.Errorf("alert %s uses %s, which no pagewarden process exports", r.Alert, name)
				}
			}
		}
	}
	if count < 10 {
		t.Fatalf("only %d metric references in the rules", count)
	}
}

// exportedMetrics returns the name of every metric a serving process (a
// gateway over a node) exports, with the _bucket, _sum and _count series
// of each name, as queries over histograms name them.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	m, err := model.Load(model.BuiltinPrefix+"tiny", model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(m, node.Options{Threads: 1, KVMemory: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	srv, err := gateway.New(gateway.Config{Backend: n, Tenants: &tenants.Config{Tenants: []tenants.Tenant{{ID: "a", APIKeySHA256: []string{tenants.HashKey("k")}}}}})
	if err != nil {
		t.Fatal(err)
	}
	reg := srv.Metrics()
	if err := reg.Register(n.Collector()); err != nil {
		t.Fatal(err)
	}
	// Vectors have no series until used: count them by their descriptions.
	exported := map[string]bool{}
	ch := make(chan *prometheus.Desc, 256)
	go func() {
		reg.Describe(ch)
		close(ch)
	}()
	nameRe := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if m := nameRe.FindStringSubmatch(d.String()); m != nil {
			for _, suffix := range []string{"", "_bucket", "_sum", "_count"} {
				exported[m[1]+suffix] = true
			}
		}
	}
	return exported
}
