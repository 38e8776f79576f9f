package app

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go/jetstream"
)

const validYAML = `cluster: lab
node: n1
bus:
  url: nats://127.0.0.1:4222
checks:
  - name: pbx
    kind: ami
    address: 127.0.0.1:5038
    username: fan
    secret: s
    interval: 200ms
    timeout: 150ms
    rise: 2
    fall: 3
`

func TestConfigErrorsNameTheKeyAndFile(t *testing.T) {
	cases := map[string]struct{ from, to, key string }{
		"unknown kind":           {"kind: ami", "kind: telepathy", "checks[0].kind"},
		"rise 0":                 {"rise: 2", "rise: 0", "checks[0].rise"},
		"timeout not below":      {"timeout: 150ms", "timeout: 200ms", "checks[0].timeout"},
		"unknown key":            {"fall: 3", "fall: 3\n    fal: 3", "fal"},
		"peer without target":    {"kind: ami", "kind: ami\n    role: peer", "checks[0].target_node"},
		"dotted name":            {"name: pbx", "name: p.bx", "checks[0].name"},
		"no bus":                 {"bus:\n  url: nats://127.0.0.1:4222\n", "", "bus"},
		"bare number as a delay": {"interval: 200ms", "interval: 200", "interval"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "prober.yaml")
			if err := os.WriteFile(path, []byte(strings.Replace(validYAML, tc.from, tc.to, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Build(daemon.Options{ConfigPath: path, Logger: slog.New(slog.DiscardHandler)})
			if err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("error %v should name %s and %s", err, path, tc.key)
			}
		})
	}
	var c Config
	if err := config.Parse("ok.yaml", []byte(validYAML), &c); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	if c.Checks[0].TargetNode != "n1" || c.Checks[0].Role != events.RoleSelf {
		t.Fatalf("self check defaults: %+v", c.Checks[0])
	}
	if got := daemon.Run([]string{"--check-config", filepath.Join(t.TempDir(), "missing.yaml")}, "fan-prober", "t", "", Build); got == 0 {
		t.Fatal("--check-config of an unreadable file must exit non-zero")
	}
}

type harness struct {
	peer    *amipeer.Peer
	watcher *bus.Bus
	got     chan events.Payload
}

// start runs a prober against a fresh AMI peer and an embedded JetStream.
func start(t *testing.T, secret string, interval, timeout time.Duration, rise, fall int) *harness {
	t.Helper()
	peer, err := amipeer.Start(amipeer.Config{Username: "fan", Secret: "right", SlowDelay: timeout / 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	h := runProber(t, []CheckConfig{{Name: "pbx", Kind: "ami", Address: peer.Addr(), Username: "fan", Secret: secret,
		Interval: config.Duration(interval), Timeout: config.Duration(timeout), Rise: rise, Fall: fall}}, nil)
	h.peer = peer
	return h
}

// runProber runs a prober with these checks and groups against an embedded
// JetStream and watches everything it publishes.
func runProber(t *testing.T, checks []CheckConfig, groups []GroupConfig) *harness {
	t.Helper()
	return runProberWith(t, checks, groups, nil)
}

// runProberWith is runProber with the configuration changed by edit first.
func runProberWith(t *testing.T, checks []CheckConfig, groups []GroupConfig, edit func(*Config)) *harness {
	t.Helper()
	s := bustest.Server(t)
	cfg := Config{
		Common:            daemon.Common{Cluster: "lab", Node: "n1", Bus: bus.Config{URL: s.ClientURL()}},
		HeartbeatInterval: config.Duration(100 * time.Millisecond),
		Checks:            checks,
		Groups:            groups,
	}
	if edit != nil {
		edit(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	h := &harness{watcher: bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "test", Node: "w"}), got: make(chan events.Payload, 4096)}
	ctx, cancel := context.WithCancel(context.Background())
	watched := make(chan struct{})
	go func() {
		_ = h.watcher.Watch(ctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("lab"), events.ClusterLiveState("lab")}, All: true},
			func(_ events.Envelope, p events.Decoded, _ uint64) { h.got <- p })
		close(watched)
	}()
	done := make(chan error, 1)
	go func() { done <- New(cfg, slog.New(slog.DiscardHandler), "test").Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("prober run: %v", err)
		}
		<-watched
	})
	return h
}

// next waits for the next health transition.
func (h *harness) next(t *testing.T, within time.Duration) (*events.HealthTransition, time.Time) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case p := <-h.got:
			if ht, ok := p.(*events.HealthTransition); ok {
				return ht, time.Now()
			}
		case <-deadline:
			return nil, time.Now()
		}
	}
}

