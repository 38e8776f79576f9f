package fanctl

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

func runExplain(inv *invocation, args []string) error {
	stdout := inv.stdout
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	lookback := fs.Duration("lookback", 24*time.Hour, "how far before the event to look for its causes")
	asJSON := fs.Bool("json", false, "print the chain as JSON: each link's depth and event envelope")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if err := wantArgs(pos, "EVENT_ID"); err != nil {
		return err
	}
	id := pos[0]
	if _, err := view.IDTime(id); err != nil {
		return usagef("EVENT_ID: %v", err)
	}
	// The trail: the audit stream, and the live stream for the heartbeats
	// a decision cites.
	b, err := inv.connect(bus.EventsStream, bus.LiveStream)
	if err != nil {
		return err
	}
	defer b.Close()
	chain, err := view.Explain(inv.bounded, b, inv.cluster, id, *lookback)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(chain)
	}
	return printChain(stdout, chain)
}

func printChain(w io.Writer, chain []view.Link) error {
	var calls *view.CallsOutcome
	for i, l := range chain {
		ind := strings.Repeat("  ", l.Depth)
		if l.Consequence {
			if i == 0 || !chain[i-1].Consequence {
				fmt.Fprintf(w, "what followed (the claim's result and the adoption of the calls, looked for up to %s after the decision):\n", view.OutcomeWithin)
			}
			ind = "  => "
		}
		switch {
		case l.Event == nil:
			fmt.Fprintf(w, "%s? %s (not in the trail read: live state (a heartbeat or probe result) older than the live stream keeps, "+
				"whose transition and its evidence are shown beside or above it; otherwise try a longer --lookback)\n", ind, l.ID)
			continue
		case l.Repeat:
			fmt.Fprintf(w, "%s^ %s %s (shown above)\n", ind, l.Event.Type, l.ID)
			continue
		}
		e := l.Event
		line := fmt.Sprintf("%s%s %s %s@%s %s", ind, stamp(e.Time), e.Type, e.Source.Service, e.Source.Node, view.Summary(l.Payload()))
		if e.Epoch != 0 {
			line += fmt.Sprintf(" epoch=%d", e.Epoch)
		}
		if _, err := fmt.Fprintf(w, "%s id=%s\n", line, l.ID); err != nil {
			return err
		}
		if l.Calls != nil && calls == nil {
			calls = l.Calls
		}
		// The probe results are carried in the transition itself.
		if v, ok := l.Payload().(*events.HealthTransition); ok {
			for _, ev := range v.Evidence {
				res := "ok"
				if !ev.OK {
					res = fmt.Sprintf("FAIL %s (%s)", ev.Error, ev.ErrorClass)
				}
				fmt.Fprintf(w, "%s  probe %s %s %s in %.1fms\n", ind, stamp(ev.At), v.Check, res, ev.DurationMS)
			}
		}
	}
	// What the move did to the calls, once its consequences are shown.
	if calls != nil {
		if _, err := fmt.Fprintln(w, calls.String()); err != nil {
			return err
		}
	}
	return nil
}

func runWindows(inv *invocation, args []string) error {
	stdout := inv.stdout
	fs := flag.NewFlagSet("windows", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the raw plans as a JSON array ([] when none is published)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	plans, err := readRecords[events.SchedulePlan](inv, view.ScheduleFilter(inv.cluster))
	if err != nil {
		return err
	}
	sort.Slice(plans, func(i, j int) bool { return plans[i].Cluster < plans[j].Cluster })
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(plans)
	}
	if len(plans) == 0 {
		fmt.Fprintln(stdout, "no failback windows published: no scheduler is running, so nothing fails back automatically")
		return nil
	}
	return PrintWindows(stdout, plans, time.Now())
}

// PrintWindows renders scheduler plans: the open window and the next ones,
// with absolute times in each window's zone and how far away they are.
func PrintWindows(w io.Writer, plans []events.SchedulePlan, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tGROUP\tWINDOW\tSTATE\tSTART\tEND\tZONE")
	const layout = "Mon 2006-01-02 15:04 -07:00"
	for _, p := range plans {
		for _, g := range p.Groups {
			if g.Open == nil && len(g.Windows) == 0 {
				fmt.Fprintf(tw, "%s\t%s\t-\tno window: never fails back automatically\t-\t-\t-\n", p.Cluster, g.Group)
			}
			row := func(pw events.PlannedWindow, state string) {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Cluster, g.Group, pw.Window, state,
					inZone(pw.Start, pw.TimeZone).Format(layout), inZone(pw.End, pw.TimeZone).Format(layout), pw.TimeZone)
			}
			if g.Open != nil {
				row(*g.Open, "open, closes in "+view.HumanDuration(g.Open.End.Sub(now)))
			}
			for _, pw := range g.Windows {
				row(pw, "opens in "+view.HumanDuration(pw.Start.Sub(now)))
			}
		}
		fmt.Fprintf(tw, "\n(plan written %s ago by %s)\n", view.HumanDuration(now.Sub(p.UpdatedAt)), p.UpdatedBy)
	}
	return tw.Flush()
}

// inZone shows t in the window's own zone when this host knows it.
func inZone(t time.Time, zone string) time.Time {
	if loc, err := time.LoadLocation(zone); err == nil && zone != "" {
		return t.In(loc)
	}
	return t
}
