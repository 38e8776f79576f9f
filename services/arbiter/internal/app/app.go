// Package app wires the arbiter: one goroutine owns the pure decision core
// and feeds it the prober's transitions and heartbeats, the executors'
// results, the scheduler's permits, the replicator's reports, operator
// requests and the clock; while this replica holds the lease it persists
// the core's state, publishes decisions, and publishes commands fenced by
// the lease so that only the current leader's commands reach an executor.
// Beside it, and never in its way, the leader keeps the node registry.
//
// A Service is what the configuration says; Run builds an arbiter from it
// on the runtime's bus (arbiter.go: everything it needs, or an error) and
// only then hands its actors to a run group (run.go). The arbiter's jobs
// have a file each: leadership and restore (leadership.go), operator
// requests (operator.go), the node registry (registry.go), and persisting
// and publishing what the core decided (publish.go).
package app

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
)

// Service is a configured arbiter. It starts nothing; Run connects it.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string
	core    *decide.Core

	// watch reads the audit stream's inputs (nil: the bus's Watch); a
	// test replaces it to end it early.
	watch func(context.Context, bus.WatchOptions, bus.EventHandler) error
	// wired, when set, is handed the arbiter once it is built and before
	// any of its actors runs: a test's handle on what no request causes.
	wired func(*arbiter)
}

// Build loads and validates the configuration; it starts nothing.
func Build(o daemon.Options) (daemon.Service, error) {
	var cfg Config
	if err := daemon.LoadConfig(o, &cfg); err != nil {
		return nil, err
	}
	s, err := New(cfg, o.Logger, o.Version)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", o.ConfigPath, err)
	}
	return s, nil
}

// New builds an arbiter from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) (*Service, error) {
	core, err := decide.New(cfg.decideConfig())
	if err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, log: daemon.ServiceLogger(log, cfg.Node), version: version, core: core}, nil
}

// Run arbitrates until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return daemon.Serve(ctx, s.cfg.Common, "arbiter", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		a, err := s.newArbiter(ctx, rt)
		if err != nil {
			return err
		}
		defer a.close()
		if s.wired != nil {
			s.wired(a)
		}
		return a.run(ctx)
	})
}
