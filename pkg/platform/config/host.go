package config

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
)

// Names a configuration gives to things of the host (a network interface,
// an address to listen on) are checked where it runs, like its files: the
// ipmover's "interface: eth0" copied to a host whose NIC is ens18 is
// refused by -check-config, not by the first failover.

// InterfaceExists requires name to be a network interface of this host
// (in this network namespace), naming those it has otherwise.
func InterfaceExists(key, name string) error {
	if name == "" {
		return nil
	}
	if _, err := net.InterfaceByName(name); err == nil {
		return nil
	}
	var names []string
	if ifs, err := net.Interfaces(); err == nil {
		for _, ifc := range ifs {
			names = append(names, ifc.Name)
		}
	} else {
		// No netlink socket (a unit's RestrictAddressFamilies): sysfs
		// lists the same interfaces.
		entries, err := os.ReadDir("/sys/class/net")
		if err != nil {
			return Errf(key, "%s: the host's interfaces cannot be listed: %v", name, err)
		}
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if slices.Contains(names, name) {
			return nil
		}
	}
	return Errf(key, "%s does not exist on this host (it has: %s)", name, strings.Join(names, ", "))
}

// ListenLocal requires the host of a listen address (host:port), when it
// is an IP address, to be one of this host's addresses (or the unspecified
// address, or loopback): a service would otherwise fail to bind it, or,
// with ip_nonlocal_bind, listen where nothing arrives. A name is not
// resolved (that is neither cheap nor certain), and where the host's
// addresses cannot be listed (a unit whose RestrictAddressFamilies has no
// AF_NETLINK) nothing is refused.
func ListenLocal(key, hostport string) error {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil // the bounds check names a malformed address
	}
	ip, err := netip.ParseAddr(strings.Trim(host, "[]"))
	if err != nil || ip.IsUnspecified() || ip.IsLoopback() {
		return nil
	}
	ip = ip.Unmap().WithZone("")
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var have []string
	for _, a := range addrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		if p.Addr().Unmap() == ip {
			return nil
		}
		if !p.Addr().IsLoopback() && !p.Addr().IsLinkLocalUnicast() {
			have = append(have, p.Addr().String())
		}
	}
	slices.Sort(have)
	if len(have) == 0 {
		return Errf(key, "%s is not an address of this host (it has none but loopback)", ip)
	}
	return Errf(key, "%s is not an address of this host (it has: %s)", ip, strings.Join(have, ", "))
}
