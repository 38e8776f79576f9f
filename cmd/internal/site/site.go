// Package site turns the one file an operator writes by hand, the site
// file, into everything each host of a fan cluster needs: the bus's
// credentials (through natsconfig), every service's configuration, the
// NATS server's, the status page's, fan's AMI user for Asterisk, the
// kernel setting hot standby needs, and an install plan per host that
// `fanctl install-host` carries out. The production shape is fixed: two or
// more PBX hosts and a witness, a NATS server and an arbiter replica on
// each, the PBX hosts' replicas standing by for the witness's.
package site

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/config"
)

// Roles a host of the site can have.
const (
	// RolePBX runs Asterisk and fan's node services (prober, ipmover,
	// replicator), a NATS server and a standby arbiter replica.
	RolePBX = "pbx"
	// RoleWitness runs no Asterisk: a NATS server, the arbiter replica that
	// leads, the scheduler and (by default) the status page. It keeps the
	// bus and the arbiter in the majority when a PBX host dies.
	RoleWitness = "witness"
)

// Site is the site file.
type Site struct {
	// Cluster is fan's name for the site: a subject token, the same in
	// every file init writes.
	Cluster string  `yaml:"cluster"`
	Hosts   []Host  `yaml:"hosts"`
	Groups  []Group `yaml:"groups"`
	// Asterisk says how fan reaches the PBX on each PBX host.
	Asterisk Asterisk `yaml:"asterisk"`
	// Checks tunes how fast a dead PBX is noticed.
	Checks Checks `yaml:"checks"`
	// Replication lists what the replicator keeps in step.
	Replication Replication `yaml:"replication"`
	// People are the operators (fanctl's actions) and auditors (read only).
	People People `yaml:"people"`
	// StatusPage places the NOC's read-only page (fanctl serve).
	StatusPage StatusPage `yaml:"status_page"`
	// MetricsListen is where the services serve /metrics and /healthz:
	// loopback (default) or host (the host's own address, for a Prometheus
	// elsewhere; firewall it).
	MetricsListen string `yaml:"metrics_listen"`
	// CertDays is the validity of issued certificates (default 825).
	CertDays int `yaml:"cert_days"`
}

// Host is one machine of the site.
type Host struct {
	// Name is fan's name for the host (a subject token); its NATS server
	// is nats-<name>.
	Name string `yaml:"name"`
	// Role is pbx or witness.
	Role string `yaml:"role"`
	// Address is the host's own address: the bus and its routes, the
	// other PBX hosts' SIP checks, its certificate.
	Address string `yaml:"address"`
	// DNSName, when set, is the name every bus URL uses for this host's
	// NATS server and that its certificate carries beside Address; it must
	// resolve on every host. Empty: URLs use Address, nothing to resolve.
	DNSName string `yaml:"dns_name"`
	// Interface is the LAN the phones are on (PBX hosts): the floating
	// address goes there.
	Interface string `yaml:"interface"`
}

// Group is a set of floating addresses that move together between PBX
// hosts.
type Group struct {
	Name string `yaml:"name"`
	// Addresses are the floating addresses phones use, each with its
	// LAN's prefix length (192.0.2.10/24).
	Addresses []string `yaml:"addresses"`
	// Nodes are PBX hosts in priority order: the first is preferred.
	Nodes []string `yaml:"nodes"`
	// FailbackWindows say when a failed-over group may return to its
	// preferred node on its own. None: it never does (fanctl failback --now
	// always can).
	FailbackWindows []Window `yaml:"failback_windows"`
	// StableFor is how long the preferred node must be healthy before a
	// failback (default 10m).
	StableFor config.Duration `yaml:"stable_for"`
	// DrainWithin is how long a planned move waits for calls to end
	// (default 30m).
	DrainWithin config.Duration `yaml:"drain_within"`
}

// Window is a failback window, in the scheduler's own terms.
type Window struct {
	Name          string   `yaml:"name"`
	TimeZone      string   `yaml:"time_zone"`
	Weekly        []Weekly `yaml:"weekly"`
	Once          []Once   `yaml:"once"`
	BlackoutDates []string `yaml:"blackout_dates"`
}

// Weekly is "on these days, from HH:MM to HH:MM".
type Weekly struct {
	Days []string `yaml:"days"`
	From string   `yaml:"from"`
	To   string   `yaml:"to"`
}

