package doctor

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
	"github.com/fanpbx/fan/pkg/ami/pjsip"
)

// amiUse is one place a fan service logs in to this node's Asterisk, and
// the actions it runs there.
type amiUse struct {
	who     string // "prober check pbx-ami"
	subject string // file and key
	cfg     amiSection
	needs   []string // actions it cannot work without
	wants   []string // actions whose absence costs a feature, not the service
	lost    string   // the feature lost without wants
}

// actionClasses are the manager classes Asterisk 22 lets an action run
// with (ListCommands' Priv, docs/asterisk22.md): a user may run it when its
// write classes hold one of them.
var actionClasses = map[string]string{
	"Command":            "command",
	"CoreStatus":         "system or reporting",
	"CoreSettings":       "system or reporting",
	"Reload":             "system or config",
	"DBGet":              "system or reporting",
	"DBGetTree":          "system or reporting",
	"DBPut":              "system",
	"DBDel":              "system",
	"Filter":             "system",
	"PJSIPShowEndpoints": "system",
	"PJSIPShowEndpoint":  "system",
	"Getvar":             "call or reporting",
	"CoreShowChannels":   "system or reporting",
	"Hangup":             "system or call",
}

// uses lists every AMI login of this host's fan services.
func (r *run) uses() []amiUse {
	var out []amiUse
	if p := r.files.prober; p != nil {
		for i, c := range p.Checks {
			if c.Kind != "ami" || c.role() != "self" {
				continue
			}
			// The health question is `core show channels count` with
			// CoreStatus; the heartbeat's systemname is CoreSettings.
			out = append(out, amiUse{who: "prober check " + c.Name, subject: fmt.Sprintf("prober.yaml checks[%d]", i),
				cfg:   amiSection{Address: c.Address, Username: c.Username, Secret: c.Secret},
				needs: []string{"Command", "CoreStatus"}, wants: []string{"CoreSettings"},
				lost: "the prober's heartbeat cannot carry this node's systemname, so no doctor can compare it with the other nodes'"})
		}
	}
	if ip := r.files.ipmover; ip != nil && ip.isIP() && ip.answerMode() == "reload" && ip.AMI.Address != "" {
		out = append(out, amiUse{who: "ipmover (answer mode reload)", subject: "ipmover.yaml ami", cfg: ip.AMI, needs: []string{"Reload"}})
	}
	if rp := r.files.replicator; rp != nil && rp.AstDB.Enabled {
		// On the holder it follows registrations through events (a
		// session filter) and reads each with DBGet, reconciles with
		// DBGetTree; on a standby it writes with DBPut and DBDel
		// (services/replicator/README.md).
		out = append(out, amiUse{who: "replicator (registrations)", subject: "replicator.yaml astdb.ami", cfg: rp.AstDB.AMI,
			needs: []string{"DBGet", "DBGetTree", "DBPut", "DBDel", "Filter"}})
	}
	if rp := r.files.replicator; rp != nil && rp.recordsCalls() {
		// On the holder it reads each call's dialogs and media (Getvar)
		// and every channel (CoreShowChannels); without them no call is
		// carried across a failover, and nothing else stops.
		out = append(out, amiUse{who: "replicator (calls)", subject: "replicator.yaml calls.ami", cfg: rp.callsAMI(),
			wants: []string{"Getvar", "CoreShowChannels"},
			lost:  "the calls in progress are not recorded, so none is carried across a failover and planned moves wait for every call"})
		// After a planned move it hangs up the channels its Asterisk
		// still has of the calls another node kept, once they ended there.
		out = append(out, amiUse{who: "replicator (calls a planned move left here)", subject: "replicator.yaml calls.ami", cfg: rp.callsAMI(),
			wants: []string{"Hangup"},
			lost:  "the channels of the calls a planned move leaves on this node's Asterisk are never hung up: they stay until Asterisk restarts, and a later move that waits for every channel waits for them"})
		// At each reconcile it reads the settings that keep calls from
		// surviving (what this doctor checks too) for its calls summary.
		out = append(out, amiUse{who: "replicator (calls settings)", subject: "replicator.yaml calls.ami", cfg: rp.callsAMI(),
			wants: []string{"Command", "PJSIPShowEndpoints", "PJSIPShowEndpoint"},
			lost:  "its calls summary cannot report the endpoints' session timers and the transports' addresses, so fanctl status does not warn of them (this doctor still does, here)"})
	}
	return out
}

