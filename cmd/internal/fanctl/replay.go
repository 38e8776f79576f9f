package fanctl

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/services/arbiter/replay"
)

// errDiffers: the replay found decisions that differ from the recorded ones.
var errDiffers = errors.New("replay: decisions differ")

// runReplay reads the audit stream and replays it through the arbiter's
// decision core under an arbiter configuration file.
func runReplay(inv *invocation, args []string) error {
	cluster, stdout := inv.cluster, inv.stdout
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	cfgPath := fs.String("arbiter-config", "", "the arbiter's configuration file: the policy the decisions are replayed under (required)")
	since := fs.String("since", "24h", "read from this long ago (10m) or this time (RFC 3339); 'all' from the beginning; the replay starts at the first arbiter start or term start in what is read")
	until := fs.String("until", "", "stop reading at this time (RFC 3339)")
	tolerance := fs.Duration("tolerance", time.Second, "how far a time quoted in a reason may be off (an input's arrival is not recorded)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *cfgPath == "" {
		return usagef("--arbiter-config FILE is required: the policy the decisions are replayed under")
	}
	cfg, err := replay.LoadConfig(*cfgPath)
	if err != nil {
		return err
	}
	if cluster != "" && cluster != cfg.Cluster() {
		return fmt.Errorf("--cluster %s, but %s configures an arbiter of cluster %s", cluster, *cfgPath, cfg.Cluster())
	}
	from := time.Unix(0, 0)
	if *since != "all" {
		if from, err = parseSince(*since, time.Now()); err != nil {
			return err
		}
	}
	var end time.Time
	if *until != "" {
		if end, err = time.Parse(time.RFC3339, *until); err != nil {
			return usagef("--until %q: want an RFC 3339 time", *until)
		}
	}
	b, err := inv.connect(bus.EventsStream, bus.LiveStream)
	if err != nil {
		return err
	}
	defer b.Close()
	trail, err := view.ReadTrail(inv.bounded, b, cfg.Cluster(), from)
	if err != nil {
		return err
	}
	recs := make([]replay.Record, 0, len(trail))
	for _, e := range trail {
		if !end.IsZero() && e.Env.Time.After(end) {
			break
		}
		recs = append(recs, replay.Record{Env: e.Env, Payload: e.P, Stored: e.Stored})
	}
	rep, err := replay.Run(cfg, recs, replay.Options{Tolerance: *tolerance})
	if err != nil {
		return err
	}
	if err := rep.Print(stdout); err != nil {
		return err
	}
	if rep.Differ > 0 {
		return fmt.Errorf("%w: %d of %d", errDiffers, rep.Differ, len(rep.Rows))
	}
	return nil
}
