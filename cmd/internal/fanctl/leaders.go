package fanctl

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go/jetstream"
)

func init() {
	registerCommand(commandSpec{Name: "leaders", Section: sectionActions,
		Synopsis: "[--json]\n" +
			"hold (--for D | --until TIME) [--to SERVER] [--reason TEXT] [--as COMMENT] [--json]\n" +
			"release [--reason TEXT] [--as COMMENT] [--json]",
		Summary: "where the raft leaders are, and the operator's hold on them (hold: the steward moves them only onto --to, a standby keeps the lease; release ends it)",
		Examples: []string{"fanctl leaders",
			"fanctl leaders hold --for 30m --to nats-pbx-b --reason \"witness reboot\"",
			"fanctl leaders release --reason \"witness back\""},
		Args: []argSpec{{Name: "hold|release", Words: []string{"hold", "release"}}},
		More: func() string {
			return wrap(fmt.Sprintf("A hold lasts at most %v and always ends by itself; the steward ends it sooner only when keeping it "+
				"would cost a failover (services/arbiter/README.md, \"Where the raft leaders live\"). "+
				"--until takes an RFC 3339 time (seconds optional) or HH:MM, the next such time here.", events.MaxLeadersHold), "") +
				"--json prints the hold record and the stream leaders as one object (without hold|release).\n"
		}})
}

// lifetimeFlags end what a request starts: a switchover's pin, a hold.
type lifetimeFlags struct {
	forD  *time.Duration
	until *string
}

func addLifetimeFlags(fs *flag.FlagSet, forHelp, untilHelp string) lifetimeFlags {
	return lifetimeFlags{
		forD:  fs.Duration("for", 0, forHelp),
		until: fs.String("until", "", untilHelp+" (RFC 3339, seconds optional: 2026-12-08T06:00Z; or HH:MM, the next such time here)"),
	}
}

func (l lifetimeFlags) given() bool { return *l.forD != 0 || *l.until != "" }

// apply puts the lifetime into req, checked against [lo, hi] from now.
func (l lifetimeFlags) apply(req *events.OperatorRequest, now time.Time, lo, hi time.Duration) error {
	switch {
	case *l.forD != 0 && *l.until != "":
		return usagef("--for and --until: one end, please")
	case *l.forD != 0:
		if *l.forD < lo || *l.forD > hi {
			return usagef("--for %v: want between %v and %v", *l.forD, lo, hi)
		}
		req.ForMS = l.forD.Milliseconds()
	case *l.until != "":
		t, err := parseUntil(*l.until, now)
		if err != nil {
			return err
		}
		if d := t.Sub(now); d < lo || d > hi {
			return usagef("--until %s is %s from now: want between %v and %v", *l.until, view.HumanDuration(d), lo, hi)
		}
		req.Until = t.UTC()
	}
	return nil
}

// parseUntil reads an end: an RFC 3339 time, with or without seconds, or
// HH:MM, the next such time in the local zone (at 02:10, 06:00 is today's;
// at 07:00, tomorrow's).
func parseUntil(s string, now time.Time) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04Z07:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	if hm, err := time.ParseInLocation("15:04", s, now.Location()); err == nil {
		t := time.Date(now.Year(), now.Month(), now.Day(), hm.Hour(), hm.Minute(), 0, 0, now.Location())
		if !t.After(now) {
			t = t.AddDate(0, 0, 1)
		}
		return t, nil
	}
	return time.Time{}, usagef("--until %q: want an RFC 3339 time (2026-12-08T06:00Z) or HH:MM", s)
}

// leadersShown is what fanctl leaders prints.
type leadersShown struct {
	Hold    *events.LeadersHoldRecord `json:"hold,omitempty"`
	InForce bool                      `json:"in_force"`
	Streams []streamLeader            `json:"streams"`
}

type streamLeader struct {
	Stream   string   `json:"stream"`
	Leader   string   `json:"leader,omitempty"`
	Replicas []string `json:"replicas,omitempty"`
	Error    string   `json:"error,omitempty"`
}

