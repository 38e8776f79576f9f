// Package dnsexec is the DNS executor (executor: dns): under the command
// contract (package execute) it moves one DNS name between sites, each an
// arbiter node, by signed dynamic UPDATEs: to the name's primary, verified
// on every authoritative server (dns.primary), or to one primary per site,
// each updated, verified and kept in line on its own (dns.primaries,
// primaries.go).
package dnsexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/dnsupdate"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
	"github.com/fanpbx/fan/services/ipmover/internal/fence"
)

// Step names of the DNS executor's results (named in events).
const (
	StepDNSAccepted      = events.StepDNSUpdateAccepted
	StepDNSVerified      = events.StepDNSVerified // suffixed with ":<server>", one per authoritative server
	StepDNSAlreadyServed = events.StepDNSAlreadyServed
	StepDNSReleaseNoop   = events.StepDNSReleaseNoop
)

// Config is the DNS executor's configuration: the keys of the ipmover's
// file that belong to it, and no other.
type Config struct {
	daemon.Common `yaml:",inline"`
	// StateFile persists the highest epoch seen and the applied command
	// ids, so a restart never re-applies an old command.
	StateFile string    `yaml:"state_file"`
	DNS       DNSConfig `yaml:"dns"`
}

// Validate checks the file after loading, reporting every key that is
// wrong.
func (c *Config) Validate() error {
	bounds := c.DNS.validateBounds()
	errs := []error{c.Common.Validate(), bounds}
	if c.StateFile == "" {
		errs = append(errs, config.Errf("state_file", "required (it keeps commands at most once across restarts)"))
	}
	return config.Join(append(errs, c.DNS.validate(bounds == nil))...)
}

// CheckHost checks what the file names on this host (config.HostChecker):
// the bus's files and http_listen (daemon.Common) and the directory the
// state file is written in.
func (c *Config) CheckHost() error {
	return config.Join(c.Common.CheckHost(), config.ParentDirExists("state_file", c.StateFile))
}

// DNSConfig moves one DNS name between sites. Each site is a
// node of an arbiter group (whose health comes from an observer's quorum
// group, arbiter health_from); the executor consumes the commands of every
// site in Sites.
type DNSConfig struct {
	// Group is the arbiter group whose claims move the name.
	Group            string `yaml:"group"`
	dnsupdate.Config `yaml:",inline"`
	// Resync, with Primaries, is how often every primary is read and one
	// that serves another site's records than the last claim's is brought
	// in line (default 1s).
	Resync time.Duration `yaml:"resync"`
}

// validate checks the section; the updater's own checks (which repeat the
// bounds' for a value out of range) only when the bounds passed.
func (d *DNSConfig) validate(boundsOK bool) error {
	var errs []error
	if err := events.ValidToken("group", d.Group); err != nil {
		errs = append(errs, &config.FieldError{Key: "dns.group", Err: err})
	}
	for _, site := range slices.Sorted(maps.Keys(d.Sites)) {
		if err := events.ValidToken("site", site); err != nil {
			errs = append(errs, &config.FieldError{Key: "dns.sites", Err: fmt.Errorf("a site is an arbiter node name: %w", err)})
		}
	}
	if d.Resync != 0 && len(d.Primaries) == 0 {
		// A key that does nothing is refused: its writer believes the
		// name is kept in line by it.
		errs = append(errs, config.Errf("dns.resync", "only with dns.primaries (one primary per site); one primary is kept by its own zone transfers"))
	}
	if boundsOK {
		if _, err := dnsupdate.New(d.Config, slog.New(slog.DiscardHandler)); err != nil {
			errs = append(errs, &config.FieldError{Key: "dns", Err: err})
		}
	}
	return config.Join(errs...)
}

// dnsExecutor carries out the arbiter's commands for the sites of one DNS
// name. A claim on a site swaps the records to that site's in one signed
// UPDATE whose prerequisite is that the previous site's records are still
// there, then verifies on every authoritative server. A release does
// nothing: the claim on the other site replaces the records in the same
// message, so no resolver ever sees an empty answer in between.
type dnsExecutor struct {
	group string
	log   *slog.Logger
	fence *fence.Store
	up    *dnsupdate.Updater
	sites map[string]dnsupdate.Values
}

func newDNSExecutor(cfg Config, log *slog.Logger) (*dnsExecutor, error) {
	f, err := fence.Open(cfg.StateFile, fence.DefaultKeep)
	if err != nil {
		return nil, fmt.Errorf("ipmover state: %w", err)
	}
	up, err := dnsupdate.New(cfg.DNS.Config, log)
	if err != nil {
		return nil, err
	}
	return &dnsExecutor{group: cfg.DNS.Group, log: log, fence: f, up: up, sites: cfg.DNS.Sites}, nil
}

// Service is a configured DNS executor.
type Service struct {
	cfg     Config
	log     *slog.Logger
	version string
}

// New builds a DNS executor from a validated configuration.
func New(cfg Config, log *slog.Logger, version string) *Service {
	return &Service{cfg: cfg, log: daemon.ServiceLogger(log, cfg.Node), version: version}
}

