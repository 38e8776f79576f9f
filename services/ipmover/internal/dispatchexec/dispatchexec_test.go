package dispatchexec

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/kamailio"
	"github.com/fanpbx/fan/lab/kamailio/kamailiotest"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/porttest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/fanpbx/fan/services/ipmover/internal/dispatcher"
	"github.com/fanpbx/fan/services/ipmover/internal/execute/executetest"
)

func TestDesired(t *testing.T) {
	nodes := map[string]string{"n1": "sip:a", "n2": "sip:b", "n3": "sip:c"}
	st := events.GroupStatus{Group: "pbx", Nodes: map[string]events.NodeStatus{
		"n1": {Health: events.HealthUp, Eligible: true},
		"n2": {Health: events.HealthDown},
		// n3 unknown to the arbiter
	}}
	cases := []struct {
		name     string
		presence map[string]events.Presence
		want     map[string]dispatcher.State
	}{
		{"eligible active, unhealthy and unknown disabled", nil,
			map[string]dispatcher.State{"sip:a": dispatcher.Active, "sip:b": dispatcher.Disabled, "sip:c": dispatcher.Disabled}},
		{"offline in the registry overrides eligible", map[string]events.Presence{"n1": events.PresenceOffline},
			map[string]dispatcher.State{"sip:a": dispatcher.Disabled, "sip:b": dispatcher.Disabled, "sip:c": dispatcher.Disabled}},
		{"online changes nothing", map[string]events.Presence{"n1": events.PresenceOnline},
			map[string]dispatcher.State{"sip:a": dispatcher.Active, "sip:b": dispatcher.Disabled, "sip:c": dispatcher.Disabled}},
	}
	for _, tc := range cases {
		got := Desired(nodes, st, tc.presence)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

// harness is the test arbiter with a dispatcher executor on its bus.
type harness struct{ *executetest.Arbiter }

func newBusHarness(t *testing.T) *harness { return &harness{executetest.NewArbiter(t)} }

// start runs a dispatcher executor until the test ends.
func (h *harness) start(cfg Config) {
	h.T.Helper()
	if err := cfg.Validate(); err != nil {
		h.T.Fatal(err)
	}
	s := New(cfg, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
	h.Start("ipmover", cfg.Node, s.Run)
}

func status(eligible map[string]bool) events.GroupStatus {
	st := events.GroupStatus{Group: "pbx", Addresses: []string{"198.51.100.10/24"}, Nodes: map[string]events.NodeStatus{}}
	for n, e := range eligible {
		h := events.HealthDown
		if e {
			h = events.HealthUp
		}
		st.Nodes[n] = events.NodeStatus{Health: h, Eligible: e}
	}
	return st
}

// The dispatcher executor follows the arbiter's published group status and
// the registry (the state bucket, as the arbiter writes it) and steers a
// real Kamailio: SIPp's INVITEs reach both PBX stand-ins while both are
// eligible, stop reaching n1 once the arbiter counts it unhealthy or the
// registry marks it offline, and reach it again when it is back.
func TestDispatcherExecutorSteersCalls(t *testing.T) {
	kamailiotest.Need(t, "kamailio", "sipp")
	portA := kamailiotest.FreeUDPPort(t)
	portB := kamailiotest.FreeUDPPort(t)
	for portB == portA {
		portB = kamailiotest.FreeUDPPort(t)
	}
	uasA := kamailiotest.Start(t, "uas-a", kamailio.UASConfig("a", portA))
	uasB := kamailiotest.Start(t, "uas-b", kamailio.UASConfig("b", portB))
	uriA, uriB := fmt.Sprintf("sip:127.0.0.1:%d", portA), fmt.Sprintf("sip:127.0.0.1:%d", portB)
	proxyPort := porttest.Port(t)
	list := filepath.Join(t.TempDir(), "dispatcher.list")
	if err := os.WriteFile(list, []byte(fmt.Sprintf("1 %s 8 0 duid=n1\n1 %s 8 0 duid=n2\n", uriA, uriB)), 0o644); err != nil {
		t.Fatal(err)
	}
	kamailiotest.Start(t, "proxy", kamailio.ProxyConfig(proxyPort, list))
	uasA.WaitFor(t, 10*time.Second, "OPTIONS probe at a", func() bool { return uasA.Count("OPTIONS a") > 0 })
	uasB.WaitFor(t, 10*time.Second, "OPTIONS probe at b", func() bool { return uasB.Count("OPTIONS b") > 0 })

	h := newBusHarness(t)
	rpcURL := fmt.Sprintf("http://127.0.0.1:%d/RPC", proxyPort)
	h.PutStatus(status(map[string]bool{"n1": true, "n2": true}), "")
	h.start(Config{
		Common: daemon.Common{Cluster: "lab", Node: "kam1", Bus: bus.Config{URL: h.URL()}, ShutdownTimeout: config.Duration(5 * time.Second)},
		Dispatcher: DispatcherConfig{Config: dispatcher.Config{URL: rpcURL, ListFile: list, Timeout: 2 * time.Second},
			Group: "pbx", Nodes: map[string]string{"n1": uriA, "n2": uriB}, Resync: config.Duration(time.Second), Weights: true},
	})
	kam, err := dispatcher.New(dispatcher.Config{URL: rpcURL}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	flags := func(uri string) string {
		l, err := kam.List(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range l {
			if d.URI == uri {
				return d.Flags
			}
		}
		t.Fatalf("%s not listed", uri)
		return ""
	}
	// waitFlags returns how long after the state was written Kamailio
	// showed the wanted flags (a measured figure, not asserted).
	waitFlags := func(uri, prefix string, since time.Time) time.Duration {
		t.Helper()
		waittest.Until(t, 10*time.Second, uri+" flags "+prefix, func() bool { return strings.HasPrefix(flags(uri), prefix) })
		return time.Since(since)
	}
	calls := func(n int) (a, b int) {
		t.Helper()
		a0, b0 := uasA.Count("INVITE a"), uasB.Count("INVITE b")
		if err := kamailiotest.SIPp(t.Context(), t, proxyPort, n, 100); err != nil {
			t.Fatal(err)
		}
		// Every call was answered, so each INVITE has been logged by now
		// or is about to be: wait for the total.
		uasA.WaitFor(t, 5*time.Second, "INVITEs logged", func() bool {
			return uasA.Count("INVITE a")-a0+uasB.Count("INVITE b")-b0 >= n
		})
		return uasA.Count("INVITE a") - a0, uasB.Count("INVITE b") - b0
	}

	if a, b := calls(10); a == 0 || b == 0 {
		t.Fatalf("both eligible: calls a=%d b=%d, want both > 0", a, b)
	}

	at := time.Now()
	h.PutStatus(status(map[string]bool{"n1": false, "n2": true}), "")
	t.Logf("n1 unhealthy -> disabled in Kamailio after %v", waitFlags(uriA, "D", at))
	if a, b := calls(10); a != 0 || b != 10 {
		t.Fatalf("n1 unhealthy: calls a=%d b=%d, want 0 and 10", a, b)
	}

	// Healthy again per the arbiter, but the registry's sweeper says
	// offline. n2 going down and up around it shows when the executor has
	// taken the new status in, without sleeping.
	h.PutStatus(status(map[string]bool{"n1": false, "n2": false}), "")
	waitFlags(uriB, "D", time.Now())
	h.PutRecord(events.NodeRecord{Node: "n1", Presence: events.PresenceOffline})
	h.PutStatus(status(map[string]bool{"n1": true, "n2": true}), "")
	waitFlags(uriB, "AP", time.Now())
	// The two keys are watched separately, so the record may be taken in
	// just after the status: wait for the settled state, then count calls.
	waitFlags(uriA, "D", time.Now())
	if a, b := calls(10); a != 0 || b != 10 {
		t.Fatalf("n1 offline in the registry: calls a=%d b=%d, want 0 and 10", a, b)
	}

	at = time.Now()
	h.PutRecord(events.NodeRecord{Node: "n1", Presence: events.PresenceOnline})
	t.Logf("n1 back -> active in Kamailio after %v", waitFlags(uriA, "AP", at))
	if a, b := calls(20); a == 0 || b == 0 {
		t.Fatalf("n1 back: calls a=%d b=%d, want both > 0", a, b)
	}

	// A state set by hand is put back by the periodic re-sync.
	if _, err := kam.Sync(t.Context(), map[string]dispatcher.State{uriB: dispatcher.Disabled}); err != nil {
		t.Fatal(err)
	}
	waitFlags(uriB, "AP", time.Now())

	// The arbiter's weight set is applied through the list file, with the
	// states kept: n1 is disabled again first, and must stay so.
	h.PutStatus(status(map[string]bool{"n1": false, "n2": true}), "")
	waitFlags(uriA, "D", time.Now())
	if _, err := h.Ctl.Emit(t.Context(), events.DispatcherWeights{Group: "pbx", Weights: map[string]int{"n1": 80, "n2": 35}, Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	waittest.Until(t, 15*time.Second, "weights in Kamailio", func() bool {
		l, err := kam.List(t.Context())
		if err != nil {
			return false
		}
		got := map[string]int{}
		for _, d := range l {
			got[d.URI] = d.Weight
		}
		return got[uriA] == 80 && got[uriB] == 35
	})
	if f := flags(uriA); !strings.HasPrefix(f, "D") {
		t.Fatalf("after the weight reload n1 is %s, want still disabled", f)
	}
	if a, b := calls(10); a != 0 || b != 10 {
		t.Fatalf("after the weight reload: calls a=%d b=%d, want 0 and 10", a, b)
	}
}

// dispatcher.mode decides which keys mean something, and a key that would
// do nothing in the chosen mode is refused with its name.
func TestModeKeys(t *testing.T) {
	base := func() Config {
		return Config{
			Common: daemon.Common{Cluster: "lab", Node: "kam1", Bus: bus.Config{URL: "nats://127.0.0.1:4222"}},
			Dispatcher: DispatcherConfig{Config: dispatcher.Config{URL: "http://127.0.0.1:5071/RPC", ListFile: "/tmp/list"},
				Group: "pbx", Nodes: map[string]string{"n1": "sip:192.0.2.11:5060"}},
		}
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		refuse string // the key named, or "" when valid
	}{
		{"eligible by default", func(*Config) {}, ""},
		{"holder with a state file", func(c *Config) { c.Dispatcher.Mode = ModeHolder; c.StateFile = "/tmp/s.json" }, ""},
		{"holder without a state file", func(c *Config) { c.Dispatcher.Mode = ModeHolder }, "state_file"},
		{"a state file in mode eligible", func(c *Config) { c.StateFile = "/tmp/s.json" }, "state_file"},
		{"weights in mode holder", func(c *Config) {
			c.Dispatcher.Mode = ModeHolder
			c.StateFile = "/tmp/s.json"
			c.Dispatcher.Weights = true
		}, "dispatcher.weights"},
		{"unknown mode", func(c *Config) { c.Dispatcher.Mode = "sometimes" }, "dispatcher.mode"},
	} {
		c := base()
		tc.change(&c)
		err := c.Validate()
		switch {
		case tc.refuse == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.refuse != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.refuse+":")):
			t.Errorf("%s: err = %v, want a refusal of %s", tc.name, err, tc.refuse)
		}
		if tc.refuse == "" && c.Dispatcher.Mode == "" {
			t.Errorf("%s: no mode after Validate", tc.name)
		}
	}
}
