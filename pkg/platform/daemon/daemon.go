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
}

// Builder loads the configuration at opts.ConfigPath and builds the service
// without starting anything, so --check-config can use it too.
type Builder func(opts Options) (Service, error)

// Commit is the commit a release binary was built from; the Makefile sets it
// (-X) next to main.version. Empty in a plain `go build`.
var Commit string

// VersionLine is what --version prints: the name, the release version
// (v0.1.0, or git describe's v0.1.0-3-gabc1234 between tags), the commit and
// the Go toolchain, so a bug report names exactly what ran.
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
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, VersionLine(name, version))
		return 0
	}
	if *check && fs.NArg() == 1 {
		*cfgPath = fs.Arg(0)
	}
	log, err := NewLogger(os.Stderr, *level, *format)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 2
	}
	log = log.With("service", name)

	svc, err := build(Options{ConfigPath: *cfgPath, Logger: log, Version: version})
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", name, err)
		return 1
	}
	if *check {
		fmt.Fprintf(os.Stdout, "%s: configuration %s is valid\n", name, *cfgPath)
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
				sup.reload(ctx, svc, build, Options{ConfigPath: *cfgPath, Logger: log, Version: version})
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
		fmt.Fprintf(os.Stderr, "%s: -release-all: this service holds no node resources\n", name)
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
