// Package quorum turns member checks' health into group health: "web is up
// while at least N of its M checks are up" (a DNS site's rule). It is pure:
// member states in, group transitions out. Hysteresis lives in the members;
// a group flips as soon as its count crosses N.
package quorum

import (
	"fmt"
	"strings"

	"github.com/fanpbx/fan/pkg/events"
)

// Group is a named quorum over member checks.
type Group struct {
	Name    string
	MinUp   int
	Members []string
}

// Tracker follows every group. Members start unknown.
type Tracker struct {
	groups  []Group
	members map[string]events.Health
	state   map[string]events.Health
	byCheck map[string][]int
}

// New starts every group and member in the unknown state.
func New(groups []Group) *Tracker {
	t := &Tracker{groups: groups, members: map[string]events.Health{}, state: map[string]events.Health{}, byCheck: map[string][]int{}}
	for i, g := range groups {
		t.state[g.Name] = events.HealthUnknown
		for _, m := range g.Members {
			t.members[m] = events.HealthUnknown
			t.byCheck[m] = append(t.byCheck[m], i)
		}
	}
	return t
}

// Change is a group crossing its threshold.
type Change struct {
	Group    string
	From, To events.Health
	Up       int // members up
	Need     int
	Total    int
	// Members are the group's members and their health, in configured order.
	Members []Member
}

// Member is one member's health at the time of a change.
type Member struct {
	Check  string
	Health events.Health
}

// Reason says why the group is where it is, naming every member.
func (c Change) Reason() string {
	parts := make([]string, len(c.Members))
	for i, m := range c.Members {
		parts[i] = m.Check + " " + string(m.Health)
	}
	return fmt.Sprintf("%d of %d up, need %d: %s", c.Up, c.Total, c.Need, strings.Join(parts, ", "))
}

// Observe records a member's new health and returns the groups that changed.
func (t *Tracker) Observe(check string, h events.Health) []Change {
	idx, ok := t.byCheck[check]
	if !ok {
		return nil
	}
	t.members[check] = h
	var out []Change
	for _, i := range idx {
		g := t.groups[i]
		up, unknown := 0, 0
		ms := make([]Member, len(g.Members))
		for j, m := range g.Members {
			ms[j] = Member{Check: m, Health: t.members[m]}
			switch t.members[m] {
			case events.HealthUp:
				up++
			case events.HealthUnknown:
				unknown++
			}
		}
		to := t.state[g.Name]
		switch {
		case up >= g.MinUp:
			to = events.HealthUp
		case up+unknown < g.MinUp:
			// Down only once the quorum cannot be reached even if every
			// member still unknown comes up: no "down" at start-up.
			to = events.HealthDown
		}
		if to == t.state[g.Name] {
			continue
		}
		out = append(out, Change{Group: g.Name, From: t.state[g.Name], To: to, Up: up, Need: g.MinUp, Total: len(g.Members), Members: ms})
		t.state[g.Name] = to
	}
	return out
}

// State is a group's current health.
func (t *Tracker) State(group string) events.Health { return t.state[group] }
