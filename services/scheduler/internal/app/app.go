// Package app wires the scheduler. For now it only joins the bus and
// announces itself: failback windows come with the arbiter's failback policy.
// Until then no permit is ever published, so nothing fails back.
package app

import (
	"context"
	"log/slog"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// Config is the scheduler's configuration file.
type Config struct {
	daemon.Common `yaml:",inline"`
}

// Validate checks the file after loading.
func (c *Config) Validate() error { return c.Common.Validate() }

// Service is a running scheduler.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string
}

// Build loads the configuration; it starts nothing.
func Build(o daemon.Options) (daemon.Service, error) {
	var cfg Config
	if err := config.Load(o.ConfigPath, &cfg); err != nil {
		return nil, err
	}
	return &Service{cfg: cfg, log: o.Logger.With("node", cfg.Node), version: o.Version}, nil
}

// Run joins the bus, announces the service and waits for the stop signal.
func (s *Service) Run(ctx context.Context) error {
	return daemon.Serve(ctx, s.cfg.Common, "scheduler", s.version, s.log, func(ctx context.Context, _ *daemon.Runtime) error {
		<-ctx.Done()
		return nil
	})
}
