package doctor

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// groupInfo is one of the arbiter's groups as doctor learnt it: from the
// local arbiter.yaml, from the group status record on the bus, or both.
type groupInfo struct {
	Name      string
	Addresses []netip.Prefix
	Nodes     []string
	From      []string // "arbiter.yaml", "the bus"
}

func (g *groupInfo) from() string { return strings.Join(g.From, " and ") }

func (g *groupInfo) has(node string) bool { return slices.Contains(g.Nodes, node) }

// groups merges what the local arbiter.yaml and the bus's group status
// records say about the arbiter's groups.
func (r *run) groups(b busFacts) map[string]*groupInfo {
	out := map[string]*groupInfo{}
	get := func(name, from string) *groupInfo {
		g := out[name]
		if g == nil {
			g = &groupInfo{Name: name}
			out[name] = g
		}
		if !slices.Contains(g.From, from) {
			g.From = append(g.From, from)
		}
		return g
	}
	addAddr := func(g *groupInfo, a string) {
		p, err := netip.ParsePrefix(a)
		if err == nil && !slices.Contains(g.Addresses, p) {
			g.Addresses = append(g.Addresses, p)
		}
	}
	if a := r.files.arbiter; a != nil {
		for _, ag := range a.Groups {
			g := get(ag.Name, "arbiter.yaml")
			for _, addr := range ag.Addresses {
				addAddr(g, addr)
			}
			for _, n := range ag.Nodes {
				if !g.has(n) {
					g.Nodes = append(g.Nodes, n)
				}
			}
		}
	}
	for _, st := range b.groupStatus[r.cluster(b)] {
		g := get(st.Group, "the bus")
		for _, addr := range st.Addresses {
			addAddr(g, addr)
		}
		for n := range st.Nodes {
			if !g.has(n) {
				g.Nodes = append(g.Nodes, n)
			}
		}
		slices.Sort(g.Nodes)
	}
	return out
}

// fits is the ipmover's rule (services/ipmover/README.md, groups[]): an
// entry written as a network allows any address in it, one written as an
// address allows that address only; either way with a prefix no shorter.
func fits(addr, entry netip.Prefix) bool {
	if addr.Bits() < entry.Bits() {
		return false
	}
	if entry == entry.Masked() {
		return entry.Contains(addr.Addr())
	}
	return addr.Addr() == entry.Addr()
}

// floating are the floating addresses this node may hold: the ipmover's
// prefixes written as addresses, and the addresses of the arbiter's groups
// that list this node.
func (r *run) floating(groups map[string]*groupInfo) []netip.Prefix {
	var out []netip.Prefix
	add := func(p netip.Prefix) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	if ip := r.files.ipmover; ip != nil {
		for _, g := range ip.Groups {
			for _, s := range g.Prefixes {
				if p, err := netip.ParsePrefix(s); err == nil {
					add(p)
				}
			}
		}
	}
	node := r.files.node()
	for _, name := range sortedKeys(groups) {
		if g := groups[name]; g.has(node) {
			for _, a := range g.Addresses {
				add(a)
			}
		}
	}
	return out
}

// checkInterface: the ipmover's interface exists and every floating
// address lies in a subnet of it (an address of the interface is in the
// floating address's prefix), so the phones' ARP for it reaches this
// interface.
func (r *run) checkInterface(groups map[string]*groupInfo) {
	ip := r.files.ipmover
	if ip == nil || !ip.isIP() {
		return
	}
	subject := "ipmover.yaml interface " + ip.Interface
	ifc, err := net.InterfaceByName(ip.Interface)
	if err != nil {
		var names []string
		if all, err := net.Interfaces(); err == nil {
			for _, i := range all {
				names = append(names, i.Name)
			}
		}
		r.out.addf(Error, "host.interface", subject, "set interface: to the LAN the phones are on in "+filepath.Join(r.o.Etc, "ipmover.yaml")+" (ip -br addr lists them)",
			"no such interface on this host (it has: %s): the ipmover refuses to start", strings.Join(names, ", "))
		return
	}
	var own []netip.Prefix
	if addrs, err := ifc.Addrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				ones, _ := n.Mask.Size()
				if ad, ok := netip.AddrFromSlice(n.IP); ok {
					own = append(own, netip.PrefixFrom(ad.Unmap(), ones))
				}
			}
		}
	}
	var ownText []string
	for _, p := range own {
		ownText = append(ownText, p.String())
	}
	r.out.addf(OK, "host.interface", subject, "", "exists (%s)", strings.Join(ownText, ", "))
	for _, fl := range r.floating(groups) {
		// The interface's own address in the floating address's subnet, or
		// (a /32 or a range entry) the floating address in the interface's.
		inside := slices.ContainsFunc(own, func(o netip.Prefix) bool {
			return o.Addr() != fl.Addr() && (fl.Masked().Contains(o.Addr()) || o.Masked().Contains(fl.Addr()))
		})
		if !inside {
			r.out.addf(Error, "host.floating-subnet", fl.String(),
				"give the floating address one in the subnet of "+ip.Interface+" (arbiter.yaml groups[].addresses and ipmover.yaml groups[].prefixes), or name the interface on the phones' LAN",
				"not in the subnet of %s (%s): the phones' ARP for it never reaches this interface, and the address added here is not reachable from the LAN",
				ip.Interface, strings.Join(ownText, ", "))
			continue
		}
		r.out.addf(OK, "host.floating-subnet", fl.String(), "", "in the subnet of %s", ip.Interface)
	}
}

