package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"time"

	"github.com/fanpbx/fan/lab/leaders"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/poll"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// AddressHolders lists the nodes whose eth0 carries the floating IP.
func AddressHolders(ctx context.Context, l *netlab.Lab) ([]string, error) {
	var out []string
	for _, n := range l.Nodes() {
		b, err := l.Exec(ctx, n.Name, "ip", "-o", "addr", "show", "dev", "eth0")
		if err != nil {
			return nil, err
		}
		if strings.Contains(string(b), " "+l.FloatingIP().Addr().String()+"/") {
			out = append(out, n.Name)
		}
	}
	return out, nil
}

// oneHolderBesides is true when exactly one node other than node holds the address.
func oneHolderBesides(ctx context.Context, l *netlab.Lab, node string) bool {
	h, err := AddressHolders(ctx, l)
	return err == nil && len(h) == 1 && h[0] != node
}

// Fan is fan's stack under test.
type Fan struct {
	St *stack.Stack
	// ForceLeaders, in a three-server topology, moves every raft leader
	// and the arbiter's lease onto the node about to crash just before a
	// node-crash fault: the worst case, bounded by raft's election.
	ForceLeaders bool
	// LeadersOn, when set (and not ForceLeaders), names the servers fan
	// keeps every raft leader on: a node-crash waits until they are all
	// there, so that each cycle measures a crash with the leaders where fan
	// puts them, not one that caught them still moving after the start or
	// the previous cycle.
	LeadersOn []string

	nc *nats.Conn
	js jetstream.JetStream
	// restoredAt is when the last Restore finished: Ready trusts only
	// heartbeats stored after it.
	restoredAt time.Time
}

// bus is a NATS connection from the control host, opened on first use.
func (f *Fan) bus() (*nats.Conn, jetstream.JetStream, error) {
	if f.nc == nil {
		nc, js, err := f.St.Connect(netlab.ControlHost)
		if err != nil {
			return nil, nil, err
		}
		f.nc, f.js = nc, js
	}
	return f.nc, f.js, nil
}

func (f *Fan) Name() string { return "fan" }

func (f *Fan) Fault(ctx context.Context, s Scenario, node string) error {
	switch s {
	case PBXDeath:
		return f.St.KillPBX(ctx, node)
	case NodeCrash:
		if len(f.St.NATSHosts()) > 1 {
			// A crash while a raft group still catches up (after the start
			// or the last cycle's restart) can take the group's quorum with
			// it: that measures the previous cycle, not this one.
			if err := f.settle(ctx); err != nil {
				return err
			}
		}
		if f.ForceLeaders {
			nc, js, err := f.bus()
			if err != nil {
				return err
			}
			fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = f.St.ForceOnto(fctx, nc, js, node)
			cancel()
			if err != nil {
				return fmt.Errorf("force leaders onto %s: %w", node, err)
			}
		}
		_, err := f.St.Lab.KillAll(node)
		return err
	case LinkCut:
		return f.St.Lab.LinkDown(node)
	case Calls:
		return f.St.CrashPBX(node)
	}
	return fmt.Errorf("unknown scenario %q", s)
}

func (f *Fan) Restore(ctx context.Context, s Scenario, node string) error {
	defer func() { f.restoredAt = time.Now() }()
	switch s {
	case PBXDeath:
		return f.St.ThawPBX(ctx, node)
	case NodeCrash, Calls:
		return f.St.StartNode(ctx, node)
	case LinkCut:
		return f.St.Lab.LinkUp(node)
	}
	return fmt.Errorf("unknown scenario %q", s)
}

// PeersReachEachOther says why not every node's last heartbeat, stored
// since since, has each of its peer checks up ("" when they all have). A
// node back from a cut link still has its peer checks down until rise
// probes answer; a fault on the other node before that would find the
// peer's verdict given in advance and measure a failover decided on the
// silence alone, or none where the arbiter needs a peer's word.
func PeersReachEachOther(ctx context.Context, js jetstream.JetStream, st *stack.Stack, since time.Time) string {
	live, err := js.Stream(ctx, events.LiveStream)
	if err != nil {
		return fmt.Sprintf("live stream: %v", err)
	}
	for _, n := range st.Lab.Nodes() {
		m, err := live.GetLastMsgForSubject(ctx, events.HeartbeatSubject(st.Cluster(), n.Name))
		if err != nil {
			return fmt.Sprintf("%s heartbeat: %v", n.Name, err)
		}
		if m.Time.Before(since) {
			return fmt.Sprintf("%s: no heartbeat since %s", n.Name, since.Format(time.RFC3339Nano))
		}
		_, p, err := events.DecodeFrom(m.Subject, m.Data)
		hb, ok := p.(*events.NodeHeartbeat)
		if err != nil || !ok {
			return fmt.Sprintf("%s heartbeat does not decode: %v", n.Name, err)
		}
		for name, c := range hb.Checks {
			if c.Role == events.RolePeer && c.Health != events.HealthUp {
				return fmt.Sprintf("%s's peer check %s on %s is %s", n.Name, name, c.TargetNode, c.Health)
			}
		}
	}
	return ""
}

