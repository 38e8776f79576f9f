package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/waittest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// recorder is a hook script that appends each event's stdin JSON, one per
// line, to a file.
type recorder struct{ out, script string }

func newRecorder(t *testing.T) recorder {
	out := filepath.Join(t.TempDir(), "events")
	return recorder{out: out, script: script(t, `cat >> "$1"; echo >> "$1"`)}
}

func (r recorder) hook(name string) HookConfig {
	return HookConfig{Name: name, Command: []string{r.script, r.out}}
}

func (r recorder) events(t *testing.T) []Event {
	t.Helper()
	b, err := os.ReadFile(r.out)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	// Only whole lines: the script may be between its two writes.
	lines := strings.Split(string(b), "\n")
	var out []Event
	for _, line := range lines[:len(lines)-1] {
		var ev Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("recorded %q: %v", line, err)
		}
		out = append(out, ev)
	}
	return out
}

func (r recorder) ids(t *testing.T) string {
	var ids []string
	for _, ev := range r.events(t) {
		ids = append(ids, ev.ID)
	}
	return strings.Join(ids, ",")
}

// idle is a watch that reads nothing: these tests offer events themselves.
func idle(ctx context.Context, _ bus.WatchOptions, _ bus.EventHandler) error {
	<-ctx.Done()
	return ctx.Err()
}

type harness struct {
	n       *Notifier
	reg     *prometheus.Registry
	leading atomic.Bool
	stop    func()
}

func start(t testing.TB, cfg Config, leading bool, watch func(context.Context, bus.WatchOptions, bus.EventHandler) error) *harness {
	t.Helper()
	if err := cfg.Validate([]string{"pbx", "fax"}); err != nil {
		t.Fatal(err)
	}
	h := &harness{reg: prometheus.NewRegistry()}
	h.leading.Store(leading)
	n, err := New(cfg, Options{Cluster: "lab", Agent: "fan-arbiter/test", Leading: h.leading.Load,
		Groups: []Group{{Name: "pbx", Nodes: []string{"n1", "n2"}, HealthCheck: "pbx"}, {Name: "fax", Nodes: []string{"n2", "n3"}, HealthCheck: "fax"}},
		Log:    slog.New(slog.DiscardHandler), Metrics: h.reg})
	if err != nil {
		t.Fatal(err)
	}
	h.n = n
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx, watch) }()
	h.stop = func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}
	t.Cleanup(func() {
		if ctx.Err() == nil {
			h.stop()
		}
	})
	return h
}

func event(i int, group string) Event {
	ev := sampleEvent()
	ev.ID = fmt.Sprintf("0192b6a0-0000-7000-8000-%012d", i)
	ev.Group = group
	return ev
}

// A hook that hangs holds up neither the other hooks nor the events after
// it: while it is stuck in its first event, the recorder is told of both,
// and offering them never waited for it. Stopping kills the hung group.
func TestHungHookDoesNotDelayTheNextEvent(t *testing.T) {
	dir := t.TempDir()
	hang := script(t, `echo $$ > "$1/pid.$FAN_EVENT_ID"; sleep 300`)
	rec := newRecorder(t)
	h := start(t, Config{Hooks: []HookConfig{
		{Name: "hangs", Command: []string{hang, dir}, Timeout: config.Duration(5 * time.Minute)},
		rec.hook("records"),
	}}, true, idle)
	e1, e2 := event(1, "pbx"), event(2, "pbx")
	h.n.Offer(e1)
	pid := readPid(t, filepath.Join(dir, "pid."+e1.ID)) // the hung hook is inside e1
	h.n.Offer(e2)
	want := e1.ID + "," + e2.ID
	waittest.Until(t, 10*time.Second, "the recorder told of both events", func() bool { return rec.ids(t) == want })
	if len(groupAlive(t, pid)) == 0 {
		t.Fatal("the hung hook ended: the test proves nothing")
	}
	if _, err := os.Stat(filepath.Join(dir, "pid."+e2.ID)); err == nil {
		t.Fatal("the hung hook ran e2 before e1 ended")
	}
	h.stop()
	waittest.Until(t, 10*time.Second, "the hung hook's process group killed at stop", func() bool { return len(groupAlive(t, pid)) == 0 })
	if v := testutil.ToFloat64(h.n.m.runs.WithLabelValues(kindCommand, resultError)); v != 1 {
		t.Errorf("runs{command,error} = %v, want 1 (the hook stopped with the service)", v)
	}
}

