package stack

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/lab/netlab"
)

// Identities the secure lab issues besides the services' own: the operator
// and auditor people, the status page (a viewer), and the admin that
// provisions the streams.
const (
	LabOperator = "alice"
	LabAuditor  = "audit"
	LabViewer   = "noc"
	LabAdmin    = "admin"
)

// bundleMount stands for the directory a bundle is installed in: the lab's
// hosts share one file system, so each host's files stay in their bundle
// and the generated paths are rewritten to point there.
const bundleMount = "/fan-lab-bundle"

// busDir is where `fanctl nats-config` writes the secure lab's credentials.
func (s *Stack) busDir() string { return filepath.Join(s.dir, "bus") }

// Bundle is the directory of one host's or person's generated credentials
// (SecureBus only).
func (s *Stack) Bundle(name string) string { return filepath.Join(s.busDir(), "hosts", name) }

// generateBus writes a cluster file naming the lab's hosts and runs
// `fanctl nats-config` on it, as an installer would: one NATS server on ctl,
// or the colocated shape's three (one beside each PBX node's services, one
// on the witness, with bus.leader_servers naming the witness's when the
// stack places leaders).
func (s *Stack) generateBus(ctx context.Context) error {
	var b strings.Builder
	fmt.Fprintf(&b, "cluster: %s\nnats:\n", s.opts.Cluster)
	for _, h := range s.NATSHosts() {
		addr := s.hostAddr(h)
		fmt.Fprintf(&b, "  - name: %s\n    host: %q\n    ips: [%q]\n    client_port: %d\n    cluster_port: %d\n    monitor: \"-\"\n",
			s.ServerName(h), addr, addr, natsPort, routePort)
		if s.opts.Topology != TopologySingle {
			fmt.Fprintf(&b, "    fan_host: %s\n", h)
		}
	}
	if s.opts.LeaderPlacement && s.opts.Topology == TopologyColocated {
		fmt.Fprintf(&b, "leader_servers: [%s]\n", s.ServerName(WitnessHost))
	}
	b.WriteString("nodes:\n")
	for _, n := range s.nodeNames() {
		fmt.Fprintf(&b, "  - name: %s\n", n)
		if slices.Contains(s.ArbiterHosts(), n) {
			b.WriteString("    services: [prober, ipmover, replicator, arbiter]\n")
		}
	}
	fmt.Fprintf(&b, "control:\n  - name: %s\noperators: [%s]\nauditors: [%s]\nviewers: [%s]\n", netlab.ControlHost, LabOperator, LabAuditor, LabViewer)
	// Each server's and host's files stay in its own bundle (installed
	// rewrites bundleMount to it); fan-nats's -store gives each server its
	// own store.
	fmt.Fprintf(&b, "nats_dir: %q\nstore_dir: %q\nfan_dir: %q\n", bundleMount, filepath.Join(s.dir, "nats"), bundleMount)
	cf := filepath.Join(s.dir, "bus-cluster.yaml")
	if err := os.WriteFile(cf, []byte(b.String()), 0o644); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(s.opts.BinDir, "fanctl"), "nats-config",
		"--cluster-file", cf, "--out", s.busDir()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("fanctl nats-config: %w: %s", err, out)
	}
	for _, p := range []string{LabOperator, LabAuditor, LabViewer, LabAdmin} {
		if _, err := s.installed(p, "fanctl.yaml"); err != nil {
			return err
		}
	}
	for _, h := range s.NATSHosts() {
		if _, err := s.installed(s.ServerName(h), "nats-server.conf"); err != nil {
			return err
		}
	}
	return nil
}

// installed reads file from name's bundle with the bundle's paths pointing
// at the bundle itself, writes that copy into the lab's dir and returns it.
func (s *Stack) installed(name, file string) (string, error) {
	b, err := os.ReadFile(filepath.Join(s.Bundle(name), file))
	if err != nil {
		return "", fmt.Errorf("bundle %s: %w", name, err)
	}
	p := s.FanctlConfig(name)
	if file != "fanctl.yaml" {
		p = filepath.Join(s.dir, name+"-"+file)
	}
	txt := strings.ReplaceAll(string(b), bundleMount+"/", s.Bundle(name)+"/")
	return txt, os.WriteFile(p, []byte(txt), 0o600)
}

