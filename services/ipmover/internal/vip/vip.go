// Package vip puts floating addresses on, and takes them off, one network
// interface through netlink, and watches that interface's addresses.
//
// Every operation is idempotent because the reconcile loop calls them
// repeatedly from a level-triggered view: adding an address that is already
// there, or deleting one that is gone, is success. IPv6 addresses are added
// with IFA_F_NODAD: after a split brain heals, duplicate address detection
// would otherwise leave the address stuck in "dadfailed" on the node that is
// supposed to hold it, and DAD also delays the first usable moment by about a
// second on the failover critical path.
package vip

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// LabelSuffix marks IPv4 addresses fan added, so `ip addr` shows them as
// `<ifname>:fan` and an operator can tell them from the node's own.
const LabelSuffix = ":fan"

// maxLabelLen is IFNAMSIZ less the terminating NUL; the kernel rejects longer labels.
const maxLabelLen = unix.IFNAMSIZ - 1

// Label returns the label for addresses on ifname, or "" when ifname is too
// long for the suffix to fit (the kernel then shows the interface name).
// The kernel and netlink both require a label to start with the interface name.
func Label(ifname string) string {
	l := ifname + LabelSuffix
	if len(l) > maxLabelLen {
		return ""
	}
	return l
}

// Manager manages addresses on one interface.
type Manager struct {
	ifname string
	label  string
	h      *netlink.Handle
	ns     netns.NsHandle // netns.None() for the caller's namespace
	log    *slog.Logger
	index  atomic.Int32 // last seen ifindex, used to filter watch events
}

// Option adjusts a Manager.
type Option func(*Manager)

// WithNamespace makes the Manager work on an interface inside another
// network namespace (labs and tests) rather than the caller's own.
func WithNamespace(ns netns.NsHandle) Option {
	return func(m *Manager) { m.ns = ns }
}

// New returns a Manager for ifname. The interface must exist now, so that a
// misconfigured name fails at start-up rather than at the first failover.
func New(ifname string, log *slog.Logger, opts ...Option) (*Manager, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &Manager{ifname: ifname, ns: netns.None(), log: log.With("component", "vip", "interface", ifname)}
	for _, o := range opts {
		o(m)
	}
	var err error
	if m.ns.IsOpen() {
		m.h, err = netlink.NewHandleAt(m.ns)
	} else {
		m.h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("netlink handle: %w", err)
	}
	if _, err := m.link(); err != nil {
		m.h.Close()
		return nil, err
	}
	m.label = Label(ifname)
	if m.label == "" {
		m.log.Warn("interface name too long for an address label; fan's addresses will be unlabelled", "suffix", LabelSuffix)
	}
	return m, nil
}

// Close releases the netlink handle.
func (m *Manager) Close() { m.h.Close() }

// Interface is the managed interface's name.
func (m *Manager) Interface() string { return m.ifname }

// link looks the interface up on every call: an interface that was deleted
// and re-created (a bond or VLAN restarted) gets a new index, and a cached
// one would make every later call fail.
func (m *Manager) link() (netlink.Link, error) {
	l, err := m.h.LinkByName(m.ifname)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", m.ifname, err)
	}
	m.index.Store(int32(l.Attrs().Index))
	return l, nil
}

