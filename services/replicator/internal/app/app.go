// Package app wires the replicator: configuration, the bus, the object
// stores, AMI for AstDB, and the replication engine.
package app

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
	"github.com/fanpbx/fan/services/replicator/internal/replicate"
	"github.com/fanpbx/fan/services/replicator/internal/store"
)

// TreeConfig is one replicated directory.
type TreeConfig struct {
	Name    string   `yaml:"name"`
	Path    string   `yaml:"path"`
	Exclude []string `yaml:"exclude"`
	// Create makes the root on start when it is missing (labs, fresh
	// installs). Never set it for a tree on its own mount: an unmounted
	// disk would then look like an empty tree (the empty-source guard and
	// the targets' safety valve still refuse to delete, but alarms fire).
	Create bool `yaml:"create"`
}

// AstDBConfig carries AstDB families between the nodes' running Asterisks.
type AstDBConfig struct {
	Enabled  bool            `yaml:"enabled"`
	Name     string          `yaml:"name"`
	Families []string        `yaml:"families"`
	Interval config.Duration `yaml:"interval"`
	AMI      struct {
		Address  string `yaml:"address"`
		Username string `yaml:"username"`
		Secret   string `yaml:"secret"`
	} `yaml:"ami"`
}

// SafetyConfig is the valve against mass deletion.
type SafetyConfig struct {
	MaxDeleteShare float64 `yaml:"max_delete_share"`
	AllowDeletes   *int    `yaml:"allow_deletes"`
}

// Config is the replicator's configuration file.
type Config struct {
	daemon.Common `yaml:",inline"`
	Group         string          `yaml:"group"`
	StateDir      string          `yaml:"state_dir"`
	Trees         []TreeConfig    `yaml:"trees"`
	AstDB         AstDBConfig     `yaml:"astdb"`
	Debounce      config.Duration `yaml:"debounce"`
	ScanInterval  config.Duration `yaml:"scan_interval"`
	Workers       int             `yaml:"workers"`
	Safety        SafetyConfig    `yaml:"safety"`
	GCInterval    config.Duration `yaml:"gc_interval"`
	GCGrace       config.Duration `yaml:"gc_grace"`
}

// DefaultTrees are replicated when the file names none.
func DefaultTrees() []TreeConfig {
	return []TreeConfig{
		{Name: "asterisk-etc", Path: "/etc/asterisk"},
		// tmp/ holds recordings in progress; .lock* files are always left out.
		{Name: "voicemail", Path: "/var/spool/asterisk/voicemail", Exclude: []string{"tmp/"}},
	}
}

// neverReplicated are paths no tree may carry: call files in outgoing are
// executed at once, and the others are per-process or live databases.
var neverReplicated = []string{
	"/var/spool/asterisk/outgoing",
	"/var/spool/asterisk/tmp",
	"/var/run/asterisk",
	"/run/asterisk",
	"/var/lib/asterisk/astdb.sqlite3",
	"/var/lib/asterisk/astdb.sqlite3-journal",
}

