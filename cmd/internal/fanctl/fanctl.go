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
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

const usage = `usage: fanctl [flags] <command> [command flags]
(flags may come before or after the command)

commands:
  events       print the audit trail (--since 1h, --follow, --json, --type T; --live: heartbeats and probe results)
  status       who holds each group's addresses, and each node's health (--json)
  explain ID   the causal chain of an event, back to the probe results (--json)
  windows      the failback windows the scheduler will permit next (--json)
  replay --arbiter-config FILE [--since 24h] [--until T]
               replay the arbiter's decisions through its decision core and
               compare each with the one recorded (exit 4 on a difference)
  serve        the live status page (--listen, --path-prefix, --token-file; the serve: section
               of --config; cmd/README.md)
  help [CMD]   this text, or a command's flags
  version      fanctl's version (also --version)
  completion bash|zsh   a shell completion script (source <(fanctl completion bash))

operator actions (need --cluster and --operator, or a --config naming both;
each is recorded as the operator whose credentials sent it; --as adds a comment;
--json prints the arbiter's answer as JSON):
  switchover --to NODE [--group G] [--reason TEXT] [--within D] [--force-after | --now]
  switchover --cancel [--group G]                  (the planned switchover still waiting)
  failback --now --reason TEXT [--group G]
  maintenance on|off [--group G] [--reason TEXT]   (no --group: the whole cluster)
  node standby NODE [--reason TEXT] [--within D] [--force-after | --now]
  node active NODE [--reason TEXT]                 (also cancels a standby's waiting moves)
  a switchover or standby waits until the holder's calls have ended (at most the group's
  drain limit of active channels), up to --within (the group's planned.drain_within, 30m by
  default), then gives up, or with --force-after moves anyway; --now moves at once

install (deploy/systemd/README.md):
  nats-config --cluster-file F --out DIR [--renew]   CA, certificates, nkeys, nats-server configs, bundles
  provision [--replicas 3]   create fan's streams, bucket and object stores (the admin identity)

exit status: 0 done, 1 failed, 2 usage error, 3 the arbiter refused the action

flags:
`

// commands lists every command, for help and shell completion.
var commands = []string{"events", "status", "explain", "windows", "replay", "serve", "switchover", "failback", "maintenance", "node",
	"nats-config", "provision", "help", "version", "completion"}

// errReported marks an error already shown to the user (the flag package
// prints a bad flag and the usage itself), so Main does not print it again.
var errReported = errors.New("reported")

// parseFlags parses a command's flags.
func parseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w: %w", errReported, err)
	}
	return nil
}

// hoistGlobalFlags moves fanctl's own flags to the front wherever they
// appear, so `fanctl status --url U` means what `fanctl --url U status`
// does. A command's own flags and arguments keep their order; `--` ends
// the search.
func hoistGlobalFlags(fs *flag.FlagSet, args []string) []string {
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
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) && i+1 < len(args) {
			i++
			global = append(global, args[i])
		}
	}
	return append(global, rest...)
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
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
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
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(hoistGlobalFlags(fs, args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, VersionLine(version))
		return 0
	}
	var file Config
	if *cfgPath != "" {
		var err error
		if file, err = applyConfig(fs, *cfgPath, &cfg, cluster, operator); err != nil {
			fmt.Fprintln(stderr, "fanctl:", err)
			return 2
		}
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	switch fs.Arg(0) {
	case "help":
		// Asked for: to stdout, exit 0.
		fs.SetOutput(stdout)
		if fs.NArg() < 2 {
			fs.Usage()
			return 0
		}
		args := append(fs.Args()[1:2:2], "-h")
		return Main(args, stdout, stdout, version)
	case "version":
		fmt.Fprintln(stdout, VersionLine(version))
		return 0
	case "completion":
		if err := runCompletion(fs.Args()[1:], fs, stdout); err != nil {
			fmt.Fprintln(stderr, "fanctl:", err)
			return 2
		}
		return 0
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
		cfg.ConnectOnce = true
		b, err := bus.Connect(cctx, cfg, bus.Identity{Cluster: *cluster, Service: "fanctl", Node: node, Version: version}, log)
		if err != nil {
			return nil, withDialErrors(cctx, cfg.URL, err)
		}
		return b, nil
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
	case "replay":
		err = runReplay(ctx, rest, *cluster, connect, stdout, stderr)
	case "switchover", "failback", "maintenance", "node":
		err = runOperate(ctx, cmd, rest, *cluster, *operator, connect, stdout, stderr)
	case "serve":
		err = runServe(ctx, rest, *cluster, file.Serve, cfg, version, stdout, stderr)
	case "nats-config":
		err = runNATSConfig(rest, stdout, stderr)
	case "provision":
		err = runProvision(ctx, rest, &cfg, connect, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "fanctl: unknown command %q (fanctl help lists them)\n", cmd)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, errReported) {
		return 2
	}
	if errors.Is(err, errRefused) {
		return 3
	}
	if errors.Is(err, errDiffers) {
		fmt.Fprintln(stderr, "fanctl:", err)
		return 4
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
	live := fs.Bool("live", false, "show the live stream (heartbeats, probe results; kept for hours) instead of the audit trail")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	// The audit stream holds the events and a copy of every command.
	opts := bus.WatchOptions{Subjects: []string{events.AllEvents(), events.AllCommands()}}
	if cluster != "" {
		opts.Subjects = []string{events.ClusterEvents(cluster), events.ClusterCommands(cluster)}
	}
	if *live {
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
	b, err := connect()
	if err != nil {
		return err
	}
	defer b.Close()

	// Without --follow, stop at the end of the trail as it is now.
	opts.ToEnd = !*follow
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		printErr error
	)
	handler := func(env events.Envelope, p events.Payload, _ uint64) {
		if *typ == "" || string(env.Type) == *typ {
			if err := printEvent(stdout, env, p, *asJSON); err != nil {
				mu.Lock()
				printErr = err
				mu.Unlock()
				cancel()
			}
		}
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

func runStatus(ctx context.Context, args []string, cluster string, connect connector, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the raw status records")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	b, err := connect()
	if err != nil {
		return err
	}
	defer b.Close()
	records, err := view.Records[events.GroupStatus](ctx, b, view.StatusFilter(cluster))
	if err != nil {
		return err
	}
	if len(records) == 0 {
		fmt.Fprintln(stdout, "no group status yet (is an arbiter leading?)")
		return nil
	}
	groups := make([]events.GroupStatus, len(records))
	for i, r := range records {
		groups[i] = r.Value
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(groups)
	}
	return PrintStatus(stdout, groups, view.LastHeard(records, view.Heartbeats(ctx, b, records)), time.Now())
}

// PrintStatus renders group status records as two tables. heard maps
// "group/node" to when the node was last heard (lastHeard); a node missing
// from it shows the arbiter's own record of its last heartbeat.
func PrintStatus(w io.Writer, groups []events.GroupStatus, heard map[string]time.Time, now time.Time) error {
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
	if notes := view.Notes(groups, heard, now); len(notes) > 0 {
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
// filter, in key order.
func readRecords[T any](ctx context.Context, connect connector, filter string) ([]T, error) {
	b, err := connect()
	if err != nil {
		return nil, err
	}
	defer b.Close()
	recs, err := view.Records[T](ctx, b, filter)
	if err != nil {
		return nil, err
	}
	out := make([]T, len(recs))
	for i, r := range recs {
		out[i] = r.Value
	}
	return out, nil
}