// Once is a one-off window (RFC 3339 with an offset).
type Once struct {
	From string `yaml:"from"`
	To   string `yaml:"to"`
}

// Asterisk is how fan reaches Asterisk on every PBX host.
type Asterisk struct {
	// AMIUser is the manager.conf user fan logs in as (default fan). Its
	// secret is made by init, one per host.
	AMIUser string `yaml:"ami_user"`
	// AMIPort is the manager's port on loopback (default 5038).
	AMIPort int `yaml:"ami_port"`
	// SIPPort is PJSIP's UDP port (default 5060).
	SIPPort int `yaml:"sip_port"`
	// Answer is how Asterisk answers on the floating address: hot (bound to
	// it before it arrives, with ip_nonlocal_bind; default) or reload (an
	// AMI Reload of res_pjsip.so once it is here).
	Answer string `yaml:"answer"`
	// SystemName is asterisk.conf's systemname, the same on every PBX host
	// (registrations carry it); doctor compares it with what Asterisk says.
	SystemName string `yaml:"systemname"`
	// ManageAMIUser: install-host writes fan's user into
	// /etc/asterisk/manager.d/fan.conf and includes it from manager.conf
	// (default true). False: add the user yourself, from the bundle's
	// asterisk/manager-fan.conf.
	ManageAMIUser *bool `yaml:"manage_ami_user"`
}

// Checks tunes detection: a dead PBX is called down after about interval ×
// fall, a silent peer after peer_interval × fall.
type Checks struct {
	Interval     config.Duration `yaml:"interval"`      // default 200ms
	Timeout      config.Duration `yaml:"timeout"`       // default 150ms
	Rise         int             `yaml:"rise"`          // default 2
	Fall         int             `yaml:"fall"`          // default 3
	PeerInterval config.Duration `yaml:"peer_interval"` // default 500ms
	PeerTimeout  config.Duration `yaml:"peer_timeout"`  // default 400ms
}

// Replication is what the replicator carries from the holder outward.
type Replication struct {
	// Trees default to /etc/asterisk (without fan's AMI user and
	// manager.conf, which differ per host) and the voicemail spool.
	Trees []Tree `yaml:"trees"`
	// Registrations carries PJSIP's registrations (AstDB registrar) to the
	// standby, so phones are reachable from it without re-registering
	// (default true).
	Registrations *bool `yaml:"registrations"`
}

// Tree is one directory tree kept in step.
type Tree struct {
	Name    string   `yaml:"name"`
	Path    string   `yaml:"path"`
	Exclude []string `yaml:"exclude"`
}

// People run fanctl against the site from their own machines.
type People struct {
	Operators []string `yaml:"operators"`
	Auditors  []string `yaml:"auditors"`
}

// StatusPage places the read-only page for a NOC.
type StatusPage struct {
	// Host runs it (default: the first witness). "none": no page.
	Host string `yaml:"host"`
	// Listen is its address (default 127.0.0.1:9110: put a TLS proxy in
	// front, or set an address the NOC reaches).
	Listen string `yaml:"listen"`
}

// Defaults of what the site file may leave out.
const (
	DefaultAMIUser      = "fan"
	DefaultAMIPort      = 5038
	DefaultSIPPort      = 5060
	DefaultStatusListen = "127.0.0.1:9110"
	NoStatusPage        = "none"
)

// Warning is something init reports without refusing the site.
type Warning struct {
	Key string
	Msg string
}

func (w Warning) String() string { return w.Key + ": " + w.Msg }

// Load reads and checks a site file; it returns every error the file has
// at once, and what is worth a warning.
func Load(path string) (Site, []Warning, error) {
	var s Site
	if err := config.Load(path, &s); err != nil {
		return s, nil, err
	}
	warns, err := s.Check()
	if err != nil {
		return s, warns, fmt.Errorf("site %s: %w", path, err)
	}
	return s, warns, nil
}

// Check fills defaults and checks the whole site, cross-references
// included; the error joins every problem found.
func (s *Site) Check() ([]Warning, error) {
	s.defaults()
	c := &checker{}
	s.check(c)
	return c.warns, errors.Join(c.errs...)
}

type checker struct {
	errs  []error
	warns []Warning
}

