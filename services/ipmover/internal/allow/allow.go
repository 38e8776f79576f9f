// Package allow is an executor's own list of what it may ever hold: groups
// and, for each, the address ranges its floating addresses must lie in. It
// is the last line against a command the arbiter never sent (or a state
// bucket someone else wrote): whatever the bus says, the node takes nothing
// outside its configuration.
package allow

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/ipmover/internal/execute"
)

// Group is one group a node may hold and the ranges its addresses lie in.
type Group struct {
	Name     string
	Prefixes []netip.Prefix
}

// List is a set of allowed groups. The zero value allows nothing.
type List struct {
	groups map[string][]netip.Prefix
}

// New builds a list; names must be valid tokens and unique.
func New(groups []Group) (*List, error) {
	l := &List{groups: make(map[string][]netip.Prefix, len(groups))}
	for _, g := range groups {
		if err := events.ValidToken("group", g.Name); err != nil {
			return nil, err
		}
		if _, dup := l.groups[g.Name]; dup {
			return nil, fmt.Errorf("group %s listed twice", g.Name)
		}
		if len(g.Prefixes) == 0 {
			return nil, fmt.Errorf("group %s: at least one prefix", g.Name)
		}
		l.groups[g.Name] = slices.Clone(g.Prefixes)
	}
	return l, nil
}

// Groups returns the allowed group names, sorted.
func (l *List) Groups() []string {
	out := make([]string, 0, len(l.groups))
	for g := range l.groups {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// Check refuses (wrapping execute.ErrNotAllowed) a group not in the list
// or an address outside the group's prefixes. A prefix written as a network
// (198.51.100.0/28, no host bits) allows any address in it; one written as
// an address (198.51.100.10/24, as the arbiter's group lists it) allows that
// address only. Either way the address's prefix length must be no shorter
// than the entry's: 198.51.100.10/8 would put a route for a /8 on the
// interface.
func (l *List) Check(group string, addresses []string) error {
	ranges, ok := l.groups[group]
	if !ok {
		return fmt.Errorf("group %q is not one this node may hold (groups: %v): %w", group, l.Groups(), execute.ErrNotAllowed)
	}
	for _, a := range addresses {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			return fmt.Errorf("address %q: %v: %w", a, err, execute.ErrNotAllowed)
		}
		if !slices.ContainsFunc(ranges, func(r netip.Prefix) bool { return fits(p, r) }) {
			return fmt.Errorf("address %s is outside group %s's prefixes %v: %w", a, group, ranges, execute.ErrNotAllowed)
		}
	}
	return nil
}

func fits(p, entry netip.Prefix) bool {
	if p.Bits() < entry.Bits() {
		return false
	}
	if entry == entry.Masked() {
		return entry.Contains(p.Addr())
	}
	return p.Addr() == entry.Addr()
}
