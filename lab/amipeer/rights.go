package amipeer

import (
	"slices"
	"strings"
)

// User is one manager.conf user: its secret and the classes it may read
// (the events a session receives) and write (the actions it may run), by
// manager.conf's class names (system, call, log, verbose, command, agent,
// user, config, dtmf, reporting, cdr, dialplan, originate, agi, cc, aoc,
// test, security, message, or all).
type User struct {
	Name   string
	Secret string
	Read   []string
	Write  []string
}

// allClasses are Asterisk 22's manager classes; "all" stands for every one.
var allClasses = []string{"system", "call", "log", "verbose", "command", "agent", "user", "config", "dtmf",
	"reporting", "cdr", "dialplan", "originate", "agi", "cc", "aoc", "test", "security", "message"}

// classSet is a set of manager classes.
type classSet map[string]bool

func newClassSet(names []string) classSet {
	s := classSet{}
	for _, n := range names {
		n = strings.ToLower(strings.TrimSpace(n))
		if n == "all" {
			for _, c := range allClasses {
				s[c] = true
			}
			continue
		}
		if n != "" {
			s[n] = true
		}
	}
	return s
}

// overlaps is Asterisk's test of a session's rights against an action's or
// an event's classes: any class in common will do, and an action of no
// class is open to everyone.
func (s classSet) overlaps(classes []string) bool {
	if len(classes) == 0 {
		return true
	}
	for _, c := range classes {
		if s[c] {
			return true
		}
	}
	return false
}

// managerAction is one action as Asterisk 22's ListCommands shows it: the
// synopsis and the classes a user must write one of to run it (none: anyone
// logged in).
type managerAction struct {
	Name     string
	Synopsis string
	Classes  []string
}

