package app

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/pkg/platform/daemon/metricstest"
)

// TestMetricsFollowTheWindow: before a window /metrics names its start as
// the next edge; while it is open, its end, with the window open and
// permits counted; after it, no edge and the window closed.
func TestMetricsFollowTheWindow(t *testing.T) {
	s := bustest.Server(t)
	addr := metricstest.Listen(t)
	start := time.Now().Truncate(time.Second).Add(2 * time.Second)
	end := start.Add(2 * time.Second)
	cfg := Config{Common: daemon.Common{Cluster: "lab", Node: "ctl", Bus: bus.Config{URL: s.ClientURL()}, HTTPListen: addr},
		TickEvery: config.Duration(time.Second), PlanAhead: 3,
		Groups: []GroupConfig{{Name: "pbx", Windows: []WindowConfig{{Name: "oneoff", TimeZone: "Europe/Berlin",
			Once: []OnceConfig{{From: start.Format(time.RFC3339), To: end.Format(time.RFC3339)}}}}}}}
	svc, err := New(cfg, slog.New(slog.DiscardHandler), "t")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = svc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	const within = 10 * time.Second
	metricstest.WaitFor(t, addr, `fan_scheduler_window_open{group="pbx"}`, metricstest.Is(0), within)
	metricstest.WaitFor(t, addr, `fan_scheduler_next_edge_timestamp_seconds{edge="open",group="pbx"}`, metricstest.Is(float64(start.Unix())), within)
	metricstest.WaitFor(t, addr, `fan_scheduler_permits_total{group="pbx"}`, metricstest.Is(0), within)

	metricstest.WaitFor(t, addr, `fan_scheduler_window_open{group="pbx"}`, metricstest.Is(1), within)
	metricstest.WaitFor(t, addr, `fan_scheduler_next_edge_timestamp_seconds{edge="close",group="pbx"}`, metricstest.Is(float64(end.Unix())), within)
	metricstest.WaitFor(t, addr, `fan_scheduler_permits_total{group="pbx"}`, metricstest.AtLeast(1), within)

	metricstest.WaitFor(t, addr, `fan_scheduler_window_open{group="pbx"}`, metricstest.Is(0), within)
	m, err := metricstest.Scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	for series := range m {
		if strings.HasPrefix(series, "fan_scheduler_next_edge_timestamp_seconds") {
			t.Fatalf("a next edge after the only window: %s", series)
		}
	}
}