// asteriskFacts is what the AMI checks learnt, for the checks that need it.
type asteriskFacts struct {
	// systemName is CoreSettings' SystemName; nil when not read.
	systemName *string
	// transports are `pjsip show transports` with each one's details; read
	// says whether they could be read.
	transports []pjsip.Transport
	read       bool
	// addr is the AMI address they were read from.
	addr string
}

// loginTimeout is above Asterisk's one-second pause before it refuses a
// wrong secret, so a wrong secret is told from a silent Asterisk.
const loginTimeout = 3 * time.Second

// checkAsterisk logs in as every fan service does, checks each one's
// rights, and with the first session that may, reads the systemname, the
// PJSIP transports and the endpoints.
func (r *run) checkAsterisk(ctx context.Context) asteriskFacts {
	var facts asteriskFacts
	uses := r.uses()
	if len(uses) == 0 {
		if r.files.isPBX() {
			r.out.addf(Skipped, "asterisk.login", "", "", "no fan service on this host logs in to Asterisk (no ami check in prober.yaml, no astdb in replicator.yaml, ipmover answers without AMI)")
		}
		return facts
	}
	// One session per distinct login: services that share a user share
	// its verdict.
	type login struct {
		cfg  amiSection
		uses []amiUse
	}
	var logins []*login
	for _, u := range uses {
		i := slices.IndexFunc(logins, func(l *login) bool { return l.cfg == u.cfg })
		if i < 0 {
			logins = append(logins, &login{cfg: u.cfg})
			i = len(logins) - 1
		}
		logins[i].uses = append(logins[i].uses, u)
	}
	failed := map[amiSection]bool{}
	for _, l := range logins {
		var who []string
		for _, u := range l.uses {
			who = append(who, u.who)
		}
		subject := fmt.Sprintf("AMI %s user %s (%s)", l.cfg.Address, l.cfg.Username, strings.Join(who, ", "))
		c, err := r.amiLogin(ctx, l.cfg)
		if err != nil {
			r.amiLoginFailed(subject, l.uses[0], l.cfg, err)
			failed[l.cfg] = true
			continue
		}
		r.out.addf(OK, "asterisk.login", subject, "", "logged in")
		allowed, err := listCommands(ctx, c, r.o.Step)
		if err != nil {
			r.out.addf(Error, "asterisk.rights", subject, "", "ListCommands did not answer: %v", err)
			_ = c.Close()
			continue
		}
		for _, u := range l.uses {
			r.checkRights(subject, u, l.cfg.Username, allowed)
		}
		if !facts.read && facts.systemName == nil {
			facts = r.readAsterisk(ctx, c, subject, allowed)
			facts.addr = l.cfg.Address
		}
		_ = c.Close()
	}
	r.checkEventRights(ctx, failed)
	return facts
}

func (r *run) amiLogin(ctx context.Context, cfg amiSection) (*ami.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, loginTimeout+r.o.Step)
	defer cancel()
	return ami.Dial(ctx, ami.Config{Addr: cfg.Address, Username: cfg.Username, Secret: cfg.Secret,
		DialTimeout: r.o.Step, LoginTimeout: loginTimeout}, r.o.Log)
}

