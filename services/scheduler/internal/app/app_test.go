package app

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/nats-io/nats.go/jetstream"
)

func parse(t *testing.T, yaml string) (Config, error) {
	t.Helper()
	var c Config
	err := config.Parse("test.yaml", []byte(yaml), &c)
	return c, err
}

const base = "cluster: lab\nnode: ctl\nbus:\n  url: nats://127.0.0.1:1\n"

func TestConfigErrorsNameTheKey(t *testing.T) {
	cases := map[string]string{
		"groups[0].windows[0].time_zone":      "groups:\n- name: pbx\n  windows:\n  - name: n\n    time_zone: Mars/Olympus\n    weekly: [{days: [mon], from: '02:00', to: '05:00'}]\n",
		"groups[0].windows[0].weekly[0].days": "groups:\n- name: pbx\n  windows:\n  - name: n\n    weekly: [{days: [funday], from: '02:00', to: '05:00'}]\n",
		"groups[0].windows[0].weekly[0].from": "groups:\n- name: pbx\n  windows:\n  - name: n\n    weekly: [{days: [mon], from: '2am', to: '05:00'}]\n",
		"groups[0].windows[0].once[0].to":     "groups:\n- name: pbx\n  windows:\n  - name: n\n    once: [{from: '2026-12-01T02:00:00Z', to: '2026-12-01T01:00:00Z'}]\n",
		"groups[0].windows[0].blackout_dates": "groups:\n- name: pbx\n  windows:\n  - name: n\n    weekly: [{days: [mon], from: '02:00', to: '05:00'}]\n    blackout_dates: [24.12.2026]\n",
		"tick_every":                          "tick_every: 5m\n",
		"groups[0].windows[0].weekly":         "groups:\n- name: pbx\n  windows:\n  - name: n\n",
	}
	for key, y := range cases {
		if _, err := parse(t, base+y); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: error %v", key, err)
		}
	}
	c, err := parse(t, base+"groups:\n- name: pbx\n  windows:\n  - name: nightly\n    time_zone: Europe/Berlin\n    weekly: [{days: [daily], from: '02:00', to: '05:00'}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.TickEvery.D() != time.Minute || c.PlanAhead != 5 {
		t.Fatalf("defaults %+v", c)
	}
}

// TestInstancesAgreeWithoutDuplicates runs two schedulers against one
// JetStream with a one-off window a moment from now: the stream must hold
// exactly one permit per tick, each valid until the window's end, and the
// plan must be readable by fanctl.
func TestInstancesAgreeWithoutDuplicates(t *testing.T) {
	s := bustest.Server(t)
	start := time.Now().Truncate(time.Second).Add(2 * time.Second)
	end := start.Add(3 * time.Second)
	cfg := Config{Common: daemon.Common{Cluster: "lab", Node: "ctl"}, TickEvery: config.Duration(time.Second), PlanAhead: 3,
		Groups: []GroupConfig{{Name: "pbx", Windows: []WindowConfig{{Name: "oneoff", TimeZone: "Europe/Berlin",
			Once: []OnceConfig{{From: start.Format(time.RFC3339), To: end.Format(time.RFC3339)}}}}}}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	lctx, lcancel := context.WithCancel(ctx)
	var outboxes []*bus.Outbox
	for _, node := range []string{"ctl1", "ctl2"} {
		b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "scheduler", Node: node})
		svc, err := New(cfg, slog.New(slog.DiscardHandler), "t")
		if err != nil {
			t.Fatal(err)
		}
		ob := bustest.Outbox(t, b)
		outboxes = append(outboxes, ob)
		wg.Go(func() { _ = svc.loop(lctx, b, ob) })
	}
	reader := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "test", Node: "r"})
	var mu sync.Mutex
	ticks := map[time.Time]int{}
	wctx, wcancel := context.WithCancel(ctx)
	go func() {
		_ = reader.Watch(wctx, bus.WatchOptions{Subjects: []string{events.AllPermits("lab")}, All: true}, func(env events.Envelope, p events.Decoded, _ uint64) {
			fp := p.(*events.FailbackPermit)
			if !fp.ValidUntil.Equal(end) || fp.Window != "oneoff" || fp.ValidFrom.Before(start) {
				t.Errorf("permit %+v", fp)
			}
			mu.Lock()
			ticks[fp.ValidFrom.UTC()]++
			mu.Unlock()
		})
	}()
	waittest.Succeeds(t, 15*time.Second, "three ticks", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(ticks) != 3 {
			return fmt.Errorf("ticks seen: %v", ticks)
		}
		return nil
	})
	// Both instances have published every tick by the window's end: once
	// it has passed, stop them and let their outboxes store what they
	// posted. The stream then holds every copy it ever will, and the watch
	// has seen them all once it has delivered as many.
	time.Sleep(time.Until(end))
	lcancel()
	wg.Wait()
	waittest.Until(t, 10*time.Second, "the schedulers' outboxes drained", func() bool {
		return outboxes[0].Pending() == 0 && outboxes[1].Pending() == 0
	})
	st, err := reader.JS.Stream(ctx, bus.EventsStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(events.AllPermits("lab")))
	if err != nil {
		t.Fatal(err)
	}
	var stored int
	for _, n := range info.State.Subjects {
		stored += int(n)
	}
	waittest.Until(t, 5*time.Second, fmt.Sprintf("the watch delivering the %d stored permits", stored), func() bool {
		mu.Lock()
		defer mu.Unlock()
		seen := 0
		for _, n := range ticks {
			seen += n
		}
		return seen >= stored
	})
	wcancel()
	mu.Lock()
	for at, n := range ticks {
		if n != 1 {
			t.Errorf("tick %v stored %d times", at, n)
		}
		if off := at.Sub(start); off%time.Second != 0 {
			t.Errorf("tick %v not aligned to the window start", at)
		}
	}
	mu.Unlock()
	kv, err := reader.StateKV(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, events.ScheduleKey("lab"))
	if err != nil {
		t.Fatal(err)
	}
	var plan events.SchedulePlan
	if err := json.Unmarshal(e.Value(), &plan); err != nil || len(plan.Groups) != 1 || plan.Groups[0].Group != "pbx" {
		t.Fatalf("plan %s: %v", e.Value(), err)
	}
}
