// Package stack runs fan's real binaries, as separate processes, inside a
// netlab topology: NATS (fan-nats), the arbiter and scheduler on the control
// host; on each node an AMI peer standing in for Asterisk, Kamailio answering
// SIP on the floating IP (hot standby), the prober, the ipmover and the
// replicator. The end-to-end test and `make lab` both use it, so the demo
// shows exactly what the test proves.
package stack

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"text/template"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/poll"
	"github.com/fanpbx/fan/pkg/sipoptions"
)

// Binaries fan's stack needs, all built by `make build`.
var Binaries = []string{"fan-nats", "fan-arbiter", "fan-scheduler", "fan-prober", "fan-ipmover", "fan-replicator", "fanctl", "fan-amipeer"}

// Options tunes the stack. Zero values give the lab defaults.
type Options struct {
	// BinDir holds the binaries listed in Binaries.
	BinDir string
	// Cluster and Group name the lab cluster and its one floating-IP group.
	Cluster, Group string
	// Check timing of the PBX checks: interval × fall is the detection budget.
	Interval, Timeout time.Duration
	// PeerInterval and PeerTimeout time each node's probes of its peers'
	// PBX, the evidence that tells a dead node from one cut off the bus;
	// PeerDecisiveMargin, when set, is their decisive_margin (negative:
	// off).
	PeerInterval, PeerTimeout, PeerDecisiveMargin time.Duration
	// PresenceInterval is the prober's presence beacon period; the arbiter
	// counts a node silent after 3 missed beacons.
	PresenceInterval time.Duration
	// MaxMovesPerHour, when not zero, sets the arbiter's flap cap (negative:
	// no cap). Benchmarks and the chaos suite cause a justified move every
	// few seconds; with the production cap they would measure the freeze.
	MaxMovesPerHour int
	// PresenceGrace and ArbiterTick, when set, tune how fast the arbiter
	// acts on missed presence beacons (policy.presence_grace, tick_every).
	PresenceGrace, ArbiterTick time.Duration
	Rise, Fall                 int
	Log                        *slog.Logger
	// Topology places the NATS servers and arbiter replicas; empty means
	// single. A lab for the dedicated topology needs its extra hosts
	// (Topology.LabSpec).
	Topology Topology
	// LeaderPlacement, in a three-server topology, writes the arbiter key
	// that keeps raft leaders off the PBX hosts: bus.leader_servers naming
	// the witness's server (colocated) or every server (dedicated).
	LeaderPlacement bool
	// StandbyArbiters, in the colocated topology, writes standby: true in
	// the configs of the arbiter replicas that share a host with a PBX node.
	StandbyArbiters bool
	// SecureBus runs the bus as an installation does: `fanctl nats-config`
	// writes the CA, certificates, nkeys and the server's configuration into
	// the lab's dir, fan-nats runs it, the admin provisions the streams and
	// every service and fanctl connect with their own identity (operator
	// LabOperator, auditor LabAuditor). Single and colocated topologies;
	// with three servers the routes are mutual TLS too, and the arbiters'
	// bus.system is the generated system-account identity.
	SecureBus bool
	// AMISystemName is the systemname every node's AMI peer reports
	// (CoreSettings), as asterisk.conf sets it; empty is Asterisk's default.
	AMISystemName string
	// PBX is what each node runs as its PBX (pbx.go): Kamailio and an AMI
	// peer by default; PBXStandIn or PBXAsterisk for calls between
	// Endpoints, from the Asterisk configuration in ShippedAsterisk
	// (deploy/asterisk, found above the working directory when empty).
	// Asterisk is the Asterisk 22 install PBXAsterisk runs
	// (FAN_ASTERISK); StandInArgs are more flags for fan-pbxstandin.
	PBX             PBX
	Asterisk        string
	Endpoints       []Endpoint
	ShippedAsterisk string
	StandInArgs     []string
}

