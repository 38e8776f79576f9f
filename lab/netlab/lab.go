package netlab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"
)

// Host names of the non-node hosts every lab has.
const (
	ClientHost  = "c"
	ControlHost = "ctl"
)

const (
	lanName    = "lan"
	bridgeName = "br0"
	portPrefix = "veth-"
	hostIf     = "eth0"
	netnsDir   = "/run/netns"
)

// DefaultFloatingIP is the address the PBX nodes take turns holding.
var DefaultFloatingIP = netip.MustParsePrefix("198.51.100.10/24")

// Role says what a host is for; only nodes get ip_nonlocal_bind.
type Role int

const (
	RoleNode Role = iota
	RoleClient
	RoleControl
)

func (r Role) String() string {
	switch r {
	case RoleNode:
		return "node"
	case RoleClient:
		return "client"
	case RoleControl:
		return "control"
	}
	return fmt.Sprintf("role(%d)", int(r))
}

// HostSpec describes one host. An empty MAC lets the kernel choose one.
type HostSpec struct {
	Name string
	Addr netip.Prefix
	MAC  string
}

// Spec describes a lab. The zero value gives the standard two-node lab.
type Spec struct {
	// Prefix names the lab's namespaces; empty picks a free "fan" + 4 hex digits. A
	// caller-chosen prefix must still match that pattern so Sweep can recognise it.
	Prefix string
	// Nodes defaults to n1 198.51.100.11/24 and n2 198.51.100.12/24.
	Nodes []HostSpec
	// Client defaults to c 198.51.100.50/24, Control to ctl 198.51.100.2/24.
	Client  HostSpec
	Control HostSpec
	// Extra hosts have the control role (no floating IP, no PBX): the
	// dedicated NATS hosts of a three-server bus, for example.
	Extra []HostSpec
	// Clients are client hosts besides Client: the namespaces phones live
	// in (PhoneHosts), for example.
	Clients []HostSpec
	// FloatingIP is not assigned by Build; it is recorded for callers. Default
	// DefaultFloatingIP.
	FloatingIP netip.Prefix
	// Dir is where the lab's temp dir is made; empty means os.TempDir().
	Dir string
	// StopTimeout is how long Proc.Stop and Close wait after SIGTERM before SIGKILL.
	// Default 3s.
	StopTimeout time.Duration
	// Logger receives lab lifecycle messages; nil discards them.
	Logger *slog.Logger
}

// DefaultNodes returns the standard node pair.
func DefaultNodes() []HostSpec {
	return []HostSpec{
		{Name: "n1", Addr: netip.MustParsePrefix("198.51.100.11/24"), MAC: "02:fa:00:00:00:11"},
		{Name: "n2", Addr: netip.MustParsePrefix("198.51.100.12/24"), MAC: "02:fa:00:00:00:12"},
	}
}

// NATSHosts are the three hosts apart from the PBX nodes that the
// dedicated topology runs its NATS servers (and arbiter replicas) on.
func NATSHosts() []HostSpec {
	return []HostSpec{
		{Name: "s1", Addr: netip.MustParsePrefix("198.51.100.21/24"), MAC: "02:fa:00:00:00:21"},
		{Name: "s2", Addr: netip.MustParsePrefix("198.51.100.22/24"), MAC: "02:fa:00:00:00:22"},
		{Name: "s3", Addr: netip.MustParsePrefix("198.51.100.23/24"), MAC: "02:fa:00:00:00:23"},
	}
}

// PhoneHosts are two client hosts for phones, so that audio between two
// phones crosses the LAN as it does between desks.
func PhoneHosts() []HostSpec {
	return []HostSpec{
		{Name: "pa", Addr: netip.MustParsePrefix("198.51.100.51/24"), MAC: "02:fa:00:00:00:51"},
		{Name: "pb", Addr: netip.MustParsePrefix("198.51.100.52/24"), MAC: "02:fa:00:00:00:52"},
	}
}

