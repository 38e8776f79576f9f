package fanctl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fanpbx/fan/cmd/internal/site"
)

// runInit derives every host's bundle, the people's and the admin's from
// the site file.
func runInit(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	file := fs.String("site", "site.yaml", "the site file")
	out := fs.String("out", "fan-site", "output directory (kept: its CA, keys and secrets are reused on every run; back it up)")
	renew := fs.Bool("renew", false, "reissue every certificate from the same CA (keys are kept)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	raw, err := os.ReadFile(*file)
	if err != nil {
		return fmt.Errorf("init: %w", err)
	}
	s, warns, err := site.Load(*file)
	for _, w := range warns {
		fmt.Fprintf(stderr, "fanctl init: warning: %s: %s\n", *file, w)
	}
	if err != nil {
		return err
	}
	res, err := site.Init(s, site.InitOptions{Out: *out, Renew: *renew, SiteFile: raw})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "site %s: %s, %s; bundles in %s\n", s.Cluster, count(len(s.Hosts), "host"), count(len(s.Groups), "group"), filepath.Join(*out, site.HostsOut))
	var todo []string
	for _, h := range res.Hosts {
		dir := filepath.Join(*out, site.HostsOut, h.Host)
		switch {
		case h.New:
			fmt.Fprintf(stdout, "  %-12s new: copy %s to %s and run its %s\n", h.Host, dir, h.Host, site.InstallScript)
			todo = append(todo, h.Host)
		case h.Needed():
			what := append(append([]string{}, h.Changed...), h.Removed...)
			fmt.Fprintf(stdout, "  %-12s changed (%s): copy %s to %s again and run its %s\n", h.Host, strings.Join(what, ", "), dir, h.Host, site.InstallScript)
			todo = append(todo, h.Host)
		default:
			fmt.Fprintf(stdout, "  %-12s unchanged\n", h.Host)
		}
	}
	for _, g := range res.Gone {
		fmt.Fprintf(stdout, "  %-12s no longer in the site: its bundle is removed; take fan off that host (docs/operations.md, Uninstall)\n", g)
	}
	if res.CertsRenewed > 0 {
		fmt.Fprintf(stdout, "renewed %d certificates\n", res.CertsRenewed)
	}
	for _, p := range res.People {
		fmt.Fprintf(stdout, "  %s: fanctl --config %s\n", p, filepath.Join(*out, p, "fanctl.yaml"))
	}
	if len(todo) == 0 {
		fmt.Fprintln(stdout, "no host needs a new bundle")
	} else {
		fmt.Fprintf(stdout, "hosts that need the new bundle: %s\n", strings.Join(todo, " "))
	}
	fmt.Fprintf(stdout, "keep %s under backup, readable by you only: it holds the CA's key and every secret of the site\n", *out)
	return nil
}

// runInstallHost carries out one host's bundle on this host.
func runInstallHost(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("install-host", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o site.InstallOptions
	fs.BoolVar(&o.DryRun, "dry-run", false, "say what would change, change nothing")
	fs.BoolVar(&o.NoStart, "no-start", false, "install the files, start or restart nothing")
	fs.BoolVar(&o.Force, "force", false, "install even though no address of this machine is the host's")
	fs.BoolVar(&o.RestartIPMover, "restart-ipmover", false, "restart a changed fan-ipmover even while this host holds a floating address (calls drop)")
	fs.BoolVar(&o.NoAsterisk, "no-asterisk", false, "leave /etc/asterisk alone (add fan's AMI user yourself)")
	fs.StringVar(&o.Root, "root", "", "install under this directory instead of / and start nothing (building an image)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("install-host: the host's bundle is missing (DIR/hosts/NAME from fanctl init)")
	}
	bundle := fs.Arg(0)
	o.Out = stdout
	rep, err := site.InstallHost(ctx, bundle, o)
	if err != nil {
		return err
	}
	p, err := site.ReadPlan(bundle)
	if err != nil {
		return err
	}
	verb := "installed"
	if o.DryRun {
		verb = "would install"
	}
	fmt.Fprintf(stdout, "%s fan %s host %s of site %s: %s written, %d unchanged\n", verb, p.Role, p.Host, p.Cluster, count(len(rep.Changed), "file"), rep.Unchanged)
	// On a first install every file is new; on a later one, what changed
	// is what the operator wants to see.
	if rep.Unchanged > 0 || o.DryRun {
		for _, f := range rep.Changed {
			fmt.Fprintf(stdout, "  wrote %s\n", f)
		}
	}
	if len(rep.Started) > 0 {
		fmt.Fprintf(stdout, "started: %s\n", strings.Join(rep.Started, " "))
	}
	if len(rep.Restarted) > 0 {
		fmt.Fprintf(stdout, "restarted: %s\n", strings.Join(rep.Restarted, " "))
	}
	if len(rep.Reloaded) > 0 {
		fmt.Fprintf(stdout, "reloaded: %s\n", strings.Join(rep.Reloaded, " "))
	}
	for _, d := range rep.Deferred {
		fmt.Fprintf(stdout, "not restarted: %s\n", d)
	}
	for _, w := range rep.Warnings {
		fmt.Fprintf(stderr, "fanctl install-host: warning: %s\n", w)
	}
	if len(rep.CheckFails) > 0 {
		return fmt.Errorf("install-host: %s refused their configuration (above) and were not started", strings.Join(rep.CheckFails, ", "))
	}
	if o.DryRun || o.Root != "" {
		return nil
	}
	if !slices.Contains(rep.Started, "fan-nats") {
		fmt.Fprintln(stdout, "next: check this host: fanctl doctor")
		return nil
	}
	// A first install: the services wait for the streams.
	fmt.Fprintln(stdout, "next: when every host of the site is installed, create the streams once, from the admin's bundle:")
	fmt.Fprintln(stdout, "  fanctl --config <init's output>/admin/fanctl.yaml provision")
	fmt.Fprintln(stdout, "then check this host: fanctl doctor")
	return nil
}

// The help and completion of init and install-host (help.go).
func init() {
	registerCommand(commandSpec{Name: "init", Section: sectionInstall, Synopsis: "[--site site.yaml] [--out fan-site] [--renew]",
		Summary:  "derive every host's bundle, the people's and the admin's from the site file",
		Examples: []string{"fanctl init --site site.yaml --out fan-site", "fanctl init --site site.yaml --out fan-site --renew"},
		Values:   map[string]valueKind{"site": kindFile, "out": kindDir}})
	registerCommand(commandSpec{Name: "install-host", Section: sectionInstall,
		Synopsis: "BUNDLE [--dry-run] [--no-start] [--force] [--restart-ipmover] [--no-asterisk] [--root DIR]",
		Summary:  "carry out one host's bundle (DIR/hosts/NAME from fanctl init) on this host",
		Examples: []string{"fanctl install-host fan-site/hosts/pbx-a --dry-run", "fanctl install-host fan-site/hosts/pbx-a"},
		Values:   map[string]valueKind{"root": kindDir},
		Args:     []argSpec{{Name: "BUNDLE", Kind: kindDir}}})
}

// count writes n things, singular or plural.
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
