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

func TestEventsPrintsTheTrailInOrder(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "prober", Node: "n1"})
	ctx := context.Background()
	down := emitDown(t, b)
	// n1's health stored on n2's subject: not shown, but not hidden either.
	forged, _ := down.Encode()
	if _, err := b.JS.Publish(ctx, events.HealthSubject("lab", "n2"), forged); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Emit(ctx, events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2",
		Reason: "holder down", CausedBy: []string{down.ID}}, events.CausedBy(down)); err != nil {
		t.Fatal(err)
	}

	var out, errb bytes.Buffer
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "events", "--since", "all"}, &out, &errb, "t"); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(errb.String(), "1 stored message(s) not shown") {
		t.Fatalf("the forged event went unmentioned: %q", errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "health.transition") || !strings.Contains(lines[1], "FAILOVER n1->n2") ||
		!strings.Contains(lines[1], "cause="+down.ID) {
		t.Fatalf("unexpected output:\n%s", out.String())
	}

	out.Reset()
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "events", "--json", "--type", "arbiter.decision"}, &out, &errb, "t"); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if _, _, err := events.Decode(bytes.TrimSpace(out.Bytes())); err != nil {
		t.Fatalf("--json line does not decode: %v\n%s", err, out.String())
	}

	out.Reset()
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "other", "events"}, &out, &errb, "t"); code != 0 || out.Len() != 0 {
		t.Fatalf("another cluster's trail should be empty: exit %d %q", code, out.String())
	}
}

func TestStatusShowsHolderAndHealth(t *testing.T) {
	s := bustest.Server(t)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	ctx := context.Background()
	var out, errb bytes.Buffer
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "status"}, &out, &errb, "t"); code != 0 || !strings.Contains(out.String(), "no group status") {
		t.Fatalf("empty status: exit %d %q %q", code, out.String(), errb.String())
	}
	kv, err := b.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	g := events.GroupStatus{Group: "pbx", Addresses: []string{"198.51.100.10/24"}, Holder: "n2", Epoch: 9, Since: now, UpdatedAt: now,
		Nodes: map[string]events.NodeStatus{"n1": {Health: events.HealthDown, Priority: 0}, "n2": {Health: events.HealthUp, Priority: 1, LastHeartbeat: now}}}
	v, _ := json.Marshal(g)
	if _, err := kv.Put(ctx, events.GroupStatusKey("lab", "pbx"), v); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := fanctl.Main([]string{"--url", s.ClientURL(), "--cluster", "lab", "status"}, &out, &errb, "t"); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"pbx", "198.51.100.10/24", "n2", "down", "up"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("status lacks %q:\n%s", want, out.String())
		}
	}
}

func TestUsageErrors(t *testing.T) {
	var out, errb bytes.Buffer
	for _, args := range [][]string{{}, {"bogus"}, {"--cluster", "a.b", "status"}, {"events", "--since", "yesterday"}} {
		if code := fanctl.Main(append([]string{"--url", "nats://127.0.0.1:1", "--timeout", "200ms"}, args...), &out, &errb, "t"); code == 0 {
			t.Errorf("%v: exit 0", args)
		}
	}
}
