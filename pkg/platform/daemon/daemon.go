// Package daemon is the lifecycle every fan binary shares: flags, logging,
// signals (SIGINT and SIGTERM, since systemd stops services with SIGTERM;
// SIGHUP reloads, see Reloader), the common configuration section, the bus
// connection, the start and stop announcements, the /metrics and /healthz
// endpoint, NATS service discovery (`nats micro ls`), and systemd's
// notification protocol: READY, STOPPING, and a watchdog fed only while the
// service's main loops turn (Runtime.Loop).
package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/fanpbx/fan/pkg/platform/config"
)

// Service is what a fan binary runs until ctx ends.
type Service interface {
	Run(ctx context.Context) error
}

// Options are the command-line settings every fan binary accepts.
type Options struct {
	ConfigPath string
	Logger     *slog.Logger
	Version    string
	// Warn is told each warning about the configuration (a certificate
	// that expires soon): -check-config prints it, a service logs it. Nil
	// logs it on Logger.
	Warn func(warning string)
	// SkipHostChecks leaves out the checks of what the file names on this
	// host (config.HostChecker), for -release-all: what the node holds is
	// released even when a certificate has expired or an interface is gone.
	SkipHostChecks bool
}

// Builder loads the configuration at opts.ConfigPath and builds the service
// without starting anything, so --check-config can use it too. A Builder
// reads the file with LoadConfig, so that -check-config and the service's
// start check the same things and report them the same way.
type Builder func(opts Options) (Service, error)

// LoadConfig reads a service's configuration file into dst (a pointer to
// the service's Config) as -check-config checks it and as the service
// starts: strictly, then Validate, then (config.HostChecker) what the file
// names on this host. The error lists every mistake, one per line, each
// with the file, the line and the key (a *config.Errors); warnings go to
// o.Warn.
func LoadConfig(o Options, dst any) error {
	if o.SkipHostChecks {
		return config.Load(o.ConfigPath, dst)
	}
	warnings, err := config.Check(o.ConfigPath, dst)
	o.Warnings(warnings)
	return err
}

// Warnings hands each warning to o.Warn (or logs it).
func (o Options) Warnings(warnings []string) {
	for _, w := range warnings {
		switch {
		case o.Warn != nil:
			o.Warn(w)
		case o.Logger != nil:
			o.Logger.Warn("configuration warning", "warning", w)
		}
	}
}

// Commit is the commit a release binary was built from; the Makefile sets it
// (-X) next to main.version. Empty in a plain `go build`.
var Commit string