// FanctlConfig is the fanctl --config file of a person (LabOperator,
// LabAuditor, LabAdmin) or the status page (LabViewer) in a SecureBus lab.
func (s *Stack) FanctlConfig(person string) string {
	return filepath.Join(s.dir, "fanctl-"+person+".yaml")
}

// NATSServerConfig is the nats-server configuration host's fan-nats runs
// with in a SecureBus lab (-server-config): its name, TLS and routes.
func (s *Stack) NATSServerConfig(host string) string {
	return filepath.Join(s.dir, s.ServerName(host)+"-nats-server.conf")
}

// natsSecurityArgs are fan-nats's authentication and TLS arguments on host.
func (s *Stack) natsSecurityArgs(host string) []string {
	if s.opts.SecureBus {
		return []string{"-server-config", s.NATSServerConfig(host)}
	}
	return []string{"-insecure-lab"}
}

// FanctlArgs are the connection flags fanctl needs to reach the lab's bus
// from the control host (the operator's identity on a SecureBus lab).
func (s *Stack) FanctlArgs() []string {
	if s.opts.SecureBus {
		return []string{"--config", s.FanctlConfig(LabOperator)}
	}
	return []string{"--url", s.NATSURL(), "--insecure-lab"}
}

// Fanctl runs fanctl on the control host, connected to the lab's bus, and
// returns its combined output.
func (s *Stack) Fanctl(ctx context.Context, args ...string) ([]byte, error) {
	argv := append([]string{filepath.Join(s.opts.BinDir, "fanctl")}, s.FanctlArgs()...)
	return s.Lab.Exec(ctx, netlab.ControlHost, append(argv, args...)...)
}

// FanctlAs runs fanctl on the control host with person's generated
// configuration (SecureBus only).
func (s *Stack) FanctlAs(ctx context.Context, person string, args ...string) ([]byte, error) {
	argv := []string{filepath.Join(s.opts.BinDir, "fanctl"), "--config", s.FanctlConfig(person)}
	return s.Lab.Exec(ctx, netlab.ControlHost, append(argv, args...)...)
}

// busAuth is the template data of the bus identity of svc on host (see
// busAuthTemplate): on a SecureBus lab, the url, seed and TLS files of the
// bus section `fanctl nats-config` wrote into host's bundle; empty while the
// lab runs a plain bus.
func (s *Stack) busAuth(host, svc string) map[string]any {
	if !s.opts.SecureBus {
		return map[string]any{}
	}
	txt, err := s.installed(host, svc+"-bus.yaml")
	if err != nil {
		// The template then writes insecure_lab and the service refuses
		// the secure server: the failure shows in its log.
		s.opts.Log.Error("bus bundle", "host", host, "service", svc, "err", err)
		return map[string]any{}
	}
	keys := map[string]string{"url": "NATS", "nkey_seed": "BusSeed", "ca": "BusCA", "cert": "BusCert", "key": "BusKey"}
	m := map[string]any{}
	inSystem := false
	for _, line := range strings.Split(txt, "\n") {
		t := strings.TrimSpace(line)
		if strings.HasPrefix(t, "#") {
			continue
		}
		k, v, ok := strings.Cut(t, ":")
		if !ok {
			continue
		}
		if k == "system" {
			inSystem = true
			continue
		}
		if uq, err := strconv.Unquote(strings.TrimSpace(v)); err == nil {
			v = uq
		}
		switch d, ok := keys[k]; {
		case inSystem && k == "nkey_seed":
			m["SystemSeed"] = strings.TrimSpace(v)
		case ok:
			m[d] = strings.TrimSpace(v)
		}
	}
	return m
}