func (c *checker) err(key, format string, args ...any) {
	c.errs = append(c.errs, config.Errf(key, format, args...))
}

func (c *checker) warn(key, format string, args ...any) {
	c.warns = append(c.warns, Warning{Key: key, Msg: fmt.Sprintf(format, args...)})
}

func (s *Site) defaults() {
	a := &s.Asterisk
	if a.AMIUser == "" {
		a.AMIUser = DefaultAMIUser
	}
	if a.AMIPort == 0 {
		a.AMIPort = DefaultAMIPort
	}
	if a.SIPPort == 0 {
		a.SIPPort = DefaultSIPPort
	}
	if a.Answer == "" {
		a.Answer = "hot"
	}
	if a.ManageAMIUser == nil {
		t := true
		a.ManageAMIUser = &t
	}
	k := &s.Checks
	if k.Interval == 0 {
		k.Interval = config.Duration(200 * time.Millisecond)
	}
	if k.Timeout == 0 {
		k.Timeout = config.Duration(150 * time.Millisecond)
	}
	if k.Rise == 0 {
		k.Rise = 2
	}
	if k.Fall == 0 {
		k.Fall = 3
	}
	if k.PeerInterval == 0 {
		k.PeerInterval = config.Duration(500 * time.Millisecond)
	}
	if k.PeerTimeout == 0 {
		k.PeerTimeout = config.Duration(400 * time.Millisecond)
	}
	r := &s.Replication
	if r.Trees == nil {
		r.Trees = []Tree{
			// manager.conf and fan's user in manager.d hold each host's own
			// AMI secret.
			{Name: "asterisk-etc", Path: "/etc/asterisk", Exclude: []string{"/manager.conf", "/" + ManagerInclude}},
			{Name: "voicemail", Path: "/var/spool/asterisk/voicemail", Exclude: []string{"tmp/"}},
		}
	}
	if r.Registrations == nil {
		t := true
		r.Registrations = &t
	}
	for i := range s.Groups {
		g := &s.Groups[i]
		if g.StableFor == 0 {
			g.StableFor = config.Duration(10 * time.Minute)
		}
		if g.DrainWithin == 0 {
			g.DrainWithin = config.Duration(30 * time.Minute)
		}
	}
	if s.StatusPage.Host == "" {
		for _, h := range s.Hosts {
			if h.Role == RoleWitness {
				s.StatusPage.Host = h.Name
				break
			}
		}
	}
	if s.StatusPage.Listen == "" {
		s.StatusPage.Listen = DefaultStatusListen
	}
	if s.CertDays == 0 {
		s.CertDays = 825
	}
	if s.MetricsListen == "" {
		s.MetricsListen = "loopback"
	}
}

var (
	hostnameRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$`)
	ifnameRE   = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,15}$`)
	// An AMI user is a section name in manager.conf.
	amiUserRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
	clockRE   = regexp.MustCompile(`^([01][0-9]|2[0-3]):[0-5][0-9]$|^24:00$`)
	dayWords  = []string{"mon", "tue", "wed", "thu", "fri", "sat", "sun", "daily", "weekdays", "weekends"}
)

