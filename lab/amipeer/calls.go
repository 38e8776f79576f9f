package amipeer

import (
	"crypto/rand"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Calls as Asterisk 22 reports them over AMI (docs/asterisk22.md, "Calls:
// a B2BUA, its dialogs and its AMI events"): a call between two phones is
// two PJSIP channels, the caller's and the callee's, and once answered a
// bridge holding both. Whoever plays the PBX's SIP side (lab/pbxstandin)
// drives a Call through its life; the peer raises the events Asterisk
// raises at each step, in its order and with its fields, and answers
// Getvar of CHANNEL(pjsip,...) and CHANNEL(rtp,...), CoreShowChannels,
// BridgeList and BridgeInfo from what it was told.

// LegVars are what Getvar reads of one channel's dialog and media, in
// Asterisk's forms: LocalURI and RemoteURI with their angle brackets,
// TargetURI without. RequestURI, RemoteAddr and LocalAddr come from the
// INVITE the PBX received, so the callee's channel has none. RTPDirect is
// the other phone's media address while the audio goes phone to phone, ""
// while it passes through the PBX (Getvar then reads "(null)").
type LegVars struct {
	CallID, LocalTag, RemoteTag    string
	LocalURI, RemoteURI, TargetURI string
	RequestURI                     string
	RemoteAddr, LocalAddr          string
	RTPDest, RTPSrc, RTPDirect     string
}

// Channel states, as ChannelState and ChannelStateDesc show them.
const (
	stateDown    = 0
	stateRing    = 4
	stateRinging = 5
	stateUp      = 6
	stateBusy    = 7
)

var stateDesc = map[int]string{stateDown: "Down", stateRing: "Ring", stateRinging: "Ringing", stateUp: "Up", stateBusy: "Busy"}

type channel struct {
	name, endpoint     string
	state              int
	callerNum          string // "" is written <unknown>
	connectedNum       string
	context, exten     string
	uniqueid, linkedid string
	app, appData       string
	created            time.Time
	bridge             *bridge
	vars               LegVars
	call               *Call // the call it is a leg of
}

type bridge struct {
	id       string
	tech     string
	channels []*channel
}

// callBook holds the peer's channels and bridges; it lives under Peer.mu.
type callBook struct {
	channels  []*channel
	bridges   []*bridge
	next      int // the channel sequence number: its name's suffix and its Uniqueid's
	processed int
}

// callEvents writes the events of calls in order, outside the SIP side's
// locks (a slow AMI client must not hold up a call).
type callEvents struct {
	once sync.Once
	q    chan []Field
}

// Call is one call between two phones as the PBX reports it. Its methods
// are the steps of a call; each raises Asterisk's events for that step.
// A Call is not safe for concurrent use: its owner serializes the steps.
type Call struct {
	p              *Peer
	caller, callee *channel
	bridge         *bridge
	dialed         string
	// connected: the caller's NewConnectedLine was raised (when the
	// callee rang, or answered without ringing).
	connected bool
}

// StartCall is an INVITE from endpoint caller to exten, dialled to
// endpoint callee (Dial(PJSIP/<exten>)): the two channels appear and the
// dial begins. callerVars is the caller's dialog as far as it is known.
func (p *Peer) StartCall(caller, callee, exten string, callerVars LegVars) *Call {
	p.mu.Lock()
	a := p.newChannelLocked(caller, exten)
	a.state, a.callerNum, a.vars = stateRing, caller, callerVars
	a.app, a.appData = "Dial", "PJSIP/"+exten
	b := p.newChannelLocked(callee, "s")
	b.linkedid = a.uniqueid
	b.app, b.appData = "AppDial", "(Outgoing Line)"
	p.book.processed++
	c := &Call{p: p, caller: a, callee: b, dialed: exten}
	a.call, b.call = c, c
	newA := p.channelEventLocked("Newchannel", a)
	newB := p.channelEventLocked("Newchannel", b)
	b.callerNum, b.connectedNum, b.exten = callee, caller, exten
	callerid := append(p.channelEventLocked("NewCallerid", b), Field{"CID-CallingPres", "0 (Presentation Allowed, Not Screened)"})
	connB := p.channelEventLocked("NewConnectedLine", b)
	begin := append(p.dialEventLocked("DialBegin", a, b), Field{"DialString", exten})
	p.mu.Unlock()
	p.raiseCall(newA, newB, callerid, connB, begin)
	return c
}

// Unreachable is a dial that fails before a callee channel exists (an AOR
// with no contact: Asterisk answers 503): only the caller's channel
// appears, and it ends at once.
func (p *Peer) Unreachable(caller, exten string, callerVars LegVars) {
	p.mu.Lock()
	a := p.newChannelLocked(caller, exten)
	a.state, a.callerNum, a.vars = stateRing, caller, callerVars
	a.app, a.appData = "Dial", "PJSIP/"+exten
	p.book.processed++
	evs := [][]Field{p.channelEventLocked("Newchannel", a)}
	a.state = stateBusy
	evs = append(evs, p.channelEventLocked("Newstate", a),
		append(p.channelEventLocked("HangupRequest", a), Field{"Cause", "34"}, Field{"TechCause", "503"}),
		append(p.channelEventLocked("SoftHangupRequest", a), Field{"Cause", "16"}, Field{"TechCause", "503"}),
		append(p.channelEventLocked("Hangup", a), hangupCause(34, "503")...))
	p.dropChannelLocked(a)
	p.mu.Unlock()
	p.raiseCall(evs...)
}

// Channels are the call's channel names, the caller's first.
func (c *Call) Channels() (caller, callee string) { return c.caller.name, c.callee.name }

// BridgeID is the bridge's unique id once answered, "" before.
func (c *Call) BridgeID() string {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if c.bridge == nil {
		return ""
	}
	return c.bridge.id
}

// SetVars replaces what Getvar reads of each leg (nil leaves it).
func (c *Call) SetVars(caller, callee *LegVars) {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if caller != nil {
		c.caller.vars = *caller
	}
	if callee != nil {
		c.callee.vars = *callee
	}
}

// Ringing is the callee answering 180.
func (c *Call) Ringing() {
	p := c.p
	p.mu.Lock()
	c.callee.state = stateRinging
	evs := [][]Field{p.channelEventLocked("Newstate", c.callee), p.deviceStateLocked(c.callee.endpoint, "RINGING")}
	evs = append(evs, c.connectLocked()...)
	evs = append(evs, append(p.dialEventLocked("DialState", c.caller, c.callee), Field{"DialStatus", "RINGING"}),
		p.deviceStateLocked(c.caller.endpoint, "INUSE"))
	p.mu.Unlock()
	p.raiseCall(evs...)
}

// Answered is the callee answering 200 and the PBX answering the caller:
// the two channels enter a bridge. The bridge starts as simple_bridge and is
// native_rtp a moment later, with or without direct media, and no event
// says so.
func (c *Call) Answered() {
	p := c.p
	p.mu.Lock()
	evs := c.connectLocked()
	c.callee.state = stateUp
	evs = append(evs, p.channelEventLocked("Newstate", c.callee), p.deviceStateLocked(c.callee.endpoint, "INUSE"))
	c.callee.exten = ""
	evs = append(evs, append(p.dialEventLocked("DialEnd", c.caller, c.callee), Field{"DialStatus", "ANSWER"}))
	c.caller.state = stateUp
	evs = append(evs, p.channelEventLocked("Newstate", c.caller))
	b := &bridge{id: newUUID(), tech: "simple_bridge"}
	c.bridge = b
	p.book.bridges = append(p.book.bridges, b)
	evs = append(evs, append(p.dispatchedLocked("BridgeCreate", "call,all"), bridgeFields(b)...))
	// The callee enters first; BridgeInfo lists the caller first.
	for _, ch := range []*channel{c.callee, c.caller} {
		b.channels = append([]*channel{ch}, b.channels...)
		ch.bridge = b
		evs = append(evs, p.bridgeEventLocked("BridgeEnter", b, ch))
	}
	b.tech = "native_rtp"
	p.mu.Unlock()
	p.raiseCall(evs...)
}

// connectLocked raises the caller's NewConnectedLine once; p.mu is held.
func (c *Call) connectLocked() [][]Field {
	if c.connected {
		return nil
	}
	c.connected = true
	c.caller.connectedNum = c.callee.endpoint
	return [][]Field{c.p.channelEventLocked("NewConnectedLine", c.caller)}
}

// Busy is the callee refusing the call with status (486, 600, 603: Asterisk
// maps each to cause 17, user busy).
func (c *Call) Busy(status int) {
	p := c.p
	tech := strconv.Itoa(status)
	p.mu.Lock()
	evs := [][]Field{append(p.channelEventLocked("HangupRequest", c.callee), Field{"Cause", "17"}, Field{"TechCause", tech})}
	evs = append(evs, append(p.dialEventLocked("DialEnd", c.caller, c.callee), Field{"DialStatus", "BUSY"}))
	c.caller.state = stateBusy
	evs = append(evs, p.channelEventLocked("Newstate", c.caller),
		append(p.channelEventLocked("Hangup", c.callee), hangupCause(17, tech)...),
		p.deviceStateLocked(c.callee.endpoint, "NOT_INUSE"),
		append(p.channelEventLocked("HangupRequest", c.caller), Field{"Cause", "17"}, Field{"TechCause", tech}),
		append(p.channelEventLocked("SoftHangupRequest", c.caller), Field{"Cause", "16"}, Field{"TechCause", tech}),
		append(p.channelEventLocked("Hangup", c.caller), hangupCause(17, tech)...),
		p.deviceStateLocked(c.caller.endpoint, "NOT_INUSE"))
	p.dropChannelLocked(c.caller)
	p.dropChannelLocked(c.callee)
	p.mu.Unlock()
	p.raiseCall(evs...)
}

// Cancelled is the caller's CANCEL before the answer.
func (c *Call) Cancelled() {
	p := c.p
	p.mu.Lock()
	evs := [][]Field{
		append(p.channelEventLocked("HangupRequest", c.caller), Field{"Cause", "127"}, Field{"TechCause", "487"}),
		append(p.dialEventLocked("DialEnd", c.caller, c.callee), Field{"DialStatus", "CANCEL"}),
		append(p.channelEventLocked("SoftHangupRequest", c.caller), Field{"Cause", "16"}, Field{"TechCause", "487"}),
		append(p.channelEventLocked("Hangup", c.caller), hangupCause(127, "487")...),
		p.deviceStateLocked(c.caller.endpoint, "NOT_INUSE"),
		append(p.channelEventLocked("Hangup", c.callee), hangupCause(127, "500")...),
		p.deviceStateLocked(c.callee.endpoint, "NOT_INUSE"),
	}
	p.dropChannelLocked(c.caller)
	p.dropChannelLocked(c.callee)
	p.mu.Unlock()
	p.raiseCall(evs...)
}

// HungUp is a BYE in an answered call from one side (byCaller says
// which): the PBX tells the other side and both channels go.
func (c *Call) HungUp(byCaller bool) {
	p := c.p
	first, other := c.callee, c.caller
	if byCaller {
		first, other = c.caller, c.callee
	}
	p.mu.Lock()
	evs := [][]Field{append(p.channelEventLocked("HangupRequest", first), Field{"Cause", "16"})}
	if b := c.bridge; b != nil {
		for _, ch := range []*channel{first, other} {
			b.channels = slices.DeleteFunc(b.channels, func(x *channel) bool { return x == ch })
			evs = append(evs, p.bridgeEventLocked("BridgeLeave", b, ch))
			ch.bridge = nil
		}
		evs = append(evs, append(p.dispatchedLocked("BridgeDestroy", "call,all"), bridgeFields(b)...))
		p.book.bridges = slices.DeleteFunc(p.book.bridges, func(x *bridge) bool { return x == b })
	}
	evs = append(evs, append(p.channelEventLocked("SoftHangupRequest", c.caller), Field{"Cause", "16"}))
	for _, ch := range []*channel{c.callee, c.caller} {
		evs = append(evs, append(p.channelEventLocked("Hangup", ch), hangupCause(16, "")...),
			p.deviceStateLocked(ch.endpoint, "NOT_INUSE"))
	}
	p.dropChannelLocked(c.caller)
	p.dropChannelLocked(c.callee)
	p.mu.Unlock()
	p.raiseCall(evs...)
}

// HangupHandler is told of an AMI Hangup of one of c's channels, after the
// peer answered it and raised its events (HungUpByAMI): whoever plays the
// PBX's SIP side ends the call's dialogs there.
type HangupHandler func(c *Call, channel string)

// OnHangup sets what is told of an AMI Hangup; with none, the peer ends
// the call itself (HungUpByAMI).
func (p *Peer) OnHangup(h HangupHandler) {
	p.mu.Lock()
	p.onHangup = h
	p.mu.Unlock()
}

// hangupAction answers Hangup (write class system or call) as Asterisk 22
// does (testdata/asterisk22/hangup-*.txt): "Channel Hungup" for a live
// channel, which then ends. A channel of an answered call takes the other
// with it, as the bridge Dial made ends with either side.
func (p *Peer) hangupAction(m *msgBuilder, a Action) {
	name := a.Field("Channel")
	if name == "" {
		m.fail(a, "No channel specified")
		return
	}
	p.mu.Lock()
	ch := p.channelLocked(name)
	h := p.onHangup
	p.mu.Unlock()
	if ch == nil {
		m.fail(a, "No such channel")
		return
	}
	m.ack(a, "Channel Hungup")
	switch {
	case ch.call == nil:
		p.hangupLone(ch)
	case h != nil:
		h(ch.call, name)
	default:
		ch.call.HungUpByAMI(name)
	}
}

// hangupLone ends a channel of no call of the peer's: its soft hang-up and
// its end.
func (p *Peer) hangupLone(ch *channel) {
	p.mu.Lock()
	if p.channelLocked(ch.name) != ch {
		p.mu.Unlock()
		return
	}
	evs := [][]Field{append(p.channelEventLocked("SoftHangupRequest", ch), Field{"Cause", "16"}),
		append(p.channelEventLocked("Hangup", ch), hangupCause(16, "")...), p.deviceStateLocked(ch.endpoint, "NOT_INUSE")}
	p.dropChannelLocked(ch)
	p.mu.Unlock()
	p.raiseCall(evs...)
}

// SetLoneChannels makes the peer have n channels in no call of its own
// (a channel in an application: an IVR, a queue, voicemail), adding or
// ending them with Asterisk's Newchannel and Hangup events. Every reader
// of the peer then sees the same channels: `core show channels count`
// (the prober's), CoreShowChannels and the events (the replicator's).
func (p *Peer) SetLoneChannels(n int) {
	p.mu.Lock()
	var lone []*channel
	for _, ch := range p.book.channels {
		if ch.call == nil {
			lone = append(lone, ch)
		}
	}
	var evs [][]Field
	for len(lone) < n {
		ch := p.newChannelLocked("lab-app", "s")
		ch.state, ch.app, ch.appData = stateUp, "Wait", "3600"
		evs = append(evs, p.channelEventLocked("Newchannel", ch))
		lone = append(lone, ch)
	}
	for len(lone) > n {
		ch := lone[len(lone)-1]
		lone = lone[:len(lone)-1]
		evs = append(evs, append(p.channelEventLocked("Hangup", ch), hangupCause(16, "")...))
		p.dropChannelLocked(ch)
	}
	p.mu.Unlock()
	p.raiseCall(evs...)
}

// HungUpByAMI is an answered call ended by an AMI Hangup of its channel
// name (either of the two): the events Asterisk 22 raised (testdata/asterisk22/
// hangup-events.txt: no HangupRequest, the soft hang-up of the channel
// named, both leaving the bridge and ending with cause 16), and both
// channels go. A call that has ended already raises nothing.
func (c *Call) HungUpByAMI(name string) {
	p := c.p
	first, other := c.caller, c.callee
	if name == c.callee.name {
		first, other = c.callee, c.caller
	}
	p.mu.Lock()
	if p.channelLocked(first.name) != first {
		p.mu.Unlock()
		return
	}
	var evs [][]Field
	leave := func(ch *channel) {
		b := ch.bridge
		if b == nil {
			return
		}
		b.channels = slices.DeleteFunc(b.channels, func(x *channel) bool { return x == ch })
		ch.bridge = nil
		evs = append(evs, p.bridgeEventLocked("BridgeLeave", b, ch))
	}
	b := first.bridge
	leave(first)
	evs = append(evs, append(p.channelEventLocked("SoftHangupRequest", first), Field{"Cause", "16"}))
	leave(other)
	if b != nil {
		evs = append(evs, append(p.dispatchedLocked("BridgeDestroy", "call,all"), bridgeFields(b)...))
		p.book.bridges = slices.DeleteFunc(p.book.bridges, func(x *bridge) bool { return x == b })
	}
	for _, ch := range []*channel{first, other} {
		if p.channelLocked(ch.name) == ch {
			evs = append(evs, append(p.channelEventLocked("Hangup", ch), hangupCause(16, "")...),
				p.deviceStateLocked(ch.endpoint, "NOT_INUSE"))
			p.dropChannelLocked(ch)
		}
	}
	p.mu.Unlock()
	p.raiseCall(evs...)
}

// DropCalls forgets every channel and bridge without an event, as a
// crashed Asterisk comes back with none.
func (p *Peer) DropCalls() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.book.channels, p.book.bridges = nil, nil
}

// newChannelLocked names a channel as chan_pjsip does (PJSIP/<endpoint>-
// and a sequence number in 8 hex digits) and gives it a Uniqueid
// (<systemname>-<unix seconds>.<sequence number>); p.mu is held.
func (p *Peer) newChannelLocked(endpoint, exten string) *channel {
	now := time.Now()
	n := p.book.next
	p.book.next++
	uid := strconv.FormatInt(now.Unix(), 10) + "." + strconv.Itoa(n)
	if p.cfg.SystemName != "" {
		uid = p.cfg.SystemName + "-" + uid
	}
	ch := &channel{name: fmt.Sprintf("PJSIP/%s-%08x", endpoint, n), endpoint: endpoint, context: p.endpointContextLocked(endpoint),
		exten: exten, uniqueid: uid, linkedid: uid, created: now}
	p.book.channels = append(p.book.channels, ch)
	return ch
}

func (p *Peer) dropChannelLocked(ch *channel) {
	p.book.channels = slices.DeleteFunc(p.book.channels, func(x *channel) bool { return x == ch })
}

// endpointContextLocked is the endpoint's dialplan context: pjsip.conf's
// when the peer was given its endpoints, else the one fan's template sets.
func (p *Peer) endpointContextLocked(endpoint string) string {
	for _, e := range p.cfg.Endpoints {
		if e.Name == endpoint && e.Context != "" {
			return e.Context
		}
	}
	return "from-phones"
}

// channelLocked finds a live channel by name; p.mu is held.
func (p *Peer) channelLocked(name string) *channel {
	for _, ch := range p.book.channels {
		if ch.name == name {
			return ch
		}
	}
	return nil
}

// liveFiguresLocked adds the calls up to the figures set by SetFigures,
// for `core show channels count` and CoreStatus; p.mu is held.
func (p *Peer) liveFiguresLocked() Figures {
	f := p.figures
	f.Channels += len(p.book.channels)
	f.Calls += len(p.book.bridges)
	f.Processed += p.book.processed
	return f
}

func (p *Peer) dispatchedLocked(name, privilege string) []Field {
	fs := []Field{{"Event", name}, {"Privilege", privilege}}
	if p.cfg.SystemName != "" {
		fs = append(fs, Field{"SystemName", p.cfg.SystemName})
	}
	return fs
}

func unknown(v string) string {
	if v == "" {
		return "<unknown>"
	}
	return v
}

// snapshot is a channel's fields as every channel event and list item
// writes them, each name prefixed (Dial events write the callee's with
// "Dest").
func snapshot(prefix string, ch *channel) []Field {
	return []Field{
		{prefix + "Channel", ch.name}, {prefix + "ChannelState", strconv.Itoa(ch.state)},
		{prefix + "ChannelStateDesc", stateDesc[ch.state]}, {prefix + "CallerIDNum", unknown(ch.callerNum)},
		{prefix + "CallerIDName", "<unknown>"}, {prefix + "ConnectedLineNum", unknown(ch.connectedNum)},
		{prefix + "ConnectedLineName", "<unknown>"}, {prefix + "Language", "en"}, {prefix + "AccountCode", ""},
		{prefix + "Context", ch.context}, {prefix + "Exten", ch.exten}, {prefix + "Priority", "1"},
		{prefix + "Uniqueid", ch.uniqueid}, {prefix + "Linkedid", ch.linkedid},
	}
}

func (p *Peer) channelEventLocked(name string, ch *channel) []Field {
	return append(p.dispatchedLocked(name, "call,all"), snapshot("", ch)...)
}

func (p *Peer) dialEventLocked(name string, caller, callee *channel) []Field {
	return append(p.channelEventLocked(name, caller), snapshot("Dest", callee)...)
}

func (p *Peer) deviceStateLocked(endpoint, state string) []Field {
	return append(p.dispatchedLocked("DeviceStateChange", "call,all"), Field{"Device", "PJSIP/" + endpoint}, Field{"State", state})
}

func bridgeFields(b *bridge) []Field {
	return []Field{{"BridgeUniqueid", b.id}, {"BridgeType", "basic"}, {"BridgeTechnology", b.tech},
		{"BridgeCreator", "<unknown>"}, {"BridgeName", "<unknown>"}, {"BridgeNumChannels", strconv.Itoa(len(b.channels))},
		{"BridgeVideoSourceMode", "none"}}
}

func (p *Peer) bridgeEventLocked(name string, b *bridge, ch *channel) []Field {
	fs := append(p.dispatchedLocked(name, "call,all"), bridgeFields(b)...)
	return append(fs, snapshot("", ch)...)
}

var causeText = map[int]string{16: "Normal Clearing", 17: "User busy", 34: "Circuit/channel congestion", 127: "Interworking, unspecified"}

func hangupCause(cause int, tech string) []Field {
	fs := []Field{{"Cause", strconv.Itoa(cause)}, {"Cause-txt", causeText[cause]}}
	if tech != "" {
		fs = append(fs, Field{"TechCause", tech})
	}
	return fs
}

// raiseCall queues events for the sessions, in order.
func (p *Peer) raiseCall(evs ...[]Field) {
	p.callq.once.Do(func() {
		p.callq.q = make(chan []Field, 1<<14)
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		p.wg.Add(1)
		p.mu.Unlock()
		go func() {
			defer p.wg.Done()
			for {
				select {
				case fs := <-p.callq.q:
					p.Emit(fs...)
				case <-p.done:
					return
				}
			}
		}()
	})
	for _, fs := range evs {
		select {
		case p.callq.q <- fs:
		case <-p.done:
			return
		}
	}
}

// getvar answers Getvar: a channel's CHANNEL(pjsip,...) and
// CHANNEL(rtp,...) values; anything else, or no Channel (a global
// variable), reads empty, as Asterisk answers an unset variable.
func (p *Peer) getvar(m *msgBuilder, a Action) {
	name, variable := a.Field("Channel"), a.Field("Variable")
	if variable == "" {
		m.fail(a, "No variable specified")
		return
	}
	value := ""
	if name != "" {
		p.mu.Lock()
		ch := p.channelLocked(name)
		var v LegVars
		if ch != nil {
			v = ch.vars
		}
		p.mu.Unlock()
		if ch == nil {
			m.fail(a, "No such channel")
			return
		}
		value = channelFunction(v, variable)
	}
	m.response("Success", a)
	m.field("Variable", variable)
	m.field("Value", value)
	m.end()
}

func channelFunction(v LegVars, variable string) string {
	switch strings.ReplaceAll(variable, " ", "") {
	case "CHANNEL(pjsip,call-id)":
		return v.CallID
	case "CHANNEL(pjsip,local_tag)":
		return v.LocalTag
	case "CHANNEL(pjsip,remote_tag)":
		return v.RemoteTag
	case "CHANNEL(pjsip,local_uri)":
		return v.LocalURI
	case "CHANNEL(pjsip,remote_uri)":
		return v.RemoteURI
	case "CHANNEL(pjsip,target_uri)":
		return v.TargetURI
	case "CHANNEL(pjsip,request_uri)":
		return v.RequestURI
	case "CHANNEL(pjsip,remote_addr)":
		return v.RemoteAddr
	case "CHANNEL(pjsip,local_addr)":
		return v.LocalAddr
	case "CHANNEL(pjsip,secure)":
		return "0"
	case "CHANNEL(rtp,dest)":
		return v.RTPDest
	case "CHANNEL(rtp,src)":
		return v.RTPSrc
	case "CHANNEL(rtp,direct)":
		if v.RTPDirect == "" {
			return "(null)"
		}
		return v.RTPDirect
	}
	return ""
}

// coreShowChannels answers CoreShowChannels: one CoreShowChannel per live
// channel, in creation order.
func (p *Peer) coreShowChannels(m *msgBuilder, a Action) {
	p.mu.Lock()
	var items [][]Field
	now := time.Now()
	for _, ch := range p.book.channels {
		fs := append([]Field{{"Event", "CoreShowChannel"}}, actionIDField(a)...)
		fs = append(fs, snapshot("", ch)...)
		bridgeID := ""
		if ch.bridge != nil {
			bridgeID = ch.bridge.id
		}
		d := now.Sub(ch.created)
		fs = append(fs, Field{"Application", ch.app}, Field{"ApplicationData", ch.appData},
			Field{"Duration", fmt.Sprintf("%02d:%02d:%02d", int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60)},
			Field{"BridgeId", bridgeID})
		items = append(items, fs)
	}
	p.mu.Unlock()
	m.response("Success", a)
	m.field("EventList", "start")
	m.field("Message", "Channels will follow")
	m.end()
	writeItems(m, items)
	m.listComplete(a, "CoreShowChannelsComplete", len(items))
}

// bridgeList answers BridgeList.
func (p *Peer) bridgeList(m *msgBuilder, a Action) {
	p.mu.Lock()
	var items [][]Field
	for _, b := range p.book.bridges {
		items = append(items, append(append([]Field{{"Event", "BridgeListItem"}}, actionIDField(a)...), bridgeFields(b)...))
	}
	p.mu.Unlock()
	m.response("Success", a)
	m.field("EventList", "start")
	m.field("Message", "Bridge listing will follow")
	m.end()
	writeItems(m, items)
	m.listComplete(a, "BridgeListComplete", len(items))
}

// bridgeInfo answers BridgeInfo: the bridge's channels, then a complete
// event that describes the bridge.
func (p *Peer) bridgeInfo(m *msgBuilder, a Action) {
	id := a.Field("BridgeUniqueid")
	if id == "" {
		m.fail(a, "BridgeUniqueid must be provided")
		return
	}
	p.mu.Lock()
	var b *bridge
	for _, x := range p.book.bridges {
		if x.id == id {
			b = x
		}
	}
	if b == nil {
		p.mu.Unlock()
		m.fail(a, "Specified BridgeUniqueid not found")
		return
	}
	var items [][]Field
	for _, ch := range b.channels {
		items = append(items, append(append([]Field{{"Event", "BridgeInfoChannel"}}, actionIDField(a)...), snapshot("", ch)...))
	}
	desc := bridgeFields(b)
	p.mu.Unlock()
	m.response("Success", a)
	m.field("EventList", "start")
	m.field("Message", "Bridge channel listing will follow")
	m.end()
	writeItems(m, items)
	m.field("Event", "BridgeInfoComplete")
	m.actionID(a)
	m.field("EventList", "Complete")
	m.field("ListItems", strconv.Itoa(len(items)))
	for _, f := range desc {
		m.field(f.Name, f.Value)
	}
	m.end()
}

func actionIDField(a Action) []Field {
	if id := a.Field("ActionID"); id != "" {
		return []Field{{"ActionID", id}}
	}
	return nil
}

func writeItems(m *msgBuilder, items [][]Field) {
	for _, fs := range items {
		for _, f := range fs {
			m.field(f.Name, f.Value)
		}
		m.end()
	}
}

// newUUID is a random (version 4) UUID, the form of Asterisk's bridge ids.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
