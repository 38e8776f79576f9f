package stack

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/fanpbx/fan/lab/bindtest"
	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/poll"
)

// The sites lab: one DNS name moved between two sites, the shape of
// docs/recipes/dns-two-sites.md. Four places on a WAN (netlab.BuildWAN):
// site A and site B, each with a web server and an authoritative BIND 9 of
// the zone (two primaries, no zone transfer between them); the witness,
// with fan-nats, the arbiter, the scheduler, the observer (fan-prober, which
// judges both sites from outside) and the DNS executor (fan-ipmover,
// executor dns, one primary per site); and a client's place, with a
// recursive resolver (BIND as a resolver, finding the zone's two servers as
// a delegation names them) and the client asking it. The bus is made as an
// installer makes it: a cluster file, fanctl nats-config, the admin's
// provision.

// Names of the sites lab.
const (
	SiteA         = "site-a"
	SiteB         = "site-b"
	SitesGroup    = "web"
	SitesZone     = "voip.test"
	SitesName     = "sip.voip.test"
	SitesWitness  = "ctl"
	SitesClient   = "c"
	sitesResolver = "res"
)

// site is one site's hosts and addresses.
type site struct {
	name, place, web, dns string
	webIP, dnsIP          netip.Addr
}

var sites = []site{
	{SiteA, "a", "aweb", "adns", netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("192.0.2.53")},
	{SiteB, "b", "bweb", "bdns", netip.MustParseAddr("203.0.113.20"), netip.MustParseAddr("203.0.113.53")},
}

func siteByName(name string) (site, error) {
	for _, s := range sites {
		if s.name == name {
			return s, nil
		}
	}
	return site{}, fmt.Errorf("sites lab: no site %q", name)
}

// SiteOfAddr names the site whose web server has addr ("" for none).
func SiteOfAddr(addr netip.Addr) string {
	for _, s := range sites {
		if s.webIP == addr {
			return s.name
		}
	}
	return ""
}

// SitesOptions tunes the sites lab; zero values take the lab's defaults.
type SitesOptions struct {
	BinDir string
	Log    *slog.Logger
	// Interval, Timeout, Rise and Fall time the observer's checks of each
	// site (HTTP, TCP and DNS; a site is up while 2 of them are).
	Interval, Timeout time.Duration
	Rise, Fall        int
	// TTL is the name's TTL (dns.ttl): how long resolvers keep an answer.
	TTL time.Duration
	// Resync is the DNS executor's dns.resync, DNSTimeout its dns.timeout.
	Resync, DNSTimeout time.Duration
	// StableFor and HoldDown are the arbiter's failback.stable_for and
	// policy.hold_down.
	StableFor, HoldDown time.Duration
	// Delays are the one-way delays of each place's uplink: "a", "b", "w"
	// (the witness), "c" (the client's place).
	Delays map[string]time.Duration
}

func (o *SitesOptions) defaults() {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	set := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	set(&o.Interval, 300*time.Millisecond)
	set(&o.Timeout, 250*time.Millisecond)
	set(&o.TTL, 5*time.Second)
	set(&o.Resync, time.Second)
	set(&o.DNSTimeout, time.Second)
	set(&o.StableFor, 2*time.Second)
	set(&o.HoldDown, 2*time.Second)
	if o.Rise == 0 {
		o.Rise = 2
	}
	if o.Fall == 0 {
		o.Fall = 2
	}
	delays := map[string]time.Duration{"a": 20 * time.Millisecond, "b": 25 * time.Millisecond, "w": 20 * time.Millisecond, "c": 30 * time.Millisecond}
	for k, v := range o.Delays {
		delays[k] = v
	}
	o.Delays = delays
}

// CheckBudget is how long the observer takes at most to call a dark site
// down: Fall runs, the first starting within one interval of the fault,
// the last waiting its timeout.
func (o SitesOptions) CheckBudget() time.Duration {
	return time.Duration(o.Fall)*o.Interval + o.Timeout
}

