package calls

import (
	"slices"
	"strconv"
	"strings"

	"github.com/fanpbx/fan/pkg/ami"
)

// The AMI events the recorder follows (class call, Asterisk 22), each
// asked for by name with a session filter. Newchannel and Hangup keep the
// count of channels; BridgeEnter and BridgeLeave say which channels a
// bridge joins; Rename follows a channel whose name changes; Hold and
// Unhold make the media be read again (a held call's audio may go through
// Asterisk, for music on hold).
const (
	EventNewchannel  = "Newchannel"
	EventHangup      = "Hangup"
	EventBridgeEnter = "BridgeEnter"
	EventBridgeLeave = "BridgeLeave"
	EventRename      = "Rename"
	EventHold        = "Hold"
	EventUnhold      = "Unhold"
)

// EventNames are the events a recorder's AMI session asks for.
func EventNames() []string {
	return []string{EventNewchannel, EventHangup, EventBridgeEnter, EventBridgeLeave, EventRename, EventHold, EventUnhold}
}

// EventMask is the event class a recorder's session logs in for: its AMI
// user must read it.
const EventMask = "call"

// chanEvent is what the model takes of one AMI event.
type chanEvent struct {
	name     string
	uniqueid string
	channel  string
	linkedid string
	bridge   string
	newname  string
}

// parseEvent reads an event the model follows; ok is false for any other
// or one without a channel's unique id.
func parseEvent(ev ami.Event) (chanEvent, bool) {
	e := chanEvent{name: ev.Name(), uniqueid: ev.Field("Uniqueid"), channel: ev.Field("Channel"),
		linkedid: ev.Field("Linkedid"), bridge: ev.Field("BridgeUniqueid"), newname: ev.Field("Newname")}
	if e.uniqueid == "" || !slices.Contains(EventNames(), e.name) {
		return chanEvent{}, false
	}
	return e, true
}

// channel is one channel Asterisk has up.
type channel struct {
	name   string
	linked string
	bridge string // "" when it is in no bridge
}

// snapChannel is one channel of CoreShowChannels.
type snapChannel struct {
	uniqueid, name, linkedid, bridge string
}

// model is the channels and bridges of this node's Asterisk, as its events
// and reconciles tell them. A call is a bridge that joins exactly two
// channels.
type model struct {
	chans   map[string]*channel // by Uniqueid
	bridges map[string]map[string]bool
	// touched, while a reconcile is out, holds the channels events spoke
	// of since it was asked: they are newer than its answer.
	touched map[string]bool
}

func newModel() *model {
	return &model{chans: map[string]*channel{}, bridges: map[string]map[string]bool{}}
}

// apply takes one event and returns the bridges whose members it may have
// changed, and the channel when its media should be read again.
func (m *model) apply(e chanEvent) (bridges []string, media string) {
	if m.touched != nil {
		m.touched[e.uniqueid] = true
	}
	c := m.chans[e.uniqueid]
	switch e.name {
	case EventNewchannel:
		if c == nil {
			m.chans[e.uniqueid] = &channel{name: e.channel, linked: e.linkedid}
		}
	case EventHangup:
		if c != nil {
			bridges = m.leave(e.uniqueid, c)
			delete(m.chans, e.uniqueid)
		}
	case EventBridgeEnter:
		if c == nil {
			// Its Newchannel came before the session did (or was lost).
			c = &channel{name: e.channel, linked: e.linkedid}
			m.chans[e.uniqueid] = c
		}
		if c.bridge != e.bridge {
			bridges = m.leave(e.uniqueid, c)
		}
		c.bridge = e.bridge
		if m.bridges[e.bridge] == nil {
			m.bridges[e.bridge] = map[string]bool{}
		}
		m.bridges[e.bridge][e.uniqueid] = true
		bridges = append(bridges, e.bridge)
	case EventBridgeLeave:
		if c != nil && c.bridge == e.bridge {
			bridges = m.leave(e.uniqueid, c)
		}
	case EventRename:
		if c != nil && e.newname != "" {
			c.name = e.newname
			if c.bridge != "" {
				bridges = []string{c.bridge}
			}
		}
	case EventHold, EventUnhold:
		if c != nil && c.bridge != "" {
			return nil, e.uniqueid
		}
	}
	return bridges, ""
}

// leave takes a channel out of its bridge.
func (m *model) leave(uid string, c *channel) []string {
	b := c.bridge
	if b == "" {
		return nil
	}
	c.bridge = ""
	delete(m.bridges[b], uid)
	if len(m.bridges[b]) == 0 {
		delete(m.bridges, b)
	}
	return []string{b}
}

// startReconcile marks the moment a reconcile is asked: the events from
// now on are newer than its answer.
func (m *model) startReconcile() { m.touched = map[string]bool{} }

// reconcile replaces the model with a reconcile's channels, except those
// events spoke of since it was asked (their events are newer), and ends the
// reconcile.
func (m *model) reconcile(snap []snapChannel) {
	touched := m.touched
	m.touched = nil
	next := map[string]*channel{}
	for uid, c := range m.chans {
		if touched[uid] {
			next[uid] = c
		}
	}
	for _, s := range snap {
		if touched[s.uniqueid] {
			continue
		}
		next[s.uniqueid] = &channel{name: s.name, linked: s.linkedid, bridge: s.bridge}
	}
	m.chans = next
	m.bridges = map[string]map[string]bool{}
	for uid, c := range m.chans {
		if c.bridge == "" {
			continue
		}
		if m.bridges[c.bridge] == nil {
			m.bridges[c.bridge] = map[string]bool{}
		}
		m.bridges[c.bridge][uid] = true
	}
}

// legsOf is a call's two channels (unique ids), the one that started it
// first, or nil when the bridge does not join exactly two.
func (m *model) legsOf(bridge string) []string {
	members := m.bridges[bridge]
	if len(members) != 2 {
		return nil
	}
	legs := make([]string, 0, 2)
	for uid := range members {
		legs = append(legs, uid)
	}
	slices.SortFunc(legs, func(a, b string) int {
		// The caller's channel is the one its call's linked id names;
		// otherwise the older one (Asterisk numbers them in order).
		if ao, bo := m.chans[a].linked == a, m.chans[b].linked == b; ao != bo {
			if ao {
				return -1
			}
			return 1
		}
		return compareUniqueid(a, b)
	})
	return legs
}

// compareUniqueid orders two unique ids ("<systemname>-<seconds>.<n>") by
// their numbers.
func compareUniqueid(a, b string) int {
	na, nb := uidNumber(a), uidNumber(b)
	if na != nb {
		if na < nb {
			return -1
		}
		return 1
	}
	return strings.Compare(a, b)
}

func uidNumber(uid string) int64 {
	i := strings.LastIndexByte(uid, '.')
	if i < 0 {
		return -1
	}
	n, err := strconv.ParseInt(uid[i+1:], 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// calls are the bridges that join exactly two channels.
func (m *model) calls() []string {
	var out []string
	for b, members := range m.bridges {
		if len(members) == 2 {
			out = append(out, b)
		}
	}
	slices.Sort(out)
	return out
}