// checkCoverage: every address of every arbiter group that lists this node
// is allowed by the ipmover's groups: the ipmover refuses a claim outside
// them.
func (r *run) checkCoverage(groups map[string]*groupInfo) {
	ip := r.files.ipmover
	if ip == nil || !ip.isIP() {
		return
	}
	node := r.files.node()
	file := filepath.Join(r.o.Etc, "ipmover.yaml")
	checked := false
	for _, name := range sortedKeys(groups) {
		g := groups[name]
		if !g.has(node) {
			continue
		}
		checked = true
		i := slices.IndexFunc(ip.Groups, func(ig ipmoverGroup) bool { return ig.Name == g.Name })
		if i < 0 {
			r.out.addf(Error, "host.prefix-cover", "group "+g.Name,
				fmt.Sprintf("add to %s: groups: [{name: %s, prefixes: [%s]}]", file, g.Name, joinPrefixes(g.Addresses)),
				"the arbiter's group %s (%s) lists %s, and ipmover.yaml has no group %s: the ipmover refuses every claim of it", g.Name, g.from(), node, g.Name)
			continue
		}
		var entries []netip.Prefix
		for _, s := range ip.Groups[i].Prefixes {
			if p, err := netip.ParsePrefix(s); err == nil {
				entries = append(entries, p)
			}
		}
		for _, a := range g.Addresses {
			if !slices.ContainsFunc(entries, func(e netip.Prefix) bool { return fits(a, e) }) {
				r.out.addf(Error, "host.prefix-cover", "group "+g.Name+" address "+a.String(),
					fmt.Sprintf("add %s to groups[%s].prefixes in %s", a, g.Name, file),
					"outside ipmover.yaml groups[%s].prefixes [%s] (the address is the arbiter's, from %s): the ipmover refuses the claim and this node can never hold it",
					g.Name, joinPrefixes(entries), g.from())
				continue
			}
			r.out.addf(OK, "host.prefix-cover", "group "+g.Name+" address "+a.String(), "", "within ipmover.yaml groups[%s].prefixes", g.Name)
		}
	}
	if !checked {
		r.out.addf(Skipped, "host.prefix-cover", "", "",
			"no arbiter group listing %s is known here (no arbiter.yaml on this host, and none read from the bus)", node)
	}
}

// checkNonlocalBind: in answer mode hot, Asterisk binds the floating
// address while it is absent, which the kernel allows only with
// ip_nonlocal_bind = 1 in the host's network namespace.
func (r *run) checkNonlocalBind() {
	ip := r.files.ipmover
	if ip == nil || !ip.isIP() {
		return
	}
	if ip.answerMode() != "hot" {
		r.out.addf(Skipped, "host.nonlocal-bind", "", "", "the ipmover answers %s, not hot: Asterisk binds the floating address once it is here", ip.answerMode())
		return
	}
	families := map[string]bool{}
	for _, g := range ip.Groups {
		for _, s := range g.Prefixes {
			if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() && !p.Addr().Is4In6() {
				families["ipv6"] = true
			} else if err == nil {
				families["ipv4"] = true
			}
		}
	}
	if len(families) == 0 {
		families["ipv4"] = true
	}
	for _, fam := range []string{"ipv4", "ipv6"} {
		if !families[fam] {
			continue
		}
		key := "net." + fam + ".ip_nonlocal_bind"
		b, err := os.ReadFile(filepath.Join(r.o.ProcSys, "net", fam, "ip_nonlocal_bind"))
		if err != nil {
			r.out.addf(Warning, "host.nonlocal-bind", key, "", "cannot read it: %v", err)
			continue
		}
		if v := strings.TrimSpace(string(b)); v != "1" {
			r.out.addf(Error, "host.nonlocal-bind", key,
				"sysctl -w "+key+"=1, and keep it from boot: install deploy/asterisk/60-fan-nonlocal-bind.conf in /etc/sysctl.d; then restart Asterisk so its transport binds the floating address",
				"is %s and the ipmover answers hot (answer.mode): Asterisk cannot bind the floating address while it is on the other node, so after a failover SIP on it goes unanswered until Asterisk restarts. fan-ipmover sets it when it starts, but an Asterisk started before that has already failed to bind", v)
			continue
		}
		r.out.addf(OK, "host.nonlocal-bind", key, "", "is 1 (answer mode hot)")
	}
}

func joinPrefixes(ps []netip.Prefix) string {
	var s []string
	for _, p := range ps {
		s = append(s, p.String())
	}
	return strings.Join(s, ", ")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// hostAddrs are the addresses of every interface of this host (of the
// network namespace doctor runs in).
func hostAddrs() []netip.Prefix {
	var out []netip.Prefix
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ones, _ := n.Mask.Size()
			if ad, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, netip.PrefixFrom(ad.Unmap(), ones))
			}
		}
	}
	return out
}