func (o *Options) defaults() {
	if o.Cluster == "" {
		o.Cluster = "lab"
	}
	if o.Group == "" {
		o.Group = "pbx"
	}
	if o.Interval == 0 {
		o.Interval = 200 * time.Millisecond
	}
	if o.Timeout == 0 {
		o.Timeout = 150 * time.Millisecond
	}
	if o.PeerInterval == 0 {
		o.PeerInterval = o.Interval
	}
	if o.PeerTimeout == 0 {
		o.PeerTimeout = min(o.Timeout, o.PeerInterval*3/4)
	}
	if o.PresenceInterval == 0 {
		o.PresenceInterval = 100 * time.Millisecond
	}
	if o.Rise == 0 {
		o.Rise = 2
	}
	if o.Fall == 0 {
		o.Fall = 3
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Topology == "" {
		o.Topology = TopologySingle
	}
}

// AMI credentials of the lab's stand-in PBX.
const (
	amiUser   = "fan"
	amiSecret = "lab-secret"
	amiAddr   = "127.0.0.1:5038"
	natsPort  = 4222
)

// Stack is a running fan deployment inside a lab.
type Stack struct {
	Lab   *netlab.Lab
	opts  Options
	procs map[string]*netlab.Proc // "<host>/<name>"
	argv  map[string][]string     // "<host>/<name>": how it was last started
	dir   string
	data  map[string]any // template values shared by every config
}

// Start launches everything and returns once each process is running (not
// necessarily once a holder exists: see WaitAnswer).
func Start(ctx context.Context, l *netlab.Lab, o Options) (*Stack, error) {
	o.defaults()
	need := Binaries
	if o.PBX == PBXStandIn {
		need = append(slices.Clone(need), "fan-pbxstandin")
	}
	for _, b := range need {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return nil, fmt.Errorf("binary %s: %w (run make build)", b, err)
		}
	}
	s := &Stack{Lab: l, opts: o, procs: map[string]*netlab.Proc{}, argv: map[string][]string{}, dir: filepath.Join(l.Dir(), "fan")}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	if o.Topology != TopologySingle {
		if err := s.writeAccounts(); err != nil {
			return nil, err
		}
	}
	if _, err := ParseTopology(string(o.Topology)); err != nil {
		return nil, err
	}
	for _, h := range s.NATSHosts() {
		if _, err := l.Host(h); err != nil {
			return nil, fmt.Errorf("topology %s: %w (build the lab with Topology.LabSpec)", o.Topology, err)
		}
	}
	if o.SecureBus {
		if o.Topology == TopologyDedicated {
			return nil, fmt.Errorf("secure bus: topology %s not supported (single or colocated)", o.Topology)
		}
		if err := s.generateBus(ctx); err != nil {
			return nil, err
		}
	}
	// Every server first: a member waits for the others' routes.
	for _, h := range s.NATSHosts() {
		if err := s.start(h, "fan-nats", s.natsArgs(h)...); err != nil {
			return nil, err
		}
	}
	for _, h := range s.NATSHosts() {
		if err := s.waitTCP(ctx, h, fmt.Sprintf("%s:%d", s.hostAddr(h), natsPort)); err != nil {
			return nil, fmt.Errorf("nats on %s not reachable: %w", h, err)
		}
	}

	if o.SecureBus {
		// Services may not create streams under the generated permissions.
		if out, err := s.FanctlAs(ctx, LabAdmin, "provision", "--replicas", strconv.Itoa(s.replicas())); err != nil {
			return s, fmt.Errorf("fanctl provision: %w: %s", err, out)
		}
	}

	nodes := l.Nodes()
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	s.data = map[string]any{
		"Cluster": o.Cluster, "Group": o.Group, "Nodes": names, "Replicas": s.replicas(),
		"VIP": l.FloatingIP().String(), "AMIAddr": amiAddr, "AMIUser": amiUser, "AMISecret": amiSecret,
		"Interval": o.Interval.String(), "Timeout": o.Timeout.String(), "Rise": o.Rise, "Fall": o.Fall,
		"PeerInterval": o.PeerInterval.String(), "PeerTimeout": o.PeerTimeout.String(), "Dir": s.dir,
		"PeerDecisiveMargin": durOrEmpty(o.PeerDecisiveMargin), "PresenceInterval": o.PresenceInterval.String(),
		"MaxMovesPerHour": o.MaxMovesPerHour, "PresenceGrace": durOrEmpty(o.PresenceGrace), "ArbiterTick": durOrEmpty(o.ArbiterTick),
	}
	for _, n := range nodes {
		if err := s.StartNode(ctx, n.Name); err != nil {
			return nil, err
		}
	}
	for _, h := range s.ArbiterHosts() {
		if slices.Contains(names, h) {
			continue // StartNode started it
		}
		if err := s.startControl(h, "fan-arbiter"); err != nil {
			return nil, err
		}
	}
	if err := s.startControl(netlab.ControlHost, "fan-scheduler"); err != nil {
		return nil, err
	}
	return s, nil
}