func (s *Site) check(c *checker) {
	if err := events.ValidToken("cluster", s.Cluster); err != nil {
		c.err("cluster", "%v", err)
	}
	// Every name becomes a directory of the output and a subject token.
	names := map[string]string{"admin": "reserved"}
	unique := func(key, kind, name string) bool {
		if err := events.ValidToken(kind, name); err != nil {
			c.err(key, "%v", err)
			return false
		}
		if prev, dup := names[name]; dup {
			if prev == "reserved" {
				c.err(key, "%q is reserved", name)
			} else {
				c.err(key, "%q is already a %s", name, prev)
			}
			return false
		}
		names[name] = kind
		return true
	}
	hosts := map[string]Host{}
	addrs := map[netip.Addr]string{}
	var pbx, witness int
	for i, h := range s.Hosts {
		key := func(k string) string { return fmt.Sprintf("hosts[%d].%s", i, k) }
		if unique(key("name"), "host", h.Name) {
			hosts[h.Name] = h
		}
		switch h.Role {
		case RolePBX:
			pbx++
			if h.Interface == "" {
				c.err(key("interface"), "a pbx host needs the interface its phones are on (ip -br link shows them)")
			} else if !ifnameRE.MatchString(h.Interface) {
				c.err(key("interface"), "%q is not an interface name", h.Interface)
			}
		case RoleWitness:
			witness++
			if h.Interface != "" {
				c.warn(key("interface"), "a witness holds no floating address: interface is not used")
			}
		default:
			c.err(key("role"), "want %s or %s, got %q", RolePBX, RoleWitness, h.Role)
		}
		a, err := netip.ParseAddr(h.Address)
		switch {
		case err != nil:
			c.err(key("address"), "want the host's own IP address, got %q", h.Address)
		case a.IsUnspecified() || a.IsMulticast():
			c.err(key("address"), "%s is not a host's address", a)
		default:
			if prev, dup := addrs[a]; dup {
				c.err(key("address"), "%s is already %s's address", a, prev)
			}
			addrs[a] = h.Name
		}
		if h.DNSName != "" && !hostnameRE.MatchString(h.DNSName) {
			c.err(key("dns_name"), "%q is not a host name", h.DNSName)
		}
	}
	switch {
	case len(s.Hosts) == 0:
		c.err("hosts", "list the PBX hosts and the witness")
	case pbx < 2:
		c.err("hosts", "at least two pbx hosts (a failover needs somewhere to go), got %d", pbx)
	case witness < 1:
		c.err("hosts", "at least one witness: without it the loss of either PBX host takes the bus's majority with it")
	case len(s.Hosts)%2 == 0:
		c.err("hosts", "%d hosts run %d NATS servers: an even count tolerates no more failures than one server fewer; add or remove a witness", len(s.Hosts), len(s.Hosts))
	}

	inGroup := map[string]string{}
	floating := map[netip.Addr]string{}
	if len(s.Groups) == 0 {
		c.err("groups", "at least one group: the floating address(es) and the PBX hosts they move between")
	}
	for i, g := range s.Groups {
		key := func(k string) string { return fmt.Sprintf("groups[%d].%s", i, k) }
		unique(key("name"), "group", g.Name)
		if len(g.Addresses) == 0 {
			c.err(key("addresses"), "at least one floating address, with its prefix length (192.0.2.10/24)")
		}
		var prefixes []netip.Prefix
		for j, a := range g.Addresses {
			ak := fmt.Sprintf("groups[%d].addresses[%d]", i, j)
			p, err := netip.ParsePrefix(a)
			if err != nil {
				c.err(ak, "want an address with its LAN's prefix length (192.0.2.10/24), got %q", a)
				continue
			}
			if p.Addr().IsUnspecified() || p.Addr().IsMulticast() || p.Bits() == 0 {
				c.err(ak, "%s is not a floating address", p)
				continue
			}
			if owner, dup := addrs[p.Addr()]; dup {
				c.err(ak, "%s is %s's own address", p.Addr(), owner)
			}
			if prev, dup := floating[p.Addr()]; dup {
				c.err(ak, "%s is already in group %s", p.Addr(), prev)
			}
			floating[p.Addr()] = g.Name
			prefixes = append(prefixes, p)
		}
		if len(g.Nodes) < 2 {
			c.err(key("nodes"), "at least two pbx hosts, the preferred first")
		}
		seen := map[string]bool{}
		for j, n := range g.Nodes {
			nk := fmt.Sprintf("groups[%d].nodes[%d]", i, j)
			h, ok := hosts[n]
			switch {
			case !ok:
				c.err(nk, "%q is not a host of the site", n)
				continue
			case h.Role != RolePBX:
				c.err(nk, "%q is a %s: only pbx hosts hold floating addresses", n, h.Role)
				continue
			case seen[n]:
				c.err(nk, "%q is listed twice", n)
				continue
			}
			seen[n] = true
			if prev, dup := inGroup[n]; dup && prev != g.Name {
				c.err(nk, "%q is already in group %s: a pbx host is in one group (its replicator follows that group's holder)", n, prev)
			}
			inGroup[n] = g.Name
			if a, err := netip.ParseAddr(h.Address); err == nil {
				for _, p := range prefixes {
					if p.Addr().Is4() == a.Is4() && !p.Masked().Contains(a) {
						c.warn(nk, "%s's address %s is outside %s: fine if the host reaches the phones' LAN on %s through another address, which fanctl doctor checks there", n, a, p.Masked(), h.Interface)
					}
				}
			}
		}
		s.checkWindows(c, i, g)
		if d := g.StableFor.D(); d < 0 || d > 24*time.Hour {
			c.err(key("stable_for"), "must be between 0s and 24h, got %v", d)
		}
		if d := g.DrainWithin.D(); d < time.Second || d > 24*time.Hour {
			c.err(key("drain_within"), "must be between 1s and 24h, got %v", d)
		}
	}
	for _, h := range s.Hosts {
		if h.Role == RolePBX && inGroup[h.Name] == "" {
			c.warn("groups", "pbx host %s is in no group: nothing will ever move to it", h.Name)
		}
	}

	a := s.Asterisk
	if !amiUserRE.MatchString(a.AMIUser) {
		c.err("asterisk.ami_user", "want a manager.conf user name (letters, digits, _ . -), got %q", a.AMIUser)
	}
	for _, p := range []struct {
		key string
		v   int
	}{{"asterisk.ami_port", a.AMIPort}, {"asterisk.sip_port", a.SIPPort}} {
		if p.v < 1 || p.v > 65535 {
			c.err(p.key, "must be a port in 1..65535, got %d", p.v)
		}
	}
	if a.Answer != "hot" && a.Answer != "reload" {
		c.err("asterisk.answer", "want hot or reload, got %q", a.Answer)
	}
	if strings.ContainsAny(a.SystemName, " \t\r\n;[]") {
		c.err("asterisk.systemname", "%q is not a systemname asterisk.conf takes", a.SystemName)
	}

	k := s.Checks
	if d := k.Interval.D(); d < 10*time.Millisecond || d > time.Minute {
		c.err("checks.interval", "must be between 10ms and 1m, got %v", d)
	}
	if k.Timeout.D() <= 0 || k.Timeout >= k.Interval {
		c.err("checks.timeout", "must be above 0 and below checks.interval (%v), got %v", k.Interval, k.Timeout)
	}
	if k.PeerTimeout.D() <= 0 || k.PeerTimeout >= k.PeerInterval {
		c.err("checks.peer_timeout", "must be above 0 and below checks.peer_interval (%v), got %v", k.PeerInterval, k.PeerTimeout)
	}
	if d := k.PeerInterval.D(); d < 10*time.Millisecond || d > time.Minute {
		c.err("checks.peer_interval", "must be between 10ms and 1m, got %v", d)
	}
	for _, n := range []struct {
		key string
		v   int
	}{{"checks.rise", k.Rise}, {"checks.fall", k.Fall}} {
		if n.v < 1 || n.v > events.MaxRiseFall {
			c.err(n.key, "must be between 1 and %d, got %d", events.MaxRiseFall, n.v)
		}
	}

	treeNames := map[string]bool{}
	for i, t := range s.Replication.Trees {
		key := func(k string) string { return fmt.Sprintf("replication.trees[%d].%s", i, k) }
		if err := events.ValidToken("tree", t.Name); err != nil {
			c.err(key("name"), "%v", err)
		} else if treeNames[t.Name] {
			c.err(key("name"), "%q is listed twice", t.Name)
		}
		treeNames[t.Name] = true
		if !strings.HasPrefix(t.Path, "/") || t.Path == "/" {
			c.err(key("path"), "want an absolute directory other than /, got %q", t.Path)
		}
	}

	for _, p := range []struct {
		key, kind string
		names     []string
	}{{"people.operators", "operator", s.People.Operators}, {"people.auditors", "auditor", s.People.Auditors}} {
		for i, n := range p.names {
			unique(fmt.Sprintf("%s[%d]", p.key, i), p.kind, n)
		}
	}

	if sp := s.StatusPage; sp.Host != NoStatusPage {
		if _, ok := hosts[sp.Host]; !ok {
			c.err("status_page.host", "%q is not a host of the site (or %q for no page)", sp.Host, NoStatusPage)
		}
		if err := config.HostPort("status_page.listen", sp.Listen, false); err != nil {
			c.errs = append(c.errs, err)
		}
		// The viewer is named for its host; it must not collide.
		unique("status_page.host", "status page", viewerName(sp.Host))
	}
	if s.MetricsListen != "loopback" && s.MetricsListen != "host" {
		c.err("metrics_listen", "want loopback or host, got %q", s.MetricsListen)
	}
	if s.CertDays < 30 || s.CertDays > 3650 {
		c.err("cert_days", "must be between 30 and 3650, got %d", s.CertDays)
	}
}

