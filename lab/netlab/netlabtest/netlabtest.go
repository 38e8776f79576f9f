// Package netlabtest is the namespace harness at the level of one test:
// throw-away network namespaces joined by veth pairs or a bridge, for tests
// that run fan's code in-process against real netlink, ARP and NDP without
// touching the host's own interfaces. (netlab builds whole labs of hosts
// for fan's binaries; both enter a namespace the same way, netlab.InNamespace.)
//
// Everything it creates is removed in t.Cleanup, pass or fail. Only the
// helper `ip` command is used, and only here: product code speaks netlink.
package netlabtest

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// RequireRoot skips the test unless it can create namespaces; under CI
// a missing prerequisite fails instead (prereq.SkipOrFail).
func RequireRoot(t testing.TB) {
	t.Helper()
	prereq.Root(t)
	prereq.Need(t, "iproute2", "ip")
}

// LAN is hosts on one Ethernet segment: a bridge in a namespace of its
// own, and one namespace per host whose LANInterface is a veth into the bridge.
type LAN struct {
	Bridge NS
	Hosts  map[string]NS
	MACs   map[string]net.HardwareAddr
	Index  map[string]int // LANInterface's ifindex in each host
}

// LANInterface is each LAN host's interface. It is a name the host's own
// namespace does not use: Go resolves an IPv6 zone name (fe80::1%eth0) in
// the namespace of whichever thread writes, not the socket's, so a name
// that also exists on the host would send to the host's interface index.
const LANInterface = "lan0"

// NewLAN builds the segment. Host names must be short (they name veths).
func NewLAN(t testing.TB, prefix string, hosts ...string) *LAN {
	t.Helper()
	br := NewNS(t, prefix+"br")
	br.IP(t, "link", "add", "br0", "type", "bridge")
	br.IP(t, "link", "set", "br0", "up")
	l := &LAN{Bridge: br, Hosts: map[string]NS{}, MACs: map[string]net.HardwareAddr{}, Index: map[string]int{}}
	for _, h := range hosts {
		ns := NewNS(t, prefix+h)
		port := "p-" + h
		br.IP(t, "link", "add", port, "type", "veth", "peer", "name", LANInterface, "netns", ns.Name)
		br.IP(t, "link", "set", port, "master", "br0")
		br.IP(t, "link", "set", port, "up")
		ns.IP(t, "link", "set", LANInterface, "up")
		ifi := ns.Interface(t, LANInterface)
		l.Hosts[h], l.MACs[h], l.Index[h] = ns, ifi.HardwareAddr, ifi.Index
	}
	for h, ns := range l.Hosts {
		nh := ns.Netlink(t)
		waittest.Until(t, 5*time.Second, LANInterface+" up in "+h, func() bool { return operUp(nh, LANInterface) })
	}
	return l
}

// NS is one test namespace.
type NS struct {
	Name   string
	Handle netns.NsHandle
}

// IP runs `ip -n <ns> args...` and fails the test on error.
func (n NS) IP(t testing.TB, args ...string) string {
	t.Helper()
	return Run(t, "ip", append([]string{"-n", n.Name}, args...)...)
}

// Do runs fn on an OS thread that has entered the namespace. Sockets opened
// and interfaces looked up inside fn belong to the namespace; the thread is
// thrown away afterwards (it is never unlocked), so no goroutine can later
// run on a thread left in the wrong namespace.
func (n NS) Do(t testing.TB, fn func()) {
	t.Helper()
	if err := netlab.InNamespace(n.Handle, func() error { fn(); return nil }); err != nil {
		t.Fatalf("namespace %s: %v", n.Name, err)
	}
}

// Netlink opens a netlink handle bound to the namespace, closed in cleanup.
func (n NS) Netlink(t testing.TB) *netlink.Handle {
	t.Helper()
	h, err := netlink.NewHandleAt(n.Handle)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", n.Name, err)
	}
	t.Cleanup(h.Close)
	return h
}

// Interface looks an interface up inside the namespace.
func (n NS) Interface(t testing.TB, name string) *net.Interface {
	t.Helper()
	var (
		ifi *net.Interface
		err error
	)
	n.Do(t, func() { ifi, err = net.InterfaceByName(name) })
	if err != nil {
		t.Fatalf("interface %s in %s: %v", name, n.Name, err)
	}
	return ifi
}

// Sysctl writes a sysctl inside the namespace (key in dotted form).
func (n NS) Sysctl(t testing.TB, key, value string) {
	t.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	var err error
	n.Do(t, func() { err = os.WriteFile(path, []byte(value), 0o644) })
	if err != nil {
		t.Fatalf("sysctl %s=%s in %s: %v", key, value, n.Name, err)
	}
}

// NewNS creates a uniquely named namespace with loopback up. IPv6 duplicate
// address detection is switched off inside it so link-local addresses are
// usable at once instead of after a second of DAD.
func NewNS(t testing.TB, prefix string) NS {
	t.Helper()
	RequireRoot(t)
	name := prefix + "-" + randomHex(4)
	Run(t, "ip", "netns", "add", name)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatalf("open namespace %s: %v", name, err)
	}
	t.Cleanup(func() { h.Close() })
	ns := NS{Name: name, Handle: h}
	ns.IP(t, "link", "set", "lo", "up")
	ns.Sysctl(t, "net.ipv6.conf.default.accept_dad", "0")
	ns.Sysctl(t, "net.ipv6.conf.all.accept_dad", "0")
	return ns
}

// Pair is two namespaces joined by one veth pair, both ends up.
type Pair struct {
	A, B       NS
	IfA, IfB   string
	MACA, MACB net.HardwareAddr
	IndexA     int
	IndexB     int
}

// NewPair creates namespaces A and B joined by veth ifA<->ifB. The veth is
// created directly inside the namespaces, so it never exists in the host's.
func NewPair(t testing.TB, prefix, ifA, ifB string) *Pair {
	t.Helper()
	a := NewNS(t, prefix+"a")
	b := NewNS(t, prefix+"b")
	a.IP(t, "link", "add", ifA, "type", "veth", "peer", "name", ifB, "netns", b.Name)
	a.IP(t, "link", "set", ifA, "up")
	b.IP(t, "link", "set", ifB, "up")
	p := &Pair{A: a, B: b, IfA: ifA, IfB: ifB}
	ia := a.Interface(t, ifA)
	ib := b.Interface(t, ifB)
	p.MACA, p.MACB, p.IndexA, p.IndexB = ia.HardwareAddr, ib.HardwareAddr, ia.Index, ib.Index
	ha, hb := a.Netlink(t), b.Netlink(t)
	waittest.Until(t, 5*time.Second, "veth carrier up", func() bool {
		return operUp(ha, ifA) && operUp(hb, ifB)
	})
	return p
}

func operUp(h *netlink.Handle, name string) bool {
	l, err := h.LinkByName(name)
	if err != nil {
		return false
	}
	return l.Attrs().OperState == netlink.OperUp
}

// Run runs a helper command and fails the test with its output on error.
func Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}