// LeaderServers are the NATS servers the arbiters' bus.leader_servers
// names: the witness's in the colocated topology, every server in the
// dedicated one; nil without LeaderPlacement or with one server.
func (s *Stack) LeaderServers() []string {
	if !s.opts.LeaderPlacement || s.opts.Topology == TopologySingle {
		return nil
	}
	if s.opts.Topology == TopologyColocated {
		return []string{s.ServerName(WitnessHost)}
	}
	var leaders []string
	for _, h := range s.NATSHosts() {
		leaders = append(leaders, s.ServerName(h))
	}
	return leaders
}

// hostData is the template data of host's configs.
func (s *Stack) hostData(host string) map[string]any {
	d := clone(s.data)
	d["Node"] = host
	d["NATS"] = s.NATSURLFor(host)
	if leaders := s.LeaderServers(); leaders != nil {
		d["LeaderServers"] = leaders
	}
	if s.opts.LeaderPlacement && s.opts.Topology != TopologySingle && !s.opts.SecureBus {
		d["SystemUser"], d["SystemPassword"] = labSystemUser, labSystemPassword
	}
	if s.opts.StandbyArbiters && s.opts.Topology == TopologyColocated {
		d["Standby"] = slices.Contains(s.nodeNames(), host)
	}
	return d
}

// startControl writes the config of a service that is not a node's own
// (arbiter, scheduler) and starts it.
func (s *Stack) startControl(host, name string) error {
	cfg, err := s.writeConfig(host, strings.TrimPrefix(name, "fan-"), s.hostData(host))
	if err != nil {
		return err
	}
	return s.start(host, name, "-config", cfg)
}

// NodeAddrs maps each node to its own address; templates use it for peer checks.
func nodeAddrs(l *netlab.Lab) map[string]string {
	m := map[string]string{}
	for _, n := range l.Nodes() {
		m[n.Name] = n.Addr.Addr().String()
	}
	return m
}

// StartNode starts (or restarts, after a crash) everything that runs on a
// PBX node: Kamailio on the floating IP and the node's own address, the AMI
// peer standing in for Asterisk, and fan's prober, ipmover and replicator.
// Processes of that node that are still running are left alone.
func (s *Stack) StartNode(ctx context.Context, node string) error {
	h, err := s.Lab.Host(node)
	if err != nil {
		return err
	}
	running := func(name string) bool {
		p := s.procs[node+"/"+name]
		return p != nil && !p.Exited()
	}
	colocated := s.opts.Topology == TopologyColocated
	if colocated && !running("fan-nats") {
		if err := s.StartNATSOn(ctx, node); err != nil {
			return err
		}
	}
	if s.opts.PBX != PBXKamailio {
		if !running(s.pbxProc(node)) {
			if err := s.startPBX(ctx, node); err != nil {
				return fmt.Errorf("pbx on %s: %w", node, err)
			}
		}
	} else if !running("kamailio") {
		k, err := s.Lab.StartKamailioOn(node, node, []string{s.Lab.FloatingIP().Addr().String(), h.Addr.Addr().String()})
		if err != nil {
			return fmt.Errorf("kamailio on %s: %w", node, err)
		}
		s.procs[node+"/kamailio"] = k
	}
	if s.opts.PBX == PBXKamailio && !running("fan-amipeer") {
		_ = os.Remove(s.amiControl(node))
		args := []string{"-listen", amiAddr, "-user", amiUser, "-secret", amiSecret, "-control", s.amiControl(node)}
		if s.opts.AMISystemName != "" {
			args = append(args, "-systemname", s.opts.AMISystemName)
		}
		if err := s.start(node, "fan-amipeer", args...); err != nil {
			return err
		}
		if err := s.waitTCP(ctx, node, amiAddr); err != nil {
			return fmt.Errorf("ami peer on %s: %w", node, err)
		}
	}
	d := s.hostData(node)
	d["NodeAddr"] = h.Addr.Addr().String()
	d["NodeAddrs"] = nodeAddrs(s.Lab)
	for _, svc := range []string{"prober", "ipmover", "replicator"} {
		if running("fan-" + svc) {
			continue
		}
		cfg, err := s.writeConfig(node, svc, d)
		if err != nil {
			return err
		}
		if err := s.start(node, "fan-"+svc, "-config", cfg); err != nil {
			return err
		}
	}
	if colocated && !running("fan-arbiter") {
		if err := s.startControl(node, "fan-arbiter"); err != nil {
			return err
		}
	}
	return nil
}

