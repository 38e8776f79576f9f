package site

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/fanpbx/fan/pkg/platform/durablefile"
)

// System runs the host's commands (systemctl, sysctl, runuser, ip,
// asterisk). Tests give a recording one.
type System interface {
	Run(ctx context.Context, name string, args ...string) ([]byte, error)
}

// Exec is the System of a real host.
type Exec struct{}

// Run runs name with args and returns what it printed, both streams.
func (Exec) Run(ctx context.Context, name string, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return out, nil
}

// InstallOptions of one install-host run.
type InstallOptions struct {
	// Root prefixes every path written (tests, or a system image being
	// built); with it nothing is started, checked or applied.
	Root string
	// DryRun says what would change and changes nothing.
	DryRun bool
	// NoStart installs the files without starting or restarting units.
	NoStart bool
	// Force installs even when no address of this machine is the host's.
	Force bool
	// RestartIPMover restarts a changed fan-ipmover even while this host
	// holds a floating address (the restart releases it: calls drop).
	RestartIPMover bool
	// NoAsterisk leaves /etc/asterisk alone.
	NoAsterisk bool
	Sys        System
	Out        io.Writer
	// Addrs lists this machine's addresses (nil: its interfaces').
	Addrs func() ([]netip.Addr, error)
}

// InstallReport is what a run did.
type InstallReport struct {
	Changed    []string // destination paths written
	Unchanged  int
	Started    []string
	Restarted  []string
	Reloaded   []string
	Deferred   []string // units changed but not restarted, and why
	CheckFails []string // units whose configuration its service refused
	Warnings   []string
}

// errRefused says install-host changed nothing because the host is not
// ready for it.
var errRefused = errors.New("not installed")

// InstallHost carries out a bundle's plan on this host.
func InstallHost(ctx context.Context, bundle string, o InstallOptions) (InstallReport, error) {
	var rep InstallReport
	if o.Sys == nil {
		o.Sys = Exec{}
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	p, err := ReadPlan(bundle)
	if err != nil {
		return rep, err
	}
	live := o.Root == ""
	if err := preflight(p, o); err != nil {
		return rep, err
	}
	path := func(p string) string { return filepath.Join(o.Root, p) }

	// Directories, then files.
	for _, d := range p.Dirs {
		if o.DryRun {
			continue
		}
		if err := os.MkdirAll(path(d.Path), os.FileMode(d.Mode)); err != nil {
			return rep, fmt.Errorf("install-host: %w", err)
		}
		if err := own(path(d.Path), d.Owner, d.Group, os.FileMode(d.Mode), live); err != nil {
			return rep, err
		}
	}
	changedUnits := map[string]bool{}
	// restartUnits are the changed units a reload does not suffice for.
	restartUnits := map[string]bool{}
	for _, f := range p.Files {
		data, err := os.ReadFile(filepath.Join(bundle, FilesDir, f.Path))
		if err != nil {
			return rep, fmt.Errorf("install-host: bundle %s: %w", bundle, err)
		}
		same, err := sameFile(path(f.Path), data, f, live)
		if err != nil {
			return rep, err
		}
		if same {
			rep.Unchanged++
			continue
		}
		rep.Changed = append(rep.Changed, f.Path)
		for _, u := range f.Units {
			changedUnits[u] = true
			if !f.Reload {
				restartUnits[u] = true
			}
		}
		if o.DryRun {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path(f.Path)), 0o755); err != nil {
			return rep, fmt.Errorf("install-host: %w", err)
		}
		if err := durablefile.Write(path(f.Path), data, os.FileMode(f.Mode)); err != nil {
			return rep, fmt.Errorf("install-host: %w", err)
		}
		if err := own(path(f.Path), f.Owner, f.Group, os.FileMode(f.Mode), live); err != nil {
			return rep, err
		}
	}
	if p.ManagerUser != "" && !o.NoAsterisk {
		changed, warn, err := installManagerUser(ctx, bundle, p, o, path)
		if err != nil {
			return rep, err
		}
		if changed {
			rep.Changed = append(rep.Changed, filepath.Join(AsteriskDir, ManagerInclude))
		}
		if warn != "" {
			rep.Warnings = append(rep.Warnings, warn)
		}
	}
	if !live || o.DryRun {
		return rep, nil
	}
	if p.Sysctl != "" && (slices.Contains(rep.Changed, p.Sysctl) || !nonlocalBind()) {
		if _, err := o.Sys.Run(ctx, "sysctl", "-q", "-p", p.Sysctl); err != nil {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s could not be applied now (%v); it applies at the next boot, and fanctl doctor checks the live value", p.Sysctl, err))
		}
	}
	failed := checkConfigs(ctx, p, o)
	rep.CheckFails = failed
	if o.NoStart {
		return rep, nil
	}
	holds := holdsAddress(ctx, o.Sys)
	for _, u := range p.Units {
		if slices.Contains(failed, u) {
			continue
		}
		active := unitActive(ctx, o.Sys, u)
		switch {
		case !active:
			args := []string{"enable", "--now", u}
			// fan-nats answers before anything dials it; the services wait
			// for the streams, which exist only once every host is
			// installed and the admin has provisioned them.
			if u != "fan-nats" {
				args = []string{"enable", "--now", "--no-block", u}
			}
			if _, err := o.Sys.Run(ctx, "systemctl", args...); err != nil {
				return rep, fmt.Errorf("install-host: %w", err)
			}
			rep.Started = append(rep.Started, u)
		case changedUnits[u] && u == "fan-ipmover" && holds && !o.RestartIPMover:
			rep.Deferred = append(rep.Deferred, u+": this host holds a floating address and restarting the ipmover releases it; move it first (fanctl node standby "+p.Host+"), then systemctl restart fan-ipmover, or run again with --restart-ipmover")
		case changedUnits[u] && !restartUnits[u]:
			if _, err := o.Sys.Run(ctx, "systemctl", "reload", u); err != nil {
				return rep, fmt.Errorf("install-host: %w", err)
			}
			rep.Reloaded = append(rep.Reloaded, u)
		case changedUnits[u]:
			args := []string{"restart", "--no-block", u}
			if u == "fan-nats" {
				args = []string{"restart", u}
			}
			if _, err := o.Sys.Run(ctx, "systemctl", args...); err != nil {
				return rep, fmt.Errorf("install-host: %w", err)
			}
			rep.Restarted = append(rep.Restarted, u)
		}
	}
	return rep, nil
}

