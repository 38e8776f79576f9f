package amipeer

import (
	"strings"
)

// What a session asked to receive, beyond its user's read rights: the
// event classes named in its Login's Events header ("system", "on") and the
// filters it added with the Filter action. Asterisk 22 applies both before
// an event is written to a session; list items answering an action are
// written to their session directly and pass neither (docs/asterisk22.md,
// "Registrations as they happen").

// eventFilter is one session's event selection; nil fields select all.
type eventFilter struct {
	classes classSet        // from Login's Events header
	names   map[string]bool // from Filter's MatchCriteria name(...)
}

// noteEventMask records the classes a Login's Events header asks for:
// "on" (or no header) asks for every class the user may read, "off" for
// none, a list of class names for those.
func (s *session) noteEventMask(value string) {
	v := strings.ToLower(strings.TrimSpace(value))
	f := s.currentFilter()
	switch v {
	case "", "on", "yes", "true":
		f.classes = nil
	case "off", "no", "false":
		return
	default:
		f.classes = newClassSet(strings.Split(v, ","))
	}
	s.filter.Store(&f)
}

func (s *session) currentFilter() eventFilter {
	if f := s.filter.Load(); f != nil {
		return *f
	}
	return eventFilter{}
}

// wants says whether the session's own selection lets an event through
// (its user's rights are checked apart, by readable).
func (s *session) wants(fields []Field) bool {
	f := s.filter.Load()
	if f == nil {
		return true
	}
	if f.classes != nil && !f.classes.overlaps(eventClasses(fields)) {
		return false
	}
	if f.names != nil {
		name := ""
		for _, fl := range fields {
			if strings.EqualFold(fl.Name, "Event") {
				name = fl.Value
				break
			}
		}
		if !f.names[strings.ToLower(name)] {
			return false
		}
	}
	return true
}

// filterAction answers Filter. The peer implements the forms fan uses and
// Asterisk 22 was observed to accept: Operation Add with MatchCriteria
// name(<event>), and the legacy whitelist regex of the exact form
// "Event: <name>". Asterisk then sends the session only the events named
// by some filter. Any other form is refused, so a test never relies on a
// filter the peer would not apply.
func (p *Peer) filterAction(m *msgBuilder, s *session, a Action) {
	if !strings.EqualFold(strings.TrimSpace(a.Field("Operation")), "Add") {
		m.fail(a, "Unknown operation")
		return
	}
	name := ""
	crit := strings.TrimSpace(a.Field("MatchCriteria"))
	filter := strings.TrimSpace(a.Field("Filter"))
	switch {
	case crit != "" && filter == "":
		inner, ok := strings.CutPrefix(strings.ToLower(crit), "name(")
		if ok {
			name, ok = strings.CutSuffix(inner, ")")
		}
		if !ok || name == "" || strings.ContainsAny(name, ",()") {
			m.fail(a, "amipeer: only MatchCriteria name(<event>) is implemented")
			return
		}
	case crit == "":
		v, ok := strings.CutPrefix(filter, "Event: ")
		if !ok || v == "" || strings.ContainsAny(v, ".*+?[](){}|^$\\!") {
			m.fail(a, "amipeer: only the whitelist filter \"Event: <name>\" is implemented")
			return
		}
		name = strings.ToLower(v)
	default:
		m.fail(a, "amipeer: MatchCriteria with a Filter regex is not implemented")
		return
	}
	f := s.currentFilter()
	names := map[string]bool{}
	for k := range f.names {
		names[k] = true
	}
	names[name] = true
	f.names = names
	s.filter.Store(&f)
	m.ack(a, "Success")
}
