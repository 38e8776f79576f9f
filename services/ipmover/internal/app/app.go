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
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/fanpbx/fan/pkg/platform/bus"
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

// Build loads and validates the configuration; it starts nothing.
func Build(o daemon.Options) (daemon.Service, error) {
	b, err := os.ReadFile(o.ConfigPath)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", o.ConfigPath, err)
	}
	svc, err := Parse(o.ConfigPath, b, o.Logger, o.Version)
	if err != nil {
		return nil, err
	}
	// The bus credentials must be there, and the state file is created at
	// the first start in a directory that must exist (the unit's
	// StateDirectory, the package's tmpfiles.d): -check-config names a
	// missing one. Only here, not in Parse: a configuration is also parsed
	// where the paths are not this host's.
	var files struct {
		Bus       bus.Config `yaml:"bus"`
		StateFile string     `yaml:"state_file"`
	}
	_ = yaml.Unmarshal(b, &files) // Parse has read it strictly already
	common := daemon.Common{Bus: files.Bus}
	if err := config.First(common.CheckFiles(), config.ParentDirExists("state_file", files.StateFile)); err != nil {
		return nil, fmt.Errorf("config %s: %w", o.ConfigPath, err)
	}
	return svc, nil
}

// Parse is Build for a file already read; name is used in error messages.
func Parse(name string, b []byte, log *slog.Logger, version string) (daemon.Service, error) {
	var sel struct {
		Executor string `yaml:"executor"`
	}
	// Only the selector, leniently: the strict read follows.
	if err := yaml.Unmarshal(b, &sel); err != nil {
		return nil, fmt.Errorf("config %s: %w", name, err)
	}
	switch sel.Executor {
	case "", ExecutorIP:
		var f ipFile
		if err := parseAs(name, b, &f, ExecutorIP); err != nil {
			return nil, err
		}
		return ipexec.New(f.Config, log, version), nil
	case ExecutorDNS:
		var f dnsFile
		if err := parseAs(name, b, &f, ExecutorDNS); err != nil {
			return nil, err
		}
		return noRelease{dnsexec.New(f.Config, log, version)}, nil
	case ExecutorDispatcher:
		var f dispatcherFile
		if err := parseAs(name, b, &f, ExecutorDispatcher); err != nil {
			return nil, err
		}
		return noRelease{dispatchexec.New(f.Config, log, version)}, nil
	default:
		return nil, fmt.Errorf("config %s: %w", name, config.Errf("executor", "unknown executor %q (ip, dns, dispatcher)", sel.Executor))
	}
}

var unknownField = regexp.MustCompile(`field (\S+) not found in type`)

// parseAs reads the file strictly into dst, and says so when a refused key
// is one of another executor's.
func parseAs(name string, b []byte, dst any, executor string) error {
	err := config.Parse(name, b, dst)
	var te *yaml.TypeError
	if err == nil || !errors.As(err, &te) {
		return err
	}
	var why []string
	for _, msg := range te.Errors {
		m := unknownField.FindStringSubmatch(msg)
		if m == nil {
			continue
		}
		for _, other := range []string{ExecutorIP, ExecutorDNS, ExecutorDispatcher} {
			if other != executor && slices.Contains(keys(reflect.TypeOf(files[other])), m[1]) {
				why = append(why, fmt.Sprintf("%s: a key of executor %s, not of executor %s", m[1], other, executor))
				break
			}
		}
	}
	if len(why) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(why, "; "))
}

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
