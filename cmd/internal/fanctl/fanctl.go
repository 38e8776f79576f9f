// Package fanctl implements the fanctl command: reading fan's audit trail
// and cluster state from the bus, replaying the arbiter's decisions, sending
// operator actions to the arbiter, and the install steps (nats-config,
// provision).
package fanctl

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go"
)

// commands lists every command fanctl dispatches, in the order help lists
// them; each has a case in dispatch and a commandSpec (help.go).
var commands = []string{"events", "status", "explain", "windows", "replay", "serve", "switchover", "failback", "maintenance", "node", "leaders",
	"nats-config", "provision", "init", "install-host", "doctor", "backup", "restore", "help", "version", "completion"}

// hoistGlobalFlags moves fanctl's own flags to the front wherever they
// appear, so `fanctl status --url U` means what `fanctl --url U status`
// does. A command's own flags and arguments keep their order; `--` ends
// the search. A global flag missing its value is an error naming it (the
// flag package would take the command for the value).
func hoistGlobalFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var global, rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, hasValue := strings.TrimLeft(a, "-"), false
		if n, _, ok := strings.Cut(name, "="); ok {
			name, hasValue = n, true
		}
		f := fs.Lookup(name)
		if !strings.HasPrefix(a, "-") || a == "-" || f == nil {
			rest = append(rest, a)
			continue
		}
		global = append(global, a)
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) {
			if i+1 >= len(args) || (strings.HasPrefix(args[i+1], "--") && len(args[i+1]) > 2) {
				return nil, usagef("flag needs a value: --%s", name)
			}
			i++
			global = append(global, args[i])
		}
	}
	return append(global, rest...), nil
}

// Commit is the commit a release binary was built from; the Makefile sets it
// (-X) next to main.version.
var Commit string