// ThawPBX undoes KillPBX: the AMI peer answers again and Kamailio runs.
func (s *Stack) ThawPBX(ctx context.Context, node string) error {
	if out, err := exec.CommandContext(ctx, filepath.Join(s.opts.BinDir, "fan-amipeer"), "ctl", "-control", s.amiControl(node), "normal").CombinedOutput(); err != nil {
		return fmt.Errorf("thaw ami on %s: %w: %s", node, err, out)
	}
	return s.StartNode(ctx, node)
}

// Cluster is the lab cluster's name.
func (s *Stack) Cluster() string { return s.opts.Cluster }

// arbiterPresenceGrace and arbiterPresenceMisses are the arbiter's
// defaults (policy.presence_grace, presence_misses), for a stack that
// leaves them unset.
const (
	arbiterPresenceGrace  = 50 * time.Millisecond
	arbiterPresenceMisses = 3
)

// SilenceLimit is how long the arbiter waits after a node's last presence
// beacon before it counts the node silent, as this stack configured it.
func (s *Stack) SilenceLimit() time.Duration {
	grace := s.opts.PresenceGrace
	if grace == 0 {
		grace = arbiterPresenceGrace
	}
	return arbiterPresenceMisses*s.opts.PresenceInterval + grace
}

// durOrEmpty renders an optional duration for a template: empty when unset.
func durOrEmpty(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

func clone(m map[string]any) map[string]any {
	c := make(map[string]any, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (s *Stack) amiControl(node string) string { return filepath.Join(s.dir, node+"-ami.sock") }

// SetCalls makes node's Asterisk (its AMI peer) report this many active
// channels and calls, as `core show channels count` would with calls up.
func (s *Stack) SetCalls(ctx context.Context, node string, channels, calls int) error {
	if out, err := exec.CommandContext(ctx, filepath.Join(s.opts.BinDir, "fan-amipeer"), "ctl", "-control", s.amiControl(node),
		"channels", strconv.Itoa(channels), strconv.Itoa(calls)).CombinedOutput(); err != nil {
		return fmt.Errorf("set calls on %s: %w: %s", node, err, out)
	}
	return nil
}

func (s *Stack) start(host, name string, args ...string) error {
	argv := append([]string{filepath.Join(s.opts.BinDir, name)}, args...)
	if err := s.checkConfig(host, name, argv); err != nil {
		return err
	}
	return s.run(host, name, argv)
}

// checkConfig runs a fan service's -check-config in its host's namespace
// before the service starts, as its unit's ExecStartPre does: a service
// that would refuse its configuration fails the lab's start instead of
// exiting unnoticed while the test runs without it.
func (s *Stack) checkConfig(host, name string, argv []string) error {
	if !slices.Contains(events.Services, events.BusRole(strings.TrimPrefix(name, "fan-"))) || !slices.Contains(argv, "-config") {
		return nil
	}
	h, err := s.Lab.Host(host)
	if err != nil {
		return err
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.NS}, append(slices.Clone(argv), "-check-config")...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s on %s refuses its configuration: %w: %s", name, host, err, bytes.TrimSpace(out))
	}
	return nil
}

// run starts argv as the process name on host and remembers how (Restart).
// fan's own services restart when they exit, as their units do
// (startProc).
func (s *Stack) run(host, name string, argv []string) error {
	p, err := startProc(s.Lab, s.procs[host+"/"+name], host, name, argv)
	if err != nil {
		return fmt.Errorf("start %s on %s: %w", name, host, err)
	}
	s.procs[host+"/"+name] = p
	s.argv[host+"/"+name] = argv
	return nil
}

// Restart stops one process the stack started (SIGTERM, as `systemctl
// restart` does) and starts it again with the same arguments, so it reads
// its configuration file as the file is now. A test that edits a service's
// file the way an operator would restarts it with this: RestartService and
// StartNode write the file anew from the lab's template.
func (s *Stack) Restart(host, name string) error {
	k := host + "/" + name
	p, argv := s.procs[k], s.argv[k]
	if p == nil || argv == nil {
		return fmt.Errorf("restart %s on %s: not started by this stack", name, host)
	}
	if err := p.Stop(); err != nil {
		return fmt.Errorf("restart %s on %s: stop: %w", name, host, err)
	}
	return s.run(host, name, argv)
}

// restartAfter is the RestartSec of fan's systemd units (deploy/systemd).
const restartAfter = time.Second

// restartedUnits are the programs the lab runs that have a unit of fan's
// with Restart=always (fan-status, fanctl serve, does not run in the lab).
// The PBX, its stand-ins and Kamailio are not fan's units: the lab leaves
// them as they end.
var restartedUnits = []string{"fan-arbiter", "fan-ipmover", "fan-nats", "fan-prober", "fan-replicator", "fan-scheduler"}

// startProc starts argv as name on host: one of fan's units is restarted
// restartAfter after it exits on its own, as systemd's Restart=always does (a
// crash in the lab is then the crash production would see: the service back
// a second later), and the lab's log says so. The lab's own stops (Stop,
// Kill, KillService) are final, like `systemctl stop`. prev is the process
// this one replaces: when it has exited, its pending restart is called off,
// so the two never run at once.
func startProc(l *netlab.Lab, prev *netlab.Proc, host, name string, argv []string) (*netlab.Proc, error) {
	if prev != nil && prev.Exited() {
		_ = prev.Stop()
	}
	env := []string{"FAN_LOG_LEVEL=debug"}
	if slices.Contains(restartedUnits, name) {
		return l.StartService(host, name, argv, env, restartAfter)
	}
	return l.Start(host, name, argv, env)
}

// Proc returns a started process by host and binary name.
func (s *Stack) Proc(host, name string) *netlab.Proc { return s.procs[host+"/"+name] }

// Logs returns the tail of every process's log, for a failing test.
func (s *Stack) Logs(lines int64) string {
	var b strings.Builder
	for k, p := range s.procs {
		fmt.Fprintf(&b, "==== %s (%s)\n%s\n", k, p.LogPath, p.Tail(lines))
	}
	return b.String()
}

func (s *Stack) waitTCP(ctx context.Context, host, addr string) error {
	return s.waitTCPWithin(ctx, host, addr, 10*time.Second)
}

func (s *Stack) waitTCPWithin(ctx context.Context, host, addr string, within time.Duration) error {
	return waitTCPOn(ctx, s.Lab, host, addr, within)
}

// waitTCPOn waits until something on host of l accepts connections on addr.
func waitTCPOn(ctx context.Context, l *netlab.Lab, host, addr string, within time.Duration) error {
	return poll.Until(ctx, within, addr+" on "+host+" accepting connections", func() error {
		return l.Do(host, func() error {
			c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				c.Close()
			}
			return err
		})
	})
}

func (s *Stack) writeConfig(host, svc string, data map[string]any) (string, error) {
	tmpl, ok := configTemplates[svc]
	if !ok {
		return "", fmt.Errorf("no config template for %s", svc)
	}
	data = clone(data)
	for k, v := range s.busAuth(host, svc) {
		data[k] = v
	}
	t := template.Must(template.New(svc).Parse(tmpl))
	template.Must(t.New("busauth").Parse(busAuthTemplate))
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, svc, data); err != nil {
		return "", fmt.Errorf("config %s: %w", svc, err)
	}
	p := s.ConfigPath(host, svc)
	return p, os.WriteFile(p, buf.Bytes(), 0o644)
}

