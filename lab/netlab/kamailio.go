package netlab

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/fanpbx/fan/lab/kamailio"
)

// SIPPort is where StartKamailio listens.
const SIPPort = 5060

var nodeNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,32}$`)

// KamailioReadyTimeout bounds how long StartKamailio waits for the UDP socket.
var KamailioReadyTimeout = 10 * time.Second

// StartKamailio runs Kamailio in host's namespace listening on udp:listenIP:5060 and
// answering OPTIONS with "Server-Node: nodeName". It returns once the socket is bound,
// which on a node (ip_nonlocal_bind=1) happens even while listenIP is not assigned: the
// hot-standby case. The config is checked with `kamailio -c` first and its output is in
// the error if the check fails.
func (l *Lab) StartKamailio(host, nodeName, listenIP string) (*Proc, error) {
	return l.startKamailio(host, nodeName, []string{listenIP}, false)
}

// StartKamailioOn is StartKamailio listening on several addresses, over UDP and TCP on
// each: typically the floating IP (what phones use) and the node's own address (what
// peers probe to tell a dead node from one cut off from the bus). It returns once every
// UDP socket is bound.
func (l *Lab) StartKamailioOn(host, nodeName string, listenIPs []string) (*Proc, error) {
	if len(listenIPs) == 0 {
		return nil, fmt.Errorf("netlab: kamailio on %s: no listen address", host)
	}
	return l.startKamailio(host, nodeName, listenIPs, true)
}

func (l *Lab) startKamailio(host, nodeName string, listenIPs []string, tcp bool) (*Proc, error) {
	h, err := l.host(host)
	if err != nil {
		return nil, err
	}
	if !nodeNameRE.MatchString(nodeName) {
		return nil, fmt.Errorf("netlab: kamailio on %s: node name %q must match %s", host, nodeName, nodeNameRE)
	}
	var ips []netip.Addr
	var listen strings.Builder
	for _, s := range listenIPs {
		ip, err := netip.ParseAddr(s)
		if err != nil || !ip.Is4() || !allowedAddr(ip) {
			return nil, fmt.Errorf("netlab: kamailio on %s: listen IP %q must be an IPv4 test-network address", host, s)
		}
		ips = append(ips, ip)
		fmt.Fprintf(&listen, "listen=udp:%s:%d\n", ip, SIPPort)
		if tcp {
			fmt.Fprintf(&listen, "listen=tcp:%s:%d\n", ip, SIPPort)
		}
	}
	if tcp {
		listen.WriteString("tcp_accept_no_cl=yes\n")
	}
	dir, err := os.MkdirTemp(l.dir, "kamailio-"+host+"-")
	if err != nil {
		return nil, fmt.Errorf("kamailio on %s: %w", host, err)
	}
	cfg := filepath.Join(dir, "kamailio.cfg")
	if err := os.WriteFile(cfg, []byte(kamailio.NodeConfig(strings.TrimSuffix(listen.String(), "\n"), nodeName)), 0o644); err != nil {
		return nil, fmt.Errorf("kamailio on %s: write config: %w", host, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Checked inside the namespace because the check resolves the listen address.
	if _, err := l.Exec(ctx, host, "kamailio", "-c", "-f", cfg); err != nil {
		return nil, fmt.Errorf("kamailio on %s: config check: %w", host, err)
	}
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o755); err != nil {
		return nil, fmt.Errorf("kamailio on %s: %w", host, err)
	}
	argv := []string{"kamailio", "-f", cfg, "-DD", "-E", "-Y", run, "-P", filepath.Join(run, "kamailio.pid"), "-m", "32", "-M", "8"}
	p, err := l.Start(host, "kamailio", argv, nil)
	if err != nil {
		return nil, err
	}
	want, err := nsIdentity(filepath.Join(netnsDir, h.NS))
	if err != nil {
		_ = p.Kill()
		return nil, err
	}
	deadline := time.Now().Add(KamailioReadyTimeout)
	for {
		bound := true
		for _, ip := range ips {
			bound = bound && udpBound(p.Pid(), want, ip, SIPPort)
		}
		if bound {
			l.log.Info("netlab: kamailio ready", "host", host, "node", nodeName, "listen", listenIPs, "tcp", tcp, "pid", p.Pid())
			return p, nil
		}
		if p.Exited() {
			return nil, fmt.Errorf("netlab: kamailio on %s: exited before binding (%v): %s", host, p.Wait(), p.Tail(2048))
		}
		if time.Now().After(deadline) {
			_ = p.Kill()
			return nil, fmt.Errorf("netlab: kamailio on %s: udp %v:%d not bound after %v: %s", host, listenIPs, SIPPort, KamailioReadyTimeout, p.Tail(2048))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// udpBound looks at the UDP table of pid's namespace. Until `ip netns exec` has switched
// namespaces, /proc/PID/net shows the caller's table, hence the namespace check first.
func udpBound(pid int, want nsID, ip netip.Addr, port uint16) bool {
	if id, err := nsIdentity(fmt.Sprintf("/proc/%d/ns/net", pid)); err != nil || id != want {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/udp", pid))
	if err != nil {
		return false
	}
	// /proc/net/udp prints the address as a host-order (little-endian here) u32.
	a := ip.As4()
	local := fmt.Sprintf("%08X:%04X", binary.LittleEndian.Uint32(a[:]), port)
	wild := fmt.Sprintf("%08X:%04X", 0, port)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 1 && (f[1] == local || f[1] == wild) {
			return true
		}
	}
	return false
}