// managerActions is ListCommands as Asterisk 22.10.1 answered a user with
// `write = all` (docs/asterisk22.md, "What fanctl doctor asks"), in its
// order (sorted without regard to case). The peer implements only some of
// them; the others answer "Invalid/unknown command", but they are listed,
// and refused without the rights, as Asterisk does.
var managerActions = []managerAction{
	{"AbsoluteTimeout", "Set absolute timeout.", []string{"system", "call"}},
	{"AGI", "Add an AGI command to execute by Async AGI.", []string{"agi"}},
	{"AOCMessage", "Generate an Advice of Charge message on a channel.", []string{"aoc"}},
	{"Atxfer", "Attended transfer.", []string{"call"}},
	{"BlindTransfer", "Blind transfer channel(s) to the given destination", []string{"call"}},
	{"Bridge", "Bridge two channels already in the PBX.", []string{"call"}},
	{"BridgeDestroy", "Destroy a bridge.", nil},
	{"BridgeInfo", "Get information about a bridge.", nil},
	{"BridgeKick", "Kick a channel from a bridge.", nil},
	{"BridgeList", "Get a list of bridges in the system.", nil},
	{"BridgeTechnologyList", "List available bridging technologies and their statuses.", nil},
	{"BridgeTechnologySuspend", "Suspend a bridging technology.", nil},
	{"BridgeTechnologyUnsuspend", "Unsuspend a bridging technology.", nil},
	{"CancelAtxfer", "Cancel an attended transfer.", []string{"call"}},
	{"Challenge", "Generate Challenge for MD5 Auth.", nil},
	{"Command", "Execute Asterisk CLI Command.", []string{"command"}},
	{"ControlPlayback", "Control the playback of a file being played to a channel.", []string{"call"}},
	{"CoreSettings", "Show PBX core settings (version etc).", []string{"system", "reporting"}},
	{"CoreShowChannelMap", "List all channels connected to the specified channel.", []string{"system", "reporting"}},
	{"CoreShowChannels", "List currently active channels.", []string{"system", "reporting"}},
	{"CoreStatus", "Show PBX core status variables.", []string{"system", "reporting"}},
	{"CreateConfig", "Creates an empty file in the configuration directory.", []string{"config"}},
	{"DBDel", "Delete DB entry.", []string{"system"}},
	{"DBDelTree", "Delete DB Tree.", []string{"system"}},
	{"DBGet", "Get DB Entry.", []string{"system", "reporting"}},
	{"DBGetTree", "Get DB entries, optionally at a particular family/key", []string{"system", "reporting"}},
	{"DBPut", "Put DB entry.", []string{"system"}},
	{"DeviceStateList", "List the current known device states.", []string{"call", "reporting"}},
	{"DialplanExtensionAdd", "Add an extension to the dialplan", []string{"system"}},
	{"DialplanExtensionRemove", "Remove an extension from the dialplan", []string{"system"}},
	{"Events", "Control Event Flow.", nil},
	{"ExtensionState", "Check Extension Status.", []string{"call", "reporting"}},
	{"ExtensionStateList", "List the current known extension states.", []string{"call", "reporting"}},
	{"FAXSession", "Responds with a detailed description of a single FAX session", []string{"call"}},
	{"FAXSessions", "Lists active FAX sessions", []string{"call"}},
	{"FAXStats", "Responds with fax statistics", []string{"reporting"}},
	{"Filter", "Dynamically add filters for the current manager session.", []string{"system"}},
	{"GetConfig", "Retrieve configuration.", []string{"system", "config"}},
	{"GetConfigJSON", "Retrieve configuration (JSON format).", []string{"system", "config"}},
	{"Getvar", "Gets a channel variable or function value.", []string{"call", "reporting"}},
	{"Hangup", "Hangup channel.", []string{"system", "call"}},
	{"ListCategories", "List categories in configuration file.", []string{"config"}},
	{"ListCommands", "List available manager commands.", nil},
	{"LocalOptimizeAway", "Optimize away a local channel when possible.", []string{"system", "call"}},
	{"LoggerRotate", "Reload and rotate the Asterisk logger.", []string{"system", "reporting"}},
	{"Login", "Login Manager.", nil},
	{"Logoff", "Logoff Manager.", nil},
	{"MailboxCount", "Check Mailbox Message Count.", []string{"call", "reporting"}},
	{"MailboxStatus", "Check mailbox.", []string{"call", "reporting"}},
	{"MessageSend", "Send an out of call message to an endpoint.", []string{"message"}},
	{"MixMonitor", "Record a call and mix the audio during the recording.  Use of StopMixMonitor is required to guarantee the audio file is available for processing during dialplan execution.", []string{"system"}},
	{"MixMonitorMute", "Mute / unMute a Mixmonitor recording.", []string{"system", "call"}},
	{"ModuleCheck", "Check if module is loaded.", []string{"system"}},
	{"ModuleLoad", "Module management.", []string{"system"}},
	{"MuteAudio", "Mute an audio stream.", []string{"system"}},
	{"Originate", "Originate a call.", []string{"originate"}},
	{"Ping", "Keepalive command.", nil},
	{"PJSIPHangup", "Hangup an incoming PJSIP channel with a SIP response code", []string{"system", "call"}},
	{"PJSIPQualify", "Qualify a chan_pjsip endpoint.", []string{"system", "reporting"}},
	{"PJSIPRegister", "Register an outbound registration.", []string{"system", "reporting"}},
	{"PJSIPSetMaintenance", "Enable or disable maintenance mode for a PJSIP endpoint.", []string{"system"}},
	{"PJSIPShowAors", "Lists PJSIP AORs.", []string{"system"}},
	{"PJSIPShowAuths", "Lists PJSIP Auths.", []string{"system"}},
	{"PJSIPShowContacts", "Lists PJSIP Contacts.", []string{"system"}},
	{"PJSIPShowEndpoint", "Detail listing of an endpoint and its objects.", []string{"system"}},
	{"PJSIPShowEndpoints", "Lists PJSIP endpoints.", []string{"system"}},
	{"PJSIPShowMaintenance", "Show maintenance mode status for PJSIP endpoints.", []string{"system", "reporting"}},
	{"PJSIPShowRegistrationInboundContactStatuses", "Lists ContactStatuses for PJSIP inbound registrations.", []string{"system"}},
	{"PJSIPShowRegistrationsInbound", "Lists PJSIP inbound registrations.", []string{"system"}},
	{"PJSIPShowRegistrationsOutbound", "Lists PJSIP outbound registrations.", []string{"system", "reporting"}},
	{"PJSIPShowResourceLists", "Displays settings for configured resource lists.", []string{"system"}},
	{"PJSIPShowSubscriptionsInbound", "Lists inbound subscriptions.", []string{"system"}},
	{"PJSIPShowSubscriptionsOutbound", "Lists outbound subscriptions.", []string{"system"}},
	{"PJSIPUnregister", "Unregister an outbound registration.", []string{"system", "reporting"}},
	{"PlayDTMF", "Play DTMF signal on a specific channel.", []string{"call"}},
	{"PlayMF", "Play MF digit on a specific channel.", []string{"call"}},
	{"PresenceState", "Check Presence State", []string{"call", "reporting"}},
	{"PresenceStateList", "List the current known presence states.", []string{"call", "reporting"}},
	{"Redirect", "Redirect (transfer) a call.", []string{"call"}},
	{"Reload", "Send a reload event.", []string{"system", "config"}},
	{"SendFlash", "Send a hook flash on a specific channel.", []string{"call"}},
	{"SendText", "Sends a text message to channel. A content type\tcan be optionally specified. If not set it is set to an empty string allowing a custom handler to default it as it sees fit.", []string{"call"}},
	{"Setvar", "Sets a channel variable or function value.", []string{"call"}},
	{"ShowDialPlan", "Show dialplan contexts and extensions", []string{"config", "reporting"}},
	{"SorceryMemoryCacheExpire", "Expire (remove) ALL objects from a sorcery memory cache.", []string{"system"}},
	{"SorceryMemoryCacheExpireObject", "Expire (remove) an object from a sorcery memory cache.", []string{"system"}},
	{"SorceryMemoryCachePopulate", "Expire all objects from a memory cache and populate it with all objects from the backend.", []string{"system"}},
	{"SorceryMemoryCacheStale", "Marks ALL objects in a sorcery memory cache as stale.", []string{"system"}},
	{"SorceryMemoryCacheStaleObject", "Mark an object in a sorcery memory cache as stale.", []string{"system"}},
	{"Status", "List channel status.", []string{"system", "call", "reporting"}},
	{"StopMixMonitor", "Stop recording a call through MixMonitor, and free the recording's file handle.", []string{"system", "call"}},
	{"UpdateConfig", "Update basic configuration.", []string{"config"}},
	{"UserEvent", "Send an arbitrary event.", []string{"user"}},
	{"VoicemailBoxSummary", "Show the mailbox contents of given voicemail user.", []string{"call", "reporting"}},
	{"VoicemailForward", "Forward Voicemail from one mailbox folder to another between given users.", []string{"user"}},
	{"VoicemailMove", "Move Voicemail between mailbox folders of given user.", []string{"user"}},
	{"VoicemailRefresh", "Tell Asterisk to poll mailboxes for a change", []string{"user"}},
	{"VoicemailRemove", "Remove Voicemail from mailbox folder.", []string{"user"}},
	{"VoicemailUsersList", "List All Voicemail User Information.", []string{"call", "reporting"}},
	{"VoicemailUserStatus", "Show the status of given voicemail user's info.", []string{"call", "reporting"}},
	{"WaitEvent", "Wait for an event to occur.", nil},
}