// Ready reports whether the arbiter sees node healthy and on the bus again,
// and exactly one other node holds the address.
func (f *Fan) Ready(ctx context.Context, node string) bool {
	gs, err := f.St.Status(ctx)
	if err != nil || len(gs) == 0 {
		return false
	}
	ns, ok := gs[0].Nodes[node]
	if !ok || ns.Health != "up" || ns.Silent || !oneHolderBesides(ctx, f.St.Lab, node) {
		return false
	}
	_, js, err := f.bus()
	if err != nil || PeersReachEachOther(ctx, js, f.St, f.restoredAt) != "" {
		return false
	}
	if len(f.St.NATSHosts()) == 1 {
		return true
	}
	// The next crash must find every raft group able to lose a server.
	gs2, err := leaders.List(ctx, js)
	return err == nil && leaders.Settled(gs2)
}

func (f *Fan) Close() {
	if f.nc != nil {
		f.nc.Close()
	}
	f.St.Stop()
}

// Keepalived runs Debian's keepalived in the same topology: VRRPv3 over
// unicast between the nodes, a vrrp_script that sends a real SIP OPTIONS to
// the node's own SIP server, hot standby through ip_nonlocal_bind exactly
// like fan's lab.
type Keepalived struct {
	Lab *netlab.Lab
	// BinDir holds fan-bench, whose sip-ping mode is the vrrp_script.
	BinDir string
	// AdvertInt is the VRRP advert interval in seconds (VRRPv3 allows 0.01).
	AdvertInt float64
	// ScriptInterval (whole seconds; keepalived refuses less than 1) and Fall.
	ScriptInterval, Fall int
	// PBX, when set, starts a node's PBX in place of Kamailio (the calls
	// scenario's: the same PBXs as fan's stack runs).
	PBX func(ctx context.Context, node string) (*netlab.Proc, error)

	procs  map[string]*netlab.Proc
	starts int
}

func (k *Keepalived) Name() string { return "keepalived" }

// Start launches Kamailio and keepalived on every node.
func (k *Keepalived) Start(ctx context.Context) error {
	k.procs = map[string]*netlab.Proc{}
	for _, n := range k.Lab.Nodes() {
		if err := k.startKamailio(n.Name); err != nil {
			return err
		}
		if err := k.startKeepalived(n.Name); err != nil {
			return err
		}
	}
	return nil
}

// startKamailio starts what answers SIP on node: Kamailio, or the PBX.
func (k *Keepalived) startKamailio(node string) error {
	if k.PBX != nil {
		p, err := k.PBX(context.Background(), node)
		if err != nil {
			return err
		}
		k.procs[node+"/sip"] = p
		return nil
	}
	h, err := k.Lab.Host(node)
	if err != nil {
		return err
	}
	p, err := k.Lab.StartKamailioOn(node, node, []string{k.Lab.FloatingIP().Addr().String(), h.Addr.Addr().String()})
	if err != nil {
		return err
	}
	k.procs[node+"/sip"] = p
	return nil
}

const keepalivedConf = `global_defs {
  router_id %[1]s
  vrrp_version 3
  script_user root
  enable_script_security
}
vrrp_script chk_sip {
  script "%[2]s sip-ping -timeout 500ms %[3]s:5060"
  interval %[4]d
  timeout 1
  fall %[5]d
  rise 1
}
vrrp_instance fan_bench {
  state BACKUP
  nopreempt
  interface eth0
  virtual_router_id 51
  priority %[6]d
  advert_int %[7]g
  unicast_src_ip %[3]s
  unicast_peer {
%[8]s  }
  virtual_ipaddress {
    %[9]s dev eth0
  }
  track_script {
    chk_sip
  }
}
`