func (m *Manager) nlAddr(p netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: prefixToIPNet(p)}
	if p.Addr().Is4() {
		a.Label = m.label
	} else {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

// Replace puts p on the interface, or refreshes it if it is already there.
// An IPv6 address that is present but marked dadfailed is deleted first,
// because a replace keeps that flag and the address would stay unusable.
func (m *Manager) Replace(p netip.Prefix) error {
	p, err := normalize(p)
	if err != nil {
		return err
	}
	l, err := m.link()
	if err != nil {
		return err
	}
	if p.Addr().Is6() {
		cur, err := m.list(l)
		if err != nil {
			return err
		}
		for _, a := range cur {
			if a.prefix == p && a.flags&unix.IFA_F_DADFAILED != 0 {
				m.log.Warn("address is dadfailed; deleting it before adding it back", "address", p)
				if err := m.h.AddrDel(l, m.nlAddr(p)); err != nil && !isAbsent(err) {
					return fmt.Errorf("delete dadfailed %s from %s: %w", p, m.ifname, err)
				}
			}
		}
	}
	if err := m.h.AddrReplace(l, m.nlAddr(p)); err != nil {
		return fmt.Errorf("add %s to %s: %w", p, m.ifname, err)
	}
	return nil
}

// Delete takes p off the interface. An absent address is not an error.
func (m *Manager) Delete(p netip.Prefix) error {
	p, err := normalize(p)
	if err != nil {
		return err
	}
	l, err := m.link()
	if err != nil {
		return err
	}
	// Delete by address alone: the kernel only deletes an IPv4 address
	// whose label matches the one given, and an address that must go may
	// carry another label (added by hand, or by an older fan).
	if err := m.h.AddrDel(l, &netlink.Addr{IPNet: prefixToIPNet(p)}); err != nil && !isAbsent(err) {
		return fmt.Errorf("delete %s from %s: %w", p, m.ifname, err)
	}
	return nil
}

// Present returns those of want that are on the interface and usable, in
// want's order. An IPv6 address marked dadfailed counts as absent, so the
// reconcile loop will put it back.
func (m *Manager) Present(want []netip.Prefix) ([]netip.Prefix, error) {
	l, err := m.link()
	if err != nil {
		return nil, err
	}
	cur, err := m.list(l)
	if err != nil {
		return nil, err
	}
	have := make(map[netip.Prefix]bool, len(cur))
	for _, a := range cur {
		if a.flags&unix.IFA_F_DADFAILED == 0 {
			have[a.prefix] = true
		}
	}
	var out []netip.Prefix
	for _, p := range want {
		if np, err := normalize(p); err == nil && have[np] {
			out = append(out, p)
		}
	}
	return out, nil
}

// Address is one address on the interface as netlink reports it.
type Address struct {
	Prefix netip.Prefix
	Label  string
	Flags  int // IFA_F_* flags
}

// List returns every address on the interface.
func (m *Manager) List() ([]Address, error) {
	l, err := m.link()
	if err != nil {
		return nil, err
	}
	cur, err := m.list(l)
	if err != nil {
		return nil, err
	}
	out := make([]Address, len(cur))
	for i, a := range cur {
		out[i] = Address{Prefix: a.prefix, Label: a.label, Flags: a.flags}
	}
	return out, nil
}

type listed struct {
	prefix netip.Prefix
	label  string
	flags  int
}

func (m *Manager) list(l netlink.Link) ([]listed, error) {
	addrs, err := m.h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list addresses on %s: %w", m.ifname, err)
	}
	out := make([]listed, 0, len(addrs))
	for _, a := range addrs {
		p, ok := ipNetToPrefix(a.IPNet)
		if !ok {
			continue
		}
		out = append(out, listed{prefix: p, label: a.Label, flags: a.Flags})
	}
	return out, nil
}

// normalize keeps the host part (a floating address is a host with a mask,
// not a network) but rejects forms the kernel would store differently from
// how we compare them, so Present can never miss an address it put there.
func normalize(p netip.Prefix) (netip.Prefix, error) {
	switch {
	case !p.IsValid():
		return netip.Prefix{}, fmt.Errorf("vip: invalid prefix %v", p)
	case p.Addr().Is4In6():
		return netip.Prefix{}, fmt.Errorf("vip: prefix %v: use the plain IPv4 form", p)
	}
	return p, nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	a := p.Addr()
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(p.Bits(), a.BitLen())}
}

func ipNetToPrefix(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	a = a.Unmap()
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a, ones), true
}

// isAbsent reports the kernel's "no such address" answers to a delete.
func isAbsent(err error) bool {
	return errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH)
}
