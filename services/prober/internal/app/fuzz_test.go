package app

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// FuzzConfig: whatever the prober's file holds, loading it must not panic,
// and a file that passes -check-config must not panic at start either: its
// tickers, schedules and checkers are built here as Run builds them (a
// heartbeat_interval of -1s once passed and then panicked in
// time.NewTicker, a crash loop under Restart=always).
// Run: go test -run '^$' -fuzz FuzzConfig ./internal/app (or make fuzz).
func FuzzConfig(f *testing.F) {
	for _, s := range []string{validYAML, kindsYAML, boundsValid,
		validYAML + "heartbeat_interval: -1s\n", validYAML + "presence_interval: 1ns\n",
		boundsValid + "groups: [{name: g, min_up: 1, checks: [pbx]}]\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		hang := time.AfterFunc(5*time.Second, func() { panic(fmt.Sprintf("FuzzConfig hangs on %q", b)) })
		defer hang.Stop()
		var c Config
		if err := config.Parse("fuzz.yaml", b, &c); err != nil {
			return
		}
		for _, d := range []time.Duration{c.HeartbeatInterval.D(), c.PresenceInterval.D()} {
			time.NewTicker(d).Stop()
		}
		svc := New(c, slog.New(slog.DiscardHandler), "fuzz")
		for _, cc := range c.Checks {
			s := newSchedule(cc.Interval.D(), cc.Jitter.D())
			s.due()
			s.next()
			if cc.Timeout <= 0 || cc.Timeout >= cc.Interval {
				t.Fatalf("check %s accepted with timeout %v, interval %v", cc.Name, cc.Timeout, cc.Interval)
			}
			switch cc.Kind {
			case "tcp", "http", "exec", "dns": // the others open sockets
				ch, err := svc.newChecker(cc)
				if err == nil {
					_ = ch.Target()
					_ = ch.Close()
				}
			}
		}
	})
}