func (s *Site) checkWindows(c *checker, gi int, g Group) {
	names := map[string]bool{}
	for wi, w := range g.FailbackWindows {
		key := func(k string) string { return fmt.Sprintf("groups[%d].failback_windows[%d].%s", gi, wi, k) }
		if err := events.ValidToken("window", w.Name); err != nil {
			c.err(key("name"), "%v", err)
		} else if names[w.Name] {
			c.err(key("name"), "%q is listed twice", w.Name)
		}
		names[w.Name] = true
		loc := time.UTC
		if w.TimeZone != "" {
			l, err := time.LoadLocation(w.TimeZone)
			if err != nil {
				c.err(key("time_zone"), "want an IANA time zone (Europe/Berlin): %v", err)
			} else {
				loc = l
			}
		}
		if len(w.Weekly) == 0 && len(w.Once) == 0 {
			c.err(key("weekly"), "a window needs weekly or once ranges")
		}
		for ri, r := range w.Weekly {
			rk := func(k string) string { return key(fmt.Sprintf("weekly[%d].%s", ri, k)) }
			if len(r.Days) == 0 {
				c.err(rk("days"), "at least one day (mon..sun, daily, weekdays, weekends)")
			}
			for _, d := range r.Days {
				if !slices.Contains(dayWords, strings.ToLower(d)) {
					c.err(rk("days"), "unknown day %q (mon..sun, daily, weekdays, weekends)", d)
				}
			}
			if !clockRE.MatchString(r.From) {
				c.err(rk("from"), "want HH:MM, got %q", r.From)
			}
			if !clockRE.MatchString(r.To) {
				c.err(rk("to"), "want HH:MM, got %q", r.To)
			}
		}
		for oi, o := range w.Once {
			ok := func(k string) string { return key(fmt.Sprintf("once[%d].%s", oi, k)) }
			from, ferr := time.Parse(time.RFC3339, o.From)
			if ferr != nil {
				c.err(ok("from"), "want RFC 3339 with an offset: %v", ferr)
			}
			to, terr := time.Parse(time.RFC3339, o.To)
			if terr != nil {
				c.err(ok("to"), "want RFC 3339 with an offset: %v", terr)
			}
			if ferr == nil && terr == nil {
				switch {
				case !to.After(from):
					c.err(ok("to"), "must be after from")
				case to.Sub(from) > events.MaxPermitSpan:
					c.err(ok("to"), "a one-off window lasts at most %v, got %v", events.MaxPermitSpan, to.Sub(from))
				}
			}
		}
		for bi, b := range w.BlackoutDates {
			if _, err := time.ParseInLocation("2006-01-02", b, loc); err != nil {
				c.err(key(fmt.Sprintf("blackout_dates[%d]", bi)), "want YYYY-MM-DD, got %q", b)
			}
		}
	}
}