// VersionLine is what --version prints: the name, the release version
// (0.2.0 at a release, 0.2.1~dev.5.abc1234 between releases: DEVELOPING.md,
// "Versions and releases"), the commit and the Go toolchain, so a bug report
// names exactly what ran.
func VersionLine(name, version string) string {
	commit := Commit
	if commit == "" {
		commit = "unknown"
	}
	return fmt.Sprintf("%s %s (commit %s, %s %s/%s)", name, version, commit, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Run is the whole body of a fan binary's main: it returns the exit code.
func Run(args []string, name, version, defaultConfig string, build Builder) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	cfgPath := fs.String("config", defaultConfig, "configuration file")
	check := fs.Bool("check-config", false, "validate the configuration and exit (non-zero on any error)")
	release := fs.Bool("release-all", false, "release every node resource the service manages (floating addresses) without the bus, and exit; for systemd's ExecStopPost")
	showVersion := fs.Bool("version", false, "print the version and exit")
	level := fs.String("log-level", envOr("FAN_LOG_LEVEL", "info"), "debug, info, warn or error")
	format := fs.String("log-format", envOr("FAN_LOG_FORMAT", "json"), "json or text")
	fs.SetOutput(stderr)
	rest, err := ParseFlags(fs, args)
	if err != nil {
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, VersionLine(name, version))
		return 0
	}
	path, err := ConfigPath(fs, *cfgPath, *check, rest)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	*cfgPath = path
	log, err := NewLogger(stderr, *level, *format)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	log = log.With(ServiceKey, name)

	warnings := 0
	warn := func(w string) {
		warnings++
		log.Warn("configuration warning", "warning", w)
	}
	if *check {
		warn = func(w string) {
			warnings++
			fmt.Fprintf(stderr, "warning: %s\n", w)
		}
	}
	svc, err := build(Options{ConfigPath: *cfgPath, Logger: log, Version: version, Warn: warn, SkipHostChecks: *release})
	if err != nil {
		PrintConfigError(stderr, name, *cfgPath, err)
		return 1
	}
	if *check {
		switch warnings {
		case 0:
			fmt.Fprintf(stdout, "%s: configuration %s is valid\n", name, *cfgPath)
		default:
			fmt.Fprintf(stdout, "%s: configuration %s is valid, with %d %s (above)\n", name, *cfgPath, warnings, plural(warnings, "warning"))
		}
		return 0
	}
	if *release {
		return releaseAll(svc, name, log)
	}

	notifier, err := NotifierFromEnv()
	if err != nil {
		// systemd set it, so it is worth a loud warning, but a service that
		// cannot notify still does its job (the unit's start times out).
		log.Warn("systemd notification disabled", "err", err)
	}
	sup := newSupervisor(notifier, log)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// SIGHUP would otherwise kill the process: systemctl reload must never
	// take a failover service down.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				sup.reload(ctx, svc, build, Options{ConfigPath: *cfgPath, Logger: log, Version: version, Warn: warn})
			}
		}
	}()
	go sup.runWatchdog(ctx)

	log.Info("starting", "version", version, "config", *cfgPath, "pid", os.Getpid(),
		"systemd_notify", notifier.Enabled(), "watchdog", notifier.WatchdogInterval().String())
	if err := svc.Run(withSupervisor(ctx, sup)); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("stopped with an error", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// stdout and stderr are where Run prints (tests replace them).
var stdout, stderr io.Writer = os.Stdout, os.Stderr

// ParseFlags parses args with fs, flags before and after the positional
// arguments alike, and returns the positional ones; everything after "--"
// is positional. The flag package alone stops at the first positional
// argument: in "-check-config new.yaml -log-level debug" the path would
// end the flags, and what follows it would be left unread.
func ParseFlags(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if i := len(args) - len(rest) - 1; i >= 0 && args[i] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// ConfigPath is the configuration file a command line names: -config's
// value, or, with -check-config, the one path given after it ("-check-config
// PATH", in any position). Any other positional argument is refused, named.
// fs must have been parsed; configFlag is -config's value.
func ConfigPath(fs *flag.FlagSet, configFlag string, check bool, positional []string) (string, error) {
	if len(positional) == 0 {
		return configFlag, nil
	}
	explicit := false
	fs.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "config" })
	switch {
	case !check:
		return "", fmt.Errorf("unexpected argument %q (the configuration file is given with -config FILE, or checked with -check-config FILE)", positional[0])
	case len(positional) > 1:
		return "", fmt.Errorf("unexpected argument %q (-check-config checks one file, here %q)", positional[1], positional[0])
	case explicit && positional[0] != configFlag:
		return "", fmt.Errorf("unexpected argument %q (-config already names %s)", positional[0], configFlag)
	}
	return positional[0], nil
}

// PrintConfigError prints why a configuration was refused: each error of
// a *config.Errors on a line of its own ("file:line: key: what is wrong"),
// then how many there were; any other error on one line after the name.
func PrintConfigError(w io.Writer, name, path string, err error) {
	errs, ok := err.(*config.Errors)
	if !ok {
		fmt.Fprintf(w, "%s: %v\n", name, err)
		return
	}
	fmt.Fprintln(w, errs.Error())
	fmt.Fprintf(w, "%s: configuration %s refused: %d %s\n", name, path, errs.Len(), plural(errs.Len(), "error"))
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// The keys a service's logger carries on every line: ServiceKey, set by Run,
// names the service; SelfKey, set by ServiceLogger, the node it runs on. A
// line about a node (a heartbeat heard, a claim made) says which under
// "node", so no JSON line carries a key twice: log pipelines keep only one
// of two equal keys.
const (
	ServiceKey = "service"
	SelfKey    = "self"
)

// ServiceLogger is log with the service's own node under SelfKey; every
// service's constructor derives its logger with it.
func ServiceLogger(log *slog.Logger, node string) *slog.Logger {
	return log.With(SelfKey, node)
}

// NewLogger builds the slog logger fan services use.
func NewLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	o := &slog.HandlerOptions{Level: l}
	switch strings.ToLower(format) {
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	}
	return nil, fmt.Errorf("log format %q: want json or text", format)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Releaser is implemented by a Service that holds node resources which must
// never outlive it, such as the ipmover's floating addresses. ReleaseAll
// removes every one of them using only local state (never the bus: it runs
// when the service is dead, maybe because the bus is). It must be
// idempotent: systemd runs it (`-release-all` in ExecStopPost) after every
// stop, including the clean ones that already released.
type Releaser interface {
	ReleaseAll(ctx context.Context) error
}

// releaseTimeout bounds -release-all; ExecStopPost has its own timeout too.
const releaseTimeout = 10 * time.Second

func releaseAll(svc Service, name string, log *slog.Logger) int {
	r, ok := svc.(Releaser)
	if !ok {
		fmt.Fprintf(stderr, "%s: -release-all: this service holds no node resources\n", name)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := r.ReleaseAll(ctx); err != nil {
		log.Error("release-all failed", "err", err)
		return 1
	}
	log.Info("released all node resources")
	return 0
}
