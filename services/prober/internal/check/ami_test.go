package check

import (
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// The health question, `core show channels count`, is asked on every run;
// CoreStatus only on a session's first run and then every coreStatusEvery,
// its figures carried on every healthy result in between.
func TestAMIAsksCoreStatusPerSessionNotPerRun(t *testing.T) {
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "s"})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	a := NewAMI(ami.Config{Addr: peer.Addr(), Username: "fan", Secret: "s", LoginTimeout: 3 * time.Second}, slog.New(slog.DiscardHandler))
	defer a.Close()
	healthy := func(what string) {
		t.Helper()
		var r Result
		waittest.Until(t, 5*time.Second, what+": a run with a verdict", func() bool {
			r = run(t, a, time.Second)
			return !r.NoVerdict
		})
		wantOK(t, what, r)
		for _, k := range []string{"active_channels", "active_calls", "core_current_calls", "core_processed_calls", "pbx_uptime_seconds"} {
			if _, ok := r.Figures[k]; !ok {
				t.Fatalf("%s: figures %v lack %s", what, r.Figures, k)
			}
		}
	}
	count := func() (commands, statuses int) {
		for _, act := range peer.Actions() {
			switch act.Name {
			case "Command":
				commands++
			case "CoreStatus":
				statuses++
			}
		}
		return
	}
	for range 5 {
		healthy("steady session")
	}
	if c, s := count(); c != 5 || s != 1 {
		t.Fatalf("5 healthy runs on one session asked Command %d times and CoreStatus %d times, want 5 and 1", c, s)
	}
	// A new session (an Asterisk restart looks like this) asks again.
	peer.DropSessions()
	// The redial backs off 50 ms.
	waittest.Until(t, 5*time.Second, "a healthy run on a new session", func() bool { return run(t, a, time.Second).OK })
	if _, s := count(); s != 2 {
		t.Fatalf("CoreStatus asked %d times after a new session, want 2", s)
	}
	// A failing PBX still fails every run: the Command is asked each time.
	if err := peer.SetMode(amipeer.ModeFailing); err != nil {
		t.Fatal(err)
	}
	wantFail(t, "failing PBX", run(t, a, time.Second), events.ErrorUnhealth)
}

// The systemname is asked once per session, after the health questions, and
// a user who may not ask (CoreSettings needs write class system or
// reporting) leaves it unknown without failing the check.
func TestAMIReadsSystemNameOncePerSession(t *testing.T) {
	peer, err := amipeer.Start(amipeer.Config{SystemName: "pbx-lab", Users: []amipeer.User{
		{Name: "fan", Secret: "s", Read: []string{"system"}, Write: []string{"system", "command"}},
		{Name: "cmd", Secret: "s", Write: []string{"command"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	healthyRun := func(a *AMI) Result {
		t.Helper()
		var r Result
		waittest.Until(t, 5*time.Second, "a run with a verdict", func() bool {
			r = run(t, a, time.Second)
			return !r.NoVerdict
		})
		wantOK(t, "run", r)
		return r
	}
	a := NewAMI(ami.Config{Addr: peer.Addr(), Username: "fan", Secret: "s", LoginTimeout: 3 * time.Second}, slog.New(slog.DiscardHandler))
	defer a.Close()
	for range 3 {
		if r := healthyRun(a); r.SystemName == nil || *r.SystemName != "pbx-lab" {
			t.Fatalf("system name %v, want pbx-lab", r.SystemName)
		}
	}
	asked := 0
	for _, act := range peer.Actions() {
		if act.Name == "CoreSettings" {
			asked++
		}
	}
	if asked != 1 {
		t.Fatalf("CoreSettings asked %d times in one session, want 1", asked)
	}

	denied := NewAMI(ami.Config{Addr: peer.Addr(), Username: "cmd", Secret: "s", LoginTimeout: 3 * time.Second}, slog.New(slog.DiscardHandler))
	defer denied.Close()
	// CoreStatus needs system too: this user's runs fail on it, not on
	// CoreSettings; what matters is that no name is made up.
	var r Result
	waittest.Until(t, 5*time.Second, "a run with a verdict", func() bool {
		r = run(t, denied, time.Second)
		return !r.NoVerdict
	})
	if r.SystemName != nil {
		t.Fatalf("a user without the right reported system name %q", *r.SystemName)
	}
}