// Host returns the host called name.
func (s Site) Host(name string) (Host, bool) {
	for _, h := range s.Hosts {
		if h.Name == name {
			return h, true
		}
	}
	return Host{}, false
}

// GroupOf returns the group a PBX host belongs to.
func (s Site) GroupOf(host string) (Group, bool) {
	for _, g := range s.Groups {
		if slices.Contains(g.Nodes, host) {
			return g, true
		}
	}
	return Group{}, false
}

// Witnesses are the witness hosts, in file order.
func (s Site) Witnesses() []Host {
	var out []Host
	for _, h := range s.Hosts {
		if h.Role == RoleWitness {
			out = append(out, h)
		}
	}
	return out
}

// ServerName is the NATS server running on host.
func ServerName(host string) string { return "nats-" + host }

// viewerName is the status page's identity on the bus, named for its host.
func viewerName(host string) string { return "status-" + host }

// HasStatusPage says whether host runs the status page.
func (s Site) HasStatusPage(host string) bool {
	return s.StatusPage.Host != NoStatusPage && s.StatusPage.Host == host
}

// hostPort joins an address or name and a port.
func hostPort(host string, port int) string {
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		return "[" + host + "]:" + strconv.Itoa(port)
	}
	return host + ":" + strconv.Itoa(port)
}