// Host is one built host.
type Host struct {
	Name string
	Role Role
	// NS is the network namespace name (usable with `ip -n` and `ip netns exec`).
	NS string
	// Port is the bridge-side veth, inside the lab's LAN namespace.
	Port string
	Addr netip.Prefix
	// MAC is eth0's hardware address, lower case.
	MAC string
}

// Lab is a built lab. All methods are safe for concurrent use.
type Lab struct {
	prefix      string
	dir         string
	lanNS       string
	floating    netip.Prefix
	stopTimeout time.Duration
	log         *slog.Logger

	hosts  []*Host
	byName map[string]*Host

	mu     sync.Mutex
	closed bool
	procs  []*Proc
	// made lists namespaces in creation order, so a failed Build can undo exactly what
	// it did.
	made []string

	closeOnce sync.Once
	closeErr  error
}

var (
	prefixRE   = regexp.MustCompile(`^fan[0-9a-f]{4}$`)
	hostNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,7}$`)
	docNets    = []netip.Prefix{
		netip.MustParsePrefix("192.0.2.0/24"),
		netip.MustParsePrefix("198.51.100.0/24"),
		netip.MustParsePrefix("203.0.113.0/24"),
	}
)

// allowedAddr reports whether a lab may use a: the test network safety rule of the
// project allows only the three documentation nets and loopback.
func allowedAddr(a netip.Addr) bool {
	a = a.Unmap()
	if a.IsLoopback() {
		return true
	}
	for _, n := range docNets {
		if n.Contains(a) {
			return true
		}
	}
	return false
}

// Build creates a lab. On error everything it made is already removed.
func Build(ctx context.Context, spec Spec) (*Lab, error) {
	log := spec.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	hosts, err := normalise(&spec)
	if err != nil {
		return nil, err
	}
	// Crashed runs leave namespaces holding addresses of the same range; clearing them
	// first keeps a new lab from inheriting their confusion.
	if removed, err := Sweep(log); err != nil {
		log.Warn("netlab: sweep before build", "err", err)
	} else if len(removed) > 0 {
		log.Info("netlab: swept leftovers", "namespaces", removed)
	}

	l := &Lab{
		floating:    spec.FloatingIP,
		stopTimeout: spec.StopTimeout,
		log:         log,
		byName:      map[string]*Host{},
	}
	if err := l.claim(spec.Prefix, spec.Dir); err != nil {
		return nil, err
	}
	l.lanNS = l.prefix + "-" + lanName
	l.log = log.With("lab", l.prefix)
	for _, hs := range hosts {
		h := &Host{Name: hs.spec.Name, Role: hs.role, NS: l.prefix + "-" + hs.spec.Name,
			Port: portPrefix + hs.spec.Name, Addr: hs.spec.Addr, MAC: strings.ToLower(hs.spec.MAC)}
		l.hosts = append(l.hosts, h)
		l.byName[h.Name] = h
	}
	start := time.Now()
	if err := l.build(ctx); err != nil {
		if cerr := l.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup after failed build: %w", cerr))
		}
		return nil, fmt.Errorf("build %s: %w", l.prefix, err)
	}
	l.log.Info("netlab: built", "hosts", len(l.hosts), "dir", l.dir, "took", time.Since(start))
	return l, nil
}

type hostPlan struct {
	spec HostSpec
	role Role
}

func normalise(spec *Spec) ([]hostPlan, error) {
	if len(spec.Nodes) == 0 {
		spec.Nodes = DefaultNodes()
	}
	if spec.Client.Name == "" {
		spec.Client.Name = ClientHost
	}
	if !spec.Client.Addr.IsValid() {
		spec.Client.Addr = netip.MustParsePrefix("198.51.100.50/24")
	}
	if spec.Client.MAC == "" {
		spec.Client.MAC = "02:fa:00:00:00:50"
	}
	if spec.Control.Name == "" {
		spec.Control.Name = ControlHost
	}
	if !spec.Control.Addr.IsValid() {
		spec.Control.Addr = netip.MustParsePrefix("198.51.100.2/24")
	}
	if spec.Control.MAC == "" {
		spec.Control.MAC = "02:fa:00:00:00:02"
	}
	if !spec.FloatingIP.IsValid() {
		spec.FloatingIP = DefaultFloatingIP
	}
	if spec.StopTimeout <= 0 {
		spec.StopTimeout = 3 * time.Second
	}
	if spec.Prefix != "" && !prefixRE.MatchString(spec.Prefix) {
		return nil, fmt.Errorf("netlab: prefix %q must match %s", spec.Prefix, prefixRE)
	}
	if !allowedAddr(spec.FloatingIP.Addr()) {
		return nil, fmt.Errorf("netlab: floating IP %s is outside the test networks", spec.FloatingIP)
	}
	var plans []hostPlan
	for _, n := range spec.Nodes {
		plans = append(plans, hostPlan{n, RoleNode})
	}
	plans = append(plans, hostPlan{spec.Client, RoleClient})
	for _, h := range spec.Clients {
		plans = append(plans, hostPlan{h, RoleClient})
	}
	plans = append(plans, hostPlan{spec.Control, RoleControl})
	for _, h := range spec.Extra {
		plans = append(plans, hostPlan{h, RoleControl})
	}
	seenName := map[string]bool{}
	seenAddr := map[netip.Addr]bool{}
	for _, p := range plans {
		s := p.spec
		if !hostNameRE.MatchString(s.Name) || s.Name == lanName {
			return nil, fmt.Errorf("netlab: host name %q must match %s and not be %q", s.Name, hostNameRE, lanName)
		}
		if seenName[s.Name] {
			return nil, fmt.Errorf("netlab: duplicate host %q", s.Name)
		}
		seenName[s.Name] = true
		if !s.Addr.IsValid() || !allowedAddr(s.Addr.Addr()) || s.Addr.Addr().IsLoopback() {
			return nil, fmt.Errorf("netlab: host %s address %s is outside the test networks", s.Name, s.Addr)
		}
		if seenAddr[s.Addr.Addr()] || s.Addr.Addr() == spec.FloatingIP.Addr() {
			return nil, fmt.Errorf("netlab: host %s address %s is already used", s.Name, s.Addr)
		}
		seenAddr[s.Addr.Addr()] = true
		if s.MAC != "" {
			if _, err := net.ParseMAC(s.MAC); err != nil {
				return nil, fmt.Errorf("host %s MAC: %w", s.Name, err)
			}
		}
	}
	return plans, nil
}

// claim picks the prefix and makes the temp dir and the owner marker. The marker is
// written before any namespace exists, so Sweep never mistakes a lab being built for a
// crashed one.
func (l *Lab) claim(prefix, parent string) error {
	for range 16 {
		p := prefix
		if p == "" {
			var b [2]byte
			if _, err := rand.Read(b[:]); err != nil {
				return fmt.Errorf("random prefix: %w", err)
			}
			p = "fan" + hex.EncodeToString(b[:])
		}
		if _, err := os.Stat(filepath.Join(netnsDir, p+"-"+lanName)); err == nil {
			if prefix != "" {
				return fmt.Errorf("netlab: prefix %s is in use", p)
			}
			continue
		}
		dir, err := os.MkdirTemp(parent, p+"-")
		if err != nil {
			return fmt.Errorf("temp dir: %w", err)
		}
		err = writeMarker(p, dir)
		if errors.Is(err, os.ErrExist) {
			os.RemoveAll(dir)
			if prefix != "" {
				return fmt.Errorf("netlab: prefix %s is in use", p)
			}
			continue
		}
		if err != nil {
			os.RemoveAll(dir)
			return err
		}
		l.prefix, l.dir = p, dir
		return nil
	}
	return errors.New("netlab: no free prefix after 16 tries")
}

func (l *Lab) build(ctx context.Context) error {
	if err := l.addNS(ctx, l.lanNS); err != nil {
		return err
	}
	steps := [][]string{
		{"-n", l.lanNS, "link", "set", "lo", "up"},
		{"-n", l.lanNS, "link", "add", bridgeName, "type", "bridge", "forward_delay", "0", "stp_state", "0"},
		{"-n", l.lanNS, "link", "set", bridgeName, "up"},
	}
	if err := runIPs(ctx, steps); err != nil {
		return err
	}
	for _, h := range l.hosts {
		if err := l.addNS(ctx, h.NS); err != nil {
			return err
		}
		// Creating the veth from inside the LAN namespace with its peer placed straight
		// into the host namespace means neither end ever exists in the root namespace.
		add := []string{"-n", l.lanNS, "link", "add", h.Port, "type", "veth", "peer", "name", hostIf, "netns", h.NS}
		if h.MAC != "" {
			add = append(add, "address", h.MAC)
		}
		steps := [][]string{
			{"-n", h.NS, "link", "set", "lo", "up"},
			add,
			{"-n", l.lanNS, "link", "set", h.Port, "master", bridgeName},
			{"-n", l.lanNS, "link", "set", h.Port, "up"},
			{"-n", h.NS, "addr", "add", h.Addr.String(), "dev", hostIf},
			{"-n", h.NS, "link", "set", hostIf, "up"},
		}
		if err := runIPs(ctx, steps); err != nil {
			return err
		}
		if h.Role == RoleNode {
			// Hot standby: the SIP server on the standby binds the floating IP before the
			// address arrives, which the kernel only allows with nonlocal bind.
			err := l.Do(h.Name, func() error {
				for _, f := range []string{"/proc/sys/net/ipv4/ip_nonlocal_bind", "/proc/sys/net/ipv6/ip_nonlocal_bind"} {
					if err := os.WriteFile(f, []byte("1\n"), 0o644); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return fmt.Errorf("sysctl ip_nonlocal_bind in %s: %w", h.NS, err)
			}
		}
		if h.MAC == "" {
			mac, err := ifMAC(ctx, h.NS, hostIf)
			if err != nil {
				return err
			}
			h.MAC = mac
		}
	}
	return nil
}

func (l *Lab) addNS(ctx context.Context, ns string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := runIP(ctx, "netns", "add", ns); err != nil {
		return err
	}
	l.made = append(l.made, ns)
	return nil
}

// Prefix is the lab's unique name prefix.
func (l *Lab) Prefix() string { return l.prefix }

// Dir is the lab's temp dir (logs, configs); it is removed by Close.
func (l *Lab) Dir() string { return l.dir }

// CopyTo copies the lab's directory (every process's log, the services'
// configurations) to dir, which must not exist yet, for a look after the
// lab is gone.
func (l *Lab) CopyTo(dir string) error {
	// cp -a copies into dir's parent only if that exists.
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("copy lab %s: %w", l.dir, err)
	}
	if out, err := exec.Command("cp", "-a", l.dir, dir).CombinedOutput(); err != nil {
		return fmt.Errorf("copy lab %s to %s: %w: %s", l.dir, dir, err, out)
	}
	return nil
}

// LANNS is the namespace that holds the bridge.
func (l *Lab) LANNS() string { return l.lanNS }

// FloatingIP is the address the nodes take turns holding (not assigned by Build).
func (l *Lab) FloatingIP() netip.Prefix { return l.floating }

// Hosts returns all hosts, nodes first.
func (l *Lab) Hosts() []Host {
	out := make([]Host, len(l.hosts))
	for i, h := range l.hosts {
		out[i] = *h
	}
	return out
}

// Nodes returns the node hosts in Spec order.
func (l *Lab) Nodes() []Host {
	var out []Host
	for _, h := range l.hosts {
		if h.Role == RoleNode {
			out = append(out, *h)
		}
	}
	return out
}

// Host returns the named host.
func (l *Lab) Host(name string) (Host, error) {
	h, err := l.host(name)
	if err != nil {
		return Host{}, err
	}
	return *h, nil
}

// MAC returns the eth0 MAC of the named host, or "" if there is no such host.
func (l *Lab) MAC(host string) string {
	if h, ok := l.byName[host]; ok {
		return h.MAC
	}
	return ""
}

func (l *Lab) host(name string) (*Host, error) {
	h, ok := l.byName[name]
	if !ok {
		return nil, fmt.Errorf("netlab: %s: no host %q", l.prefix, name)
	}
	return h, nil
}

// AddrAdd adds p to the host's eth0; only test-network addresses are accepted.
func (l *Lab) AddrAdd(ctx context.Context, host string, p netip.Prefix) error {
	return l.addr(ctx, "add", host, p)
}

// AddrDel removes p from the host's eth0.
func (l *Lab) AddrDel(ctx context.Context, host string, p netip.Prefix) error {
	return l.addr(ctx, "del", host, p)
}

func (l *Lab) addr(ctx context.Context, verb, host string, p netip.Prefix) error {
	h, err := l.host(host)
	if err != nil {
		return err
	}
	if !p.IsValid() || !allowedAddr(p.Addr()) {
		return fmt.Errorf("netlab: %s: address %s is outside the test networks", l.prefix, p)
	}
	_, err = runIP(ctx, "-n", h.NS, "addr", verb, p.String(), "dev", hostIf)
	return err
}

// Close stops every process the lab started, kills anything else still running in its
// namespaces, deletes the namespaces and the temp dir, and removes the owner marker.
// It is idempotent: later and concurrent calls wait for the first and return its result,
// so a signal handler and a deferred Close can race safely.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() { l.closeErr = l.teardown() })
	return l.closeErr
}

func (l *Lab) teardown() error {
	start := time.Now()
	l.mu.Lock()
	l.closed = true
	procs := append([]*Proc(nil), l.procs...)
	made := append([]string(nil), l.made...)
	l.mu.Unlock()

	var errs []error
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { _ = p.stop(l.stopTimeout) })
	}
	wg.Wait()

	// Teardown must not hang on a cancelled caller context; each step is short.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Hosts before the LAN: a host namespace takes its eth0 and thereby the bridge port
	// with it.
	nsOK := true
	for i := len(made) - 1; i >= 0; i-- {
		if err := removeNS(ctx, made[i]); err != nil {
			errs = append(errs, err)
			nsOK = false
		}
	}
	if l.dir != "" {
		if keep := os.Getenv(KeepEnv); keep != "" {
			if err := l.CopyTo(filepath.Join(keep, filepath.Base(l.dir))); err != nil {
				errs = append(errs, err)
			}
		}
		if err := os.RemoveAll(l.dir); err != nil {
			errs = append(errs, fmt.Errorf("remove %s: %w", l.dir, err))
		}
	}
	// Keeping the marker when a namespace survived lets a later Sweep retry.
	if nsOK && l.prefix != "" {
		if err := os.Remove(markerPath(l.prefix)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove marker: %w", err))
		}
	}
	err := errors.Join(errs...)
	if err != nil {
		err = fmt.Errorf("close %s: %w", l.prefix, err)
	}
	l.log.Info("netlab: closed", "took", time.Since(start), "err", err)
	return err
}

// KeepEnv names a directory into which Close copies the lab's directory
// (every process's log, the services' configurations; one subdirectory
// per lab, CopyTo) before it removes it: a failed test or chaos seed can
// then be read after the fact.
const KeepEnv = "FAN_LAB_KEEP"

// removeNS kills whatever still runs in ns (a namespace with live members outlives its
// name) and deletes it. A namespace that is already gone is not an error.
func removeNS(ctx context.Context, ns string) error {
	path := filepath.Join(netnsDir, ns)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var errs []error
	// A concurrent Sweep in another process may delete the namespace under us.
	if _, err := killInNS(ns, 3*time.Second); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	if _, err := runIP(ctx, "netns", "del", ns); err != nil {
		if _, serr := os.Stat(path); !errors.Is(serr, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
