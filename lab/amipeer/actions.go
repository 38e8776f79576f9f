package amipeer

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// msgBuilder writes AMI messages the way Asterisk's astman_append does:
// "Name: value" lines ended by CR LF, a blank line after each message.
type msgBuilder struct{ b bytes.Buffer }

func (m *msgBuilder) field(name, value string) {
	m.b.WriteString(name)
	m.b.WriteString(": ")
	m.b.WriteString(value)
	m.b.WriteString("\r\n")
}

func (m *msgBuilder) end() { m.b.WriteString("\r\n") }

func (m *msgBuilder) bytes() []byte { return m.b.Bytes() }

// response starts a response; the ActionID line is present only when the
// action carried one, exactly as astman_send_response_full does.
func (m *msgBuilder) response(kind string, a Action) {
	m.field("Response", kind)
	if id := a.Field("ActionID"); id != "" {
		m.field("ActionID", id)
	}
}

func (m *msgBuilder) actionID(a Action) {
	if id := a.Field("ActionID"); id != "" {
		m.field("ActionID", id)
	}
}

func (m *msgBuilder) ack(a Action, message string) {
	m.response("Success", a)
	m.field("Message", message)
	m.end()
}

func (m *msgBuilder) fail(a Action, message string) {
	m.response("Error", a)
	m.field("Message", message)
	m.end()
}

// listStart and listComplete frame a list response (astman_send_listack and
// astman_send_list_complete_start/end).
func (m *msgBuilder) listStart(a Action) {
	m.response("Success", a)
	m.field("EventList", "start")
	m.field("Message", "Result will follow")
	m.end()
}

func (m *msgBuilder) listComplete(a Action, event string, items int) {
	m.field("Event", event)
	m.actionID(a)
	m.field("EventList", "Complete")
	m.field("ListItems", strconv.Itoa(items))
	m.end()
}

// answer builds the reply to one action. closeAfter ends the session after
// the reply is written (Logoff, failed login). A nil reply with closeAfter
// means the peer closed while the action waited.
func (p *Peer) answer(s *session, a Action) (out []byte, closeAfter bool) {
	var m msgBuilder
	name := strings.ToLower(a.Name)
	if a.Name == "" {
		m.fail(a, "Missing action in request")
		return m.bytes(), false
	}
	// Asterisk lets only these through before authentication.
	if !s.authed && name != "login" && name != "logoff" && name != "challenge" {
		m.fail(a, "Permission denied")
		return m.bytes(), false
	}
	p.mu.Lock()
	mode, fig := p.mode, p.liveFiguresLocked()
	p.mu.Unlock()
	failing := mode == ModeFailing
	if s.authed && !permitted(s.writeRights(), a.Name) {
		m.fail(a, "Permission denied")
		return m.bytes(), false
	}

	switch name {
	case "login":
		return p.login(s, a)
	case "logoff":
		m.response("Goodbye", a)
		m.field("Message", "Thanks for all the fish.")
		m.end()
		return m.bytes(), true
	case "ping":
		now := time.Now()
		m.response("Success", a)
		m.field("Ping", "Pong")
		m.field("Timestamp", fmt.Sprintf("%d.%06d", now.Unix(), now.Nanosecond()/1000))
		m.end()
	case "events":
		on := !strings.EqualFold(strings.TrimSpace(a.Field("EventMask")), "off")
		s.events.Store(on)
		m.response("Success", a)
		if on {
			m.field("Events", "On")
		} else {
			m.field("Events", "Off")
		}
		m.end()
	case "command":
		p.command(&m, a, fig, failing)
	case "corestatus":
		if failing {
			m.fail(a, "Asterisk is shutting down")
			break
		}
		p.mu.Lock()
		reloaded := p.reloaded
		p.mu.Unlock()
		m.response("Success", a)
		m.field("CoreStartupDate", p.started.Format("2006-01-02"))
		m.field("CoreStartupTime", p.started.Format("15:04:05"))
		m.field("CoreReloadDate", reloaded.Format("2006-01-02"))
		m.field("CoreReloadTime", reloaded.Format("15:04:05"))
		m.field("CoreCurrentCalls", strconv.Itoa(fig.Calls))
		m.field("CoreProcessedCalls", strconv.Itoa(fig.Processed))
		m.end()
	case "coresettings":
		p.mu.Lock()
		systemName := p.cfg.SystemName // SetSystemName changes it
		p.mu.Unlock()
		m.response("Success", a)
		for _, f := range [][2]string{
			{"AMIversion", "11.0.0"}, {"AsteriskVersion", "22.10.1"}, {"SystemName", systemName},
			{"CoreMaxCalls", "0"}, {"CoreMaxLoadAvg", "0.000000"}, {"CoreRunUser", "root"},
			{"CoreRunGroup", "root"}, {"CoreMaxFilehandles", "0"}, {"CoreRealTimeEnabled", "No"},
			{"CoreCDRenabled", "Yes"}, {"CoreHTTPenabled", "No"}, {"SoundsSearchCustomDir", "No"},
		} {
			m.field(f[0], f[1])
		}
		m.end()
	case "reload":
		module := strings.TrimSpace(a.Field("Module"))
		switch {
		case failing:
			m.fail(a, "Asterisk is shutting down")
		case module != "" && !p.modules[strings.TrimSuffix(module, ".so")]:
			m.fail(a, "No such module")
		default:
			p.mu.Lock()
			p.reloaded = time.Now()
			p.mu.Unlock()
			m.ack(a, "Module Reloaded")
		}
	case "dbput", "dbget", "dbdel", "dbdeltree", "dbgettree":
		p.astdb(&m, name, a)
	case "filter":
		p.filterAction(&m, s, a)
	case "originate":
		p.originate(&m, a)
	case "listcommands":
		listCommands(&m, a, s.writeRights())
	case "pjsipshowendpoints", "pjsipshowendpoint":
		p.pjsipShow(&m, name, a)
	case "getvar":
		p.getvar(&m, a)
	case "coreshowchannels":
		p.coreShowChannels(&m, a)
	case "bridgelist":
		p.bridgeList(&m, a)
	case "bridgeinfo":
		p.bridgeInfo(&m, a)
	case "hangup":
		p.hangupAction(&m, a)
	default:
		m.fail(a, "Invalid/unknown command: "+a.Name+". Use Action: ListCommands to show available commands.")
	}
	return m.bytes(), false
}