// ConfigPath is where the configuration of svc (arbiter, prober, ...) on
// host is written, for a test that reads it as an operator would (fanctl
// replay --arbiter-config).
func (s *Stack) ConfigPath(host, svc string) string {
	return filepath.Join(s.dir, host+"-"+svc+".yaml")
}

// ReplicatorTree is the directory of tree (asterisk-etc, voicemail) on
// node, as its replicator's configuration names it.
func (s *Stack) ReplicatorTree(node, tree string) string {
	dir := tree
	if tree == "asterisk-etc" {
		dir = "etc-asterisk" // the replicator template's directory for it
	}
	return filepath.Join(s.dir, node+"-replicator", dir)
}

// Answer is one SIP OPTIONS answered through the floating IP.
type Answer struct {
	Node string
	At   time.Time
}

// Pinger probes the floating IP from the client host.
func (s *Stack) Pinger() (*sipoptions.Pinger, error) {
	var p *sipoptions.Pinger
	err := s.Lab.Do(netlab.ClientHost, func() error {
		var err error
		p, err = sipoptions.NewPinger(netip.AddrPortFrom(s.Lab.FloatingIP().Addr(), netlab.SIPPort).String())
		return err
	})
	return p, err
}

// WaitAnswer probes the floating IP every 10 ms until node answers it and
// returns when the first such answer arrived. Probes overlap: a probe lost
// to a dead holder must not delay the next one, or the measurement would
// be as coarse as the probe timeout.
func (s *Stack) WaitAnswer(ctx context.Context, p *sipoptions.Pinger, node string, within time.Duration) (Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	answered := make(chan Answer, 1)
	var last atomic.Value
	last.Store("")
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		go func() {
			pctx, pcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer pcancel()
			r, err := p.Ping(pctx)
			if err != nil {
				return
			}
			at := time.Now()
			last.Store(r.ServerNode)
			if r.ServerNode == node {
				select {
				case answered <- Answer{Node: node, At: at}:
				default:
				}
			}
		}()
		select {
		case a := <-answered:
			return a, nil
		case <-ctx.Done():
			return Answer{}, fmt.Errorf("floating IP not answered by %s within %v (last answer from %q)", node, within, last.Load())
		case <-t.C:
		}
	}
}

