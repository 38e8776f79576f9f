package app

import (
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/services/replicator/internal/calls"
)

// Ranges of the replicator's timing and count keys (README
// "Configuration"); zero means the default, which lies inside the range.
// Where a tree may live is checked with the trees themselves.
const (
	maxTrees    = 64
	maxFamilies = 64
	maxExcludes = 1024
)

func (c *Config) validateBounds() error {
	errs := []error{
		config.DurationOrZero("debounce", c.Debounce.D(), time.Millisecond, 10*time.Second),
		config.DurationOrZero("scan_interval", c.ScanInterval.D(), time.Second, 24*time.Hour),
		config.DurationOrZero("gc_interval", c.GCInterval.D(), time.Minute, 7*24*time.Hour),
		config.DurationOrZero("gc_grace", c.GCGrace.D(), time.Minute, 30*24*time.Hour),
		config.DurationOrZero("astdb.interval", c.AstDB.Interval.D(), 100*time.Millisecond, time.Hour),
		config.DurationOrZero("astdb.reconcile_interval", c.AstDB.ReconcileInterval.D(), 5*time.Second, time.Hour),
		config.IntIn("astdb.event_buffer", c.AstDB.EventBuffer, 0, 1<<20),
		config.DurationOrZero("calls.reconcile_interval", c.Calls.ReconcileInterval.D(), 5*time.Second, time.Hour),
		config.DurationOrZero("calls.summary_interval", c.Calls.SummaryInterval.D(), 100*time.Millisecond, time.Minute),
		config.IntIn("calls.event_buffer", c.Calls.EventBuffer, 0, 1<<20),
		config.DurationOrZero("calls.orphan_grace", c.Calls.OrphanGrace.D(), calls.MinOrphanGrace, calls.MaxOrphanGrace),
		config.CountIn("trees", len(c.Trees), 0, maxTrees),
		config.CountIn("astdb.families", len(c.AstDB.Families), 0, maxFamilies),
		config.IntIn("store_pass_mib", c.StorePassMiB, 0, 1<<20),
	}
	if c.Safety.AllowDeletes != nil {
		errs = append(errs, config.IntIn("safety.allow_deletes", *c.Safety.AllowDeletes, 0, 1_000_000))
	}
	for _, t := range c.Trees {
		errs = append(errs, config.CountIn("trees["+t.Name+"].exclude", len(t.Exclude), 0, maxExcludes))
	}
	if c.AstDB.AMI.Address != "" {
		errs = append(errs, config.HostPort("astdb.ami.address", c.AstDB.AMI.Address, false))
	}
	if c.Calls.AMI.Address != "" && c.Calls.AMI.Address != c.AstDB.AMI.Address {
		errs = append(errs, config.HostPort("calls.ami.address", c.Calls.AMI.Address, false))
	}
	return config.Join(errs...)
}
