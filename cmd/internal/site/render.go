package site

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/cmd/internal/natsconfig"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
)

// The prober's checks init writes. The group check is what the arbiter's
// groups decide on.
const (
	checkAMI   = "asterisk-ami"
	checkSIP   = "asterisk-sip"
	checkGroup = "asterisk"
)

// secrets are what init makes once and keeps: each PBX host's AMI secret
// and the status page's token.
type secrets struct {
	AMI       map[string]string // host -> secret
	PageToken string
}

// yw writes YAML line by line. Every scalar fan writes goes through q, so
// no value can change the document's shape.
type yw struct{ b strings.Builder }

func (w *yw) line(indent int, format string, args ...any) {
	w.b.WriteString(strings.Repeat("  ", indent))
	fmt.Fprintf(&w.b, format, args...)
	w.b.WriteByte('\n')
}

func (w *yw) bytes() []byte { return []byte(w.b.String()) }

// plainScalar matches what YAML reads back as the same string when written
// bare: a name, a path, an address, a URL list. Anything else is quoted.
var plainScalar = regexp.MustCompile(`^[A-Za-z/][A-Za-z0-9/_.@+-]*(:[A-Za-z0-9/_.@+,-]+)*$`)

// q writes a string scalar, bare when that reads back the same, otherwise
// double-quoted (a JSON string is a YAML double-quoted scalar).
func q(s string) string {
	switch strings.ToLower(s) {
	case "true", "false", "yes", "no", "on", "off", "null", "y", "n":
	default:
		if plainScalar.MatchString(s) {
			return s
		}
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// dur writes a duration the way a person would: 10m, 1h30m, 200ms.
func dur(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func qlist(ss []string) string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = q(s)
	}
	return "[" + strings.Join(out, ", ") + "]"
}

// header is the first lines of every file init writes.
func (s Site) header(w *yw, what, host string) {
	w.line(0, "# %s on %s, fan site %s. Written by `fanctl init` from the site file:", what, host, s.Cluster)
	w.line(0, "# change the site file and run init again rather than editing this file.")
}

func (s Site) metricsHost(h Host) string {
	if s.MetricsListen == "host" {
		return h.Address
	}
	return "127.0.0.1"
}

// common writes the keys every service shares, its bus section included.
func (s Site) common(w *yw, bc natsconfig.Cluster, h Host, role events.BusRole) {
	w.line(0, "cluster: %s", q(s.Cluster))
	w.line(0, "node: %s", q(h.Name))
	w.line(0, "bus:")
	if h.Role == RolePBX {
		w.line(1, "# This host's own NATS server first, then the witness's, then the rest:")
		w.line(1, "# a PBX host's services must never sit on the other PBX host's server.")
	} else {
		w.line(1, "# This host's own NATS server first, then the others.")
	}
	w.line(1, "url: %s", q(strings.Join(bc.ClientURLs(h.Name), ",")))
	seed := filepath.Join(BusDir, natsconfig.SeedFile(string(role)))
	w.line(1, "nkey_seed: %s", q(seed))
	w.line(1, "tls:")
	w.line(2, "ca: %s", q(filepath.Join(BusDir, "ca.pem")))
	w.line(2, "cert: %s", q(filepath.Join(BusDir, natsconfig.CertFile(string(role)))))
	w.line(2, "key: %s", q(filepath.Join(BusDir, natsconfig.KeyFile(string(role)))))
	w.line(1, "replicas: %d", s.replicas())
	if role == events.RoleArbiter {
		w.line(1, "# The system account, for moving raft leaders back to the witness.")
		w.line(1, "system:")
		w.line(2, "nkey_seed: %s", q(filepath.Join(BusDir, natsconfig.SeedFile("arbiter-system"))))
		w.line(1, "leader_servers: %s", qlist(s.leaderServers()))
	}
	w.line(0, "http_listen: %s", q(hostPort(s.metricsHost(h), metricsPort[string(role)])))
}

// replicas of every stream and the state bucket: one per server, at most
// three (more only adds write latency).
func (s Site) replicas() int { return min(3, len(s.Hosts)) }

func (s Site) leaderServers() []string {
	var out []string
	for _, h := range s.Witnesses() {
		out = append(out, ServerName(h.Name))
	}
	return out
}

// BusCluster is the cluster file natsconfig derives the bus's credentials
// from: a NATS server on every host, the witnesses' leading, an arbiter
// replica on every host.
func (s Site) BusCluster() natsconfig.Cluster {
	c := natsconfig.Cluster{
		Cluster:       s.Cluster,
		LeaderServers: s.leaderServers(),
		Operators:     slices.Clone(s.People.Operators),
		Auditors:      slices.Clone(s.People.Auditors),
		NATSDir:       NATSDir,
		StoreDir:      StoreDir,
		FanDir:        BusDir,
		CertDays:      s.CertDays,
	}
	for _, h := range s.Hosts {
		name := h.DNSName
		if name == "" {
			name = h.Address
		}
		c.NATS = append(c.NATS, natsconfig.Server{Name: ServerName(h.Name), Host: name, IPs: []string{h.Address}, FanHost: h.Name})
		switch h.Role {
		case RolePBX:
			c.Nodes = append(c.Nodes, natsconfig.Host{Name: h.Name, Services: []events.BusRole{
				events.RoleProber, events.RoleIPMover, events.RoleReplicator, events.RoleArbiter}})
		case RoleWitness:
			c.Control = append(c.Control, natsconfig.Host{Name: h.Name, Services: []events.BusRole{
				events.RoleArbiter, events.RoleScheduler}})
		}
	}
	if s.StatusPage.Host != NoStatusPage {
		c.Viewers = []string{viewerName(s.StatusPage.Host)}
	}
	c.Defaults()
	return c
}

func (s Site) proberConfig(bc natsconfig.Cluster, h Host, sec secrets) []byte {
	w := &yw{}
	s.header(w, "fan-prober's configuration", h.Name)
	w.line(0, "# Asks this host's Asterisk questions only a live Asterisk answers, and the")
	w.line(0, "# other PBX hosts' SIP, as evidence when one falls silent on the bus.")
	s.common(w, bc, h, events.RoleProber)
	w.line(0, "heartbeat_interval: 1s")
	w.line(0, "presence_interval: 100ms")
	w.line(0, "results_every: 10s")
	k := s.Checks
	timing := func(interval, timeout config.Duration) {
		w.line(2, "interval: %s", dur(interval.D()))
		w.line(2, "timeout: %s", dur(timeout.D()))
		w.line(2, "rise: %d", k.Rise)
		w.line(2, "fall: %d", k.Fall)
	}
	w.line(0, "checks:")
	w.line(1, "- name: %s", checkAMI)
	w.line(2, "kind: ami")
	w.line(2, "role: self")
	w.line(2, "address: %s", q(hostPort("127.0.0.1", s.Asterisk.AMIPort)))
	w.line(2, "username: %s", q(s.Asterisk.AMIUser))
	w.line(2, "secret: %s", q(sec.AMI[h.Name]))
	timing(k.Interval, k.Timeout)
	w.line(1, "# PJSIP's transport on this host's own address: it answers whether or not")
	w.line(1, "# the host holds the floating address.")
	w.line(1, "- name: %s", checkSIP)
	w.line(2, "kind: sip")
	w.line(2, "role: self")
	w.line(2, "address: %s", q(hostPort(h.Address, s.Asterisk.SIPPort)))
	w.line(2, "transport: udp")
	timing(k.Interval, k.Timeout)
	g, _ := s.GroupOf(h.Name)
	for _, peer := range g.Nodes {
		p, ok := s.Host(peer)
		if !ok || peer == h.Name {
			continue
		}
		w.line(1, "- name: %s", q("peer-"+peer))
		w.line(2, "kind: sip")
		w.line(2, "role: peer")
		w.line(2, "target_node: %s", q(peer))
		w.line(2, "address: %s", q(hostPort(p.Address, s.Asterisk.SIPPort)))
		timing(k.PeerInterval, k.PeerTimeout)
		w.line(2, "decisive_margin: 20ms")
	}
	w.line(0, "groups:")
	w.line(1, "# What the arbiter decides on: up while both Asterisk checks are.")
	w.line(1, "- name: %s", checkGroup)
	w.line(2, "checks: [%s, %s]", checkAMI, checkSIP)
	w.line(2, "min_up: 2")
	return w.bytes()
}

func (s Site) ipmoverConfig(bc natsconfig.Cluster, h Host, sec secrets) []byte {
	w := &yw{}
	s.header(w, "fan-ipmover's configuration", h.Name)
	w.line(0, "# Adds and removes the floating addresses as the arbiter commands, and")
	w.line(0, "# makes Asterisk answer on them.")
	s.common(w, bc, h, events.RoleIPMover)
	w.line(0, "interface: %s", q(h.Interface))
	w.line(0, "# The only groups and addresses this host may ever hold: a command for")
	w.line(0, "# anything else is refused (the bus can be written by others, this file cannot).")
	w.line(0, "groups:")
	if g, ok := s.GroupOf(h.Name); ok {
		w.line(1, "- name: %s", q(g.Name))
		w.line(2, "prefixes: %s", qlist(g.Addresses))
	}
	w.line(0, "state_file: %s", q(IPMoverState))
	w.line(0, "answer:")
	w.line(1, "mode: %s", s.Asterisk.Answer)
	w.line(0, "ami:")
	w.line(1, "address: %s", q(hostPort("127.0.0.1", s.Asterisk.AMIPort)))
	w.line(1, "username: %s", q(s.Asterisk.AMIUser))
	w.line(1, "secret: %s", q(sec.AMI[h.Name]))
	return w.bytes()
}

func (s Site) replicatorConfig(bc natsconfig.Cluster, h Host, sec secrets) []byte {
	w := &yw{}
	s.header(w, "fan-replicator's configuration", h.Name)
	w.line(0, "# Keeps Asterisk's files and registrations in step, always from the node")
	w.line(0, "# holding the group outward.")
	s.common(w, bc, h, events.RoleReplicator)
	g, _ := s.GroupOf(h.Name)
	w.line(0, "group: %s", q(g.Name))
	w.line(0, "state_dir: %s", q(ReplicatorState))
	w.line(0, "scan_interval: 30s")
	w.line(0, "safety:")
	w.line(1, "max_delete_share: 0.10")
	w.line(1, "allow_deletes: 2")
	if len(s.Replication.Trees) == 0 {
		w.line(0, "trees: []")
	} else {
		w.line(0, "trees:")
	}
	for _, t := range s.Replication.Trees {
		w.line(1, "- name: %s", q(t.Name))
		w.line(2, "path: %s", q(t.Path))
		if len(t.Exclude) > 0 {
			w.line(2, "exclude: %s", qlist(t.Exclude))
		}
	}
	w.line(0, "astdb:")
	w.line(1, "enabled: %v", *s.Replication.Registrations)
	if *s.Replication.Registrations {
		w.line(1, "# Followed as Asterisk reports them (ContactStatus events), with a whole")
		w.line(1, "# reconcile every minute as the safety net.")
		w.line(1, "families: [registrar]")
		w.line(1, "reconcile_interval: 1m")
		w.line(1, "ami:")
		w.line(2, "address: %s", q(hostPort("127.0.0.1", s.Asterisk.AMIPort)))
		w.line(2, "username: %s", q(s.Asterisk.AMIUser))
		w.line(2, "secret: %s", q(sec.AMI[h.Name]))
	}
	return w.bytes()
}

// replicates says whether anything is replicated, so failback waits for it.
func (s Site) replicates() bool {
	return len(s.Replication.Trees) > 0 || *s.Replication.Registrations
}

func (s Site) arbiterConfig(bc natsconfig.Cluster, h Host) []byte {
	w := &yw{}
	s.header(w, "fan-arbiter's configuration", h.Name)
	w.line(0, "# Decides failover and failback; the replica holding the lease leads.")
	s.common(w, bc, h, events.RoleArbiter)
	if h.Role == RolePBX {
		w.line(0, "# A PBX host's replica leads only while no witness's replica is alive, so")
		w.line(0, "# a PBX host's crash never costs the arbiter its leader.")
		w.line(0, "standby: true")
	} else {
		w.line(0, "standby: false")
	}
	w.line(0, "lease_ttl: 3s")
	var all []string
	for _, o := range s.Hosts {
		all = append(all, o.Name)
	}
	w.line(0, "# Every arbiter replica of the site: the one holding the lease reports a")
	w.line(0, "# missing one (fan_arbiter_replica_up, the FanArbiterReplicaDown alert).")
	w.line(0, "replicas: %s", qlist(all))
	w.line(0, "groups:")
	for _, g := range s.Groups {
		w.line(1, "- name: %s", q(g.Name))
		w.line(2, "addresses: %s", qlist(g.Addresses))
		w.line(2, "nodes: %s", qlist(g.Nodes))
		w.line(2, "health_check: %s", checkGroup)
		w.line(2, "# Failback happens only inside the scheduler's windows for the group (none:")
		w.line(2, "# never on its own; fanctl failback --now always can).")
		w.line(2, "failback:")
		w.line(3, "stable_for: %s", dur(g.StableFor.D()))
		w.line(3, "require_replication: %v", s.replicates())
		w.line(3, "drain_max_channels: 0")
		w.line(3, "on_window_close: wait")
		w.line(2, "planned:")
		w.line(3, "drain_within: %s", dur(g.DrainWithin.D()))
	}
	return w.bytes()
}

func (s Site) schedulerConfig(bc natsconfig.Cluster, h Host) []byte {
	w := &yw{}
	s.header(w, "fan-scheduler's configuration", h.Name)
	w.line(0, "# Publishes failback permits while a group's window is open: the arbiter")
	w.line(0, "# fails back only under one.")
	s.common(w, bc, h, events.RoleScheduler)
	w.line(0, "tick_every: 1m")
	var with []Group
	for _, g := range s.Groups {
		if len(g.FailbackWindows) > 0 {
			with = append(with, g)
		}
	}
	if len(with) == 0 {
		w.line(0, "groups: []")
		return w.bytes()
	}
	w.line(0, "groups:")
	for _, g := range with {
		w.line(1, "- name: %s", q(g.Name))
		w.line(2, "windows:")
		for _, win := range g.FailbackWindows {
			w.line(3, "- name: %s", q(win.Name))
			tz := win.TimeZone
			if tz == "" {
				tz = "UTC"
			}
			w.line(4, "time_zone: %s", q(tz))
			if len(win.Weekly) > 0 {
				w.line(4, "weekly:")
				for _, r := range win.Weekly {
					w.line(5, "- {days: %s, from: %s, to: %s}", qlist(r.Days), q(r.From), q(r.To))
				}
			}
			if len(win.Once) > 0 {
				w.line(4, "once:")
				for _, o := range win.Once {
					w.line(5, "- {from: %s, to: %s}", q(o.From), q(o.To))
				}
			}
			if len(win.BlackoutDates) > 0 {
				w.line(4, "blackout_dates: %s", qlist(win.BlackoutDates))
			}
		}
	}
	return w.bytes()
}

func (s Site) natsConfig(h Host) []byte {
	w := &yw{}
	s.header(w, "fan-nats's configuration", h.Name)
	w.line(0, "server_name: %s", q(ServerName(h.Name)))
	w.line(0, "listen: %s", q("0.0.0.0:4222"))
	w.line(0, "store_dir: %s", q(StoreDir))
	w.line(0, "# TLS with client certificates, the accounts with every identity's")
	w.line(0, "# permissions, and the cluster's routes.")
	w.line(0, "server_config: %s", q(filepath.Join(NATSDir, "nats-server.conf")))
	return w.bytes()
}

func (s Site) statusConfig(bc natsconfig.Cluster, h Host) []byte {
	w := &yw{}
	s.header(w, "The status page's configuration (fanctl serve)", h.Name)
	w.line(0, "# The page reads the bus as a viewer, which may only read.")
	w.line(0, "cluster: %s", q(s.Cluster))
	w.line(0, "url: %s", q(strings.Join(bc.ClientURLs(h.Name), ",")))
	v := string(events.RoleViewer)
	w.line(0, "nkey_seed: %s", q(filepath.Join(StatusDir, natsconfig.SeedFile(v))))
	w.line(0, "tls:")
	w.line(1, "ca: %s", q(filepath.Join(StatusDir, "ca.pem")))
	w.line(1, "cert: %s", q(filepath.Join(StatusDir, natsconfig.CertFile(v))))
	w.line(1, "key: %s", q(filepath.Join(StatusDir, natsconfig.KeyFile(v))))
	w.line(0, "serve:")
	w.line(1, "listen: %s", q(s.StatusPage.Listen))
	w.line(1, "token_file: %s", q(filepath.Join(StatusDir, "page.token")))
	return w.bytes()
}

func (s Site) sysctlConfig(h Host) []byte {
	w := &yw{}
	w.line(0, "# fan on %s (site %s), written by `fanctl init`: Asterisk binds the floating", h.Name, s.Cluster)
	w.line(0, "# address before this host holds it, so it answers the moment the address")
	w.line(0, "# arrives (fan's hot answer mode).")
	w.line(0, "net.ipv4.ip_nonlocal_bind = 1")
	w.line(0, "net.ipv6.ip_nonlocal_bind = 1")
	return w.bytes()
}

// managerUser is fan's AMI user, a manager.conf section: loopback only,
// and exactly the rights fan's services and fanctl doctor use
// (deploy/asterisk/manager.conf says which action needs which class).
func (s Site) managerUser(h Host, sec secrets) []byte {
	w := &yw{}
	w.line(0, "; fan's AMI user on %s (site %s), written by `fanctl init`. fanctl install-host", h.Name, s.Cluster)
	w.line(0, "; installs it as %s/%s and includes it from %s.", AsteriskDir, ManagerInclude, ManagerConf)
	w.line(0, "; The prober, the ipmover and the replicator log in as this user.")
	w.line(0, "[%s]", s.Asterisk.AMIUser)
	w.line(0, "secret = %s", sec.AMI[h.Name])
	w.line(0, "deny = 0.0.0.0/0.0.0.0")
	w.line(0, "permit = 127.0.0.1/255.255.255.255")
	w.line(0, "; write system: CoreStatus, CoreSettings, the AstDB actions and Filter (the")
	w.line(0, "; registrations), Reload, PJSIPShowEndpoint(s); command: core show channels")
	w.line(0, "; count and what fanctl doctor reads; reporting: Getvar and CoreShowChannels")
	w.line(0, "; (the calls the replicator records). read system: the registration events;")
	w.line(0, "; call: the bridge and hang-up events of calls.")
	w.line(0, "write = system,command,reporting")
	w.line(0, "read = system,call")
	return w.bytes()
}

// pjsipTransports is the host's part of pjsip.conf, for the operator to
// merge (deploy/asterisk/pjsip.conf explains every line): a transport on
// the host's own address (what fan's checks ask), one on each floating
// address (bound in advance), both writing the floating address into
// dialogs' Contact so a phone's in-dialog requests follow a failover (and
// no external_media_address, which would send a direct-media call's audio
// to the node), and the registration events the replicator follows.
func (s Site) pjsipTransports(h Host) []byte {
	w := &yw{}
	g, _ := s.GroupOf(h.Name)
	float := ""
	if len(g.Addresses) > 0 {
		if p, err := netip.ParsePrefix(g.Addresses[0]); err == nil {
			float = p.Addr().String()
		}
	}
	w.line(0, "; PJSIP for %s (site %s), written by `fanctl init`; not installed: merge it into", h.Name, s.Cluster)
	w.line(0, "; %s/pjsip.conf (deploy/asterisk/pjsip.conf says why each line is there, and", AsteriskDir)
	w.line(0, "; has the endpoint settings that let calls outlive a failover). fanctl doctor checks it.")
	w.line(0, "[global]")
	w.line(0, "type = global")
	w.line(0, "send_contact_status_on_update_registration = yes")
	w.line(0, "")
	w.line(0, "[transport-node]")
	w.line(0, "type = transport")
	w.line(0, "protocol = udp")
	w.line(0, "bind = %s", hostPort(h.Address, s.Asterisk.SIPPort))
	if float != "" {
		w.line(0, "external_signaling_address = %s", float)
	}
	for i, a := range g.Addresses {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			continue
		}
		name := "transport-float"
		if i > 0 {
			name = fmt.Sprintf("transport-float-%d", i+1)
		}
		w.line(0, "")
		w.line(0, "[%s]", name)
		w.line(0, "type = transport")
		w.line(0, "protocol = udp")
		w.line(0, "bind = %s", hostPort(p.Addr().String(), s.Asterisk.SIPPort))
		w.line(0, "external_signaling_address = %s", p.Addr())
	}
	return w.bytes()
}

func (s Site) asteriskConfNote(h Host) []byte {
	w := &yw{}
	w.line(0, "; asterisk.conf's [options] on %s (site %s), written by `fanctl init`; not installed.", h.Name, s.Cluster)
	w.line(0, "; Every PBX host of the site has the same systemname: a registration carries it,")
	w.line(0, "; and a standby whose systemname differs ignores the registrations fan copies to it.")
	w.line(0, "[options]")
	if s.Asterisk.SystemName == "" {
		w.line(0, ";systemname =     ; empty on every host, as the site file says")
	} else {
		w.line(0, "systemname = %s", s.Asterisk.SystemName)
	}
	return w.bytes()
}