// KillPBX makes node's PBX look dead the way a deadlocked Asterisk does:
// its AMI accepts connections and never answers, and SIP stops answering.
func (s *Stack) KillPBX(ctx context.Context, node string) error {
	if out, err := exec.CommandContext(ctx, filepath.Join(s.opts.BinDir, "fan-amipeer"), "ctl", "-control", s.amiControl(node), "frozen").CombinedOutput(); err != nil {
		return fmt.Errorf("freeze ami on %s: %w: %s", node, err, out)
	}
	if k := s.Proc(node, "kamailio"); k != nil {
		if err := k.Kill(); err != nil {
			return fmt.Errorf("stop kamailio on %s: %w", node, err)
		}
	}
	return nil
}

// Events reads the whole audit trail through fanctl on the control host.
func (s *Stack) Events(ctx context.Context) ([]Event, error) {
	// --timeout bounds the whole read: a long lab's trail takes more than
	// the 10 s default.
	out, err := s.Fanctl(ctx, "--cluster", s.opts.Cluster, "--timeout", "2m", "events", "--since", "all", "--json")
	if err != nil {
		return nil, fmt.Errorf("fanctl events: %w", err)
	}
	return ParseEvents(out)
}

// LiveEvents reads the live stream (heartbeats, probe results) through
// fanctl on the control host.
func (s *Stack) LiveEvents(ctx context.Context) ([]Event, error) {
	out, err := s.Fanctl(ctx, "--cluster", s.opts.Cluster, "--timeout", "2m", "events", "--live", "--since", "all", "--json")
	if err != nil {
		return nil, fmt.Errorf("fanctl events --live: %w", err)
	}
	return ParseEvents(out)
}

