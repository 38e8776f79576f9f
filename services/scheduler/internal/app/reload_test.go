package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// TestReloadOpensAWindowAtOnce: an operator adds a one-off window to the
// file and sends SIGHUP; permits start without a restart, and changing the
// node is reported as needing one.
func TestReloadOpensAWindowAtOnce(t *testing.T) {
	s := bustest.Server(t)
	path := filepath.Join(t.TempDir(), "scheduler.yaml")
	write := func(node, windows string) {
		doc := fmt.Sprintf("cluster: lab\nnode: %s\nbus:\n  url: %s\ntick_every: 1s\ngroups:\n  - name: pbx\n    windows:\n%s", node, s.ClientURL(), windows)
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	far := time.Now().Add(48 * time.Hour).Truncate(time.Second)
	write("ctl", fmt.Sprintf("      - name: later\n        time_zone: UTC\n        once:\n          - from: %s\n            to: %s\n",
		far.Format(time.RFC3339), far.Add(time.Hour).Format(time.RFC3339)))
	svc, err := Build(daemon.Options{ConfigPath: path, Logger: slog.New(slog.DiscardHandler), Version: "t"})
	if err != nil {
		t.Fatal(err)
	}
	sched := svc.(*Service)
	b := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "scheduler", Node: "ctl"})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	ob := bustest.Outbox(t, b)
	wg.Go(func() { _ = sched.loop(ctx, b, ob) })

	permits := make(chan *events.FailbackPermit, 16)
	reader := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "test", Node: "r"})
	wg.Go(func() {
		_ = reader.Watch(ctx, bus.WatchOptions{Subjects: []string{events.AllPermits("lab")}, All: true},
			func(_ events.Envelope, p events.Decoded, _ uint64) { permits <- p.(*events.FailbackPermit) })
	})
	select {
	case p := <-permits:
		t.Fatalf("permit before any window is open: %+v", p)
	case <-time.After(1500 * time.Millisecond):
	}

	now := time.Now().Truncate(time.Second)
	write("ctl", fmt.Sprintf("      - name: tonight\n        time_zone: UTC\n        once:\n          - from: %s\n            to: %s\n",
		now.Add(-time.Minute).Format(time.RFC3339), now.Add(time.Hour).Format(time.RFC3339)))
	if err := sched.Reload(ctx); err != nil {
		t.Fatalf("reload of windows only: %v", err)
	}
	select {
	case p := <-permits:
		if p.Window != "tonight" || p.Group != "pbx" {
			t.Fatalf("permit %+v", p)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no permit after the reload opened a window")
	}

	write("ctl2", "      - name: tonight\n        time_zone: UTC\n        weekly:\n          - days: [mon]\n            from: \"02:00\"\n            to: \"05:00\"\n")
	var rr *daemon.RestartRequired
	if err := sched.Reload(ctx); !errors.As(err, &rr) || len(rr.Keys) != 1 || rr.Keys[0] != "node" {
		t.Fatalf("changing the node must need a restart, got %v", err)
	}
}