// lookupAction finds an action by name, case-insensitively as Asterisk does.
func lookupAction(name string) (managerAction, bool) {
	i := slices.IndexFunc(managerActions, func(a managerAction) bool { return strings.EqualFold(a.Name, name) })
	if i < 0 {
		return managerAction{}, false
	}
	return managerActions[i], true
}

// privString is the "(Priv: ...)" text of ListCommands: the classes and
// "all", or "<none>".
func privString(classes []string) string {
	if len(classes) == 0 {
		return "<none>"
	}
	return strings.Join(classes, ",") + ",all"
}

// users are the peer's manager.conf: Config.Username (every right, as the
// peer always granted) and Config.Users.
func (p *Peer) users() []User {
	var out []User
	if p.cfg.Username != "" {
		out = append(out, User{Name: p.cfg.Username, Secret: p.cfg.Secret, Read: []string{"all"}, Write: []string{"all"}})
	}
	return append(out, p.cfg.Users...)
}

// authenticate returns the rights of the user whose name and secret these
// are; ok is false for an unknown user or a wrong secret alike (Asterisk
// answers both "Authentication failed").
func (p *Peer) authenticate(name, secret string) (read, write classSet, ok bool) {
	for _, u := range p.users() {
		if u.Name == name {
			if u.Secret != secret {
				return nil, nil, false
			}
			return newClassSet(u.Read), newClassSet(u.Write), true
		}
	}
	return nil, nil, false
}

// permitted says whether a session with these write rights may run the
// named action: actions the peer does not list are left to the dispatcher,
// which calls them unknown.
func permitted(write classSet, name string) bool {
	a, ok := lookupAction(name)
	if !ok {
		return true
	}
	return write.overlaps(a.Classes)
}

// listCommands answers ListCommands with the actions the session may run,
// one header each ("Name: synopsis  (Priv: classes)"), as Asterisk 22 does.
func listCommands(m *msgBuilder, a Action, write classSet) {
	m.response("Success", a)
	for _, act := range managerActions {
		if write.overlaps(act.Classes) {
			m.field(act.Name, act.Synopsis+"  (Priv: "+privString(act.Classes)+")")
		}
	}
	m.end()
}

// eventClasses are the classes an event's Privilege header names ("all"
// left out); an event without one reaches every session.
func eventClasses(fields []Field) []string {
	for _, f := range fields {
		if strings.EqualFold(f.Name, "Privilege") {
			var out []string
			for _, c := range strings.Split(f.Value, ",") {
				if c = strings.TrimSpace(c); c != "" && c != "all" {
					out = append(out, c)
				}
			}
			return out
		}
	}
	return nil
}

// sessionRights are what a logged-in session may read and write.
type sessionRights struct {
	read, write classSet
}

// readable says whether an event goes to this session: Asterisk sends an
// event only to sessions whose read classes share one with its Privilege.
func (s *session) readable(fields []Field) bool {
	r := s.rights.Load()
	return r != nil && r.read.overlaps(eventClasses(fields))
}

// writeRights are the session's write classes (none before login).
func (s *session) writeRights() classSet {
	if r := s.rights.Load(); r != nil {
		return r.write
	}
	return classSet{}
}