// preflight refuses a bundle this machine is not ready for or is not meant
// for, before anything is written.
func preflight(p Plan, o InstallOptions) error {
	if o.Root != "" {
		return nil
	}
	if o.Force {
		return accounts(p)
	}
	want, err := netip.ParseAddr(p.Address)
	if err != nil {
		return fmt.Errorf("install-host: plan address %q: %w", p.Address, err)
	}
	addrs := o.Addrs
	if addrs == nil {
		addrs = localAddrs
	}
	have, err := addrs()
	if err != nil {
		return fmt.Errorf("install-host: this machine's addresses: %w", err)
	}
	if !slices.Contains(have, want) {
		return fmt.Errorf("install-host: %w: this is the bundle of %s (%s), and no interface of this machine has %s; copy hosts/<this host> here, or --force if the address is not up yet", errRefused, p.Host, p.Address, p.Address)
	}
	return accounts(p)
}

// accounts refuses a host without root or the package's users.
func accounts(p Plan) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("install-host: %w: run it as root (it writes /etc/fan and starts units)", errRefused)
	}
	if _, err := user.Lookup(UserFan); err != nil {
		return fmt.Errorf("install-host: %w: no user %s: install the fan package first", errRefused, UserFan)
	}
	for _, d := range p.Dirs {
		if d.Group == UserStatus {
			if _, err := user.LookupGroup(UserStatus); err != nil {
				return fmt.Errorf("install-host: %w: no group %s: install a fan package that has the status page's user", errRefused, UserStatus)
			}
		}
	}
	return nil
}

func localAddrs() ([]netip.Addr, error) {
	as, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range as {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}

// sameFile says whether path already holds data with f's owner and mode.
func sameFile(path string, data []byte, f PlanFile, live bool) (bool, error) {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("install-host: %w", err)
	}
	cur, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("install-host: %w", err)
	}
	if !bytes.Equal(cur, data) || st.Mode().Perm() != os.FileMode(f.Mode).Perm() {
		return false, nil
	}
	if !live {
		return true, nil
	}
	uid, gid, err := ids(f.Owner, f.Group)
	if err != nil {
		return false, err
	}
	return ownedBy(st, uid, gid), nil
}