// Sites is a running sites lab.
type Sites struct {
	WAN    *netlab.WAN
	Opts   SitesOptions
	p      *shapeProcs
	secret string
	webs   []*http.Server
	client *net.UDPConn
	mu     sync.Mutex // the client's queries
}

// StartSites builds the sites lab and starts everything in it; the caller
// closes it with Close, pass or fail.
func StartSites(ctx context.Context, o SitesOptions) (*Sites, error) {
	o.defaults()
	for _, b := range []string{"fan-nats", "fan-arbiter", "fan-scheduler", "fan-prober", "fan-ipmover", "fanctl"} {
		if _, err := os.Stat(filepath.Join(o.BinDir, b)); err != nil {
			return nil, fmt.Errorf("binary %s: %w (run make build)", b, err)
		}
	}
	if _, err := exec.LookPath("named"); err != nil {
		return nil, fmt.Errorf("named is not installed (apt-get install bind9): %w", err)
	}
	pfx := func(s string) netip.Prefix { return netip.MustParsePrefix(s) }
	w, err := netlab.BuildWAN(ctx, netlab.WANSpec{Logger: o.Log, Places: []netlab.PlaceSpec{
		{Name: "a", Prefix: pfx("192.0.2.0/24"), Delay: o.Delays["a"], Hosts: []netlab.HostSpec{
			{Name: "aweb", Addr: pfx("192.0.2.10/24")}, {Name: "adns", Addr: pfx("192.0.2.53/24")}}},
		{Name: "b", Prefix: pfx("203.0.113.0/24"), Delay: o.Delays["b"], Hosts: []netlab.HostSpec{
			{Name: "bweb", Addr: pfx("203.0.113.20/24")}, {Name: "bdns", Addr: pfx("203.0.113.53/24")}}},
		{Name: "w", Prefix: pfx("198.51.100.0/25"), Delay: o.Delays["w"], Hosts: []netlab.HostSpec{
			{Name: SitesWitness, Addr: pfx("198.51.100.2/25")}}},
		{Name: "c", Prefix: pfx("198.51.100.128/25"), Delay: o.Delays["c"], Hosts: []netlab.HostSpec{
			{Name: sitesResolver, Addr: pfx("198.51.100.153/25")}, {Name: SitesClient, Addr: pfx("198.51.100.150/25")}}},
	}})
	if err != nil {
		return nil, err
	}
	s := &Sites{WAN: w, Opts: o, p: newShapeProcs(w.Lab, o.BinDir, filepath.Join(w.Dir(), "fan"))}
	if err := s.start(ctx); err != nil {
		return s, err
	}
	return s, nil
}

func (s *Sites) start(ctx context.Context) error {
	if err := os.MkdirAll(s.p.dir, 0o755); err != nil {
		return err
	}
	for _, st := range sites {
		if err := s.startWeb(st); err != nil {
			return err
		}
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return err
	}
	s.secret = base64.StdEncoding.EncodeToString(secret)
	if err := s.startDNS(ctx); err != nil {
		return err
	}
	if err := s.startBus(ctx); err != nil {
		return err
	}
	return s.startFan()
}

// startWeb serves site st's web page on port 80 of its web host.
func (s *Sites) startWeb(st site) error {
	var ln net.Listener
	if err := s.WAN.Do(st.web, func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(st.webIP, 80).String())
		return err
	}); err != nil {
		return fmt.Errorf("web server of %s: %w", st.name, err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintf(w, "%s\n", st.name) })}
	go func() { _ = srv.Serve(ln) }()
	s.webs = append(s.webs, srv)
	return nil
}

// zoneFile is a site's copy of the zone: the same records, its own server
// named in the SOA (each is the primary a client of RFC 2136 talks to).
func (s *Sites) zoneFile(st site) string {
	var b strings.Builder
	fmt.Fprintf(&b, "$TTL 60\n@ IN SOA ns-%s.%s. hostmaster.%s. ( 1 3600 600 86400 %d )\n", st.place, SitesZone, SitesZone, int(s.Opts.TTL.Seconds()))
	for _, o := range sites {
		fmt.Fprintf(&b, "  IN NS ns-%s.%s.\nns-%s IN A %s\n", o.place, SitesZone, o.place, o.dnsIP)
	}
	fmt.Fprintf(&b, "sip %d IN A %s\n", int(s.Opts.TTL.Seconds()), sites[0].webIP)
	return b.String()
}