// amiLoginFailed says why a login failed, by what Asterisk did.
func (r *run) amiLoginFailed(subject string, u amiUse, cfg amiSection, err error) {
	manager := "/etc/asterisk/manager.conf"
	switch {
	case errors.Is(err, ami.ErrAuth):
		r.out.addf(Error, "asterisk.login", subject,
			fmt.Sprintf("make the secret of [%s] in %s and %s the same (deploy/asterisk/manager.conf), then asterisk -rx 'manager reload'", cfg.Username, manager, u.subject),
			"Asterisk refused the login (wrong user or secret): %s cannot work", u.who)
	case errors.Is(err, ami.ErrRefused):
		r.out.addf(Error, "asterisk.login", subject,
			fmt.Sprintf("is Asterisk running? %s [general]: enabled = yes, bindaddr and port matching %s (deploy/asterisk/manager.conf)", manager, cfg.Address),
			"nothing listens there (connection refused)")
	case errors.Is(err, ami.ErrTimeout):
		r.out.addf(Error, "asterisk.login", subject, "asterisk -rx 'core show uptime' (a deadlocked Asterisk accepts TCP and answers nothing)",
			"no answer within %v: %v", loginTimeout, err)
	default:
		r.out.addf(Error, "asterisk.login", subject, "", "login failed: %v", err)
	}
}

// listCommands returns the actions this user may run: Asterisk's
// ListCommands lists only those its write classes allow, which tells the
// rights without running anything.
func listCommands(ctx context.Context, c *ami.Client, step time.Duration) (map[string]bool, error) {
	ctx, cancel := context.WithTimeout(ctx, step)
	defer cancel()
	resp, err := c.Action(ctx, "ListCommands")
	if err != nil {
		return nil, err
	}
	if !resp.Success() {
		return nil, fmt.Errorf("ListCommands: %s", resp.Message())
	}
	out := map[string]bool{}
	for _, f := range resp.Fields() {
		if !strings.EqualFold(f.Name, "Response") && !strings.EqualFold(f.Name, "ActionID") {
			out[f.Name] = true
		}
	}
	return out, nil
}

func (r *run) checkRights(subject string, u amiUse, user string, allowed map[string]bool) {
	missing := func(actions []string) (names, classes []string) {
		for _, a := range actions {
			if !allowed[a] {
				names = append(names, a)
				if c := actionClasses[a]; !slices.Contains(classes, c) {
					classes = append(classes, c)
				}
			}
		}
		return
	}
	fix := fmt.Sprintf("in /etc/asterisk/manager.conf [%s]: write = system,command,reporting (what fan needs: deploy/asterisk/manager.conf), then asterisk -rx 'manager reload' and restart the fan services on this host (a session keeps the rights it logged in with)", user)
	if names, classes := missing(u.needs); len(names) > 0 {
		r.out.addf(Error, "asterisk.rights", subject+": "+u.who, fix,
			"the user may not run %s (write class %s): %s fails without it", strings.Join(names, ", "), strings.Join(classes, "; "), u.who)
	} else if len(u.needs) > 0 {
		r.out.addf(OK, "asterisk.rights", subject+": "+u.who, "", "may run %s", strings.Join(u.needs, ", "))
	}
	if names, classes := missing(u.wants); len(names) > 0 {
		r.out.addf(Warning, "asterisk.rights", subject+": "+u.who, fix,
			"the user may not run %s (write class %s): %s", strings.Join(names, ", "), strings.Join(classes, "; "), u.lost)
	} else if len(u.needs) == 0 {
		r.out.addf(OK, "asterisk.rights", subject+": "+u.who, "", "may run %s", strings.Join(u.wants, ", "))
	}
}