// Run executes the sites' commands until ctx ends. The run group's one
// actor is the command consumer: it stops taking commands and finishes the
// one in hand; Serve then stores the last results and closes the bus.
// Nothing is released on stop: the name stays where the arbiter last put it.
func (s *Service) Run(ctx context.Context) error {
	if len(s.cfg.DNS.Primaries) > 0 {
		return s.runPrimaries(ctx)
	}
	x, err := newDNSExecutor(s.cfg, s.log)
	if err != nil {
		return err
	}
	sites := slices.Sorted(maps.Keys(s.cfg.DNS.Sites))
	return daemon.Serve(ctx, s.cfg.Common, "ipmover", s.version, s.log, func(ctx context.Context, rt *daemon.Runtime) error {
		// One contract for every site: the sites' consumers share the
		// fencing state and the name, and it handles one command at a time.
		contract, err := execute.Open(ctx, rt, execute.Config{Fence: x.fence, Executor: x, Logger: x.log})
		if err != nil {
			return err
		}
		if v, serial, err := x.up.Current(ctx); err != nil {
			s.log.Warn("dns executor: cannot read the name at start", "err", err)
		} else {
			site, _ := x.up.SiteOf(v)
			s.log.Info("dns executor ready", "group", x.group, "sites", sites, "serving", v.String(), "site", site, "serial", serial)
		}
		g, _ := daemon.NewGroup(ctx)
		g.Go("commands", func(ctx context.Context) error { return contract.Consume(ctx, rt.Bus, sites...) })
		return g.Wait()
	})
}

// Admit implements execute.Executor: only this name's group, only its sites.
func (x *dnsExecutor) Admit(cmd events.Command) ([]string, error) {
	return admit(cmd, x.group, x.sites)
}

// admit is both modes' Admit.
func admit(cmd events.Command, group string, sites map[string]dnsupdate.Values) ([]string, error) {
	g, node := cmd.Target()
	if g != group {
		return nil, fmt.Errorf("group %s is not moved by this dns executor (it serves %s): %w", g, group, execute.ErrNotAllowed)
	}
	if _, ok := sites[node]; !ok {
		return nil, fmt.Errorf("site %s is not one of this dns executor's sites: %w", node, execute.ErrNotAllowed)
	}
	return nil, nil
}

// Apply implements execute.Executor.
func (x *dnsExecutor) Apply(ctx context.Context, _ events.Envelope, cmd events.Command, tl *execute.Timeline) error {
	at := tl.At
	switch c := cmd.(type) {
	case *events.ClaimIP:
		if c.Group != x.group {
			return fmt.Errorf("group %s is not moved by this dns executor (it serves %s)", c.Group, x.group)
		}
		return x.claim(ctx, c, at)
	case *events.ReleaseIP:
		// The claim on the site that takes over swaps the records in one
		// message; removing them here would leave the name empty, and
		// resolvers would cache that (RFC 2308).
		at(StepDNSReleaseNoop, time.Now())
		return nil
	default:
		return fmt.Errorf("unsupported command %T for the dns executor", cmd)
	}
}

// claim points the name at c.Node's records. The swap's prerequisite is the
// records of the site the name is moving from: the previous holder the
// arbiter names, or else what the primary serves now, if that is a
// configured site. Records that match no site were put there by someone
// else, and are reported, never overwritten.
func (x *dnsExecutor) claim(ctx context.Context, c *events.ClaimIP, at func(string, time.Time)) error {
	to := c.Node
	from := c.PreviousHolder
	if from == "" || from == to || !x.hasSite(from) {
		cur, serial, err := x.up.Current(ctx)
		if err != nil {
			return fmt.Errorf("claim %s: %w", to, err)
		}
		site, ok := x.up.SiteOf(cur)
		switch {
		case !ok:
			return fmt.Errorf("claim %s: the primary serves %s at serial %d, which is no configured site: not overwriting what someone else wrote",
				to, cur, serial)
		case site == to:
			at(StepDNSAlreadyServed, time.Now())
			return nil
		}
		from = site
	}
	res, err := x.up.Swap(ctx, dnsupdate.Spec{From: from, To: to})
	if !res.Sent.IsZero() && (err == nil || errors.Is(err, dnsupdate.ErrUnverified)) {
		at(StepDNSAccepted, res.Sent.Add(res.UpdateRTT))
		for _, sv := range res.Servers {
			if sv.Verified {
				at(events.StepOn(StepDNSVerified, sv.Server), res.Sent.Add(sv.Elapsed))
			}
		}
	}
	var stale *dnsupdate.StaleError
	if errors.As(err, &stale) && stale.AlreadyApplied {
		// The same move was made before (a redelivery after a crash, or
		// another executor): the name already points here.
		at(StepDNSAlreadyServed, time.Now())
		return nil
	}
	if err != nil {
		return fmt.Errorf("claim %s (from %s): %w", to, from, err)
	}
	return nil
}

func (x *dnsExecutor) hasSite(n string) bool {
	_, ok := x.sites[n]
	return ok
}