// startDNS runs each site's primary and the client place's resolver.
func (s *Sites) startDNS(ctx context.Context) error {
	named := func(host, conf string, files map[string]string) error {
		dir := filepath.Join(s.p.dir, "named-"+host)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for name, txt := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(txt), 0o644); err != nil {
				return err
			}
		}
		cf := filepath.Join(dir, "named.conf")
		if err := os.WriteFile(cf, []byte(strings.ReplaceAll(conf, "@DIR@", dir)), 0o644); err != nil {
			return err
		}
		return s.p.start(host, "named", "named", "-4", "-g", "-c", cf)
	}
	var servers []string
	for _, st := range sites {
		servers = append(servers, st.dnsIP.String())
		conf := bindtest.PrimaryConfig("@DIR@", st.dnsIP.String(), SitesZone, s.secret, SitesName+". A")
		if err := named(st.dns, conf, map[string]string{"zone.db": s.zoneFile(st)}); err != nil {
			return err
		}
	}
	res := netip.MustParseAddr("198.51.100.153")
	conf := bindtest.ResolverConfig("@DIR@", res.String(), "198.51.100.128/25", SitesZone, servers...)
	// The root server the resolver is told of is a lab address nobody
	// holds: a name outside the zone goes nowhere beyond the lab.
	if err := named(sitesResolver, conf, map[string]string{"root.hint": bindtest.RootHint("198.51.100.254")}); err != nil {
		return err
	}
	for _, st := range sites {
		if err := s.waitDNS(ctx, st.dns, netip.AddrPortFrom(st.dnsIP, 53).String(), SitesZone, dns.TypeSOA, false); err != nil {
			return fmt.Errorf("%s's DNS server: %w", st.name, err)
		}
	}
	if err := s.waitDNS(ctx, SitesClient, netip.AddrPortFrom(res, 53).String(), SitesName, dns.TypeA, true); err != nil {
		return fmt.Errorf("the resolver: %w", err)
	}
	var err error
	if err = s.WAN.Do(SitesClient, func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(res, 53)))
		s.client = c
		return err
	}); err != nil {
		return fmt.Errorf("the client's socket: %w", err)
	}
	return nil
}

// waitDNS waits until server, asked from host, answers name.
func (s *Sites) waitDNS(ctx context.Context, host, server, name string, qtype uint16, rd bool) error {
	what := fmt.Sprintf("%s %s at %s, asked from %s", name, dns.TypeToString[qtype], server, host)
	return poll.Until(ctx, 20*time.Second, what, func() error {
		return s.WAN.Do(host, func() error {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(name), qtype)
			m.RecursionDesired = rd
			r, _, err := (&dns.Client{Net: "udp", Timeout: 500 * time.Millisecond}).Exchange(m, server)
			if err == nil && (r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0) {
				err = fmt.Errorf("rcode %s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
			}
			return err
		})
	})
}

// sitesOperator is the lab's operator, whose fanctl follows the trail.
const sitesOperator = LabOperator

// SitesClusterFile is the cluster file of the lab's bus, for fanctl
// nats-config: one NATS server on the witness, and the witness's services
// (the observer's prober, the DNS executor of both sites, the arbiter, the
// scheduler). The recipe's production file has a server at each site too.
func SitesClusterFile(storeDir string) string {
	return fmt.Sprintf(`cluster: lab
nats:
  - name: nats-ctl
    host: "198.51.100.2"
    ips: ["198.51.100.2"]
    monitor: "-"
control:
  - name: %s
    services: [arbiter, scheduler, prober, ipmover]
    dns_sites: [%s, %s]
operators: [%s]
nats_dir: %q
store_dir: %q
fan_dir: %q
`, SitesWitness, SiteA, SiteB, sitesOperator, bundleMount, storeDir, bundleMount)
}

