package stack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/lab/netlab"
)

// Topology says where the lab's NATS servers and arbiter replicas run.
type Topology string

const (
	// TopologySingle is one NATS server and one arbiter on the control
	// host, which never fails: the bus is not under test.
	TopologySingle Topology = "single"
	// TopologyColocated is the small production shape: three NATS servers,
	// one in each PBX node's namespace and one on the control host (the
	// witness), an arbiter replica beside each, streams at replicas 3.
	TopologyColocated Topology = "colocated"
	// TopologyDedicated is three NATS hosts apart from the PBX nodes (s1,
	// s2, s3; netlab.NATSHosts), an arbiter replica on each.
	TopologyDedicated Topology = "dedicated"
)

// Topologies lists every topology, for flags.
var Topologies = []Topology{TopologySingle, TopologyColocated, TopologyDedicated}

// ParseTopology reads a flag value; empty means single.
func ParseTopology(s string) (Topology, error) {
	if s == "" {
		return TopologySingle, nil
	}
	t := Topology(s)
	if !slices.Contains(Topologies, t) {
		return "", fmt.Errorf("topology %q: want single, colocated or dedicated", s)
	}
	return t, nil
}

// LabSpec adds the hosts the topology needs to a lab spec (the dedicated
// topology's NATS hosts).
func (t Topology) LabSpec(spec netlab.Spec) netlab.Spec {
	if t == TopologyDedicated {
		spec.Extra = append(spec.Extra, netlab.NATSHosts()...)
	}
	return spec
}

// WitnessHost runs the colocated topology's third NATS server: the host
// with no PBX, where fan keeps the raft leaders and the arbiter's lease.
const WitnessHost = netlab.ControlHost

// routePort is every lab NATS server's cluster (route) port.
const routePort = 6222

// NATSHosts are the hosts running a NATS server, in configuration order.
func (s *Stack) NATSHosts() []string {
	switch s.opts.Topology {
	case TopologyColocated:
		return append(s.nodeNames(), WitnessHost)
	case TopologyDedicated:
		var out []string
		for _, h := range netlab.NATSHosts() {
			out = append(out, h.Name)
		}
		return out
	}
	return []string{netlab.ControlHost}
}

// ArbiterHosts are the hosts running an arbiter replica.
func (s *Stack) ArbiterHosts() []string {
	if s.opts.Topology == TopologySingle {
		return []string{netlab.ControlHost}
	}
	return s.NATSHosts()
}

// ServerName is the NATS server name of host's server ("nats-n1"), as
// raft groups and bus.leader_servers name it. The single topology keeps
// its historical name.
func (s *Stack) ServerName(host string) string {
	if s.opts.Topology == TopologySingle {
		return "lab"
	}
	return "nats-" + host
}

// HostOfServer is ServerName's inverse ("" if no lab server has the name).
func (s *Stack) HostOfServer(name string) string {
	for _, h := range s.NATSHosts() {
		if s.ServerName(h) == name {
			return h
		}
	}
	return ""
}

func (s *Stack) nodeNames() []string {
	var out []string
	for _, n := range s.Lab.Nodes() {
		out = append(out, n.Name)
	}
	return out
}

func (s *Stack) hostAddr(host string) string {
	h, _ := s.Lab.Host(host)
	return h.Addr.Addr().String()
}

// natsOrder is the order host's services list the servers in: their own
// host's server first, then the witness, then the rest (so a PBX node's
// services fall back to the witness before the other PBX node).
func (s *Stack) natsOrder(host string) []string {
	servers := s.NATSHosts()
	if len(servers) == 1 {
		return servers
	}
	var order []string
	if slices.Contains(servers, host) {
		order = append(order, host)
	} else if s.opts.Topology == TopologyDedicated {
		// No own server: spread the hosts over the servers.
		all := append(s.nodeNames(), netlab.ControlHost)
		i := max(slices.Index(all, host), 0) % len(servers)
		return append(append([]string(nil), servers[i:]...), servers[:i]...)
	}
	if s.opts.Topology == TopologyColocated && !slices.Contains(order, WitnessHost) {
		order = append(order, WitnessHost)
	}
	for _, h := range servers {
		if !slices.Contains(order, h) {
			order = append(order, h)
		}
	}
	return order
}

// NATSURLFor is the bus.url of the services on host.
func (s *Stack) NATSURLFor(host string) string {
	var urls []string
	for _, h := range s.natsOrder(host) {
		urls = append(urls, fmt.Sprintf("nats://%s:%d", s.hostAddr(h), natsPort))
	}
	return strings.Join(urls, ",")
}

