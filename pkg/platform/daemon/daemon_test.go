package daemon_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

type svcFunc func(ctx context.Context) error

func (f svcFunc) Run(ctx context.Context) error { return f(ctx) }

func TestRunExitCodes(t *testing.T) {
	ok := func(daemon.Options) (daemon.Service, error) {
		return svcFunc(func(context.Context) error { return nil }), nil
	}
	bad := func(o daemon.Options) (daemon.Service, error) {
		return nil, errors.New("config " + o.ConfigPath + ": fall: must be at least 1")
	}
	failing := func(daemon.Options) (daemon.Service, error) {
		return svcFunc(func(context.Context) error { return errors.New("boom") }), nil
	}
	var released int
	releaser := func(daemon.Options) (daemon.Service, error) {
		return releasingSvc{svcFunc(func(context.Context) error { t.Error("Run called by -release-all"); return nil }), &released, nil}, nil
	}
	releaseFails := func(daemon.Options) (daemon.Service, error) {
		return releasingSvc{ok: nil, n: &released, err: errors.New("netlink: operation not permitted")}, nil
	}
	cases := []struct {
		name  string
		args  []string
		build daemon.Builder
		want  int
	}{
		{"check ok", []string{"--check-config", "x.yaml"}, ok, 0},
		{"check bad", []string{"--check-config", "x.yaml"}, bad, 1},
		{"run ok", nil, ok, 0},
		{"run error", nil, failing, 1},
		{"bad flag", []string{"--nope"}, ok, 2},
		{"bad log level", []string{"--log-level", "loud"}, ok, 2},
		{"release-all", []string{"--release-all"}, releaser, 0},
		{"release-all fails", []string{"-release-all"}, releaseFails, 1},
		{"release-all unsupported", []string{"--release-all"}, ok, 2},
		{"release-all bad config", []string{"--release-all"}, bad, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := daemon.Run(tc.args, "fan-test", "t", "/nonexistent", tc.build); got != tc.want {
				t.Fatalf("exit %d, want %d", got, tc.want)
			}
		})
	}
	if released != 2 {
		t.Fatalf("ReleaseAll called %d times, want 2", released)
	}
}

type releasingSvc struct {
	ok  daemon.Service
	n   *int
	err error
}

func (r releasingSvc) Run(ctx context.Context) error { return r.ok.Run(ctx) }

func (r releasingSvc) ReleaseAll(context.Context) error {
	*r.n++
	return r.err
}

func TestRuntimeAnnouncesAndServesHealth(t *testing.T) {
	s := bustest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	c := daemon.Common{Cluster: "lab", Node: "n1", Bus: bus.Config{URL: s.ClientURL()}, HTTPListen: addr}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	watcher := bustest.Connect(t, s, bus.Identity{Cluster: "lab", Service: "watch", Node: "w"})
	got := make(chan events.ServiceAnnounce, 4)
	go func() {
		_ = watcher.Watch(ctx, bus.WatchOptions{Subjects: []string{events.ClusterEvents("lab")}, All: true},
			func(_ events.Envelope, p events.Decoded, _ uint64) {
				if a, ok := p.(*events.ServiceAnnounce); ok {
					got <- *a
				}
			})
	}()

	rt, err := daemon.Start(ctx, c, "prober", "t", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz %d %s", resp.StatusCode, body)
	}
	resp, err = http.Get("http://" + addr + "/metrics")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("metrics: %v", err)
	}
	resp.Body.Close()
	rt.Close(ctx)
	for _, want := range []events.ServiceState{events.ServiceStarted, events.ServiceStopping} {
		select {
		case a := <-got:
			if a.State != want || a.Service != "prober" || a.Node != "n1" {
				t.Fatalf("announce %+v, want state %s", a, want)
			}
		case <-ctx.Done():
			t.Fatalf("no %s announcement", want)
		}
	}
}

func TestCommonValidation(t *testing.T) {
	for name, c := range map[string]daemon.Common{
		"no cluster":  {Node: "n1", Bus: bus.Config{URL: "nats://x:4222"}},
		"dotted node": {Cluster: "lab", Node: "n.1", Bus: bus.Config{URL: "nats://x:4222"}},
		"no bus":      {Cluster: "lab", Node: "n1"},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