func (k *Keepalived) startKeepalived(node string) error {
	h, err := k.Lab.Host(node)
	if err != nil {
		return err
	}
	var peers strings.Builder
	prio := 100
	for i, n := range k.Lab.Nodes() {
		if n.Name == node {
			prio = 100 - 10*i
			continue
		}
		fmt.Fprintf(&peers, "    %s\n", n.Addr.Addr())
	}
	dir := filepath.Join(k.Lab.Dir(), "keepalived-"+node)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cfg := filepath.Join(dir, "keepalived.conf")
	body := fmt.Sprintf(keepalivedConf, node, filepath.Join(k.BinDir, "fan-bench"), h.Addr.Addr(), k.ScriptInterval, k.Fall,
		prio, k.AdvertInt, peers.String(), k.Lab.FloatingIP())
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		return err
	}
	// Fresh pid files for every start: a killed keepalived's children can
	// linger as zombies here (nothing reaps them), and keepalived refuses to
	// start while a pid file names a live pid.
	k.starts++
	pid := func(name string) string { return filepath.Join(dir, fmt.Sprintf("%s-%d.pid", name, k.starts)) }
	p, err := k.Lab.Start(node, "keepalived", []string{"keepalived", "--dont-fork", "--log-console", "--no-syslog", "--vrrp",
		"-f", cfg, "-p", pid("keepalived"), "-r", pid("vrrp")}, nil)
	if err != nil {
		return fmt.Errorf("keepalived on %s: %w", node, err)
	}
	k.procs[node+"/keepalived"] = p
	return nil
}

func (k *Keepalived) Fault(ctx context.Context, s Scenario, node string) error {
	switch s {
	case PBXDeath, Calls:
		if p := k.procs[node+"/sip"]; p != nil {
			return p.Kill()
		}
		return fmt.Errorf("no SIP server on %s", node)
	case NodeCrash:
		_, err := k.Lab.KillAll(node)
		return err
	case LinkCut:
		return k.Lab.LinkDown(node)
	}
	return fmt.Errorf("unknown scenario %q", s)
}

func (k *Keepalived) Restore(ctx context.Context, s Scenario, node string) error {
	switch s {
	case PBXDeath, Calls:
		return k.startKamailio(node)
	case NodeCrash:
		// keepalived does not remove its address when killed (SIGKILL):
		// clean up as an operator's reboot would, then start again.
		holders, err := AddressHolders(ctx, k.Lab)
		if err != nil {
			return err
		}
		if slices.Contains(holders, node) {
			if err := k.Lab.AddrDel(ctx, node, k.Lab.FloatingIP()); err != nil {
				return err
			}
		}
		if err := k.startKamailio(node); err != nil {
			return err
		}
		return k.startKeepalived(node)
	case LinkCut:
		return k.Lab.LinkUp(node)
	}
	return fmt.Errorf("unknown scenario %q", s)
}

// Ready reports whether node's processes run and exactly one node holds the
// address.
func (k *Keepalived) Ready(ctx context.Context, node string) bool {
	for _, name := range []string{"sip", "keepalived"} {
		if p := k.procs[node+"/"+name]; p == nil || p.Exited() {
			return false
		}
	}
	h, err := AddressHolders(ctx, k.Lab)
	return err == nil && len(h) == 1
}

func (k *Keepalived) Close() {
	for _, p := range k.procs {
		_ = p.Stop()
	}
}

// LogSizes maps each keepalived's log file to its size now, the offsets
// from which MasterEntries counts a window.
func (k *Keepalived) LogSizes() map[string]int64 {
	out := map[string]int64{}
	for name, p := range k.procs {
		if !strings.HasSuffix(name, "/keepalived") {
			continue
		}
		var size int64
		if fi, err := os.Stat(p.LogPath); err == nil {
			size = fi.Size()
		}
		out[p.LogPath] = size
	}
	return out
}

// Logs returns the tail of every process's log, for a failed run.
func (k *Keepalived) Logs() string {
	var b strings.Builder
	for name, p := range k.procs {
		fmt.Fprintf(&b, "==== %s\n%s\n", name, p.Tail(3000))
	}
	return b.String()
}

// settle waits until every raft group has a leader and current replicas.
func (f *Fan) settle(ctx context.Context) error {
	_, js, err := f.bus()
	if err != nil {
		return err
	}
	return poll.Every(ctx, 100*time.Millisecond, 60*time.Second, "raft groups settled before the crash", func() error {
		gs, err := leaders.List(ctx, js)
		switch {
		case err != nil:
			return fmt.Errorf("%s: %w", leaders.Describe(gs), err)
		case !leaders.Settled(gs):
			return errors.New(leaders.Describe(gs))
		case !f.ForceLeaders && len(f.LeadersOn) > 0 && len(leaders.Off(gs, f.LeadersOn...)) > 0:
			return fmt.Errorf("%s: leaders off %v", leaders.Describe(gs), f.LeadersOn)
		}
		return nil
	})
}