func (s *Sites) startBus(ctx context.Context) error {
	store := filepath.Join(s.p.dir, "nats-store")
	if err := s.p.bus.generate(ctx, SitesClusterFile(store)); err != nil {
		return err
	}
	for _, person := range []string{sitesOperator, "admin"} {
		if err := s.p.bus.install(person, "fanctl.yaml", s.fanctlConfig(person)); err != nil {
			return err
		}
	}
	conf := filepath.Join(s.p.dir, "nats-server.conf")
	if err := s.p.bus.install("nats-ctl", "nats-server.conf", conf); err != nil {
		return err
	}
	if err := s.p.start(SitesWitness, "fan-nats", filepath.Join(s.p.bin, "fan-nats"), "-listen", "198.51.100.2:4222",
		"-store", store, "-name", "nats-ctl", "-server-config", conf); err != nil {
		return err
	}
	if err := waitTCPOn(ctx, s.WAN.Lab, SitesWitness, "198.51.100.2:4222", 10*time.Second); err != nil {
		return fmt.Errorf("nats on the witness: %w", err)
	}
	if out, err := s.fanctlAs(ctx, "admin", "provision", "--replicas", "1"); err != nil {
		return fmt.Errorf("fanctl provision: %w: %s", err, out)
	}
	return nil
}

func (s *Sites) fanctlConfig(person string) string {
	return filepath.Join(s.p.dir, "fanctl-"+person+".yaml")
}

func (s *Sites) fanctlAs(ctx context.Context, person string, args ...string) ([]byte, error) {
	argv := append([]string{filepath.Join(s.p.bin, "fanctl"), "--config", s.fanctlConfig(person)}, args...)
	return s.WAN.Exec(ctx, SitesWitness, argv...)
}

// Fanctl runs fanctl on the witness as the lab's operator.
func (s *Sites) Fanctl(ctx context.Context, args ...string) ([]byte, error) {
	return s.fanctlAs(ctx, sitesOperator, args...)
}

const sitesProber = `cluster: lab
node: {{.Node}}
{{.Bus}}heartbeat_interval: 1s
checks:
{{- range .Sites}}
  - {name: http-{{.Name}}, kind: http, role: peer, target_node: {{.Name}}, address: "http://{{.Web}}/", interval: {{$.Interval}}, timeout: {{$.Timeout}}, rise: {{$.Rise}}, fall: {{$.Fall}}}
  - {name: tcp-{{.Name}}, kind: tcp, role: peer, target_node: {{.Name}}, address: "{{.Web}}:80", interval: {{$.Interval}}, timeout: {{$.Timeout}}, rise: {{$.Rise}}, fall: {{$.Fall}}}
  - {name: dns-{{.Name}}, kind: dns, role: peer, target_node: {{.Name}}, address: "{{.DNS}}:53", query: {{$.Zone}}, interval: {{$.Interval}}, timeout: {{$.Timeout}}, rise: {{$.Rise}}, fall: {{$.Fall}}}
{{- end}}
groups:
{{- range .Sites}}
  - {name: {{.Check}}, role: peer, target_node: {{.Name}}, min_up: 2, checks: [http-{{.Name}}, tcp-{{.Name}}, dns-{{.Name}}]}
{{- end}}
`

const sitesIPMover = `cluster: lab
node: {{.Node}}
{{.Bus}}executor: dns
state_file: {{.Dir}}/dns-state.json
dns:
  group: {{.Group}}
  zone: {{.Zone}}.
  name: {{.Name}}.
  types: [A]
  ttl: {{.TTL}}
  sites:
{{- range .Sites}}
    {{.Name}}: {a: [{{.Web}}]}
{{- end}}
  # One primary per site, no zone transfer between them: each is updated
  # on its own, and one that was dark is brought in line when it answers.
  primaries: [{{range $i, $s := .Sites}}{{if $i}}, {{end}}"{{$s.DNS}}:53"{{end}}]
  resync: {{.Resync}}
  timeout: {{.DNSTimeout}}
  verify_interval: 20ms
  key:
    name: {{.KeyName}}
    secret: {{.Secret}}
`

