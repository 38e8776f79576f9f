package fanctl_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/fanctl"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
)

// TestPinAndHoldCommands: a switchover's pin (--for, --until), its
// --clear, and the leaders hold and release reach the arbiter as the
// requests the arbiter takes; a mistake in any is refused on one line,
// nothing sent.
func TestPinAndHoldCommands(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	got := make(chan events.OperatorRequest, 8)
	sub := standInArbiter(t, b, func(r events.OperatorRequest, _ string) events.OperatorReply {
		got <- r
		return events.OperatorReply{Accepted: true, Message: "ok", EventID: "0193a1b2-0000-7000-8000-000000000001", Epoch: 3}
	})
	defer func() { _ = sub.Unsubscribe() }()
	putStatus(t, s, events.GroupStatus{Group: "pbx", Holder: "n1", UpdatedAt: time.Now(), Nodes: map[string]events.NodeStatus{"n1": {}, "n2": {}}})
	base := []string{"--url", s.ClientURL(), "--cluster", "lab", "--operator", "alice"}
	until := time.Date(2026, 12, 8, 6, 0, 0, 0, time.UTC)
	cases := []struct {
		args []string
		want events.OperatorRequest
	}{
		{[]string{"switchover", "--to", "n2", "--for", "2h", "--reason", "rolling upgrade"},
			events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Reason: "rolling upgrade", Operator: "alice", ForMS: (2 * time.Hour).Milliseconds()}},
		{[]string{"switchover", "--to", "n2", "--until", "2026-12-08T06:00Z"},
			events.OperatorRequest{Verb: events.OpSwitchover, Node: "n2", Operator: "alice", Until: until}},
		{[]string{"switchover", "--clear", "--group", "pbx", "--reason", "n1 upgraded"},
			events.OperatorRequest{Verb: events.OpUnpin, Group: "pbx", Reason: "n1 upgraded", Operator: "alice"}},
		{[]string{"leaders", "hold", "--for", "30m", "--to", "nats-pbx-b", "--reason", "witness reboot"},
			events.OperatorRequest{Verb: events.OpLeadersHold, Server: "nats-pbx-b", Reason: "witness reboot", Operator: "alice", ForMS: (30 * time.Minute).Milliseconds()}},
		{[]string{"leaders", "release", "--as", "ticket 42"},
			events.OperatorRequest{Verb: events.OpLeadersRelease, Operator: "alice", Comment: "ticket 42"}},
	}
	for _, c := range cases {
		code, out, errOut := run(append(append([]string(nil), base...), c.args...)...)
		if code != 0 || !strings.Contains(out, "accepted: ok") {
			t.Fatalf("%v: exit %d %s %s", c.args, code, out, errOut)
		}
		r := <-got
		if !r.Until.Equal(c.want.Until) {
			t.Fatalf("%v sent until %s, want %s", c.args, r.Until, c.want.Until)
		}
		r.Until, c.want.Until = time.Time{}, time.Time{}
		if r != c.want {
			t.Fatalf("%v sent %+v, want %+v", c.args, r, c.want)
		}
	}
	for _, c := range []struct {
		args  []string
		names []string
	}{
		{[]string{"switchover", "--to", "n2", "--for", "10s"}, []string{"--for 10s"}},
		{[]string{"switchover", "--to", "n2", "--for", "1h", "--until", "06:00"}, []string{"--for and --until"}},
		{[]string{"switchover", "--to", "n2", "--until", "tomorrow"}, []string{"--until", "tomorrow"}},
		{[]string{"switchover", "--clear", "--to", "n2"}, []string{"--clear"}},
		{[]string{"switchover", "--clear", "--cancel"}, []string{"--cancel", "--clear"}},
		{[]string{"switchover", "--cancel", "--for", "1h"}, []string{"--for"}},
		{[]string{"leaders", "hold"}, []string{"--for D or --until TIME"}},
		{[]string{"leaders", "hold", "--for", "25h"}, []string{"--for 25h0m0s"}},
		{[]string{"leaders", "hold", "--for", "1h", "--to", "nats.pbx"}, []string{"server"}},
		{[]string{"leaders", "release", "--for", "1h"}, []string{"release takes no"}},
		{[]string{"leaders", "frobnicate"}, []string{`"frobnicate"`, "hold or release"}},
		{[]string{"leaders", "--to", "nats-pbx-b"}, []string{"go with hold or release"}},
		{[]string{"leaders", "hold", "--for", "1h", "extra"}, []string{`"extra"`}},
	} {
		code, out, errOut := run(append(append([]string(nil), base...), c.args...)...)
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%q: exit %d, stdout %q, stderr %q: want exit 2 and one line", c.args, code, out, errOut)
			continue
		}
		for _, n := range c.names {
			if !strings.Contains(errOut, n) {
				t.Errorf("%q: %q does not say %q", c.args, errOut, n)
			}
		}
	}
	select {
	case r := <-got:
		t.Fatalf("a usage error sent %+v", r)
	default:
	}
}

