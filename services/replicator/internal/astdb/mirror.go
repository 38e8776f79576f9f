package astdb

import (
	"context"
	"slices"
	"strings"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/replicator/internal/fstree"
)

// Mirror is the holder's copy of its carried families as it last read
// them or had them reported: what its deltas have told the standbys, so a
// change is published once and a reconcile publishes only what no event
// reported. It holds the records and nothing else.
type Mirror struct {
	families []string
	values   map[string]string
	// primed is set by the first reconcile: before it, everything a
	// reconcile finds is new, not unreported.
	primed bool
}

// NewMirror is an empty mirror of families.
func NewMirror(families []string) *Mirror {
	return &Mirror{families: slices.Clone(families), values: map[string]string{}}
}

// Len is how many keys the mirror holds.
func (m *Mirror) Len() int { return len(m.values) }

// Value is a key's value in the mirror.
func (m *Mirror) Value(key string) (string, bool) {
	v, ok := m.values[key]
	return v, ok
}

// Reported says whether the mirror follows Asterisk's ContactStatus events.
func (m *Mirror) Reported() bool { return slices.Contains(m.families, ReportedFamily) }

// FromEvents turns a batch of events into changes: each contact a
// ContactStatus names once, at its last status; a removed one deleted,
// the others read with DBGet (parallel at a time) and kept when their
// value is new to the mirror. A contact that is gone by the time it is
// read is left to the Removed event that follows. The mirror takes the
// changes; touched lists every key the batch named.
func (m *Mirror) FromEvents(ctx context.Context, a Actioner, evs []ami.Event, parallel int) (changes []events.AstDBChange, touched map[string]bool, err error) {
	if !m.Reported() {
		return nil, nil, nil
	}
	last := map[string]bool{} // key -> removed
	var order []string
	for _, ev := range evs {
		k, removed, ok := EventKey(ev)
		if !ok {
			continue
		}
		if _, seen := last[k]; !seen {
			order = append(order, k)
		}
		last[k] = removed
	}
	touched = make(map[string]bool, len(order))
	var read []string
	for _, k := range order {
		touched[k] = true
		if !last[k] {
			read = append(read, k)
		}
	}
	got, err := Lookup(ctx, a, read, parallel)
	if err != nil {
		return nil, touched, err
	}
	for _, k := range order {
		if last[k] {
			// Published whether or not the mirror knew it: a standby may
			// have it from an earlier holder.
			delete(m.values, k)
			changes = append(changes, events.AstDBChange{Key: k, Deleted: true})
			continue
		}
		v, ok := got[k]
		if !ok {
			continue
		}
		if old, had := m.values[k]; had && old == v {
			continue // a qualify result: the contact did not change
		}
		m.values[k] = v
		changes = append(changes, events.AstDBChange{Key: k, Value: v})
	}
	return changes, touched, nil
}

// Reconcile takes a whole read of families (DBGetTree) into the mirror,
// except the keys in skip (a fresher event reported them after the read
// began), and returns the values that changed: new keys and new values
// no event reported (unreported counts those of a reported family once
// the mirror was primed). Keys the read lacks leave the mirror without a
// change: a deletion nothing reported travels only in a manifest, where
// each standby weighs it.
func (m *Mirror) Reconcile(read []fstree.Entry, families []string, skip map[string]bool) (puts []events.AstDBChange, gone, unreported int) {
	inRead := make(map[string]bool, len(read))
	for _, e := range read {
		inRead[e.Path] = true
		if skip[e.Path] {
			continue
		}
		if old, had := m.values[e.Path]; had && old == e.Value {
			continue
		}
		if m.primed && strings.HasPrefix(e.Path, ReportedFamily+"/") {
			unreported++
		}
		m.values[e.Path] = e.Value
		puts = append(puts, events.AstDBChange{Key: e.Path, Value: e.Value})
	}
	for k := range m.values {
		if inRead[k] || skip[k] || !slices.ContainsFunc(families, func(f string) bool { return strings.HasPrefix(k, f+"/") }) {
			continue
		}
		delete(m.values, k)
		gone++
	}
	if len(families) == len(m.families) {
		m.primed = true
	}
	return puts, gone, unreported
}

// Entries is the mirror as a manifest's entries, sorted.
func (m *Mirror) Entries() []fstree.Entry {
	out := make([]fstree.Entry, 0, len(m.values))
	for k, v := range m.values {
		out = append(out, fstree.Entry{Path: k, Kind: fstree.KindValue, Value: v})
	}
	fstree.Sort(out)
	return out
}

// Reset forgets everything (a new tenure reads the families afresh).
func (m *Mirror) Reset() {
	m.values = map[string]string{}
	m.primed = false
}
