package e2e

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

// startLab builds the namespace lab for opts.Topology, starts fan's real
// binaries in it and a SIP pinger on the floating address, and tears all of
// it down when the test ends. It returns a context bounded by within. A
// failed test prints each process's last lines; FAN_LAB_KEEP=dir keeps
// every log (and the services' configurations) under dir, pass or fail
// (netlab.KeepEnv).
func startLab(t *testing.T, within time.Duration, opts stack.Options) (context.Context, *netlab.Lab, *stack.Stack, *sipoptions.Pinger) {
	t.Helper()
	stack.RequireLab(t)
	ctx, cancel := context.WithTimeout(context.Background(), within)
	t.Cleanup(cancel)
	opts.BinDir = stack.BinDirForTest(t)
	opts.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if opts.Topology == "" {
		opts.Topology = stack.TopologySingle
	}
	l, err := netlab.Build(ctx, opts.Topology.LabSpec(netlab.Spec{Logger: opts.Log}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab close: %v", err)
		}
	})
	st, err := stack.Start(ctx, l, opts)
	if st != nil {
		t.Cleanup(func() {
			if t.Failed() {
				t.Log(st.Logs(6000))
			}
			st.Stop()
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	p, err := st.Pinger()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return ctx, l, st, p
}
