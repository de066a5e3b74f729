package admin_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/pagewarden/pagewarden/internal/admin"
	"github.com/pagewarden/pagewarden/internal/invariants"
	"github.com/pagewarden/pagewarden/internal/kvcache"
	"github.com/pagewarden/pagewarden/internal/request"
	"github.com/pagewarden/pagewarden/internal/sched"
)

// chromium finds a headless-capable Chromium: $PAGEWARDEN_CHROMIUM, else
// Debian's chromium (test.sh installs it where it can) or Chrome on PATH.
func chromium(t *testing.T) string {
	if p := os.Getenv("PAGEWARDEN_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("SKIPPED: no Chromium found (install the Debian package chromium, or set PAGEWARDEN_CHROMIUM): the admin page map is NOT tested in a browser")
	return ""
}

// testExecutor is a stand-in model: every item's outcome echoes the
// view's owner and samples token 1, except for the tenants in corrupt,
// whose outcomes claim another owner: the owner mismatch the scheduler
// must catch, quarantining the request's pages (a test-only way to inject
// an isolation violation into a real scheduler loop).
type testExecutor struct {
	mu      sync.Mutex
	corrupt map[request.Tenant]bool
	delay   time.Duration // per batch: slows running requests down to be watched
}

func (e *testExecutor) Execute(_ context.Context, b *sched.Batch) ([]sched.Outcome, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	time.Sleep(e.delay)
	outs := make([]sched.Outcome, len(b.Items))
	for i, it := range b.Items {
		outs[i] = sched.Outcome{Owner: it.View.Owner(), Token: 1}
		if e.corrupt[it.Owner.Tenant] {
			outs[i].Owner = request.Owner{Tenant: "mallory", ID: it.Owner.ID}
		}
	}
	return outs, nil
}

// TestPageMapInBrowser drives a real scheduler loop through a scripted
// workload, opens /admin/ in headless Chromium and checks that every cell
// of the grid shows its page's state and tenant as the pool's own snapshot
// has them, that an injected violation shows up as quarantined pages, a
// non-zero counter and an audit event, and saves a screenshot
// ($PAGEWARDEN_SCREENSHOT_DIR, else the test's temporary directory).
func TestPageMapInBrowser(t *testing.T) {
	browser := chromium(t)
	defer invariants.SetStrict(invariants.SetStrict(false))

	const pageSize, pages = 4, 96
	layout := kvcache.Layout{Layers: 1, KVHeads: 1, HeadDim: 2, PageSize: pageSize, DType: kvcache.F32}
	lim, err := sched.ComputeLimits(sched.ModelShape{ContextLength: 64, Vocab: 32}, layout, pages, 64, 1)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := kvcache.NewPool(kvcache.Config{Layout: layout, Pages: pages})
	if err != nil {
		t.Fatal(err)
	}
	ring := admin.NewRing(0)
	logger := slog.New(ring.Handler(slog.NewTextHandler(testWriter{t}, nil), slog.LevelWarn))
	exec := &testExecutor{corrupt: map[request.Tenant]bool{}}
	sn, err := sched.NewNode(sched.NodeConfig{
		Core:     sched.Config{Limits: lim, Pool: pool, PrefixCache: true},
		Executor: exec,
		Logger:   logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	loopCtx, stopLoop := context.WithCancel(ctx)
	loopDone := make(chan error, 1)
	go func() { loopDone <- sn.Run(loopCtx) }()
	defer func() { stopLoop(); <-loopDone }()

	const key = "pw-admin-browser-key"
	srv, err := admin.New(admin.Config{
		Pools:     []admin.Pool{{Name: "node-0", Map: sn.PageMap}},
		KeySHA256: [][32]byte{sha256.Sum256([]byte(key))},
		Events:    ring,
		Interval:  50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	// The scripted workload. Finished requests leave their full prompt
	// pages in the prefix cache (cached, in their tenant's colour); a
	// handoff reservation holds its pages in transfer; the corrupted
	// tenant's request is ended by the owner mismatch and its pages
	// quarantined.
	prompt := func(n, salt int) []int {
		p := make([]int, n)
		for i := range p {
			p[i] = 2 + (i*7+salt)%29
		}
		return p
	}
	run := func(tenant request.Tenant, n, salt int) request.Result {
		s, err := sn.Submit(ctx, request.Params{Owner: request.Owner{Tenant: tenant}, Prompt: prompt(n, salt), MaxTokens: 3})
		if err != nil {
			t.Fatalf("submit for %s: %v", tenant, err)
		}
		return s.Result()
	}
	for i := range 3 {
		if res := run("acme", 17, i); res.Err != nil {
			t.Fatal(res.Err)
		}
		if res := run("beta", 9+4*i, 100+i); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	if _, _, err := sn.Reserve(ctx, request.Params{Owner: request.Owner{Tenant: "gamma"}, Prompt: prompt(10, 5), MaxTokens: 4}); err != nil {
		t.Fatal(err)
	}
	exec.mu.Lock()
	exec.corrupt["delta"] = true
	exec.mu.Unlock()
	if res := run("delta", 7, 9); res.Err == nil {
		t.Fatal("the corrupted request succeeded")
	}
	want, err := sn.PageMap(ctx)
	if err != nil {
		t.Fatal(err)
	}
	transfer := map[kvcache.PageID]bool{}
	for _, id := range want.InTransfer {
		transfer[id] = true
	}
	state := func(i int) string { return admin.CellState(want.Pages[i], transfer[kvcache.PageID(i+1)]) }
	counts := map[string]int{}
	for i := range want.Pages {
		counts[state(i)]++
	}
	if counts[admin.CellCached] == 0 || counts[admin.CellTransfer] != 3 || counts[admin.CellQuarantined] != 2 {
		t.Fatalf("the workload did not leave the states the test needs: %v", counts)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1200, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	type cellDOM struct {
		ID     string `json:"id"`
		State  string `json:"state"`
		Tenant string `json:"tenant"`
		Title  string `json:"title"`
	}
	step := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("browser: %s: %v", what, err)
		}
	}
	step("start", chromedp.Do(bctx))
	_, err = chromedp.Call(bctx, network.Enable, network.EnableParams{})
	step("network", err)
	_, err = chromedp.Call(bctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Bearer " + key}})
	step("headers", err)
	step("load", chromedp.Do(bctx,
		chromedp.Navigate(ts.URL+"/admin/"),
		// Wait for the first state and for the quarantine's event.
		chromedp.WaitVisible(chromedp.CSS(`#pool-node-0 .grid .cell`)),
		chromedp.WaitVisible(chromedp.CSS(`#status[data-state="live"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#events li[data-level="ERROR"]`)),
	))
	cells, err := chromedp.Run(bctx, chromedp.Evaluate[[]cellDOM](`Array.from(document.querySelectorAll('#pool-node-0 .grid .cell')).map(c => ({
		id: c.dataset.id, state: c.dataset.state, tenant: c.dataset.tenant || "", title: c.title}))`))
	step("cells", err)
	counter, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#counter-owner_mismatches`)))
	step("counter", err)
	eventsText, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#events`)))
	step("events", err)
	summary, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(`#pool-node-0 .summary`)))
	step("summary", err)

	// Live: two requests of acme whose prompt's first pages are in the
	// prefix cache run slowly; the page follows the stream and shows
	// their shared prefix pages and owned pages, in acme's colour only.
	exec.mu.Lock()
	exec.delay = 60 * time.Millisecond
	exec.mu.Unlock()
	var live sync.WaitGroup
	for range 2 {
		live.Add(1)
		go func() {
			defer live.Done()
			s, err := sn.Submit(ctx, request.Params{Owner: request.Owner{Tenant: "acme"}, Prompt: prompt(17, 0), MaxTokens: 40})
			if err != nil {
				t.Errorf("live submit: %v", err)
				return
			}
			s.Result()
		}()
	}
	step("live", chromedp.Do(bctx,
		chromedp.WaitVisible(chromedp.CSS(`#pool-node-0 .cell[data-state="shared"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#pool-node-0 .cell[data-state="owned"]`)),
	))
	running, err := chromedp.Run(bctx, chromedp.Evaluate[[]cellDOM](`Array.from(document.querySelectorAll(
		'#pool-node-0 .cell[data-state="owned"], #pool-node-0 .cell[data-state="shared"]')).map(c => ({
		id: c.dataset.id, state: c.dataset.state, tenant: c.dataset.tenant || "", title: c.title}))`))
	step("live cells", err)
	for _, c := range running {
		if c.Tenant != "acme" || !strings.Contains(c.Title, "tenant acme") {
			t.Errorf("live cell %+v: only acme is running", c)
		}
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	step("screenshot", err)
	live.Wait()
	dir := os.Getenv("PAGEWARDEN_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	shot := filepath.Join(dir, "admin-page-map.png")
	if err := os.WriteFile(shot, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", shot, len(png))
	if len(png) < 8 || string(png[1:4]) != "PNG" {
		t.Errorf("screenshot is not a PNG")
	}

	if len(cells) != pages {
		t.Fatalf("grid has %d cells, the pool %d pages", len(cells), pages)
	}
	for i, c := range want.Pages {
		got := cells[i]
		state, tenant := state(i), ""
		if state != admin.CellFree {
			tenant = string(c.Owner.Tenant)
		}
		if got.ID != fmt.Sprint(i+1) || got.State != state || got.Tenant != tenant {
			t.Errorf("cell %d: %+v, pool has %s of %q", i+1, got, state, tenant)
		}
		if state == admin.CellQuarantined && !strings.Contains(got.Title, fmt.Sprintf("epoch %d", c.Epoch)) {
			t.Errorf("quarantined cell %d's hover text lacks its epoch: %q", i+1, got.Title)
		}
	}
	if !strings.Contains(counter, "1") {
		t.Errorf("owner-mismatch counter reads %q, want 1", counter)
	}
	if !strings.Contains(eventsText, "isolation violation") || !strings.Contains(eventsText, "tenant=delta") {
		t.Errorf("events list lacks the violation:\n%s", eventsText)
	}
	if !strings.Contains(summary, "2 quarantined") || !strings.Contains(summary, "3 in transfer") {
		t.Errorf("summary %q", summary)
	}
}

// testWriter sends log lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
