package monitoring

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// dashboardPanel is what the test reads of a Grafana panel.
type dashboardPanel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []dashboardPanel `json:"panels"` // a collapsed row's
}

// TestDashboardNamesExportedMetrics: every metric a panel or variable of
// the Grafana dashboard queries is exported by a serving process (a panel
// over a metric nobody exports is empty forever, and looks like calm), the
// panels do not overlap, and every panel but a row has a query.
func TestDashboardNamesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("grafana/pagewarden.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID        string           `json:"uid"`
		Panels     []dashboardPanel `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatal(err)
	}
	if dash.UID == "" {
		t.Error("the dashboard has no uid (provisioning needs one)")
	}
	exported := exportedMetrics(t)
	metricRe := regexp.MustCompile(`\b(?:pagewarden|process|go)_[a-z_]+`)
	check := func(where, expr string) int {
		n := 0
		for _, name := range metricRe.FindAllString(expr, -1) {
			n++
			if !exported[name] {
				t.Errorf("%s queries %s, which no pagewarden process exports", where, name)
			}
		}
		return n
	}
	var all []dashboardPanel
	for _, p := range dash.Panels {
		all = append(all, p)
		all = append(all, p.Panels...)
	}
	ids := map[int]bool{}
	refs := 0
	for _, p := range all {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			refs += check("panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		refs += check("variable "+v.Name, v.Definition)
	}
	if refs < 30 {
		t.Fatalf("only %d metric references in the dashboard", refs)
	}
	// No two panels share a grid cell.
	cell := map[[2]int]string{}
	for _, p := range all {
		g := p.GridPos
		if g.W < 1 || g.H < 1 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q at %+v: outside the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, taken := cell[[2]int{x, y}]; taken {
					t.Fatalf("panels %q and %q overlap at %d,%d", other, p.Title, x, y)
				}
				cell[[2]int{x, y}] = p.Title
			}
		}
	}
	// The must-be-zero counters the alerts page on each have a panel.
	text := string(data)
	for _, m := range []string{"pagewarden_isolation_violations_total", "pagewarden_aborted_but_completed_total", "pagewarden_sched_owner_mismatches_total", "pagewarden_kv_pages_quarantined"} {
		if !strings.Contains(text, m) {
			t.Errorf("no panel shows %s", m)
		}
	}
}