func (p *Peer) login(s *session, a Action) ([]byte, bool) {
	var m msgBuilder
	if s.authed {
		m.ack(a, "Already authenticated")
		return m.bytes(), false
	}
	read, write, ok := p.authenticate(a.Field("Username"), a.Field("Secret"))
	if !ok {
		// Asterisk sleeps a second before refusing, to slow down guessing,
		// and then drops the session.
		if !p.sleep(p.cfg.AuthFailDelay) {
			return nil, true
		}
		m.fail(a, "Authentication failed")
		return m.bytes(), true
	}
	s.authed = true
	s.rights.Store(&sessionRights{read: read, write: write})
	s.noteEventMask(a.Field("Events"))
	m.ack(a, "Authentication accepted")
	if !strings.EqualFold(strings.TrimSpace(a.Field("Events")), "off") {
		s.events.Store(true)
	}
	// FullyBooted is a system event: only a user who reads system gets it.
	if s.events.Load() && read.overlaps([]string{"system"}) {
		up := strconv.Itoa(int(time.Since(p.started).Seconds()))
		m.field("Event", "FullyBooted")
		m.field("Privilege", "system,all")
		m.field("Uptime", up)
		m.field("LastReload", up)
		m.field("Status", "Fully Booted")
		m.end()
	}
	return m.bytes(), false
}

// cliCommands are the CLI commands the peer knows, used to answer the ones
// it implements and to find the "best" prefix Asterisk names in its
// "No such command" help hint.
var cliCommands = [][]string{
	{"core", "show", "channels", "count"},
	{"core", "show", "channels"},
	{"core", "show", "uptime"},
	{"core", "show", "version"},
	{"core", "show", "help"},
	{"core", "reload"},
	{"core", "restart", "now"},
	{"core", "stop", "now"},
	{"module", "reload"},
	{"module", "show"},
	{"pjsip", "show", "endpoints"},
	{"pjsip", "show", "contacts"},
	{"pjsip", "show", "transports"},
	{"pjsip", "show", "registrations"},
	{"database", "show"},
	{"dialplan", "reload"},
}

// findBest mirrors main/cli.c find_best: keep adding words while some
// command starts with them, and include the first word that breaks it.
func findBest(words []string) string {
	n := 0
	for n < len(words) {
		n++
		prefix := words[:n]
		if !slices.ContainsFunc(cliCommands, func(c []string) bool {
			return len(c) >= n && slices.Equal(c[:n], prefix)
		}) {
			break
		}
	}
	return strings.Join(words[:n], " ")
}