// leaderStreams are the streams an operator's credentials may read the
// leader of (stream info); the steward keeps the consumers on them, the
// object stores and the meta group alike.
var leaderStreams = []string{events.CommandsStream, events.EventsStream, events.LiveStream, events.KVStreamName(events.StateBucket)}

func runLeaders(inv *invocation, args []string) error {
	fs := flag.NewFlagSet("leaders", flag.ContinueOnError)
	o := addOperatorFlags(fs, false)
	to := fs.String("to", "", "hold: the NATS server (server_name) to keep the leaders on meanwhile; without it they stay where they are")
	l := addLifetimeFlags(fs, fmt.Sprintf("hold: this long (%v..%v)", events.MinLeadersHold, events.MaxLeadersHold), "hold: until this time")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		if *to != "" || l.given() || *o.reason != "" || *o.as != "" {
			return usagef("--to, --for, --until, --reason and --as go with hold or release")
		}
		return showLeaders(inv, *o.json)
	}
	if pos[0] != "hold" && pos[0] != "release" {
		return usagef("%q: want hold or release (or nothing, to show the leaders)", pos[0])
	}
	if err := wantArgs(pos, "hold|release"); err != nil {
		return err
	}
	req := events.OperatorRequest{Verb: events.OpLeadersRelease, Reason: *o.reason, Comment: *o.as}
	if pos[0] == "hold" {
		if !l.given() {
			return usagef("hold needs --for D or --until TIME (at most %v: a hold always ends by itself)", events.MaxLeadersHold)
		}
		req.Verb, req.Server = events.OpLeadersHold, *to
		if err := l.apply(&req, time.Now(), events.MinLeadersHold, events.MaxLeadersHold); err != nil {
			return err
		}
	} else if *to != "" || l.given() {
		return usagef("release takes no --to, --for or --until")
	}
	return sendOperatorRequest(inv, req, o, "")
}

func showLeaders(inv *invocation, asJSON bool) error {
	if inv.cluster == "" {
		return usagef("--cluster (or FAN_CLUSTER) is required: a leaders hold is one cluster's")
	}
	b, err := inv.connect(bus.StateBucket)
	if err != nil {
		return err
	}
	defer b.Close()
	var shown leadersShown
	recs, err := view.Records[events.LeadersHoldRecord](inv.bounded, b, events.LeadersHoldKey(inv.cluster))
	if err != nil {
		return err
	}
	now := time.Now()
	if len(recs) > 0 {
		r := recs[0].Value
		shown.Hold, shown.InForce = &r, r.InForce(now)
	}
	for _, name := range leaderStreams {
		sl := streamLeader{Stream: name}
		st, err := b.JS.Stream(inv.bounded, name)
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			continue
		case err != nil:
			sl.Error = err.Error()
		default:
			if ci := st.CachedInfo().Cluster; ci != nil {
				sl.Leader = ci.Leader
				for _, p := range ci.Replicas {
					if p == nil {
						continue
					}
					state := "current"
					switch {
					case p.Offline:
						state = "offline"
					case !p.Current:
						state = "behind"
					}
					sl.Replicas = append(sl.Replicas, p.Name+" ("+state+")")
				}
			}
		}
		shown.Streams = append(shown.Streams, sl)
	}
	if asJSON {
		enc := json.NewEncoder(inv.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(shown)
	}
	w := tabwriter.NewWriter(inv.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, view.HoldNote(shown.Hold, now))
	fmt.Fprintln(w)
	fmt.Fprintln(w, "STREAM\tLEADER\tOTHER REPLICAS")
	for _, s := range shown.Streams {
		leader := view.OrNone(s.Leader)
		if s.Error != "" {
			leader = "? (" + s.Error + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", s.Stream, leader, strings.Join(s.Replicas, ", "))
	}
	return w.Flush()
}