// Event is one decoded line of `fanctl events --json`.
type Event struct {
	Env     events.Envelope
	Payload events.Payload
}

// ParseEvents decodes `fanctl events --json` output.
func ParseEvents(out []byte) ([]Event, error) {
	var evs []Event
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 0, 64<<10), events.MaxEncodedSize+1)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		env, p, err := events.Decode(line)
		if err != nil {
			return nil, fmt.Errorf("decode %s: %w", line, err)
		}
		evs = append(evs, Event{Env: env, Payload: p})
	}
	return evs, sc.Err()
}

// FailoverChain is the causal chain of one failover found in the trail.
type FailoverChain struct {
	Health   Event
	Decision Event
	Claim    Event
	Result   Event
}

// FindFailoverChain looks for health-down(from) → failover decision → claim
// on to → applied result, each linked to the previous by causation ids.
func FindFailoverChain(evs []Event, from, to string) (FailoverChain, error) {
	byID := map[string]Event{}
	for _, e := range evs {
		byID[e.Env.ID] = e
	}
	for _, r := range evs {
		res, ok := r.Payload.(*events.CommandResult)
		if !ok || res.Node != to || res.CommandType != events.TypeClaimIP || res.Outcome != events.OutcomeApplied {
			continue
		}
		claim, ok := byID[r.Env.CausationID]
		if !ok || claim.Env.ID != res.CommandID {
			continue
		}
		dec, ok := byID[claim.Env.CausationID]
		if !ok {
			continue
		}
		d, ok := dec.Payload.(*events.ArbiterDecision)
		if !ok || d.Action != events.ActionFailover || d.From != from || d.To != to {
			continue
		}
		for _, cause := range d.CausedBy {
			h, ok := byID[cause]
			if !ok {
				continue
			}
			if ht, ok := h.Payload.(*events.HealthTransition); ok && ht.TargetNode == from && ht.To == events.HealthDown {
				return FailoverChain{Health: h, Decision: dec, Claim: claim, Result: r}, nil
			}
		}
	}
	return FailoverChain{}, errors.New("no chain health-down -> failover decision -> claim -> applied result in the trail")
}

// Status runs `fanctl status --json` on the control host.
func (s *Stack) Status(ctx context.Context) ([]events.GroupStatus, error) {
	out, err := s.Fanctl(ctx, "--cluster", s.opts.Cluster, "status", "--json")
	if err != nil {
		return nil, fmt.Errorf("fanctl status: %w: %s", err, out)
	}
	var gs []events.GroupStatus
	if err := json.Unmarshal(out, &gs); err != nil {
		return nil, fmt.Errorf("fanctl status output: %w: %s", err, out)
	}
	return gs, nil
}

// Stop stops every fan process gracefully (SIGTERM), services first so the
// ipmovers release their addresses, NATS last.
func (s *Stack) Stop() {
	order := []string{"fan-arbiter", "fan-scheduler", "fan-prober", "fan-replicator", "fan-ipmover", "fan-amipeer", "fan-pbxstandin", "asterisk", "fan-nats"}
	for _, name := range order {
		for k, p := range s.procs {
			if strings.HasSuffix(k, "/"+name) {
				_ = p.Stop()
			}
		}
	}
}

var execLookPath = exec.LookPath

// The methods below exist for the chaos suite (lab/chaos): they fault and
// heal single parts of a running stack. They touch nothing the methods
// above rely on.

// KillService sends SIGKILL to one process the stack started (for example
// host "n1", name "fan-ipmover"; "ctl", "fan-arbiter"), the way a crash
// would end it: no shutdown handler runs, so an ipmover leaves its
// addresses behind. Unlike a crash it is not restarted after RestartSec:
// the test says when it comes back (RestartService).
func (s *Stack) KillService(host, name string) error {
	p := s.Proc(host, name)
	if p == nil {
		return fmt.Errorf("kill %s on %s: not started by this stack", name, host)
	}
	if err := p.Kill(); err != nil {
		return fmt.Errorf("kill %s on %s: %w", name, host, err)
	}
	return nil
}