const sitesArbiter = `cluster: lab
node: {{.Node}}
{{.Bus}}lease_ttl: 1s
groups:
  - name: {{.Group}}
    # The command schema needs an address; the DNS executor moves the name.
    addresses: [{{(index .Sites 0).Web}}/32]
    nodes: [{{range $i, $s := .Sites}}{{if $i}}, {{end}}{{$s.Name}}{{end}}]
    health_check: site
    health_from:
{{- range .Sites}}
      {{.Name}}: {observer: {{$.Node}}, check: {{.Check}}}
{{- end}}
    failback: {stable_for: {{.StableFor}}}
policy:
  hold_down: {{.HoldDown}}
`

const sitesScheduler = `cluster: lab
node: {{.Node}}
{{.Bus}}{{if .Window}}groups:
  - name: {{.Group}}
    windows:
      - name: {{.Window}}
        once: [{from: "{{.From}}", to: "{{.To}}"}]
{{else}}# No window yet: nothing fails back until one opens.
{{end}}`

type siteData struct{ Name, Web, DNS, Check string }

func (s *Sites) data() map[string]any {
	var ss []siteData
	for _, st := range sites {
		ss = append(ss, siteData{st.name, st.webIP.String(), st.dnsIP.String(), strings.ReplaceAll(st.name, "-", "_") + "_up"})
	}
	o := s.Opts
	return map[string]any{"Node": SitesWitness, "Sites": ss, "Zone": SitesZone, "Name": SitesName, "Group": SitesGroup,
		"Interval": o.Interval.String(), "Timeout": o.Timeout.String(), "Rise": o.Rise, "Fall": o.Fall,
		"TTL": o.TTL.String(), "Resync": o.Resync.String(), "DNSTimeout": o.DNSTimeout.String(),
		"StableFor": o.StableFor.String(), "HoldDown": o.HoldDown.String(),
		"KeyName": bindtest.KeyName, "Secret": s.secret, "Dir": s.p.dir}
}

func (s *Sites) startFan() error {
	d := s.data()
	for _, svc := range []struct{ name, tmpl string }{
		{"prober", sitesProber}, {"ipmover", sitesIPMover}, {"scheduler", sitesScheduler}, {"arbiter", sitesArbiter},
	} {
		if err := s.p.service(SitesWitness, svc.name, svc.tmpl, d); err != nil {
			return err
		}
	}
	return nil
}

// OpenFailbackWindow adds a one-off failback window from now to the
// scheduler's file and reloads it (SIGHUP), as an operator would for
// tonight's failback.
func (s *Sites) OpenFailbackWindow(name string) error {
	d := s.data()
	d["Window"], d["From"], d["To"] = name, time.Now().Add(-time.Minute).UTC().Format(time.RFC3339), time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	if _, err := s.p.config(SitesWitness, "scheduler", sitesScheduler, d); err != nil {
		return err
	}
	pr := s.p.procs[SitesWitness+"/fan-scheduler"]
	if pr == nil {
		return errors.New("the scheduler is not running")
	}
	return syscall.Kill(pr.Pid(), syscall.SIGHUP)
}

// CutSite cuts the uplink of st's place: its web and DNS servers go dark
// from everywhere else.
func (s *Sites) CutSite(name string) error {
	st, err := siteByName(name)
	if err != nil {
		return err
	}
	return s.WAN.CutUplink(st.place)
}

// RestoreSite undoes CutSite.
func (s *Sites) RestoreSite(name string) error {
	st, err := siteByName(name)
	if err != nil {
		return err
	}
	return s.WAN.RestoreUplink(st.place)
}