// TestLeadersShowsTheHold: fanctl leaders prints the hold in force and
// each stream's leader; fanctl status adds the hold among its lines and a
// group's pin under its tables.
func TestLeadersShowsTheHold(t *testing.T) {
	s := bustest.Server(t)
	arb := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	now := time.Now()
	pin := &events.PinStatus{PinFacts: events.PinFacts{Node: "n2", Operator: "alice", Reason: "rolling upgrade", RequestID: "r", ActionID: "a",
		Since: now.Add(-10 * time.Minute), Until: now.Add(110 * time.Minute)}, EventID: "e"}
	putStatus(t, s, events.GroupStatus{Group: "pbx", Holder: "n2", UpdatedAt: now, Pin: pin,
		Nodes: map[string]events.NodeStatus{"n1": {Health: events.HealthUp}, "n2": {Health: events.HealthUp, Priority: 1}}})
	base := []string{"--url", s.ClientURL(), "--cluster", "lab"}
	code, out, errOut := run(append(base, "leaders")...)
	if code != 0 || !strings.Contains(out, "no leaders hold: the steward keeps the raft leaders on bus.leader_servers") ||
		!strings.Contains(out, "FAN_CMD") {
		t.Fatalf("no hold: exit %d\n%s%s", code, out, errOut)
	}
	rec := events.LeadersHoldRecord{LeadersHoldFacts: events.LeadersHoldFacts{Operator: "alice", Reason: "witness reboot", Server: "nats-pbx-b",
		Since: now.Add(-5 * time.Minute), Until: now.Add(25 * time.Minute), HeldSince: now.Add(-5 * time.Minute), RequestID: "r", ActionID: "a"},
		EventID: "0193a1b2-0000-7000-8000-000000000009"}
	kv, err := arb.StateKV(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	v, _ := json.Marshal(rec)
	if _, err := kv.Put(context.Background(), events.LeadersHoldKey("lab"), v); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(append(base, "leaders")...)
	if code != 0 || !strings.Contains(out, `LEADERS HELD on nats-pbx-b by alice ("witness reboot") since`) || !strings.Contains(out, "(in 25m0s)") {
		t.Fatalf("a hold: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = run(append(base, "leaders", "--json")...)
	var shown struct {
		InForce bool `json:"in_force"`
		Streams []struct {
			Stream, Leader string
		} `json:"streams"`
	}
	if err := json.Unmarshal([]byte(out), &shown); code != 0 || err != nil || !shown.InForce || len(shown.Streams) == 0 || shown.Streams[0].Stream != events.CommandsStream {
		t.Fatalf("leaders --json: exit %d %v\n%s", code, err, out)
	}
	code, out, _ = run(append(base, "status")...)
	for _, want := range []string{`leaders: HELD on nats-pbx-b by alice ("witness reboot")`,
		`pbx: PINNED to n2 by alice ("rolling upgrade") since`, "(in 1h50m): no automatic failback moves it; a failover still does. fanctl switchover --clear --group pbx ends it"} {
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	var buf bytes.Buffer
	pin.Until = time.Time{}
	if err := fanctl.PrintStatus(&buf, []events.GroupStatus{{Group: "pbx", Holder: "n2", Pin: pin, Nodes: map[string]events.NodeStatus{}}}, nil, now); err != nil ||
		!strings.Contains(buf.String(), "since "+pin.Since.Format(time.RFC3339)+" (10m0s ago), until cleared") {
		t.Errorf("a pin without an end:\n%s", buf.String())
	}
}

func TestUntilParsing(t *testing.T) {
	loc := time.FixedZone("CET", 3600)
	now := time.Date(2026, 12, 8, 2, 10, 0, 0, loc)
	for in, want := range map[string]time.Time{
		"06:00":                time.Date(2026, 12, 8, 6, 0, 0, 0, loc),
		"01:30":                time.Date(2026, 12, 9, 1, 30, 0, 0, loc),
		"2026-12-08T06:00Z":    time.Date(2026, 12, 8, 6, 0, 0, 0, time.UTC),
		"2026-12-08T06:00:30Z": time.Date(2026, 12, 8, 6, 0, 30, 0, time.UTC),
	} {
		got, err := fanctl.ParseUntil(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("%s: %v %v, want %v", in, got, err, want)
		}
	}
	if _, err := fanctl.ParseUntil("6am", now); err == nil {
		t.Error("6am parsed")
	}
}