// checkEventRights: the replicator's user reads class system. On the node
// holding the floating address the replicator follows registrations
// through Asterisk's ContactStatus events, which are of class system, and a
// user receives events only of the classes it reads. Whether it does shows
// without changing anything: Asterisk sends FullyBooted, a system event,
// right after the login, to such a user only (docs/asterisk22.md).
func (r *run) checkEventRights(ctx context.Context, failed map[amiSection]bool) {
	rp := r.files.replicator
	if rp == nil || !rp.AstDB.Enabled || failed[rp.AstDB.AMI] {
		return
	}
	ok, err := r.readsSystemEvents(ctx, rp.AstDB.AMI)
	subject := fmt.Sprintf("AMI %s user %s (replicator)", rp.AstDB.AMI.Address, rp.AstDB.AMI.Username)
	switch {
	case err != nil:
		r.out.addf(Warning, "asterisk.events", subject, "", "cannot tell whether the user reads class system: %v", err)
	case !ok:
		r.out.addf(Error, "asterisk.events", subject,
			fmt.Sprintf("in /etc/asterisk/manager.conf [%s]: read = system,call (deploy/asterisk/manager.conf), then asterisk -rx 'manager reload'", rp.AstDB.AMI.Username),
			"the user does not read class system: the registration events (ContactStatus) the replicator follows on the holder never reach it, so registrations reach the other node only with its reconcile (astdb.reconcile_interval)")
	default:
		r.out.addf(OK, "asterisk.events", subject, "", "reads class system (FullyBooted came after the login): the registration events reach the replicator")
	}
}

