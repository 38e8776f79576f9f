package app

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// The status writer stores the newest status posted for each group (an
// older one still waiting is never written after it), and nothing computed
// under a term this replica no longer commands.
func TestStatusWriter(t *testing.T) {
	b := bustest.Connect(t, bustest.Server(t), bus.Identity{Cluster: "lab", Service: "arbiter", Node: "ctl"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kv, err := b.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var epoch atomic.Uint64
	epoch.Store(2)
	w := newStatusWriter(kv, "lab", func(e uint64) bool { return e == epoch.Load() }, slog.New(slog.DiscardHandler))
	read := func(group string) (events.GroupStatus, uint64) {
		e, err := kv.Get(ctx, events.GroupStatusKey("lab", group))
		if err != nil {
			return events.GroupStatus{}, 0
		}
		var st events.GroupStatus
		if err := json.Unmarshal(e.Value(), &st); err != nil {
			t.Fatal(err)
		}
		return st, e.Revision()
	}
	// Posted before the writer runs: the second supersedes the first.
	w.post(events.GroupStatus{Group: "a", Holder: "n1", Epoch: 2})
	w.post(events.GroupStatus{Group: "a", Holder: "n2", Epoch: 2})
	w.post(events.GroupStatus{Group: "b", Holder: "n3", Epoch: 1}) // an older term's
	w.post(events.GroupStatus{Group: "c", Holder: "n4", Epoch: 2})
	done := make(chan struct{})
	go func() { w.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waittest.Until(t, 10*time.Second, "groups a and c stored", func() bool {
		a, _ := read("a")
		c, _ := read("c")
		return a.Holder != "" && c.Holder == "n4"
	})
	if a, rev := read("a"); a.Holder != "n2" {
		t.Fatalf("group a: holder %q (revision %d), want the newest status's n2", a.Holder, rev)
	}
	// The term ends: what it posted is no longer written.
	epoch.Store(3)
	w.post(events.GroupStatus{Group: "c", Holder: "n5", Epoch: 2})
	w.post(events.GroupStatus{Group: "d", Holder: "n6", Epoch: 3})
	waittest.Until(t, 10*time.Second, "group d stored", func() bool { d, _ := read("d"); return d.Holder == "n6" })
	if b, _ := read("b"); b.Holder != "" {
		t.Errorf("group b written from an older term: %+v", b)
	}
	if c, _ := read("c"); c.Holder != "n4" {
		t.Errorf("group c: holder %q, want n4 (n5 was posted under a term no longer held)", c.Holder)
	}
}

// A status that differs only in heartbeat times and its own write time is
// the same (not rewritten every tick); any other difference is not.
func TestSameStatus(t *testing.T) {
	at := time.Date(2026, 12, 1, 21, 0, 0, 0, time.UTC)
	base := func() events.GroupStatus {
		return events.GroupStatus{Group: "a", Addresses: []string{"198.51.100.10/24"}, Holder: "n1", Epoch: 2, UpdatedAt: at,
			Nodes: map[string]events.NodeStatus{"n1": {Health: events.HealthUp, LastHeartbeat: at, Eligible: true}, "n2": {Health: events.HealthUp, Priority: 1}}}
	}
	later := base()
	later.UpdatedAt = at.Add(time.Second)
	later.Nodes["n1"] = events.NodeStatus{Health: events.HealthUp, LastHeartbeat: at.Add(time.Second), Eligible: true}
	if !sameStatus(base(), later) {
		t.Error("heartbeat and update times alone made a status differ")
	}
	for name, change := range map[string]func(*events.GroupStatus){
		"holder": func(g *events.GroupStatus) { g.Holder = "n2" },
		"node eligible": func(g *events.GroupStatus) {
			g.Nodes["n2"] = events.NodeStatus{Health: events.HealthUp, Priority: 1, Eligible: true}
		},
		"node gone":      func(g *events.GroupStatus) { delete(g.Nodes, "n2") },
		"node replaced":  func(g *events.GroupStatus) { delete(g.Nodes, "n2"); g.Nodes["n3"] = events.NodeStatus{} },
		"situation":      func(g *events.GroupStatus) { g.Situation = "hold" },
		"planned":        func(g *events.GroupStatus) { g.Planned = &events.PlannedStatus{} },
		"no nodes (nil)": func(g *events.GroupStatus) { g.Nodes = nil },
	} {
		g := base()
		change(&g)
		if sameStatus(base(), g) || sameStatus(g, base()) {
			t.Errorf("%s changed, status still the same", name)
		}
	}
	empty, none := base(), base()
	empty.Nodes, none.Nodes = map[string]events.NodeStatus{}, nil
	if !sameStatus(empty, none) {
		t.Error("an empty and a nil node map differ")
	}
}
