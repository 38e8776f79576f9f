// Package app wires the replicator. For now it only joins the bus and
// announces itself: file replication comes in its own change. It never
// touches a file yet, so it cannot replicate in the wrong direction.
package app

import (
	"context"
	"log/slog"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
)

// Config is the replicator's configuration file.
type Config struct {
	daemon.Common `yaml:",inline"`
}

// Validate checks the file after loading.
func (c *Config) Validate() error { return c.Common.Validate() }

// Service is a running replicator.
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
	return daemon.Serve(ctx, s.cfg.Common, "replicator", s.version, s.log, func(ctx context.Context, _ *daemon.Runtime) error {
		<-ctx.Done()
		return nil
	})
}