// readsSystemEvents logs in with events on: Asterisk sends FullyBooted, a
// system event, right after the login only to a user who reads class
// system.
func (r *run) readsSystemEvents(ctx context.Context, cfg amiSection) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, loginTimeout+r.o.Step)
	defer cancel()
	c, err := ami.Dial(ctx, ami.Config{Addr: cfg.Address, Username: cfg.Username, Secret: cfg.Secret,
		DialTimeout: r.o.Step, LoginTimeout: loginTimeout, Events: true}, r.o.Log)
	if err != nil {
		return false, err
	}
	defer c.Close()
	wait := time.NewTimer(500 * time.Millisecond)
	defer wait.Stop()
	for {
		select {
		case ev := <-c.Events():
			if ev.Name() == "FullyBooted" {
				return true, nil
			}
		case <-wait.C:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// readAsterisk reads, with one session, what the Asterisk checks need:
// the systemname, the PJSIP transports and the endpoints.
func (r *run) readAsterisk(ctx context.Context, c *ami.Client, subject string, allowed map[string]bool) asteriskFacts {
	var facts asteriskFacts
	act := func(name string, fields ...ami.Field) (ami.Response, error) {
		actx, cancel := context.WithTimeout(ctx, r.o.Step)
		defer cancel()
		return c.Action(actx, name, fields...)
	}
	if allowed["CoreSettings"] {
		if resp, err := act("CoreSettings"); err == nil && resp.Success() {
			name := resp.Field("SystemName")
			facts.systemName = &name
		}
	}
	if !allowed["Command"] {
		r.out.addf(Skipped, "sip.transports", subject, "", "the user may not run Command: the PJSIP transports were not read")
	} else if ts, err := pjsip.ReadTransports(act); err != nil {
		r.out.addf(Warning, "sip.transports", subject, "", "could not read the PJSIP transports: %v", err)
	} else {
		facts.transports, facts.read = ts, true
		var list []string
		for _, t := range ts {
			list = append(list, t.ID+" "+t.Protocol+" "+t.Bind)
		}
		if len(ts) == 0 {
			list = []string{"none"}
		}
		r.out.addf(OK, "sip.transports", "pjsip show transports", "", "%s", strings.Join(list, "; "))
	}
	if rp := r.files.replicator; rp != nil && rp.AstDB.Enabled && allowed["Command"] {
		r.checkContactStatusSetting(act)
	}
	if !allowed["PJSIPShowEndpoints"] || !allowed["PJSIPShowEndpoint"] {
		r.out.addf(Skipped, "sip.endpoints", subject, "", "the user may not run PJSIPShowEndpoints (write class system): the endpoints were not read")
		return facts
	}
	r.checkEndpoints(ctx, act)
	return facts
}

// endpointBudget bounds the endpoint listing: a PBX with thousands of
// endpoints gets the first ones checked and a note.
const (
	endpointBudget = 3 * time.Second
	endpointMax    = 2000
)

// checkEndpoints reads each endpoint's timers and direct_media: what they
// do to a call that survives a failover (docs/asterisk22.md).
func (r *run) checkEndpoints(ctx context.Context, act pjsip.Action) {
	eps, err := pjsip.ReadEndpoints(ctx, act, endpointBudget, endpointMax)
	switch {
	case errors.Is(err, pjsip.ErrRefused):
		r.out.addf(Warning, "sip.endpoints", "PJSIPShowEndpoints", "", "%v", err)
		return
	case err != nil:
		r.out.addf(Warning, "sip.endpoints", "PJSIPShowEndpoints", "", "no answer: %v", err)
		return
	case len(eps.Names) == 0:
		r.out.addf(OK, "sip.endpoints", "PJSIPShowEndpoints", "", "no endpoints configured")
		return
	}
	var timersOn []string
	for _, e := range eps.Timers {
		timersOn = append(timersOn, e.Name+" ("+e.Value+")")
	}
	noDirect := eps.NoDirectMedia
	of := fmt.Sprintf("%d endpoints", len(eps.Names))
	if eps.Read < len(eps.Names) {
		of = fmt.Sprintf("%d of %d endpoints (the rest not read within %v)", eps.Read, len(eps.Names), endpointBudget)
	}
	if len(timersOn) > 0 {
		r.out.addf(Warning, "sip.timers", fmt.Sprintf("%d endpoints: %s", len(timersOn), listSome(timersOn)),
			"timers = no on them (deploy/asterisk/pjsip.conf, the endpoint template); it costs the refresh that clears a call whose far end vanished without a BYE: set rtp_timeout to clear those instead",
			"session timers are on: a call that survives a failover (direct media) ends at its first session refresh, which the new node answers 481 (the default timers_sess_expires 1800 s refreshes within 15 minutes)")
	}
	if len(noDirect) > 0 {
		r.out.addf(Warning, "sip.direct-media", fmt.Sprintf("%d endpoints: %s", len(noDirect), listSome(noDirect)),
			"direct_media = yes on them where the phones can reach each other (deploy/asterisk/pjsip.conf); it costs what needs the audio in Asterisk mid-call: recording, music on hold and DTMF features re-INVITE the media back first",
			"direct_media is off: their audio flows through this Asterisk and stops when it dies, so no call of theirs survives a failover")
	}
	if len(timersOn) == 0 && len(noDirect) == 0 {
		r.out.addf(OK, "sip.endpoints", of, "", "timers = no and direct_media = yes: a call between phones keeps its audio across a failover")
	} else {
		r.out.addf(OK, "sip.endpoints", of, "", "read")
	}
}

// listSome names up to 8 items and counts the rest.
func listSome(items []string) string {
	if len(items) <= 8 {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:8], ", ") + fmt.Sprintf(" and %d more", len(items)-8)
}

// checkSystemNames: every PBX node of this node's groups has the same
// systemname (asterisk.conf), because the registrations the replicator
// carries name it (the contact's reg_server) and a node ignores contacts
// of another systemname. This host sees only its own Asterisk; the other
// nodes' names come from their probers' last heartbeats, which only an
// identity that reads the live stream may read (the arbiter's, on a PBX
// host its standby replica's).
func (r *run) checkSystemNames(pbx asteriskFacts, b busFacts, groups map[string]*groupInfo) {
	if !r.files.isPBX() || r.files.prober == nil {
		return
	}
	if pbx.systemName == nil {
		r.out.addf(Skipped, "asterisk.systemname", "", "", "this node's systemname was not read (no AMI session with the right to run CoreSettings)")
		return
	}
	here := *pbx.systemName
	node := r.files.node()
	var others []string
	for _, name := range sortedKeys(groups) {
		if !groups[name].has(node) {
			continue
		}
		for _, n := range groups[name].Nodes {
			if n != node && !slices.Contains(others, n) {
				others = append(others, n)
			}
		}
	}
	fix := fmt.Sprintf("the same [options] systemname in /etc/asterisk/asterisk.conf on every PBX node (deploy/asterisk/asterisk.conf), then restart Asterisk; this node's is %q", here)
	if len(others) == 0 {
		r.out.addf(Skipped, "asterisk.systemname", "", "", "this node's is %q; no other node of its groups is known here to compare with", here)
		return
	}
	if b.heartbeatsErr != "" {
		r.out.addf(Skipped, "asterisk.systemname", "", "compare by hand on each node: asterisk -rx 'core show settings' | grep -i 'system name'",
			"this node's is %q; the other nodes' were not compared: %s", here, b.heartbeatsErr)
		return
	}
	for _, n := range others {
		hb, ok := b.heartbeats[n]
		switch {
		case !ok:
			r.out.addf(Skipped, "asterisk.systemname", n, "", "no heartbeat of %s in the live stream (its prober has not run within the stream's max age)", n)
		case hb.name == nil:
			r.out.addf(Skipped, "asterisk.systemname", n, "compare by hand: asterisk -rx 'core show settings' | grep -i 'system name' on "+n,
				"%s's heartbeat (%s) does not carry its systemname (a prober older than this check, or its AMI user may not run CoreSettings)", n, hb.at.Format(time.RFC3339))
		case *hb.name != here:
			r.out.addf(Error, "asterisk.systemname", n, fix,
				"%s's Asterisk has systemname %q (its heartbeat of %s), this node's %q: a registration the replicator carries names its node's systemname (the contact's reg_server) and serves on the other node only when both are the same (docs/asterisk22.md), so phones must register again after a failover",
				n, *hb.name, hb.at.Format(time.RFC3339), here)
		default:
			r.out.addf(OK, "asterisk.systemname", n, "", "%q here and on %s (its heartbeat of %s)", here, n, hb.at.Format(time.RFC3339))
		}
	}
}

// checkContactStatusSetting: pjsip.conf's [global] has
// send_contact_status_on_update_registration = yes, without which Asterisk
// raises no event for a registration's refresh (docs/asterisk22.md,
// "Registrations as they happen").
func (r *run) checkContactStatusSetting(act func(string, ...ami.Field) (ami.Response, error)) {
	const key = "send_contact_status_on_update_registration"
	resp, err := act("Command", ami.F("Command", "pjsip show settings"))
	if err != nil || !resp.Success() {
		r.out.addf(Warning, "sip.contact-status", key, "", "`pjsip show settings` did not answer: %v %s", err, resp.Message())
		return
	}
	value := ""
	for _, l := range resp.Outputs() {
		if name, v, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && strings.TrimSpace(name) == key {
			value = strings.TrimSpace(v)
		}
	}
	switch value {
	case "yes":
		r.out.addf(OK, "sip.contact-status", key, "", "yes: every refresh of a registration raises ContactStatus")
	case "":
		r.out.addf(Warning, "sip.contact-status", key, "", "not in `pjsip show settings`: this Asterisk may not raise ContactStatus for refreshes")
	default:
		r.out.addf(Warning, "sip.contact-status", key,
			"send_contact_status_on_update_registration = yes in pjsip.conf's [global] (deploy/asterisk/pjsip.conf), then asterisk -rx 'module reload res_pjsip.so'",
			"%s: Asterisk raises no event when a phone refreshes its registration, so the refresh reaches the other node only with the replicator's reconcile (astdb.reconcile_interval, a minute), and a copy whose phone refreshed late can expire there first", value)
	}
}
