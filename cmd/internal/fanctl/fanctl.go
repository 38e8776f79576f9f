// Package fanctl implements the fanctl command: reading fan's audit trail
// and cluster state from the bus. It only reads; it never provisions.
package fanctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go/jetstream"
)

const usage = `usage: fanctl [connection flags] <command> [flags]

commands:
  events       print the event trail (--since 1h, --follow, --json, --type T)
  status       who holds each group's addresses, and each node's health
  explain ID   the causal chain of an event, back to the probe results
  windows      the failback windows the scheduler will permit next

operator actions (need --cluster and --operator, or a --config naming both;
each is recorded as the operator whose credentials sent it; --as adds a comment):
  switchover --to NODE [--group G] [--reason TEXT]
  failback --now --reason TEXT [--group G]
  maintenance on|off [--group G] [--reason TEXT]   (no --group: the whole cluster)
  node standby|active NODE [--reason TEXT]

install (deploy/systemd/README.md):
  nats-config --cluster-file F --out DIR [--renew]   CA, certificates, nkeys, nats-server configs, bundles
  provision [--replicas 3]   create fan's streams, bucket and object stores (the admin identity)

connection flags:
`

// Main runs fanctl and returns its exit code.
func Main(args []string, stdout, stderr io.Writer, version string) int {
	fs := flag.NewFlagSet("fanctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	var cfg bus.Config
	fs.StringVar(&cfg.URL, "url", envOr("NATS_URL", "nats://127.0.0.1:4222"), "NATS server URL(s)")
	fs.StringVar(&cfg.Creds, "creds", os.Getenv("NATS_CREDS"), "credentials file")
	fs.StringVar(&cfg.NKeySeed, "nkey", os.Getenv("NATS_NKEY"), "nkey seed file")
	fs.StringVar(&cfg.TLS.CA, "tls-ca", os.Getenv("NATS_CA"), "CA certificate file")
	fs.StringVar(&cfg.TLS.Cert, "tls-cert", os.Getenv("NATS_CERT"), "client certificate file")
	fs.StringVar(&cfg.TLS.Key, "tls-key", os.Getenv("NATS_KEY"), "client key file")
	fs.BoolVar(&cfg.InsecureLab, "insecure-lab", os.Getenv("FAN_INSECURE_LAB") == "true",
		"allow a server off loopback without TLS or an identity (throwaway labs only)")
	cluster := fs.String("cluster", os.Getenv("FAN_CLUSTER"), "cluster name (default: all clusters)")
	operator := fs.String("operator", os.Getenv("FAN_OPERATOR"), "the operator whose credentials these are (operator actions are sent as, and recorded as, this operator)")
	cfgPath := fs.String("config", os.Getenv("FANCTL_CONFIG"), "configuration file (url, creds, nkey_seed, tls, cluster, operator); the command line overrides it")
	timeout := fs.Duration("timeout", 10*time.Second, "how long to wait for the bus")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *cfgPath != "" {
		if err := applyConfig(fs, *cfgPath, &cfg, cluster, operator); err != nil {
			fmt.Fprintln(stderr, "fanctl:", err)
			return 2
		}
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	if *cluster != "" {
		if err := events.ValidToken("cluster", *cluster); err != nil {
			fmt.Fprintln(stderr, "fanctl:", err)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	connect := func() (*bus.Bus, error) {
		cctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		host, _ := os.Hostname()
		node := sanitizeToken(host)
		return bus.Connect(cctx, cfg, bus.Identity{Cluster: *cluster, Service: "fanctl", Node: node, Version: version}, log)
	}
	var err error
	switch cmd, rest := fs.Arg(0), fs.Args()[1:]; cmd {
	case "events":
		err = runEvents(ctx, rest, *cluster, connect, stdout, stderr)
	case "status":
		err = runStatus(ctx, rest, *cluster, connect, stdout, stderr)
	case "explain":
		err = runExplain(ctx, rest, *cluster, connect, stdout, stderr)
	case "windows":
		err = runWindows(ctx, rest, *cluster, connect, stdout, stderr)
	case "switchover", "failback", "maintenance", "node":
		err = runOperate(ctx, cmd, rest, *cluster, *operator, connect, stdout, stderr)
	case "nats-config":
		err = runNATSConfig(rest, stdout, stderr)
	case "provision":
		err = runProvision(ctx, rest, &cfg, connect, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "fanctl: unknown command %q\n", cmd)
		fs.Usage()
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 2
	}
	if errors.Is(err, errRefused) {
		return 3
	}
	if err != nil {
		fmt.Fprintln(stderr, "fanctl:", err)
		return 1
	}
	return 0
}

type connector func() (*bus.Bus, error)

func runEvents(ctx context.Context, args []string, cluster string, connect connector, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	fs.SetOutput(stderr)
	since := fs.String("since", "1h", "start this long ago (10m) or at a time (RFC 3339); 'all' for everything")
	follow := fs.Bool("follow", false, "keep printing new events")
	asJSON := fs.Bool("json", false, "one JSON envelope per line")
	typ := fs.String("type", "", "only events of this type (e.g. health.transition)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The audit stream holds the events and a copy of every command.
	opts := bus.WatchOptions{Subjects: []string{events.AllEvents(), events.AllCommands()}}
	if cluster != "" {
		opts.Subjects = []string{events.ClusterEvents(cluster), events.ClusterCommands(cluster)}
	}
	switch {
	case *since == "all":
		opts.All = true
	default:
		t, err := parseSince(*since, time.Now())
		if err != nil {
			return err
		}
		opts.Since = t
	}
	b, err := connect()
	if err != nil {
		return err
	}
	defer b.Close()

	var last uint64
	if !*follow {
		st, err := b.JS.Stream(ctx, bus.EventsStream)
		if err != nil {
			return fmt.Errorf("events stream: %w", err)
		}
		last = st.CachedInfo().State.LastSeq
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	arrived := make(chan struct{}, 1)
	var (
		mu       sync.Mutex
		printErr error
	)
	handler := func(env events.Envelope, p events.Payload, seq uint64) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		if *typ == "" || string(env.Type) == *typ {
			if err := printEvent(stdout, env, p, *asJSON); err != nil {
				mu.Lock()
				printErr = err
				mu.Unlock()
				cancel()
			}
		}
		if !*follow && seq >= last {
			cancel()
		}
	}
	if !*follow {
		if last == 0 {
			return nil
		}
		// Events older than --since, or filtered by cluster, never reach
		// the last sequence: stop once the trail goes quiet.
		go func() {
			for {
				select {
				case <-arrived:
				case <-time.After(time.Second):
					cancel()
					return
				case <-wctx.Done():
					return
				}
			}
		}()
	}
	if err := b.Watch(wctx, opts, handler); err != nil && ctx.Err() == nil {
		return err
	}
	// An auditor must know the trail holds messages no service acted on.
	if n := b.RefusedCount(events.RefusedSubject) + b.RefusedCount(events.RefusedUndecodable); n > 0 {
		fmt.Fprintf(stderr, "fanctl: %d stored message(s) not shown: they do not decode or do not match the subject they were stored on (forged, or from a broken producer); fan's services drop them too\n", int(n))
	}
	mu.Lock()
	defer mu.Unlock()
	return printErr
}

func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("--since %q: want a duration like 10m or an RFC 3339 time", s)
}

func printEvent(w io.Writer, env events.Envelope, p events.Payload, asJSON bool) error {
	if asJSON {
		b, err := json.Marshal(env)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	}
	line := fmt.Sprintf("%s %-20s %-22s %s", env.Time.Local().Format("15:04:05.000"), env.Type,
		env.Source.Service+"@"+env.Source.Node, Summary(p))
	if env.Epoch != 0 {
		line += fmt.Sprintf(" epoch=%d", env.Epoch)
	}
	line += " id=" + env.ID
	if env.CausationID != "" {
		line += " cause=" + env.CausationID
	}
	_, err := fmt.Fprintln(w, line)
	return err
}

// Summary renders the gist of a payload in one line.
func Summary(p events.Payload) string {
	switch v := p.(type) {
	case *events.HealthTransition:
		return fmt.Sprintf("%s %s[%s] %s->%s: %s", v.TargetNode, v.Check, v.Role, v.From, v.To, v.Reason)
	case *events.ProbeResult:
		if v.OK {
			return fmt.Sprintf("%s %s ok %.1fms", v.TargetNode, v.Check, v.DurationMS)
		}
		return fmt.Sprintf("%s %s FAIL %s (%s)", v.TargetNode, v.Check, v.Error, v.ErrorClass)
	case *events.NodeHeartbeat:
		return fmt.Sprintf("%s seq=%d cpu=%.1f%% mem_avail=%dMiB", v.Node, v.Seq, v.CPUPercent, v.MemAvailableBytes>>20)
	case *events.ArbiterDecision:
		s := fmt.Sprintf("%s %s %s->%s: %s", v.Group, strings.ToUpper(string(v.Action)), v.From, v.To, v.Reason)
		if v.NeedsHuman {
			s = "NEEDS A HUMAN: " + s
		}
		return s
	case *events.ClaimIP:
		return fmt.Sprintf("claim %s on %s for %s", strings.Join(v.Addresses, ","), v.Node, v.Group)
	case *events.ReleaseIP:
		return fmt.Sprintf("release %s on %s for %s", strings.Join(v.Addresses, ","), v.Node, v.Group)
	case *events.AnswerPBX:
		return fmt.Sprintf("answer %s on %s (%s)", v.Group, v.Node, v.Mode)
	case *events.CommandResult:
		s := fmt.Sprintf("%s on %s: %s", v.CommandType, v.Node, v.Outcome)
		if v.Error != "" {
			s += " (" + v.Error + ")"
		}
		for _, st := range v.Steps {
			s += fmt.Sprintf(" %s=%.1fms", st.Name, st.ElapsedMS)
		}
		return s
	case *events.FailbackPermit:
		return fmt.Sprintf("%s window %s until %s", v.Group, v.Window, v.ValidUntil.Format(time.RFC3339))
	case *events.ReplicationStatus:
		return fmt.Sprintf("%s->%s %s files=%d caught_up=%v", v.Node, v.Peer, v.Tree, v.Files, v.CaughtUp)
	case *events.ServiceAnnounce:
		return fmt.Sprintf("%s on %s %s (%s)", v.Service, v.Node, v.State, v.Version)
	case *events.OperatorAction:
		return describeAction(v)
	case *events.NodePresence:
		s := fmt.Sprintf("%s %s", v.Node, strings.ToUpper(string(v.Presence)))
		if v.SilentMS > 0 {
			s += fmt.Sprintf(" after %s of silence", (time.Duration(v.SilentMS) * time.Millisecond).Round(time.Second))
		}
		return s
	}
	return ""
}

func runStatus(ctx context.Context, args []string, cluster string, connect connector, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the raw status records")
	if err := fs.Parse(args); err != nil {
		return err
	}
	filter := events.StateKeyPrefix + ".>"
	if cluster != "" {
		filter = events.AllGroupStatusKeys(cluster)
	}
	groups, err := readRecords[events.GroupStatus](ctx, connect, filter)
	if err != nil {
		return err
	}
	if len(groups) == 0 {
		fmt.Fprintln(stdout, "no group status yet (is an arbiter leading?)")
		return nil
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(groups)
	}
	return PrintStatus(stdout, groups, time.Now())
}

// PrintStatus renders group status records as two tables.
func PrintStatus(w io.Writer, groups []events.GroupStatus, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tADDRESSES\tHOLDER\tEPOCH\tSINCE\tUPDATED")
	for _, g := range groups {
		holder := g.Holder
		if holder == "" {
			holder = "(none)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s ago\n", g.Group, strings.Join(g.Addresses, ","), holder, g.Epoch,
			fmtTime(g.Since), now.Sub(g.UpdatedAt).Round(time.Millisecond))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "GROUP\tNODE\tPRIORITY\tHEALTH\tSINCE\tLAST HEARTBEAT\tSILENT")
	for _, g := range groups {
		names := make([]string, 0, len(g.Nodes))
		for n := range g.Nodes {
			names = append(names, n)
		}
		sort.Slice(names, func(i, j int) bool { return g.Nodes[names[i]].Priority < g.Nodes[names[j]].Priority })
		for _, n := range names {
			s := g.Nodes[n]
			hb := "never"
			if !s.LastHeartbeat.IsZero() {
				hb = now.Sub(s.LastHeartbeat).Round(time.Millisecond).String() + " ago"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%v\n", g.Group, n, s.Priority, s.Health, fmtTime(s.HealthSince), hb, s.Silent)
		}
	}
	// What the arbiter is waiting for, when it is waiting: only printed
	// when there is something to say, so the common case stays short.
	var notes []string
	for _, g := range groups {
		if g.Frozen != "" {
			notes = append(notes, fmt.Sprintf("%s: FROZEN: %s", g.Group, g.Frozen))
		}
		if g.Situation != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", g.Group, g.Situation))
		}
		if !g.PermitUntil.IsZero() {
			notes = append(notes, fmt.Sprintf("%s: failback permitted until %s", g.Group, fmtTime(g.PermitUntil)))
		}
		for n, s := range g.Nodes {
			if s.Standby {
				notes = append(notes, fmt.Sprintf("%s: %s is in standby", g.Group, n))
			}
		}
	}
	if len(notes) > 0 {
		sort.Strings(notes)
		fmt.Fprintln(tw)
		for _, n := range notes {
			fmt.Fprintln(tw, n)
		}
	}
	return tw.Flush()
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05")
}

func sanitizeToken(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 {
		return "fanctl"
	}
	return b.String()
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// readRecords reads every JSON record of the state bucket whose key matches
// filter, in key order. A key deleted between listing and reading is skipped.
func readRecords[T any](ctx context.Context, connect connector, filter string) ([]T, error) {
	b, err := connect()
	if err != nil {
		return nil, err
	}
	defer b.Close()
	kv, err := b.StateKV(ctx)
	if err != nil {
		return nil, err
	}
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", filter, err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []T
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", k, err)
		}
		var v T
		if err := json.Unmarshal(e.Value(), &v); err != nil {
			return nil, fmt.Errorf("decode %s: %w", k, err)
		}
		out = append(out, v)
	}
	return out, nil
}