func ess(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func (p *Peer) command(m *msgBuilder, a Action, fig Figures, failing bool) {
	raw := a.Field("Command")
	words := strings.Fields(raw)
	if len(words) == 0 {
		m.fail(a, "No command provided")
		return
	}
	if failing {
		// A CLI handler that returns CLI_FAILURE: Error, the usual "Command
		// output follows", and nothing useful after it.
		m.response("Error", a)
		m.field("Message", "Command output follows")
		m.field("Output", "")
		m.end()
		return
	}
	switch strings.Join(words, " ") {
	case "core show channels count":
		m.response("Success", a)
		m.field("Message", "Command output follows")
		m.field("Output", fmt.Sprintf("%d active channel%s", fig.Channels, ess(fig.Channels)))
		m.field("Output", fmt.Sprintf("%d active call%s", fig.Calls, ess(fig.Calls)))
		m.field("Output", fmt.Sprintf("%d call%s processed", fig.Processed, ess(fig.Processed)))
		m.end()
	case "core reload":
		p.mu.Lock()
		p.reloaded = time.Now()
		p.mu.Unlock()
		m.response("Success", a)
		m.field("Message", "Command output follows")
		m.field("Output", "")
		m.end()
	default:
		if p.pjsipCLI(m, a, words) {
			return
		}
		m.response("Error", a)
		m.field("Message", "Command output follows")
		m.field("Output", fmt.Sprintf("No such command '%s' (type 'core show help %s' for other possible commands)", raw, findBest(words)))
		m.end()
	}
}

// astdb implements the DB* actions over the in-memory database, with the
// messages of main/db.c.
func (p *Peer) astdb(m *msgBuilder, name string, a Action) {
	family, key := a.Field("Family"), a.Field("Key")
	p.mu.Lock()
	defer p.mu.Unlock()
	switch name {
	case "dbput":
		switch {
		case family == "":
			m.fail(a, "No family specified")
		case key == "":
			m.fail(a, "No key specified")
		default:
			p.db["/"+family+"/"+key] = a.Field("Val")
			m.ack(a, "Updated database successfully")
		}
	case "dbget":
		switch {
		case family == "":
			m.fail(a, "No family specified.")
		case key == "":
			m.fail(a, "No key specified.")
		default:
			v, ok := p.db["/"+family+"/"+key]
			if !ok {
				m.fail(a, "Database entry not found")
				return
			}
			m.listStart(a)
			m.field("Event", "DBGetResponse")
			m.field("Family", family)
			m.field("Key", key)
			m.field("Val", v)
			m.actionID(a)
			m.end()
			m.listComplete(a, "DBGetComplete", 1)
		}
	case "dbdel":
		switch {
		case family == "":
			m.fail(a, "No family specified.")
		case key == "":
			m.fail(a, "No key specified.")
		default:
			k := "/" + family + "/" + key
			if _, ok := p.db[k]; !ok {
				// Asterisk 22's answer to a key that is not there.
				m.fail(a, "Database entry could not be deleted")
				return
			}
			delete(p.db, k)
			m.ack(a, "Key deleted successfully")
		}
	case "dbdeltree":
		if family == "" {
			m.fail(a, "No family specified.")
			return
		}
		keys := p.treeLocked(family, key)
		if len(keys) == 0 {
			m.fail(a, "Database entry not found")
			return
		}
		for _, k := range keys {
			delete(p.db, k)
		}
		m.ack(a, "Key tree deleted successfully")
	case "dbgettree":
		if family == "" && key != "" {
			m.fail(a, "'Key' requires 'Family'")
			return
		}
		keys := p.treeLocked(family, key)
		m.listStart(a)
		for _, k := range keys {
			m.field("Event", "DBGetTreeResponse")
			m.field("Key", k)
			m.field("Val", p.db[k])
			m.actionID(a)
			m.end()
		}
		m.listComplete(a, "DBGetTreeComplete", len(keys))
	}
}

// treeLocked lists the full keys under /family[/key], sorted as AstDB's
// ORDER BY key does; an empty family means the whole database.
func (p *Peer) treeLocked(family, key string) []string {
	prefix := ""
	if family != "" {
		prefix = "/" + family
		if key != "" {
			prefix += "/" + key
		}
	}
	var keys []string
	for k := range p.db {
		if prefix == "" || k == prefix || strings.HasPrefix(k, prefix+"/") {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