func TestFrozenPBXIsDownWithinTimeoutTimesFall(t *testing.T) {
	const interval, timeout, fall = 100 * time.Millisecond, 60 * time.Millisecond, 3
	h := start(t, "right", interval, timeout, 2, fall)
	up, _ := h.next(t, 5*time.Second)
	if up == nil || up.To != events.HealthUp || len(up.Evidence) != 2 {
		t.Fatalf("first transition %+v, want up with 2 results", up)
	}
	frozenAt := time.Now()
	if err := h.peer.SetMode(amipeer.ModeFrozen); err != nil {
		t.Fatal(err)
	}
	down, _ := h.next(t, 5*time.Second)
	if down == nil || down.To != events.HealthDown {
		t.Fatalf("frozen PBX: got %+v, want down", down)
	}
	if len(down.Evidence) != fall {
		t.Fatalf("evidence %d results, want %d", len(down.Evidence), fall)
	}
	// Judged on the prober's own record, not on when the event reached this
	// test: the last failing run ended within fall runs (each at most one
	// interval, the timeout being shorter) plus the run in flight at the
	// freeze, with room for a loaded machine's scheduling.
	last := down.Evidence[fall-1]
	decided := last.At.Add(time.Duration(last.DurationMS * float64(time.Millisecond)))
	if budget := time.Duration(fall+1) * interval; decided.Sub(frozenAt) > budget+400*time.Millisecond {
		t.Errorf("down %v after the freeze, budget %v", decided.Sub(frozenAt), budget)
	}
	for _, e := range down.Evidence {
		if e.OK || e.ErrorClass != events.ErrorTimeout {
			t.Fatalf("evidence %+v, want timeouts", e)
		}
	}
	if err := h.peer.SetMode(amipeer.ModeNormal); err != nil {
		t.Fatal(err)
	}
	back, _ := h.next(t, 5*time.Second)
	if back == nil || back.To != events.HealthUp {
		t.Fatalf("after recovery: %+v, want up", back)
	}
}

func TestSlowButAnsweringPBXStaysUp(t *testing.T) {
	h := start(t, "right", 100*time.Millisecond, 60*time.Millisecond, 2, 3)
	if up, _ := h.next(t, 5*time.Second); up == nil || up.To != events.HealthUp {
		t.Fatalf("want up, got %+v", up)
	}
	// Answers take a third of the timeout: slow, but inside it.
	if err := h.peer.SetMode(amipeer.ModeSlow); err != nil {
		t.Fatal(err)
	}
	if tr, _ := h.next(t, 1500*time.Millisecond); tr != nil {
		t.Fatalf("a slow PBX answering within the timeout moved: %+v", tr)
	}
}

func TestWrongPasswordIsAnAuthFailureNotATimeout(t *testing.T) {
	// The probe timeout (60 ms) is far below Asterisk's 1 s wait before
	// "Authentication failed": the login runs apart from the probes, so the
	// wrong password is still reported as such, never as a timeout. Every
	// result in the evidence must say auth: none of the runs made while the
	// login was in flight may count.
	for _, fall := range []int{1, 3} {
		h := start(t, "wrong", 100*time.Millisecond, 60*time.Millisecond, 1, fall)
		down, _ := h.next(t, 6*time.Second)
		if down == nil || down.To != events.HealthDown || len(down.Evidence) != fall {
			t.Fatalf("fall %d: want down with %d results, got %+v", fall, fall, down)
		}
		for _, e := range down.Evidence {
			if e.ErrorClass != events.ErrorAuth {
				t.Fatalf("fall %d: error class %q (%s), want auth", fall, e.ErrorClass, e.Error)
			}
		}
	}
}

// A client connection does not come back by itself: the check logs in again after the PBX
// drops the session (an Asterisk restart), without a down transition when
// the new login is quick, and reports a refused port as refused.
func TestAMIReconnectsAfterDrop(t *testing.T) {
	h := start(t, "right", 100*time.Millisecond, 60*time.Millisecond, 1, 3)
	if up, _ := h.next(t, 5*time.Second); up == nil || up.To != events.HealthUp {
		t.Fatalf("first transition %+v, want up", up)
	}
	h.peer.DropSessions()
	logins := func() int {
		n := 0
		for _, a := range h.peer.Actions() {
			if a.Name == "Login" {
				n++
			}
		}
		return n
	}
	waittest.Until(t, 5*time.Second, "a second login after the session was dropped", func() bool { return logins() >= 2 })
	if tr, _ := h.next(t, 500*time.Millisecond); tr != nil {
		t.Fatalf("a dropped session that came straight back moved the check: %+v", tr)
	}
	if err := h.peer.SetMode(amipeer.ModeDead); err != nil {
		t.Fatal(err)
	}
	down, _ := h.next(t, 5*time.Second)
	if down == nil || down.To != events.HealthDown || down.Evidence[len(down.Evidence)-1].ErrorClass != events.ErrorRefused {
		t.Fatalf("dead PBX: %+v, want down ending with refused", down)
	}
	if err := h.peer.SetMode(amipeer.ModeNormal); err != nil {
		t.Fatal(err)
	}
	if up, _ := h.next(t, 5*time.Second); up == nil || up.To != events.HealthUp {
		t.Fatalf("after restart: %+v, want up", up)
	}
}