// Validate fills defaults and checks the file after loading.
func (c *Config) Validate() error {
	if err := c.Common.Validate(); err != nil {
		return err
	}
	if err := events.ValidToken("group", c.Group); err != nil {
		return &config.FieldError{Key: "group", Err: err}
	}
	if c.StateDir == "" {
		c.StateDir = "/var/lib/fan/replicator"
	}
	if c.Trees == nil {
		c.Trees = DefaultTrees()
	}
	if c.Debounce == 0 {
		c.Debounce = config.Duration(20 * time.Millisecond)
	}
	if c.ScanInterval == 0 {
		c.ScanInterval = config.Duration(30 * time.Second)
	}
	if c.Workers == 0 {
		c.Workers = 4
	}
	if c.Workers < 1 || c.Workers > 64 {
		return config.Errf("workers", "must be 1..64, got %d", c.Workers)
	}
	if c.Safety.MaxDeleteShare == 0 {
		c.Safety.MaxDeleteShare = 0.10
	}
	if c.Safety.MaxDeleteShare < 0 || c.Safety.MaxDeleteShare > 1 {
		return config.Errf("safety.max_delete_share", "must be in (0, 1], got %v", c.Safety.MaxDeleteShare)
	}
	if c.Safety.AllowDeletes == nil {
		two := 2
		c.Safety.AllowDeletes = &two
	}
	if c.GCInterval == 0 {
		c.GCInterval = config.Duration(time.Hour)
	}
	if c.GCGrace == 0 {
		c.GCGrace = config.Duration(time.Hour)
	}
	names := map[string]bool{}
	for i := range c.Trees {
		t := &c.Trees[i]
		key := fmt.Sprintf("trees[%d]", i)
		if err := events.ValidToken("name", t.Name); err != nil {
			return &config.FieldError{Key: key + ".name", Err: err}
		}
		if names[t.Name] {
			return config.Errf(key+".name", "%q used twice", t.Name)
		}
		names[t.Name] = true
		if !filepath.IsAbs(t.Path) {
			return config.Errf(key+".path", "must be absolute, got %q", t.Path)
		}
		t.Path = filepath.Clean(t.Path)
		for _, n := range neverReplicated {
			if t.Path == n || strings.HasPrefix(t.Path, n+"/") {
				return config.Errf(key+".path", "%s is never replicated", n)
			}
			// A tree above a never-replicated path leaves it out.
			if rel, ok := strings.CutPrefix(n, t.Path+"/"); ok {
				t.Exclude = append(t.Exclude, "/"+rel)
			}
		}
		if _, err := fstree.NewExcluder(t.Exclude); err != nil {
			return &config.FieldError{Key: key + ".exclude", Err: err}
		}
	}
	if c.AstDB.Enabled {
		if c.AstDB.Name == "" {
			c.AstDB.Name = "astdb"
		}
		if err := events.ValidToken("name", c.AstDB.Name); err != nil {
			return &config.FieldError{Key: "astdb.name", Err: err}
		}
		if names[c.AstDB.Name] {
			return config.Errf("astdb.name", "%q is also a tree's name", c.AstDB.Name)
		}
		if len(c.AstDB.Families) == 0 {
			c.AstDB.Families = []string{"registrar"}
		}
		for _, f := range c.AstDB.Families {
			if f == "" || strings.ContainsAny(f, "/ ") {
				return config.Errf("astdb.families", "bad family %q", f)
			}
		}
		if c.AstDB.Interval == 0 {
			c.AstDB.Interval = config.Duration(time.Second)
		}
		if c.AstDB.AMI.Address == "" || c.AstDB.AMI.Username == "" || c.AstDB.AMI.Secret == "" {
			return config.Errf("astdb.ami", "address, username and secret are required")
		}
	}
	return nil
}

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
	return New(cfg, o.Logger, o.Version), nil
}

// New makes a service from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) *Service {
	return &Service{cfg: cfg, log: log.With("node", cfg.Node), version: version}
}

// Run joins the bus, opens (creating when missing) the object stores, and
// replicates until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return daemon.Serve(ctx, s.cfg.Common, "replicator", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		st, err := store.Open(ctx, rt.Bus.JS, s.cfg.Bus.Replicas)
		if err != nil {
			return fmt.Errorf("replicator: %w", err)
		}
		ecfg := replicate.Config{
			Cluster: s.cfg.Cluster, Group: s.cfg.Group, Node: s.cfg.Node, StateDir: s.cfg.StateDir,
			Debounce: s.cfg.Debounce.D(), ScanInterval: s.cfg.ScanInterval.D(),
			MaxDeleteShare: s.cfg.Safety.MaxDeleteShare, AllowDeletes: *s.cfg.Safety.AllowDeletes,
			Workers: s.cfg.Workers, Owner: os.Geteuid() == 0,
			GCInterval: s.cfg.GCInterval.D(), GCGrace: s.cfg.GCGrace.D(),
			Conditions: rt.Conditions,
		}
		for _, t := range s.cfg.Trees {
			ex, _ := fstree.NewExcluder(t.Exclude)
			if t.Create {
				if err := os.MkdirAll(t.Path, 0o755); err != nil {
					return fmt.Errorf("replicator: create tree %s: %w", t.Path, err)
				}
			}
			ecfg.Trees = append(ecfg.Trees, replicate.Tree{Name: t.Name, Root: t.Path, Exclude: ex})
		}
		if s.cfg.AstDB.Enabled {
			sess := ami.NewSession(ami.Config{Addr: s.cfg.AstDB.AMI.Address, Username: s.cfg.AstDB.AMI.Username,
				Secret: s.cfg.AstDB.AMI.Secret}, s.log.With("component", "ami"))
			defer sess.Close()
			ecfg.Trees = append(ecfg.Trees, replicate.Tree{Name: s.cfg.AstDB.Name, AMI: sess,
				Families: s.cfg.AstDB.Families, Poll: s.cfg.AstDB.Interval.D()})
		}
		ecfg.Outbox = rt.Outbox
		eng, err := replicate.New(ecfg, rt.Bus, st, rt.Metrics, s.log)
		if err != nil {
			return fmt.Errorf("replicator: %w", err)
		}
		return eng.Run(ctx)
	})
}
