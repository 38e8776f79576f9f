// Package app builds the ipmover from its file. `executor:` selects one
// executor, each in its own package with its own configuration type:
// ip (ipexec, the default: floating addresses), dns (dnsexec: a DNS name
// between sites) or dispatcher (dispatchexec: a Kamailio dispatcher set).
// The file is then read strictly as that executor's configuration, so a
// key that belongs to another executor (interface: under executor: dns) is
// refused like any unknown key, never silently ignored.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"strings"

	"github.com/fanpbx/fan/pkg/platform/config"
	"github.com/fanpbx/fan/pkg/platform/daemon"
	"github.com/fanpbx/fan/services/ipmover/internal/dispatchexec"
	"github.com/fanpbx/fan/services/ipmover/internal/dnsexec"
	"github.com/fanpbx/fan/services/ipmover/internal/ipexec"
)

// Executors (the file's executor: key).
const (
	ExecutorIP         = "ip"
	ExecutorDNS        = "dns"
	ExecutorDispatcher = "dispatcher"
)

// The file as each executor reads it: the selector and its own keys.
type (
	ipFile struct {
		Executor      string `yaml:"executor"`
		ipexec.Config `yaml:",inline"`
	}
	dnsFile struct {
		Executor       string `yaml:"executor"`
		dnsexec.Config `yaml:",inline"`
	}
	dispatcherFile struct {
		Executor            string `yaml:"executor"`
		dispatchexec.Config `yaml:",inline"`
	}
)

// files maps each executor to its file type, for the key check below.
var files = map[string]any{ExecutorIP: ipFile{}, ExecutorDNS: dnsFile{}, ExecutorDispatcher: dispatcherFile{}}

// Build loads and validates the configuration, and checks what it names on
// this host (the executor's config.HostChecker: the bus's files, the state
// file's directory, the interface; not for -release-all, which must release
// whatever the host has become); it starts nothing.
func Build(o daemon.Options) (daemon.Service, error) {
	b, err := os.ReadFile(o.ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", o.ConfigPath, err)
	}
	svc, warnings, err := parseFile(o.ConfigPath, b, o.Logger, o.Version, !o.SkipHostChecks)
	o.Warnings(warnings)
	if err != nil {
		return nil, err
	}
	return svc, nil
}

// Parse is Build for a file already read, without the checks of the host;
// name is used in error messages.
func Parse(name string, b []byte, log *slog.Logger, version string) (daemon.Service, error) {
	svc, _, err := parseFile(name, b, log, version, false)
	return svc, err
}

func parseFile(name string, b []byte, log *slog.Logger, version string, host bool) (daemon.Service, []string, error) {
	// Only the selector first, every other key let through: the strict
	// read as the selected executor's file follows.
	var sel struct {
		Executor string         `yaml:"executor"`
		Rest     map[string]any `yaml:",inline"`
	}
	doc, ok := config.Decode(name, b, &sel)
	if !ok {
		_, err := doc.Report()
		return nil, nil, err
	}
	switch sel.Executor {
	case "", ExecutorIP:
		var f ipFile
		warnings, err := parseAs(name, b, &f, ExecutorIP, host)
		if err != nil {
			return nil, warnings, err
		}
		return ipexec.New(f.Config, log, version), warnings, nil
	case ExecutorDNS:
		var f dnsFile
		warnings, err := parseAs(name, b, &f, ExecutorDNS, host)
		if err != nil {
			return nil, warnings, err
		}
		return noRelease{dnsexec.New(f.Config, log, version)}, warnings, nil
	case ExecutorDispatcher:
		var f dispatcherFile
		warnings, err := parseAs(name, b, &f, ExecutorDispatcher, host)
		if err != nil {
			return nil, warnings, err
		}
		return noRelease{dispatchexec.New(f.Config, log, version)}, warnings, nil
	default:
		_, err := doc.Report(config.Errf("executor", "unknown executor %q (ip, dns, dispatcher)", sel.Executor))
		return nil, nil, err
	}
}

// parseAs reads the file strictly into dst (and, with host, checks what it
// names on this host), and says so when a refused key is one of another
// executor's.
func parseAs(name string, b []byte, dst any, executor string, host bool) ([]string, error) {
	var warnings []string
	var err error
	if host {
		warnings, err = config.CheckBytes(name, b, dst)
	} else {
		err = config.Parse(name, b, dst)
	}
	var errs *config.Errors
	if !errors.As(err, &errs) {
		return warnings, err
	}
	for _, it := range errs.Items {
		var fe *config.FieldError
		if !errors.As(it.Err, &fe) || !errors.Is(fe.Err, config.ErrUnknownKey) || strings.ContainsAny(fe.Key, ".[") {
			continue
		}
		for _, other := range []string{ExecutorIP, ExecutorDNS, ExecutorDispatcher} {
			if other != executor && slices.Contains(keys(reflect.TypeOf(files[other])), fe.Key) {
				fe.Err = otherExecutorKey{other: other, executor: executor}
				break
			}
		}
	}
	return warnings, err
}

// otherExecutorKey refuses a key that belongs to another executor's file.
type otherExecutorKey struct{ other, executor string }

func (e otherExecutorKey) Error() string {
	return fmt.Sprintf("a key of executor %s, not of executor %s", e.other, e.executor)
}

func (e otherExecutorKey) Unwrap() error { return config.ErrUnknownKey }

// keys lists the top-level YAML keys of a file type.
func keys(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		switch {
		case opts == "inline" && f.Type.Kind() == reflect.Struct:
			out = append(out, keys(f.Type)...)
		case tag != "" && tag != "-":
			out = append(out, tag)
		}
	}
	return out
}

// noRelease is an executor that leaves nothing on the node: -release-all
// (systemd's ExecStopPost, the same unit for every executor) has nothing to
// do, since a DNS name or a dispatcher set stays as the arbiter last set it.
type noRelease struct{ daemon.Service }

// ReleaseAll implements daemon.Releaser.
func (noRelease) ReleaseAll(context.Context) error { return nil }