// A PBX that answers every question with an error is unhealthy, not a
// timeout: "Command output follows" alone proves nothing.
func TestFailingPBXIsUnhealthy(t *testing.T) {
	h := start(t, "right", 100*time.Millisecond, 60*time.Millisecond, 1, 2)
	if up, _ := h.next(t, 5*time.Second); up == nil || up.To != events.HealthUp {
		t.Fatalf("first transition %+v, want up", up)
	}
	if err := h.peer.SetMode(amipeer.ModeFailing); err != nil {
		t.Fatal(err)
	}
	down, _ := h.next(t, 5*time.Second)
	if down == nil || down.To != events.HealthDown || down.Evidence[0].ErrorClass != events.ErrorUnhealth {
		t.Fatalf("failing PBX: %+v, want down with unhealthy results", down)
	}
}

func TestHeartbeatCarriesStateAndFigures(t *testing.T) {
	h := start(t, "right", 100*time.Millisecond, 60*time.Millisecond, 1, 1)
	h.peer.SetFigures(amipeer.Figures{Channels: 4, Calls: 2, Processed: 9})
	deadline := time.After(5 * time.Second)
	for {
		select {
		case p := <-h.got:
			hb, ok := p.(*events.NodeHeartbeat)
			if !ok || hb.Checks["pbx"].Health != events.HealthUp || hb.ActiveCalls == nil || *hb.ActiveCalls != 2 {
				continue
			}
			if hb.MemTotalBytes == 0 || *hb.ActiveChannels != 4 || hb.Checks["pbx"].SinceEvent == "" {
				t.Fatalf("heartbeat %+v", hb)
			}
			return
		case <-deadline:
			t.Fatal("no heartbeat with the check up and the PBX's figures")
		}
	}
}

func TestPresenceBeaconsAreFrequentAndNotStored(t *testing.T) {
	h := start(t, "right", 100*time.Millisecond, 60*time.Millisecond, 1, 1)
	sub, err := h.watcher.NC.SubscribeSync(events.AllBeacons("lab"))
	if err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range 5 {
		m, err := sub.NextMsg(2 * time.Second)
		if err != nil {
			t.Fatalf("beacon %d: %v", i, err)
		}
		b, err := events.DecodeBeacon(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		if b.Node != "n1" || b.IntervalMS != 100 || b.Seq <= last || m.Subject != events.BeaconSubject("lab", "n1") {
			t.Fatalf("beacon %+v on %s after seq %d", b, m.Subject, last)
		}
		last = b.Seq
	}
	// Beacons are core NATS only: neither the audit nor the live stream
	// may capture them.
	for _, name := range []string{bus.EventsStream, bus.LiveStream} {
		st, err := h.watcher.JS.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(context.Background(), jetstream.WithSubjectFilter(events.AllBeacons("lab")))
		if err != nil {
			t.Fatal(err)
		}
		if n := len(info.State.Subjects); n != 0 {
			t.Fatalf("%s stored beacons on %d subjects", name, n)
		}
	}
}

// The heartbeat carries the node's Asterisk systemname, read once per AMI
// session: fanctl doctor compares it between the PBX nodes.
func TestHeartbeatCarriesSystemName(t *testing.T) {
	h := start(t, "right", 100*time.Millisecond, 60*time.Millisecond, 1, 1)
	h.peer.SetSystemName("pbx-lab")
	h.peer.DropSessions() // a new session asks again (an Asterisk restart)
	deadline := time.After(5 * time.Second)
	for {
		select {
		case p := <-h.got:
			if hb, ok := p.(*events.NodeHeartbeat); ok && hb.PBXSystemName != nil && *hb.PBXSystemName == "pbx-lab" {
				return
			}
		case <-deadline:
			t.Fatal("no heartbeat with the PBX's systemname")
		}
	}
}