// A hook's queue holds queue events; beyond, the oldest waiting is
// dropped and counted, and the rest run in the order read.
func TestFullQueueDropsTheOldest(t *testing.T) {
	dir := t.TempDir()
	gate := script(t, `echo "$FAN_EVENT_ID" >> "$1/ran"; while [ ! -e "$1/go" ]; do sleep 0.02; done`)
	h := start(t, Config{Queue: 2, Hooks: []HookConfig{{Name: "gated", Command: []string{gate, dir}}}}, true, idle)
	ran := func() string {
		b, _ := os.ReadFile(filepath.Join(dir, "ran"))
		return strings.Join(strings.Fields(string(b)), ",")
	}
	h.n.Offer(event(1, "pbx"))
	waittest.Until(t, 10*time.Second, "the first event running", func() bool { return ran() == event(1, "pbx").ID })
	for i := 2; i <= 5; i++ {
		h.n.Offer(event(i, "pbx"))
	}
	if v := testutil.ToFloat64(h.n.m.dropped.WithLabelValues(kindCommand)); v != 2 {
		t.Errorf("dropped = %v, want 2", v)
	}
	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{event(1, "").ID, event(4, "").ID, event(5, "").ID}, ",")
	waittest.Until(t, 10*time.Second, "e1, e4, e5 run", func() bool { return ran() == want })
	waittest.Until(t, 10*time.Second, "three runs counted", func() bool {
		return testutil.ToFloat64(h.n.m.runs.WithLabelValues(kindCommand, resultOK)) == 3
	})
}

// A hook hears only of its groups and kinds.
func TestHookFilters(t *testing.T) {
	rec, all := newRecorder(t), newRecorder(t)
	only := rec.hook("fax-health")
	only.Groups, only.Events = []string{"fax"}, []Kind{KindHealth}
	h := start(t, Config{Hooks: []HookConfig{only, all.hook("all")}}, true, idle)
	faxHealth := event(2, "fax")
	faxHealth.Kind = KindHealth
	h.n.Offer(event(1, "pbx"))
	h.n.Offer(faxHealth)
	h.n.Offer(event(3, "fax"))
	waittest.Until(t, 10*time.Second, "every event to the unfiltered hook", func() bool { return len(all.events(t)) == 3 })
	if got := rec.ids(t); got != faxHealth.ID {
		t.Errorf("filtered hook told of %q, want only %s", got, faxHealth.ID)
	}
}

// A follower runs no hook; when it takes the lease it runs them for what
// happened in the last catch_up (the previous leader may have died with it
// queued), and not for older events.
func TestFollowerCatchesUpWhenItTakesTheLease(t *testing.T) {
	rec := newRecorder(t)
	h := start(t, Config{CatchUp: config.Duration(time.Minute), Hooks: []HookConfig{rec.hook("records")}}, false, idle)
	var offset atomic.Int64
	h.n.mu.Lock()
	h.n.now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	h.n.mu.Unlock()
	old, recent := event(1, "pbx"), event(2, "pbx")
	old.Time = time.Now()
	h.n.Offer(old)
	offset.Store(int64(2 * time.Minute))
	recent.Time = time.Now().Add(2 * time.Minute)
	h.n.Offer(recent)
	for _, hk := range h.n.hooks {
		hk.mu.Lock()
		queued := len(hk.queue)
		hk.mu.Unlock()
		if queued != 0 {
			t.Fatalf("a follower queued %d events", queued)
		}
	}
	h.leading.Store(true)
	// One worker runs the queue in order: had the old event been queued,
	// it would be recorded before the recent one.
	waittest.Until(t, 10*time.Second, "the recent event run after taking the lease", func() bool { return rec.ids(t) != "" })
	if got := rec.ids(t); got != recent.ID {
		t.Errorf("after taking the lease ran %q, want only %s", got, recent.ID)
	}
}
