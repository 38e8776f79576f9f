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
	"github.com/fanpbx/fan/services/replicator/internal/astdb"
	"github.com/fanpbx/fan/services/replicator/internal/calls"
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
	// The safety policy on a target (all false by default): see the
	// README's Safety section.
	AllowOutsideSymlinks bool `yaml:"allow_outside_symlinks"`
	PreserveOwner        bool `yaml:"preserve_owner"`
	PreserveSpecialBits  bool `yaml:"preserve_special_bits"`
}

// AstDBConfig carries AstDB families between the nodes' running Asterisks.
type AstDBConfig struct {
	Enabled  bool     `yaml:"enabled"`
	Name     string   `yaml:"name"`
	Families []string `yaml:"families"`
	// Interval is how often the holder reads the families Asterisk
	// reports no changes of (all but registrar).
	Interval config.Duration `yaml:"interval"`
	// ReconcileInterval is how often the holder reads every family whole
	// and publishes it as a manifest: what no event reported reaches the
	// standbys then at the latest.
	ReconcileInterval config.Duration `yaml:"reconcile_interval"`
	// EventBuffer is how many Asterisk events wait to be read before the
	// next is dropped (and a reconcile made).
	EventBuffer int `yaml:"event_buffer"`
	AMI         struct {
		Address  string `yaml:"address"`
		Username string `yaml:"username"`
		Secret   string `yaml:"secret"`
	} `yaml:"ami"`
}

// AMIConfig is an AMI login to this node's Asterisk.
type AMIConfig struct {
	Address  string `yaml:"address"`
	Username string `yaml:"username"`
	Secret   string `yaml:"secret"`
}

