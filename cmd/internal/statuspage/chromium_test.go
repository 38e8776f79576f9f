package statuspage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/fanpbx/fan/cmd/internal/statuspage"
	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/pkg/events"
)

// onPageWithin bounds how soon a failover is on the page once published.
// The page's promise is a second. Measured here (-race, a shared 2-core
// machine) the figure was 0.2 to 0.85 s, of which the three publishes take
// 50 to 160 ms and the server's stream under 50 ms: the rest is Chromium
// and the DOM polling under load. That is too close to a second to assert
// without flaking, so the test prints the figure
// (statuspage_failover_on_page_ms) and asserts a looser bound.
const onPageWithin = 3 * time.Second

// artefacts is where screenshots go: FAN_ARTEFACTS when set (CI keeps it),
// the test's temporary directory otherwise.
func artefacts(t *testing.T) string {
	if d := os.Getenv("FAN_ARTEFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// TestPageInChromium drives a real headless Chromium: the page asks for a
// login, shows the holder after it, shows a failover published during the
// test (new holder, the decision in the timeline) within onPageWithin, and
// a click on the decision shows its chain down to the probe evidence.
func TestPageInChromium(t *testing.T) {
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		prereq.SkipOrFail(t, "chromium is not installed (apt-get install chromium; make deps)")
	}
	p := startPage(t, statuspage.Config{PathPrefix: "/fan/"})
	now := time.Now()
	p.putStatus(group("n1", 1, now))
	p.heartbeat("n1", map[string]events.CheckState{
		"ami":     {TargetNode: "n1", Role: events.RoleSelf, Health: events.HealthUp, Since: now.Add(-time.Hour)},
		"sip":     {TargetNode: "n1", Role: events.RoleSelf, Health: events.HealthUp, Since: now.Add(-time.Hour)},
		"peer-n2": {TargetNode: "n2", Role: events.RolePeer, Health: events.HealthUp, Since: now.Add(-time.Hour)}})
	p.heartbeat("n2", map[string]events.CheckState{
		"ami":     {TargetNode: "n2", Role: events.RoleSelf, Health: events.HealthUp, Since: now.Add(-time.Hour)},
		"sip":     {TargetNode: "n2", Role: events.RoleSelf, Health: events.HealthUp, Since: now.Add(-time.Hour)},
		"peer-n1": {TargetNode: "n1", Role: events.RolePeer, Health: events.HealthUp, Since: now.Add(-time.Hour)}})
	p.putPlan(now)
	if _, err := p.arb.Emit(context.Background(), events.ArbiterDecision{Group: "pbx", Action: events.ActionPlace, To: "n1",
		Reason: "n1 is preferred and healthy", CausedBy: []string{"0193a1b2-0000-7000-8000-000000000001"}}, events.WithEpoch(1)); err != nil {
		t.Fatal(err)
	}
	dir := artefacts(t)
	began := time.Now()

	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chrome),
		chromedp.UserDataDir(t.TempDir()),
		// With /dev/shm disabled Chromium keeps its shared memory in
		// TMPDIR: the test's own, so a run leaves nothing in /tmp.
		chromedp.Env("TMPDIR="+t.TempDir()),
		chromedp.WindowSize(1280, 900),
		// CI runs as root, where Chromium's sandbox refuses to start.
		chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-gpu", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	// The browser lives as long as the context of the first call.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	t.Logf("chromium started in %v", time.Since(began).Round(time.Millisecond))
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Errorf("screenshot %s: %v", name, err)
			return
		}
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot %s (%d bytes)", f, len(png))
	}
	// Each step has 10 s; on a failure the page's state is still read.
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, 10*time.Second)
		defer cancel()
		defer func() { t.Logf("%s: done at %v", what, time.Since(began).Round(time.Millisecond)) }()
		if err := chromedp.Do(sctx, actions...); err != nil {
			shot("failed.png")
			state, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("%s: %v\npage:\n%s\nlog:\n%s", what, err, state, p.logs.String())
		}
	}
	value := func(what string, a chromedp.Action[string]) string {
		t.Helper()
		v, err := chromedp.Run(bctx, a)
		if err != nil {
			shot("failed.png")
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}

	// Before a login the page shows the form and no data.
	run("the login form", chromedp.Navigate(p.base), chromedp.WaitVisible(chromedp.ID("token")))
	if hidden, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`document.getElementById('app').hidden`)); err != nil || !hidden {
		t.Fatal("the status shows before a login")
	}
	shot("1-login.png")
	run("a wrong token", chromedp.SendKeys(chromedp.ID("token"), "wrong-token-but-long-enough"),
		chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("login-error")))
	run("the login", chromedp.SendKeys(chromedp.ID("token"), testToken),
		chromedp.Click(chromedp.CSS(`#login button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-group="lab/pbx"] td.holder[data-holder="n1"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#timeline li`)))
	shown := value("the status", chromedp.Text(chromedp.ID("app")))
	for _, want := range []string{"198.51.100.10/24", "pbx: holding: n1 is preferred and healthy", "nightly: opens in",
		"peer-n1 (peer, by n2)", "pbx: failback permitted until"} {
		if !strings.Contains(shown, want) {
			t.Errorf("the page lacks %q:\n%s", want, shown)
		}
	}
	if conn := value("the stream", chromedp.Text(chromedp.ID("conn"))); conn != "live" {
		t.Errorf("the live stream says %q", conn)
	}
	shot("2-holder-n1.png")

	// The failover, published now: the clock runs from before the first
	// publish to the first poll that sees both the new holder and the
	// decision on the page.
	start := time.Now()
	dec := p.failover(2)
	published := time.Since(start)
	probe := fmt.Sprintf(`(() => { const h = document.querySelector('tr[data-group="lab/pbx"] td.holder');
		return (h ? h.dataset.holder : '') + '|' + !!document.querySelector('#timeline li.decision[data-id="%s"]'); })()`, dec.ID)
	var took time.Duration
	for {
		seen, err := chromedp.Run(bctx, chromedp.Evaluate[string](probe))
		if err != nil {
			t.Fatal(err)
		}
		if seen == "n2|true" {
			took = time.Since(start)
			break
		}
		if time.Since(start) > 10*time.Second {
			shot("failed.png")
			t.Fatalf("the failover is not on the page after 10 s (holder|decision: %s)", seen)
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Printf("statuspage_failover_published_ms=%d\nstatuspage_failover_on_page_ms=%d\n", published.Milliseconds(), took.Milliseconds())
	if took > onPageWithin {
		t.Errorf("the failover took %v to reach the page, more than %v", took, onPageWithin)
	}
	// n1's prober's next heartbeat says what the transition said.
	p.heartbeat("n1", map[string]events.CheckState{
		"ami":     {TargetNode: "n1", Role: events.RoleSelf, Health: events.HealthDown, Since: start, SinceEvent: dec.ID},
		"sip":     {TargetNode: "n1", Role: events.RoleSelf, Health: events.HealthUp, Since: now.Add(-time.Hour)},
		"peer-n2": {TargetNode: "n2", Role: events.RolePeer, Health: events.HealthUp, Since: now.Add(-time.Hour)}})
	if epoch := value("the epoch", chromedp.Text(chromedp.CSS(`tr[data-group="lab/pbx"] td.epoch`))); epoch != "2" {
		t.Errorf("epoch on the page %q, want 2", epoch)
	}

	// A click on the decision shows its chain: the decision, and under it
	// n1's transition with its probe evidence.
	run("the explanation", chromedp.Click(chromedp.CSS(fmt.Sprintf(`#timeline li[data-id="%s"]`, dec.ID))),
		chromedp.WaitVisible(chromedp.CSS(`#explain li.link[data-type="health.transition"]`)),
		// The heartbeat's check states reach the page at the next refresh.
		chromedp.WaitVisible(chromedp.CSS(`tr[data-node="n1"] li[data-check="ami"] .health-down`)))
	chain := value("the chain", chromedp.Text(chromedp.ID("explain")))
	if !strings.Contains(chain, "pbx FAILOVER n1->n2") || !strings.Contains(chain, "n1 ami[self] up->down") ||
		!strings.Contains(chain, "FAIL connection refused (refused)") {
		t.Errorf("the chain on the page:\n%s", chain)
	}
	shot("3-failover-explained.png")

	// The session survives a reload (the cookie), and logging out ends it.
	run("a reload", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`tr[data-group="lab/pbx"] td.holder[data-holder="n2"]`)))
	run("the logout", chromedp.Click(chromedp.ID("logout")), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.Reload(), chromedp.WaitVisible(chromedp.ID("token")))
}

// putPlan writes the scheduler's plan: a nightly window opening tonight.
func (p *page) putPlan(now time.Time) {
	p.t.Helper()
	ctx := context.Background()
	kv, err := p.arb.StateKV(ctx)
	if err != nil {
		p.t.Fatal(err)
	}
	start := now.Add(5 * time.Hour).Truncate(time.Hour)
	plan := events.SchedulePlan{Cluster: "lab", UpdatedAt: now, UpdatedBy: "scheduler@ctl", Groups: []events.GroupSchedule{{Group: "pbx",
		Windows: []events.PlannedWindow{{Window: "nightly", Start: start, End: start.Add(2 * time.Hour), TimeZone: "UTC", Kind: "weekly"}}}}}
	v, err := json.Marshal(plan)
	if err != nil {
		p.t.Fatal(err)
	}
	if _, err := kv.Put(ctx, events.ScheduleKey("lab"), v); err != nil {
		p.t.Fatal(err)
	}
}