func (s *Stack) replicas() int {
	if s.opts.Topology == TopologySingle {
		return 1
	}
	return 3
}

func (s *Stack) natsArgs(host string) []string {
	addr := s.hostAddr(host)
	args := []string{"-listen", fmt.Sprintf("%s:%d", addr, natsPort),
		"-store", filepath.Join(s.dir, "nats-"+host), "-name", s.ServerName(host)}
	args = append(args, s.natsSecurityArgs(host)...)
	args = append(args, s.accountsArgs()...)
	if s.opts.Topology == TopologySingle {
		// The single topology's store keeps its historical place.
		args[3] = filepath.Join(s.dir, "nats")
		return args
	}
	if s.opts.SecureBus {
		// The generated server configuration has the cluster block: its
		// routes, their mutual TLS and their ping timing.
		return args
	}
	var routes []string
	for _, h := range s.NATSHosts() {
		routes = append(routes, s.hostAddr(h)+":"+strconv.Itoa(routePort))
	}
	return append(args, "-cluster-name", "fan-lab", "-cluster-listen", s.hostAddr(host)+":"+strconv.Itoa(routePort),
		"-routes", strings.Join(routes, ","))
}

// StartNATSOn starts host's NATS server (again, after a stop or a kill) on
// the same addresses and store, and returns once it accepts connections.
func (s *Stack) StartNATSOn(ctx context.Context, host string) error {
	if p := s.Proc(host, "fan-nats"); p != nil && !p.Exited() {
		return fmt.Errorf("start nats on %s: still running (pid %d)", host, p.Pid())
	}
	if !slices.Contains(s.NATSHosts(), host) {
		return fmt.Errorf("start nats on %s: no NATS server there in the %s topology", host, s.opts.Topology)
	}
	if err := s.start(host, "fan-nats", s.natsArgs(host)...); err != nil {
		return err
	}
	if err := s.waitTCP(ctx, host, fmt.Sprintf("%s:%d", s.hostAddr(host), natsPort)); err != nil {
		return fmt.Errorf("nats on %s not reachable: %w", host, err)
	}
	return nil
}

// KillNATS ends host's NATS server with SIGKILL, as a crash would.
func (s *Stack) KillNATS(host string) error { return s.KillService(host, "fan-nats") }

// routeRules are the iptables rules that cut host's NATS server off from
// the other members (the cluster's route port, both directions) and
// nothing else: clients still reach every server.
func routeRules() [][]string {
	mark := []string{"-m", "comment", "--comment", "fan-lab-routes", "-j", "DROP"}
	port := strconv.Itoa(routePort)
	var rules [][]string
	for _, chain := range []string{"INPUT", "OUTPUT"} {
		for _, dir := range []string{"--dport", "--sport"} {
			rules = append(rules, append([]string{chain, "-p", "tcp", dir, port}, mark...))
		}
	}
	return rules
}

// CutRoutes partitions host's NATS server from the other two (routes only;
// its clients keep their connections). HealRoutes undoes it.
func (s *Stack) CutRoutes(ctx context.Context, host string) error {
	if !slices.Contains(s.NATSHosts(), host) || len(s.NATSHosts()) < 2 {
		return fmt.Errorf("cut routes of %s: no clustered NATS server there", host)
	}
	for _, r := range routeRules() {
		if _, err := s.Lab.Exec(ctx, host, append([]string{"iptables", "-w", "-I"}, r...)...); err != nil {
			return fmt.Errorf("cut routes of %s: %w", host, err)
		}
	}
	return nil
}

// HealRoutes removes every rule CutRoutes added on host.
func (s *Stack) HealRoutes(ctx context.Context, host string) error {
	return s.deleteRules(ctx, host, routeRules())
}

func (s *Stack) deleteRules(ctx context.Context, host string, rules [][]string) error {
	var errs []error
	for _, r := range rules {
		check := append([]string{"iptables", "-w", "-C"}, r...)
		del := append([]string{"iptables", "-w", "-D"}, r...)
		for range 16 {
			if _, err := s.Lab.Exec(ctx, host, check...); err != nil {
				break // -C fails once no copy is left
			}
			if _, err := s.Lab.Exec(ctx, host, del...); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("heal rules on %s: %w", host, err)
	}
	return nil
}

// NATSStore is the store directory of host's NATS server, for a test that
// loses it as a dead disk would (stop the server first).
func (s *Stack) NATSStore(host string) string {
	args := s.natsArgs(host)
	for i, a := range args[:len(args)-1] {
		if a == "-store" {
			return args[i+1]
		}
	}
	return ""
}