// CallsConfig is the recorder of calls in progress (internal/calls).
type CallsConfig struct {
	// Enabled (default: on when the file gives an AMI login, calls.ami or
	// astdb.ami) records the calls this node's Asterisk has up while it
	// holds the group.
	Enabled *bool `yaml:"enabled"`
	// AMI defaults to astdb.ami; the recorder logs in on a session of its
	// own either way.
	AMI AMIConfig `yaml:"ami"`
	// ReconcileInterval is how often every channel and every call's media
	// are read again.
	ReconcileInterval config.Duration `yaml:"reconcile_interval"`
	// SummaryInterval is how often the calls summary is restated.
	SummaryInterval config.Duration `yaml:"summary_interval"`
	// EventBuffer is how many call events wait to be read before the next
	// is dropped (and a reconcile made).
	EventBuffer int `yaml:"event_buffer"`
	// OrphanGrace is how long a call a planned move left on this node that
	// no other node keeps stays up before its channels are hung up
	// (calls.DefaultOrphanGrace when zero).
	OrphanGrace config.Duration `yaml:"orphan_grace"`
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
	Calls         CallsConfig     `yaml:"calls"`
	Debounce      config.Duration `yaml:"debounce"`
	ScanInterval  config.Duration `yaml:"scan_interval"`
	Workers       int             `yaml:"workers"`
	Safety        SafetyConfig    `yaml:"safety"`
	GCInterval    config.Duration `yaml:"gc_interval"`
	GCGrace       config.Duration `yaml:"gc_grace"`
	// DirectTransfer (default on): a pass's new contents beyond
	// StorePassMiB are served by the holder to its peers over the bus
	// instead of being stored.
	DirectTransfer *bool `yaml:"direct_transfer"`
	StorePassMiB   int   `yaml:"store_pass_mib"`
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

// systemRoots are directories no tree may be: replication deletes what the
// holder does not have, so a tree at one of them would let one manifest
// (or one mistaken holder) rewrite the operating system. Trees below them
// (/etc/asterisk) are the point.
var systemRoots = []string{
	"/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
	"/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp",
	"/usr", "/usr/bin", "/usr/lib", "/usr/libexec", "/usr/local", "/usr/sbin", "/usr/share",
	"/var", "/var/lib", "/var/log", "/var/run", "/var/spool", "/var/tmp",
}

// within says whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// resolved is where p leads now, or p when it does not exist yet.
func resolved(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return p
}

// checkTreePath refuses a tree at a system root, or one that is (or holds)
// the replicator's state directory.
func checkTreePath(key, p, stateDir string) error {
	// Where the path leads now (it may be a symlink) counts as well as
	// what is written: /etc/asterisk -> /etc is /etc.
	paths := []string{p}
	if real := resolved(p); real != p {
		paths = append(paths, real)
	}
	for _, q := range paths {
		for _, r := range systemRoots {
			if q == r {
				return config.Errf(key, "%s is a system directory; a tree must be a directory of its own (such as /etc/asterisk)", q)
			}
		}
		if within(stateDir, q) || within(q, stateDir) {
			return config.Errf(key, "%s overlaps state_dir %s (a manifest could rewrite the replicator's own state)", q, stateDir)
		}
	}
	return nil
}

// Validate fills defaults and checks the file after loading.
func (c *Config) Validate() error {
	errs := []error{c.Common.Validate(), c.validateBounds()}
	if err := events.ValidToken("group", c.Group); err != nil {
		errs = append(errs, &config.FieldError{Key: "group", Err: err})
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
		errs = append(errs, config.Errf("workers", "must be 1..64, got %d", c.Workers))
	}
	if c.Safety.MaxDeleteShare == 0 {
		c.Safety.MaxDeleteShare = 0.10
	}
	if c.Safety.MaxDeleteShare < 0 || c.Safety.MaxDeleteShare > 1 {
		errs = append(errs, config.Errf("safety.max_delete_share", "must be in (0, 1], got %v", c.Safety.MaxDeleteShare))
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
	if c.DirectTransfer == nil {
		on := true
		c.DirectTransfer = &on
	}
	if c.StorePassMiB == 0 {
		c.StorePassMiB = 64
	}
	names := map[string]bool{}
	for i := range c.Trees {
		t := &c.Trees[i]
		key := fmt.Sprintf("trees[%d]", i)
		if err := events.ValidToken("name", t.Name); err != nil {
			errs = append(errs, &config.FieldError{Key: key + ".name", Err: err})
		} else if names[t.Name] {
			errs = append(errs, config.Errf(key+".name", "%q used twice", t.Name))
		}
		names[t.Name] = true
		// Where a tree lies is judged from an absolute path only.
		if !filepath.IsAbs(t.Path) {
			errs = append(errs, config.Errf(key+".path", "must be absolute, got %q", t.Path))
			continue
		}
		t.Path = filepath.Clean(t.Path)
		if err := checkTreePath(key+".path", t.Path, filepath.Clean(c.StateDir)); err != nil {
			errs = append(errs, err)
			continue
		}
		real := resolved(t.Path)
		for j := range i {
			o := c.Trees[j].Path
			for _, pair := range [][2]string{{t.Path, o}, {real, resolved(o)}} {
				if within(pair[0], pair[1]) || within(pair[1], pair[0]) {
					errs = append(errs, config.Errf(key+".path", "%s overlaps trees[%d].path %s: a tree inside another would be written by both", t.Path, j, o))
				}
			}
		}
		for _, n := range neverReplicated {
			if t.Path == n || strings.HasPrefix(t.Path, n+"/") {
				errs = append(errs, config.Errf(key+".path", "%s is never replicated", n))
			}
			// A tree above a never-replicated path leaves it out.
			if rel, ok := strings.CutPrefix(n, t.Path+"/"); ok {
				t.Exclude = append(t.Exclude, "/"+rel)
			}
		}
		if _, err := fstree.NewExcluder(t.Exclude); err != nil {
			errs = append(errs, &config.FieldError{Key: key + ".exclude", Err: err})
		}
	}
	if c.AstDB.Enabled {
		if c.AstDB.Name == "" {
			c.AstDB.Name = "astdb"
		}
		if err := events.ValidToken("name", c.AstDB.Name); err != nil {
			errs = append(errs, &config.FieldError{Key: "astdb.name", Err: err})
		} else if names[c.AstDB.Name] {
			errs = append(errs, config.Errf("astdb.name", "%q is also a tree's name", c.AstDB.Name))
		}
		if len(c.AstDB.Families) == 0 {
			c.AstDB.Families = []string{"registrar"}
		}
		for _, f := range c.AstDB.Families {
			if f == "" || strings.ContainsAny(f, "/ ") {
				errs = append(errs, config.Errf("astdb.families", "bad family %q", f))
			}
		}
		if c.AstDB.Interval == 0 {
			c.AstDB.Interval = config.Duration(time.Second)
		}
		if c.AstDB.ReconcileInterval == 0 {
			c.AstDB.ReconcileInterval = config.Duration(time.Minute)
		}
		if c.AstDB.EventBuffer == 0 {
			c.AstDB.EventBuffer = 8192
		}
		if c.AstDB.AMI.Address == "" || c.AstDB.AMI.Username == "" || c.AstDB.AMI.Secret == "" {
			errs = append(errs, config.Errf("astdb.ami", "address, username and secret are required"))
		}
	}
	errs = append(errs, c.validateCalls())
	return config.Join(errs...)
}

// validateCalls fills the recorder's defaults: on with an AMI login, the
// registrations' login unless it has its own.
func (c *Config) validateCalls() error {
	k := &c.Calls
	if k.AMI == (AMIConfig{}) && c.AstDB.Enabled {
		k.AMI = AMIConfig(c.AstDB.AMI)
	}
	if k.Enabled == nil {
		on := k.AMI.Address != ""
		k.Enabled = &on
	}
	if !*k.Enabled {
		return nil
	}
	if k.ReconcileInterval == 0 {
		k.ReconcileInterval = config.Duration(calls.DefaultReconcile)
	}
	if k.SummaryInterval == 0 {
		k.SummaryInterval = config.Duration(calls.DefaultSummaryEvery)
	}
	if k.EventBuffer == 0 {
		k.EventBuffer = 8192
	}
	if k.OrphanGrace == 0 {
		k.OrphanGrace = config.Duration(calls.DefaultOrphanGrace)
	}
	if k.AMI.Address == "" || k.AMI.Username == "" || k.AMI.Secret == "" {
		return config.Errf("calls.ami", "address, username and secret are required (or astdb.ami, which it defaults to)")
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
	if err := daemon.LoadConfig(o, &cfg); err != nil {
		return nil, err
	}
	return New(cfg, o.Logger, o.Version), nil
}

// checkDirs requires every tree to exist (unless create: true makes it),
// so -check-config (the unit's ExecStartPre) names a mistyped path before
// the service starts. The state directory is made by the service itself.
// Only here, not in Validate: a configuration is also validated where these
// paths are not the host's (tests, fanctl replay).
func (c *Config) checkDirs() error {
	var errs []error
	for i, t := range c.Trees {
		if !t.Create {
			errs = append(errs, config.DirExists(fmt.Sprintf("trees[%d].path", i), t.Path))
		}
	}
	return config.Join(errs...)
}

// CheckHost checks what the file names on this host (config.HostChecker):
// the bus's files and http_listen (daemon.Common) and the trees.
func (c *Config) CheckHost() error {
	return config.Join(c.Common.CheckHost(), c.checkDirs())
}

// New makes a service from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) *Service {
	return &Service{cfg: cfg, log: daemon.ServiceLogger(log, cfg.Node), version: version}
}

// Run joins the bus, opens (creating when missing, and waiting while they
// cannot be opened) the object stores, and replicates until ctx ends.
func (s *Service) Run(ctx context.Context) error {
	return daemon.Serve(ctx, s.cfg.Common, "replicator", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		st, err := store.Wait(ctx, rt.Bus.JS, s.cfg.Bus.Replicas, s.log)
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
		if *s.cfg.DirectTransfer {
			ecfg.StorePassBytes = int64(s.cfg.StorePassMiB) << 20
		}
		for _, t := range s.cfg.Trees {
			ex, _ := fstree.NewExcluder(t.Exclude)
			if t.Create {
				if err := os.MkdirAll(t.Path, 0o755); err != nil {
					return fmt.Errorf("replicator: create tree %s: %w", t.Path, err)
				}
			}
			ecfg.Trees = append(ecfg.Trees, replicate.Tree{Name: t.Name, Root: t.Path, Exclude: ex,
				Policy: replicate.Policy{AllowOutsideSymlinks: t.AllowOutsideSymlinks,
					PreserveOwner: t.PreserveOwner, PreserveSpecialBits: t.PreserveSpecialBits}})
		}
		if s.cfg.AstDB.Enabled {
			// The session follows ContactStatus events (system class) as
			// they happen, and keeps its connection up to do so.
			sess := ami.NewSession(ami.Config{Addr: s.cfg.AstDB.AMI.Address, Username: s.cfg.AstDB.AMI.Username,
				Secret: s.cfg.AstDB.AMI.Secret, Events: true, EventMask: "system",
				EventNames: []string{astdb.ContactStatusEvent}, EventBuffer: s.cfg.AstDB.EventBuffer},
				s.log.With("component", "ami"))
			defer sess.Close()
			ecfg.Trees = append(ecfg.Trees, replicate.Tree{Name: s.cfg.AstDB.Name, AMI: sess, Watch: sess,
				Families: s.cfg.AstDB.Families, Poll: s.cfg.AstDB.Interval.D(),
				Reconcile: s.cfg.AstDB.ReconcileInterval.D()})
		}
		ecfg.Outbox = rt.Outbox
		eng, err := replicate.New(ecfg, rt.Bus, st, rt.Metrics, s.log)
		if err != nil {
			return fmt.Errorf("replicator: %w", err)
		}
		// The engine (it stops its trees' workers itself) and the
		// recorder of calls: each stops at its turn (daemon.Group), then
		// Serve stores the last reports (the outbox) and closes the bus.
		g, _ := daemon.NewGroup(ctx)
		if *s.cfg.Calls.Enabled {
			k := s.cfg.Calls
			// A session of its own: the call events have a queue apart
			// from the registrations', and Getvar reads never wait
			// behind a registration's DBGet.
			sess := ami.NewSession(ami.Config{Addr: k.AMI.Address, Username: k.AMI.Username, Secret: k.AMI.Secret,
				Events: true, EventMask: calls.EventMask, EventNames: calls.EventNames(), EventBuffer: k.EventBuffer},
				s.log.With("component", "ami-calls"))
			defer sess.Close()
			rec := calls.New(calls.Config{Cluster: s.cfg.Cluster, Group: s.cfg.Group, Node: s.cfg.Node, AMI: sess, Events: sess,
				Reconcile: k.ReconcileInterval.D(), SummaryEvery: k.SummaryInterval.D(), OrphanGrace: k.OrphanGrace.D(),
				Publish: func(sum events.CallsSummary) {
					// A summary still waiting for the bus is superseded by
					// the next one.
					if _, err := rt.Outbox.Post("calls-summary", sum); err != nil && ctx.Err() == nil {
						s.log.Warn("publish calls summary failed", "err", err)
					}
				}}, rt.Bus, rt.Metrics, s.log)
			g.Go("calls", rec.Run)
		}
		g.Go("engine", eng.Run)
		return g.Wait()
	})
}