// VersionLine is what fanctl --version prints.
func VersionLine(version string) string {
	commit := Commit
	if commit == "" {
		commit = "unknown"
	}
	return fmt.Sprintf("fanctl %s (commit %s, %s %s/%s)", version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Main runs fanctl and returns its exit code.
func Main(args []string, stdout, stderr io.Writer, version string) int {
	fs := flag.NewFlagSet("fanctl", flag.ContinueOnError)
	// The flag package prints nothing: a bad flag is one line (below), -h
	// the help on standard output.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
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
	timeout := fs.Duration("timeout", 10*time.Second, "how long a command may take to reach the bus and read what it needs (not events --follow, serve)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	usageLine := func(cmd string, err error) int {
		if cmd == "" {
			fmt.Fprintf(stderr, "fanctl: %v (fanctl help)\n", err)
		} else {
			fmt.Fprintf(stderr, "fanctl: %s: %v (fanctl help %s)\n", cmd, err, cmd)
		}
		return 2
	}
	hoisted, err := hoistGlobalFlags(fs, args)
	if err == nil {
		err = fs.Parse(hoisted)
	}
	if errors.Is(err, flag.ErrHelp) {
		printUsage(stdout, fs)
		return 0
	}
	if err != nil {
		return usageLine("", err)
	}
	if *showVersion {
		fmt.Fprintln(stdout, VersionLine(version))
		return 0
	}
	if fs.NArg() == 0 {
		return usageLine("", errors.New("no command given"))
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	if !isCommand(cmd) && cmd != completeCommand {
		msg := fmt.Sprintf("unknown command %q", cmd)
		if n, ok := closeTo(cmd, commands); ok {
			msg += fmt.Sprintf(": did you mean %s?", n)
		}
		return usageLine("", errors.New(msg))
	}
	if wantsHelp(rest) {
		printCommandHelp(stdout, cmd)
		return 0
	}
	switch cmd {
	case "help":
		switch {
		case len(rest) == 0:
			printUsage(stdout, fs)
		case len(rest) > 1:
			return usageLine(cmd, fmt.Errorf("unexpected argument %q", rest[1]))
		case !isCommand(rest[0]):
			return usageLine(cmd, fmt.Errorf("unknown command %q: %s", rest[0], unknownName(rest[0], commands)))
		default:
			printCommandHelp(stdout, rest[0])
		}
		return 0
	case "version":
		if len(rest) > 0 {
			return usageLine(cmd, fmt.Errorf("unexpected argument %q", rest[0]))
		}
		fmt.Fprintln(stdout, VersionLine(version))
		return 0
	case "completion":
		if err := runCompletion(rest, fs, stdout); err != nil {
			return usageLine(cmd, err)
		}
		return 0
	}
	var file Config
	// The install commands work on local files only: a FANCTL_CONFIG naming
	// a bundle that does not exist yet (before init made it) is no error.
	local := cmd == "init" || cmd == "install-host" || cmd == "nats-config" || cmd == "doctor"
	if *cfgPath != "" && !local {
		var err error
		if file, err = applyConfig(fs, *cfgPath, &cfg, cluster, operator); err != nil {
			fmt.Fprintln(stderr, "fanctl:", err)
			return 2
		}
	}
	if *cluster != "" {
		if err := events.ValidToken("cluster", *cluster); err != nil {
			return usageLine("", fmt.Errorf("--cluster: %w", err))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// --timeout bounds the whole command from here: the connection and
	// every read (commands that wait longer on purpose use ctx).
	bounded, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	connect := func(needs ...string) (*bus.Bus, error) {
		host, _ := os.Hostname()
		cfg.ConnectOnce = true
		b, err := bus.Connect(bounded, cfg, bus.Identity{Cluster: *cluster, Service: "fanctl", Node: sanitizeToken(host), Version: version}, log)
		if err != nil {
			return nil, withDialErrors(bounded, cfg.URL, err)
		}
		if err := requireProvisioned(bounded, b, needs...); err != nil {
			b.Close()
			return nil, err
		}
		return b, nil
	}
	inv := &invocation{ctx: ctx, bounded: bounded, cluster: *cluster, operator: *operator, cfg: &cfg, file: file,
		connect: connect, version: version, stdout: stdout, stderr: stderr}
	err = dispatch(inv, cmd, rest)
	var usage *usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		printCommandHelp(stdout, cmd)
		return 0
	case errors.As(err, &usage):
		return usageLine(cmd, err)
	case errors.Is(err, errReported):
		// Shown already, or wrapped with what to say.
		if msg := strings.TrimPrefix(err.Error(), errReported.Error()+": "); err != errReported {
			return usageLine(cmd, errors.New(msg))
		}
		return 2
	case errors.Is(err, errRefused):
		return 3
	case errors.Is(err, errDiffers):
		fmt.Fprintln(stderr, "fanctl:", err)
		return 4
	}
	if !inv.ownWait && ctx.Err() == nil && bounded.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)) {
		err = fmt.Errorf("%w (gave up after --timeout %v, which bounds the connection and every read; a longer read needs a longer --timeout)", err, *timeout)
	}
	fmt.Fprintln(stderr, "fanctl:", err)
	return 1
}

// invocation is what Main hands a command: the global settings, parsed.
type invocation struct {
	// ctx ends on SIGINT or SIGTERM; bounded also --timeout after the
	// start. A command reads the bus under bounded, and uses ctx only for
	// what waits longer on purpose (events --follow, serve, an action's
	// --wait, provision's --wait).
	ctx, bounded context.Context
	cluster      string
	operator     string
	cfg          *bus.Config
	file         Config
	// connect connects within --timeout and checks that the streams and
	// the bucket named exist (bus.EventsStream, bus.LiveStream,
	// bus.StateBucket), so that a bus nobody provisioned fails at once
	// with what to do, instead of a read waiting for a stream.
	connect        connector
	version        string
	stdout, stderr io.Writer
	// ownWait is set once the command waits under a bound of its own
	// (waitOnItsOwn): a deadline then is not --timeout's.
	ownWait bool
}

// waitOnItsOwn marks the start of what a command waits for under its own
// bound rather than --timeout (an action's --wait, events --follow).
func (inv *invocation) waitOnItsOwn() { inv.ownWait = true }

// dispatch runs cmd. Every command parses its flags first (parseFlags,
// parseInterspersed): help and completion call it with -h alone to learn
// them (describe).
func dispatch(inv *invocation, cmd string, rest []string) error {
	ctx, connect, stdout, stderr := inv.ctx, inv.connect, inv.stdout, inv.stderr
	switch cmd {
	case "serve", "init", "install-host", "doctor", "backup", "restore":
		// These bound what they wait for themselves (serve: nothing).
		inv.waitOnItsOwn()
	}
	switch cmd {
	case "events":
		return runEvents(inv, rest)
	case "status":
		return runStatus(inv, rest)
	case "explain":
		return runExplain(inv, rest)
	case "windows":
		return runWindows(inv, rest)
	case "replay":
		return runReplay(inv, rest)
	case "switchover", "failback", "maintenance", "node":
		return runOperate(inv, cmd, rest)
	case "leaders":
		return runLeaders(inv, rest)
	case "serve":
		return runServe(inv, rest)
	case "nats-config":
		return runNATSConfig(rest, stdout, stderr)
	case "provision":
		return runProvision(inv, rest)
	case "init":
		return runInit(rest, stdout, stderr)
	case "install-host":
		return runInstallHost(ctx, rest, stdout, stderr)
	case "doctor":
		return runDoctor(ctx, rest, stdout, stderr)
	case "backup":
		return runBackup(ctx, rest, connect, stdout, stderr)
	case "restore":
		return runRestore(ctx, rest, connect, stdout, stderr)
	case completeCommand:
		return runComplete(inv, rest)
	}
	return usagef("unknown command %q", cmd)
}

// connector connects to the bus; see invocation.connect.
type connector func(needs ...string) (*bus.Bus, error)

func runEvents(inv *invocation, args []string) error {
	cluster, stdout, stderr := inv.cluster, inv.stdout, inv.stderr
	fs := flag.NewFlagSet("events", flag.ContinueOnError)
	since := fs.String("since", "1h", "start this long ago (10m) or at a time (RFC 3339); 'all' for everything")
	follow := fs.Bool("follow", false, "keep printing new events")
	asJSON := fs.Bool("json", false, "one JSON envelope per line")
	typ := fs.String("type", "", "only events of this type (e.g. health.transition)")
	live := fs.Bool("live", false, "show the live stream (heartbeats, probe results; kept for hours) instead of the audit trail")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *typ != "" {
		if err := checkType(*typ, *live); err != nil {
			return err
		}
	}
	// The audit stream holds the events and a copy of every command.
	opts := bus.WatchOptions{Subjects: []string{events.AllEvents(), events.AllCommands()}}
	if cluster != "" {
		opts.Subjects = []string{events.ClusterEvents(cluster), events.ClusterCommands(cluster)}
	}
	stream := bus.EventsStream
	if *live {
		stream = bus.LiveStream
		opts.Subjects = []string{events.AllLiveState()}
		if cluster != "" {
			opts.Subjects = []string{events.ClusterLiveState(cluster)}
		}
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
	b, err := inv.connect(stream)
	if err != nil {
		return err
	}
	defer b.Close()

	// Without --follow, read to the end of the trail as it is now, within
	// --timeout; with it, keep printing until interrupted.
	opts.ToEnd = !*follow
	parent := inv.bounded
	if *follow {
		parent = inv.ctx
		inv.waitOnItsOwn()
	}
	wctx, cancel := context.WithCancel(parent)
	defer cancel()
	var (
		mu       sync.Mutex
		printErr error
	)
	handler := func(env events.Envelope, p events.Decoded, _ uint64) {
		if *typ == "" || string(env.Type) == *typ {
			if err := printEvent(stdout, env, p, *asJSON); err != nil {
				mu.Lock()
				printErr = err
				mu.Unlock()
				cancel()
			}
		}
	}
	err = b.Watch(wctx, opts, handler)
	if inv.ctx.Err() != nil {
		// Interrupted: what was printed stands.
		err = nil
	}
	// An auditor must know the trail holds messages no service acted on.
	if n := b.RefusedCount(events.RefusedSubject) + b.RefusedCount(events.RefusedUndecodable); n > 0 {
		fmt.Fprintf(stderr, "fanctl: %d stored message(s) not shown: they do not decode or do not match the subject they were stored on (forged, or from a broken producer); fan's services drop them too\n", int(n))
	}
	mu.Lock()
	defer mu.Unlock()
	if printErr != nil {
		return printErr
	}
	return err
}

// checkType refuses an event type pkg/events does not define, naming the
// nearest one, and a type the stream read does not keep.
func checkType(t string, live bool) error {
	types := eventTypes()
	if !slices.Contains(types, t) {
		return usagef("--type %q: no such event type; did you mean %s?", t, nearest(t, types))
	}
	switch isLive := events.IsLive(events.Type(t)); {
	case isLive && !live:
		return usagef("--type %s: kept in the live stream, not the audit trail: add --live", t)
	case !isLive && live:
		return usagef("--type %s: kept in the audit trail, not the live stream: drop --live", t)
	}
	return nil
}

// stampLayout is RFC 3339 with milliseconds: date, time and zone, so a line
// pasted into a ticket means the same instant to everyone who reads it.
const stampLayout = "2006-01-02T15:04:05.000Z07:00"

func stamp(t time.Time) string { return t.Local().Format(stampLayout) }

func parseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	return time.Time{}, usagef("--since %q: want a duration like 10m, an RFC 3339 time or all", s)
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
	line := fmt.Sprintf("%s %-20s %-22s %s", stamp(env.Time), env.Type,
		env.Source.Service+"@"+env.Source.Node, view.Summary(p))
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

func runStatus(inv *invocation, args []string) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print the raw status records as a JSON array ([] when there are none)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	b, err := inv.connect(bus.StateBucket)
	if err != nil {
		return err
	}
	defer b.Close()
	records, err := view.Records[events.GroupStatus](inv.bounded, b, view.StatusFilter(inv.cluster))
	if err != nil {
		return err
	}
	groups := make([]events.GroupStatus, len(records))
	for i, r := range records {
		groups[i] = r.Value
	}
	if *asJSON {
		enc := json.NewEncoder(inv.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(groups)
	}
	if len(records) == 0 {
		fmt.Fprintln(inv.stdout, "no group status yet (is an arbiter leading?)")
		return nil
	}
	now := time.Now()
	calls := view.CallNotes(records, view.CallsSummaries(inv.bounded, b, records), now)
	// The operator's leaders hold is the cluster's, beside the groups'.
	if inv.cluster != "" {
		holds, err := view.Records[events.LeadersHoldRecord](inv.bounded, b, events.LeadersHoldKey(inv.cluster))
		if err != nil {
			return err
		}
		calls = append(calls, view.HoldNotes(holds, now)...)
	}
	return PrintStatus(inv.stdout, groups, view.LastHeard(records, view.Heartbeats(inv.bounded, b, records)), now, calls...)
}

// PrintStatus renders group status records as two tables. heard maps
// "group/node" to when the node was last heard (lastHeard); a node missing
// from it shows the arbiter's own record of its last heartbeat. more are
// notes of other sources (view.CallNotes), printed among the arbiter's.
func PrintStatus(w io.Writer, groups []events.GroupStatus, heard map[string]time.Time, now time.Time, more ...string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tADDRESSES\tHOLDER\tEPOCH\tSINCE\tUPDATED")
	for _, g := range groups {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s ago\n", g.Group, strings.Join(g.Addresses, ","), view.OrNone(g.Holder), g.Epoch,
			view.Time(g.Since), view.HumanDuration(now.Sub(g.UpdatedAt)))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "GROUP\tNODE\tPRIORITY\tHEALTH\tHEALTH SINCE\tLAST HEARD\tSILENT")
	for _, g := range groups {
		for _, n := range view.NodesByPriority(g) {
			s := g.Nodes[n]
			hb := "never"
			if t := view.Seen(g, heard, n); !t.IsZero() {
				hb = view.HumanDuration(now.Sub(t)) + " ago"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%v\n", g.Group, n, s.Priority, s.Health, view.Time(s.HealthSince), hb, s.Silent)
		}
	}
	// What the arbiter is waiting for, when it is waiting: only printed
	// when there is something to say, so the common case stays short.
	notes := append(view.Notes(groups, heard, now), more...)
	sort.Strings(notes)
	if len(notes) > 0 {
		fmt.Fprintln(tw)
		for _, n := range notes {
			fmt.Fprintln(tw, n)
		}
	}
	return tw.Flush()
}

// withDialErrors adds what dialing each server says to a failed connect:
// the NATS client reports only "no servers available", while the operator
// needs to read "connection refused" or "no such host".
func withDialErrors(ctx context.Context, urls string, err error) error {
	var why []string
	for _, u := range strings.Split(urls, ",") {
		pu, perr := url.Parse(strings.TrimSpace(u))
		if perr != nil || pu.Host == "" {
			continue
		}
		host := pu.Host
		if pu.Port() == "" {
			host = net.JoinHostPort(pu.Hostname(), "4222")
		}
		d := net.Dialer{Timeout: time.Second}
		c, derr := d.DialContext(ctx, "tcp", host)
		if derr != nil {
			why = append(why, derr.Error())
			continue
		}
		_ = c.Close()
	}
	if len(why) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(why, "; "))
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
// filter, in key order, within --timeout.
func readRecords[T any](inv *invocation, filter string) ([]T, error) {
	b, err := inv.connect(bus.StateBucket)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	recs, err := view.Records[T](inv.bounded, b, filter)
	if err != nil {
		return nil, err
	}
	out := make([]T, len(recs))
	for i, r := range recs {
		out[i] = r.Value
	}
	return out, nil
}
