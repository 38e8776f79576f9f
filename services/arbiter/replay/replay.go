// Package replay is the arbiter's door for tools that check its decisions
// after the fact (fanctl replay): it runs a stretch of the audit stream
// through the arbiter's own decision core, under an arbiter configuration
// file, and compares each decision with the one recorded. The core stays
// internal to the arbiter; this package exports only the replay of it.
// How faithful a replay is, and where it cannot be, is described in the
// arbiter's README ("Replay").
package replay

import (
	"github.com/fanpbx/fan/services/arbiter/internal/app"
	"github.com/fanpbx/fan/services/arbiter/internal/decide"
	"github.com/fanpbx/fan/services/arbiter/internal/replay"
)

type (
	// Record is one stored event, decoded.
	Record = replay.Record
	// Report is the outcome: one Row per decision.
	Report = replay.Report
	// Row is a recorded decision beside the replayed one.
	Row = replay.Row
	// Decision is a decision with its envelope's facts.
	Decision = replay.Decision
	// Options tune the comparison.
	Options = replay.Options
)

// ErrNoStart is returned when the events given hold neither an arbiter
// start nor a term start: the core's state at their beginning is unknown.
var ErrNoStart = replay.ErrNoStart

// Config is an arbiter configuration, as its decision core takes it.
type Config struct{ core decide.Config }

// LoadConfig reads an arbiter configuration file, refusing what the
// arbiter refuses.
func LoadConfig(path string) (Config, error) {
	c, err := app.DecisionConfig(path)
	return Config{core: c}, err
}

// Cluster is the cluster the configuration serves: the replay reads its events.
func (c Config) Cluster() string { return c.core.Cluster }

// Run replays trail, the cluster's stored events in stream order.
func Run(c Config, trail []Record, o Options) (Report, error) {
	return replay.Run(c.core, trail, o)
}