// Resolve asks the client's resolver for the name, as the client does:
// the address it answers and the TTL left on it.
func (s *Sites) Resolve(timeout time.Duration) (netip.Addr, uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := new(dns.Msg)
	m.SetQuestion(SitesName+".", dns.TypeA)
	co := &dns.Conn{Conn: s.client}
	if err := co.SetDeadline(time.Now().Add(timeout)); err != nil {
		return netip.Addr{}, 0, err
	}
	if err := co.WriteMsg(m); err != nil {
		return netip.Addr{}, 0, err
	}
	for {
		r, err := co.ReadMsg()
		if err != nil {
			return netip.Addr{}, 0, err
		}
		if r.Id != m.Id {
			continue // a late answer to an earlier question
		}
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				ip, _ := netip.AddrFromSlice(a.A.To4())
				return ip, a.Hdr.Ttl, nil
			}
		}
		return netip.Addr{}, 0, fmt.Errorf("no A record (rcode %s)", dns.RcodeToString[r.Rcode])
	}
}

// ServerServes asks site's DNS server directly, from the witness, what it
// serves for the name.
func (s *Sites) ServerServes(siteName string, timeout time.Duration) (netip.Addr, uint32, error) {
	st, err := siteByName(siteName)
	if err != nil {
		return netip.Addr{}, 0, err
	}
	var addr netip.Addr
	var serial uint32
	var qerr error
	if err := s.WAN.Do(SitesWitness, func() error {
		c := &dns.Client{Net: "udp", Timeout: timeout}
		ask := func(name string, t uint16) *dns.Msg {
			m := new(dns.Msg)
			m.SetQuestion(name, t)
			m.RecursionDesired = false
			r, _, err := c.Exchange(m, netip.AddrPortFrom(st.dnsIP, 53).String())
			if err != nil {
				qerr = err
				return nil
			}
			return r
		}
		if r := ask(SitesName+".", dns.TypeA); r != nil {
			for _, rr := range r.Answer {
				if a, ok := rr.(*dns.A); ok {
					addr, _ = netip.AddrFromSlice(a.A.To4())
				}
			}
		}
		if r := ask(SitesZone+".", dns.TypeSOA); r != nil {
			for _, rr := range r.Answer {
				if soa, ok := rr.(*dns.SOA); ok {
					serial = soa.Serial
				}
			}
		}
		return nil
	}); err != nil {
		return netip.Addr{}, 0, err
	}
	return addr, serial, qerr
}

// FollowEvents calls fn with every event of the audit trail, from its
// start, as `fanctl events --follow --json` on the witness prints them,
// until ctx ends.
func (s *Sites) FollowEvents(ctx context.Context, fn func(Event)) error {
	return followEvents(ctx, s.WAN.Lab, SitesWitness, []string{filepath.Join(s.p.bin, "fanctl"), "--config", s.fanctlConfig(sitesOperator)}, fn)
}

// followEvents runs fanctl (argv) events --follow --json on host and hands
// each event to fn.
func followEvents(ctx context.Context, l *netlab.Lab, host string, argv []string, fn func(Event)) error {
	h, err := l.Host(host)
	if err != nil {
		return err
	}
	args := append([]string{"netns", "exec", h.NS}, argv...)
	cmd := exec.CommandContext(ctx, "ip", append(args, "events", "--follow", "--json", "--since", "all")...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	sc := bufio.NewScanner(out)
	sc.Buffer(make([]byte, 0, 64<<10), events.MaxEncodedSize+1)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		env, p, err := events.Decode(line)
		if err != nil {
			continue
		}
		fn(Event{Env: env, Payload: p})
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("fanctl events --follow ended: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
}

// Logs is the tail of every process's log, for a failure.
func (s *Sites) Logs(n int64) string { return s.p.logs(n) }

// Close stops everything and removes the lab.
func (s *Sites) Close() error {
	s.p.stop()
	for _, w := range s.webs {
		_ = w.Close()
	}
	if s.client != nil {
		s.client.Close()
	}
	return s.WAN.Close()
}