// RestartService starts a process the stack started earlier again, with the
// same arguments and config file, once it is no longer running. Node
// processes go through StartNode, which restarts whatever of that node is
// not running.
func (s *Stack) RestartService(ctx context.Context, host, name string) error {
	if p := s.Proc(host, name); p != nil && !p.Exited() {
		return fmt.Errorf("restart %s on %s: still running (pid %d)", name, host, p.Pid())
	}
	if slices.Contains(s.nodeNames(), host) {
		return s.StartNode(ctx, host)
	}
	switch name {
	case "fan-nats":
		return s.StartNATSOn(ctx, host)
	case "fan-arbiter", "fan-scheduler":
		// Start wrote the config under this name.
		cfg := filepath.Join(s.dir, host+"-"+strings.TrimPrefix(name, "fan-")+".yaml")
		return s.start(host, name, "-config", cfg)
	}
	return fmt.Errorf("restart %s on %s: unknown service", name, host)
}

// NATSURL is the bus address the control host's services use (every
// server, in their order).
func (s *Stack) NATSURL() string { return s.NATSURLFor(netlab.ControlHost) }

// StopNATS stops every NATS server gracefully (SIGTERM, so JetStream
// flushes its store); every service loses the bus until StartNATS.
func (s *Stack) StopNATS() error {
	var errs []error
	for _, h := range s.NATSHosts() {
		p := s.Proc(h, "fan-nats")
		if p == nil {
			errs = append(errs, fmt.Errorf("stop nats on %s: not started by this stack", h))
			continue
		}
		if err := p.Stop(); err != nil {
			errs = append(errs, fmt.Errorf("stop nats on %s: %w", h, err))
		}
	}
	return errors.Join(errs...)
}

// StartNATS starts every NATS server that is not running again, on the
// same addresses and stores as Start did, and returns once each accepts
// connections.
func (s *Stack) StartNATS(ctx context.Context) error {
	for _, h := range s.NATSHosts() {
		if p := s.Proc(h, "fan-nats"); p != nil && !p.Exited() {
			continue
		}
		if err := s.StartNATSOn(ctx, h); err != nil {
			return err
		}
	}
	return nil
}

// natsPartitionRules are the iptables rules that cut a node off from the
// control host (NATS, the arbiter) and nothing else: ARP, the LAN, its
// peers and the clients still work. The comment marks them as the lab's.
func (s *Stack) natsPartitionRules() [][]string {
	ctl, _ := s.Lab.Host(netlab.ControlHost)
	a := ctl.Addr.Addr().String()
	mark := []string{"-m", "comment", "--comment", "fan-lab-partition", "-j", "DROP"}
	return [][]string{
		append([]string{"INPUT", "-s", a}, mark...),
		append([]string{"OUTPUT", "-d", a}, mark...),
	}
}

// PartitionFromNATS drops every packet between node and the control host,
// inside node's namespace: the node stays on the LAN and serves, but it is
// cut off from the bus. The rules die with the namespace if never healed.
func (s *Stack) PartitionFromNATS(ctx context.Context, node string) error {
	if node == netlab.ControlHost {
		return errors.New("partition from nats: the control host cannot be cut off from itself")
	}
	for _, r := range s.natsPartitionRules() {
		if _, err := s.Lab.Exec(ctx, node, append([]string{"iptables", "-w", "-I"}, r...)...); err != nil {
			return fmt.Errorf("partition %s from nats: %w", node, err)
		}
	}
	return nil
}

// HealNATSPartition removes what PartitionFromNATS added (every copy, so a
// rule added twice does not survive the heal).
func (s *Stack) HealNATSPartition(ctx context.Context, node string) error {
	if err := s.deleteRules(ctx, node, s.natsPartitionRules()); err != nil {
		return fmt.Errorf("heal nats partition of %s: %w", node, err)
	}
	return nil
}