func ids(owner, group string) (int, int, error) {
	u, err := user.Lookup(owner)
	if err != nil {
		return 0, 0, fmt.Errorf("install-host: user %s: %w", owner, err)
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, 0, fmt.Errorf("install-host: group %s: %w", group, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(g.Gid)
	return uid, gid, nil
}

// own gives path its owner and mode (the owner only on a live host: a
// test's root has no such users).
func own(path, owner, group string, mode os.FileMode, live bool) error {
	if live {
		uid, gid, err := ids(owner, group)
		if err != nil {
			return err
		}
		if err := os.Lchown(path, uid, gid); err != nil {
			return fmt.Errorf("install-host: %w", err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		return fmt.Errorf("install-host: %w", err)
	}
	return nil
}

// installManagerUser puts fan's AMI user in Asterisk's manager.d and makes
// manager.conf include it. It touches nothing else of Asterisk's: the
// transports and endpoints are the operator's (the bundle's asterisk/ has
// examples, and fanctl doctor checks them).
func installManagerUser(ctx context.Context, bundle string, p Plan, o InstallOptions, path func(string) string) (bool, string, error) {
	dir := path(AsteriskDir)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return false, fmt.Sprintf("%s does not exist: install Asterisk, then run install-host again (or add fan's AMI user from %s yourself)", AsteriskDir, filepath.Join(bundle, p.ManagerUser)), nil
	}
	data, err := os.ReadFile(filepath.Join(bundle, p.ManagerUser))
	if err != nil {
		return false, "", fmt.Errorf("install-host: %w", err)
	}
	dest := filepath.Join(dir, ManagerInclude)
	changed := false
	if cur, err := os.ReadFile(dest); err != nil || !bytes.Equal(cur, data) {
		changed = true
		if o.DryRun {
			return true, "", nil
		}
		if err := os.MkdirAll(filepath.Dir(dest), 0o755); err != nil {
			return false, "", fmt.Errorf("install-host: %w", err)
		}
		// Asterisk reads it as its own user; nobody else may.
		group := "root"
		if _, err := user.LookupGroup("asterisk"); err == nil {
			group = "asterisk"
		}
		if err := durablefile.Write(dest, data, 0o640); err != nil {
			return false, "", fmt.Errorf("install-host: %w", err)
		}
		if err := own(dest, "root", group, 0o640, o.Root == ""); err != nil {
			return false, "", err
		}
	}
	conf := filepath.Join(dir, ManagerConf)
	cur, err := os.ReadFile(conf)
	if errors.Is(err, fs.ErrNotExist) {
		return changed, fmt.Sprintf("%s does not exist: AMI is off; create it with [general] enabled = yes, bindaddr = 127.0.0.1 and the line #include \"%s\"", filepath.Join(AsteriskDir, ManagerConf), ManagerInclude), nil
	}
	if err != nil {
		return changed, "", fmt.Errorf("install-host: %w", err)
	}
	if !includes(cur, ManagerInclude) {
		changed = true
		if o.DryRun {
			return true, "", nil
		}
		add := "\n; fan's AMI user (fanctl install-host)\n#include \"" + ManagerInclude + "\"\n"
		st, err := os.Stat(conf)
		if err != nil {
			return changed, "", fmt.Errorf("install-host: %w", err)
		}
		if err := durablefile.Write(conf, append(bytes.TrimRight(cur, "\n"), add...), st.Mode().Perm()); err != nil {
			return changed, "", fmt.Errorf("install-host: %w", err)
		}
		if o.Root == "" {
			if err := restoreOwner(conf, st); err != nil {
				return changed, "", err
			}
		}
	}
	if changed && o.Root == "" {
		// A running Asterisk learns the user at once; one that is not
		// running reads it when it starts.
		if _, err := exec.LookPath("asterisk"); err == nil {
			_, _ = o.Sys.Run(ctx, "asterisk", "-rx", "manager reload")
		}
	}
	return changed, "", nil
}

// includes says whether manager.conf already includes name.
func includes(conf []byte, name string) bool {
	for _, line := range strings.Split(string(conf), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#include") || strings.HasPrefix(line, "#tryinclude") {
			if strings.Contains(line, name) || strings.Contains(line, "manager.d/*") {
				return true
			}
		}
	}
	return false
}

// checkConfigs runs each unit's -check-config as the unit's user, so a
// configuration the service would refuse is named now, not at its start.
func checkConfigs(ctx context.Context, p Plan, o InstallOptions) []string {
	var failed []string
	for _, u := range p.Units {
		svc := strings.TrimPrefix(u, "fan-")
		var argv []string
		switch svc {
		case "status":
			continue // fanctl serve checks its file when it starts
		case "nats":
			argv = []string{"fan-nats", "-config", filepath.Join(EtcDir, "nats.yaml"), "-check-config"}
		default:
			argv = []string{"fan-" + svc, "-check-config", filepath.Join(EtcDir, svc+".yaml")}
		}
		// The replicator runs as root; every other service as fan.
		if svc != "replicator" {
			argv = append([]string{"-u", UserFan, "--"}, argv...)
			argv = append([]string{"runuser"}, argv...)
		}
		out, err := o.Sys.Run(ctx, argv[0], argv[1:]...)
		if err != nil {
			failed = append(failed, u)
			fmt.Fprintf(o.Out, "%s: configuration refused:\n%s\n", u, indentLines(string(out)))
		}
	}
	return failed
}

func indentLines(s string) string {
	s = strings.TrimRight(s, "\n")
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}

func unitActive(ctx context.Context, sys System, unit string) bool {
	out, _ := sys.Run(ctx, "systemctl", "is-active", unit)
	st := strings.TrimSpace(string(out))
	return st == "active" || st == "activating" || st == "reloading"
}

// holdsAddress says whether this host carries a floating address now: the
// ipmover labels every address it adds (<ifname>:fan).
func holdsAddress(ctx context.Context, sys System) bool {
	out, err := sys.Run(ctx, "ip", "-o", "addr", "show", "label", "*:fan")
	return err == nil && strings.TrimSpace(string(out)) != ""
}

func nonlocalBind() bool {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_nonlocal_bind")
	return err == nil && strings.TrimSpace(string(b)) == "1"
}

func ownedBy(st fs.FileInfo, uid, gid int) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && int(sys.Uid) == uid && int(sys.Gid) == gid
}

// restoreOwner gives a rewritten file the owner it had.
func restoreOwner(path string, was fs.FileInfo) error {
	sys, ok := was.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if err := os.Lchown(path, int(sys.Uid), int(sys.Gid)); err != nil {
		return fmt.Errorf("install-host: %w", err)
	}
	return nil
}
