package fanctl

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

type trailEntry struct {
	env events.Envelope
	p   events.Payload
}

// readTrail reads the audit stream (events and the copies of commands)
// from since up to its last message at the time of the call.
func readTrail(ctx context.Context, b *bus.Bus, cluster string, since time.Time) ([]trailEntry, error) {
	st, err := b.JS.Stream(ctx, bus.EventsStream)
	if err != nil {
		return nil, fmt.Errorf("events stream: %w", err)
	}
	last := st.CachedInfo().State.LastSeq
	if last == 0 {
		return nil, nil
	}
	subjects := []string{events.ClusterEvents(cluster), events.ClusterCommands(cluster)}
	if cluster == "" {
		subjects = []string{events.AllEvents(), events.AllCommands()}
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out []trailEntry
	seen := make(chan struct{}, 1)
	go func() {
		// Filtered subjects may never reach the last sequence: stop once quiet.
		for {
			select {
			case <-seen:
			case <-time.After(time.Second):
				cancel()
				return
			case <-wctx.Done():
				return
			}
		}
	}()
	err = b.Watch(wctx, bus.WatchOptions{Subjects: subjects, Since: since}, func(env events.Envelope, p events.Payload, seq uint64) {
		select {
		case seen <- struct{}{}:
		default:
		}
		out = append(out, trailEntry{env, p})
		if seq >= last {
			cancel()
		}
	})
	if err != nil && ctx.Err() == nil {
		return nil, err
	}
	return out, nil
}

// idTime reads the millisecond timestamp of a UUID v7.
func idTime(id string) (time.Time, error) {
	raw, err := hex.DecodeString(strings.ReplaceAll(id, "-", ""))
	if err != nil || len(raw) != 16 || raw[6]>>4 != 7 {
		return time.Time{}, fmt.Errorf("%q is not an event id (a UUID v7)", id)
	}
	var ms int64
	for _, c := range raw[:6] {
		ms = ms<<8 | int64(c)
	}
	return time.UnixMilli(ms), nil
}

func runExplain(ctx context.Context, args []string, cluster string, connect connector, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	lookback := fs.Duration("lookback", 24*time.Hour, "how far before the event to look for its causes")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return errors.New("usage: fanctl explain EVENT_ID [--lookback 24h]")
	}
	id := pos[0]
	at, err := idTime(id)
	if err != nil {
		return err
	}
	b, err := connect()
	if err != nil {
		return err
	}
	defer b.Close()
	trail, err := readTrail(ctx, b, cluster, at.Add(-*lookback))
	if err != nil {
		return err
	}
	return Explain(stdout, trail, id)
}

// Explain prints the causal chain of one event back to the probe results
// that started it: each line's indented children are its causes.
func Explain(w io.Writer, trail []trailEntry, id string) error {
	byID := make(map[string]trailEntry, len(trail))
	for _, e := range trail {
		byID[e.env.ID] = e
	}
	if _, ok := byID[id]; !ok {
		return fmt.Errorf("event %s is not in the trail (wrong cluster, or older than the stream keeps)", id)
	}
	printed := map[string]bool{}
	var walk func(id string, depth int)
	walk = func(id string, depth int) {
		ind := strings.Repeat("  ", depth)
		e, ok := byID[id]
		if !ok {
			fmt.Fprintf(w, "%s? %s (not in the trail read; try a longer --lookback)\n", ind, id)
			return
		}
		if printed[id] {
			fmt.Fprintf(w, "%s^ %s %s (shown above)\n", ind, e.env.Type, id)
			return
		}
		printed[id] = true
		line := fmt.Sprintf("%s%s %s %s@%s %s", ind, e.env.Time.Local().Format("2006-01-02 15:04:05.000"), e.env.Type,
			e.env.Source.Service, e.env.Source.Node, summarize(e.p))
		if e.env.Epoch != 0 {
			line += fmt.Sprintf(" epoch=%d", e.env.Epoch)
		}
		fmt.Fprintf(w, "%s id=%s\n", line, id)
		var causes []string
		switch v := e.p.(type) {
		case *events.ArbiterDecision:
			causes = v.CausedBy
		case *events.HealthTransition:
			// The probe results are carried in the transition itself.
			for _, ev := range v.Evidence {
				res := "ok"
				if !ev.OK {
					res = fmt.Sprintf("FAIL %s (%s)", ev.Error, ev.ErrorClass)
				}
				fmt.Fprintf(w, "%s  probe %s %s %s in %.1fms\n", ind, ev.At.Local().Format("15:04:05.000"), v.Check, res, ev.DurationMS)
			}
		}
		if len(causes) == 0 && e.env.CausationID != "" {
			causes = []string{e.env.CausationID}
		}
		for _, c := range causes {
			walk(c, depth+1)
		}
	}
	walk(id, 0)
	return nil
}

func summarize(p events.Payload) string {
	if a, ok := p.(*events.OperatorAction); ok {
		return describeAction(a)
	}
	return Summary(p)
}

func runWindows(ctx context.Context, args []string, cluster string, connect connector, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("windows", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the raw plan")
	if err := fs.Parse(args); err != nil {
		return err
	}
	filter := events.AllScheduleKeys()
	if cluster != "" {
		filter = events.ScheduleKey(cluster)
	}
	plans, err := readRecords[events.SchedulePlan](ctx, connect, filter)
	if err != nil {
		return err
	}
	if len(plans) == 0 {
		fmt.Fprintln(stdout, "no failback windows published: no scheduler is running, so nothing fails back automatically")
		return nil
	}
	sort.Slice(plans, func(i, j int) bool { return plans[i].Cluster < plans[j].Cluster })
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(plans)
	}
	return PrintWindows(stdout, plans, time.Now())
}

// PrintWindows renders scheduler plans: the open window and the next ones.
func PrintWindows(w io.Writer, plans []events.SchedulePlan, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tGROUP\tWINDOW\tSTATE\tSTART\tEND\tZONE")
	for _, p := range plans {
		for _, g := range p.Groups {
			if g.Open == nil && len(g.Windows) == 0 {
				fmt.Fprintf(tw, "%s\t%s\t-\tnone\t-\t-\t-\n", p.Cluster, g.Group)
			}
			row := func(pw events.PlannedWindow, state string) {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Cluster, g.Group, pw.Window, state,
					pw.Start.Format("Mon 2006-01-02 15:04 MST"), pw.End.Format("Mon 2006-01-02 15:04 MST"), pw.TimeZone)
			}
			if g.Open != nil {
				row(*g.Open, "OPEN")
			}
			for _, pw := range g.Windows {
				row(pw, "in "+pw.Start.Sub(now).Round(time.Minute).String())
			}
		}
		fmt.Fprintf(tw, "\n(plan written %s ago by %s)\n", now.Sub(p.UpdatedAt).Round(time.Second), p.UpdatedBy)
	}
	return tw.Flush()
}
