package stack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fanpbx/fan/lab/netlab"
	"github.com/fanpbx/fan/pkg/platform/poll"
)

// The PBX a lab node runs. By default Kamailio answers SIP on the
// floating and the node's address and an AMI peer stands in for
// Asterisk's manager interface: enough for failovers, no calls. For calls
// a node runs a PBX that is a back-to-back user agent and a registrar:
// fan-pbxstandin, or a real Asterisk 22. Both read the same Asterisk
// configuration, made from the one fan ships (deploy/asterisk) for the
// lab's addresses, with the lab's phones as endpoints on its fan-phone
// template and a dialplan that rings them (extension = endpoint).

// PBX says what runs as a lab node's PBX.
type PBX string

const (
	// PBXKamailio: Kamailio for SIP and fan-amipeer for AMI (the default).
	PBXKamailio PBX = ""
	// PBXStandIn: fan-pbxstandin, a B2BUA and registrar with its AMI
	// peer, configured from the lab's Asterisk configuration.
	PBXStandIn PBX = "standin"
	// PBXAsterisk: a real Asterisk 22 (Options.Asterisk) with the lab's
	// Asterisk configuration.
	PBXAsterisk PBX = "asterisk"
)

// Endpoint is a phone the lab's PBXs know: a PJSIP endpoint, its AOR and
// digest credentials (on deploy/asterisk's fan-phone templates), reached
// by dialling its name.
type Endpoint struct {
	User, Password string
	// Anchored makes its calls' audio flow through the PBX
	// (direct_media = no), as a trunk, a recording or music on hold do.
	Anchored bool
}

// shippedTemplates are the templates of deploy/asterisk/pjsip.conf the
// lab's endpoints use.
var shippedTemplates = []string{"fan-phone", "fan-phone-auth", "fan-phone-aor"}

// The example addresses deploy/asterisk uses (pbx-a and the floating
// address), replaced with the lab's.
const (
	shippedNodeAddr     = "192.0.2.11"
	shippedFloatingAddr = "192.0.2.10"
	shippedAMISecret    = "change-me"
)

// AsteriskEtc is what the lab's Asterisk configuration is made of.
type AsteriskEtc struct {
	// Shipped is deploy/asterisk (FindShippedAsterisk).
	Shipped string
	// Install is the Asterisk install (its lib/asterisk/modules, sbin);
	// empty for the stand-in, which reads only the files.
	Install  string
	NodeAddr netip.Addr
	Floating netip.Addr
	// AMISecret replaces the shipped secret of manager.conf's user.
	AMISecret string
	Endpoints []Endpoint
}

// FindShippedAsterisk finds deploy/asterisk above the working directory
// (a test runs in its package's directory, the benchmark from the
// repository).
func FindShippedAsterisk() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "deploy", "asterisk")
		if _, err := os.Stat(filepath.Join(p, "pjsip.conf")); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("deploy/asterisk not found above the working directory (run from the repository)")
		}
		dir = parent
	}
}

// WriteAsteriskEtc writes an Asterisk configuration under base (base/etc
// and the directories asterisk.conf names) and returns its asterisk.conf.
func WriteAsteriskEtc(base string, e AsteriskEtc) (string, error) {
	etc := filepath.Join(base, "etc")
	for _, d := range []string{"etc", "lib", "run", "log", "spool", "agi"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			return "", err
		}
	}
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(e.Shipped, name))
		if err != nil {
			return "", fmt.Errorf("shipped asterisk configuration: %w", err)
		}
		return string(b), nil
	}
	addrs := strings.NewReplacer(shippedNodeAddr, e.NodeAddr.String(), shippedFloatingAddr, e.Floating.String())
	shippedPJSIP, err := read("pjsip.conf")
	if err != nil {
		return "", err
	}
	pjsip, err := labPJSIP(addrs.Replace(shippedPJSIP), e.Endpoints)
	if err != nil {
		return "", err
	}
	mgr, err := read("manager.conf")
	if err != nil {
		return "", err
	}
	if !strings.Contains(mgr, "secret = "+shippedAMISecret) {
		return "", fmt.Errorf("%s/manager.conf: no user with secret = %s to give the lab's secret", e.Shipped, shippedAMISecret)
	}
	mgr = strings.Replace(mgr, "secret = "+shippedAMISecret, "secret = "+e.AMISecret, 1)
	options, err := read("asterisk.conf")
	if err != nil {
		return "", err
	}
	modules, varlib, sbin := "/usr/lib/asterisk/modules", "/var/lib/asterisk", "/usr/sbin"
	if e.Install != "" {
		modules, varlib, sbin = filepath.Join(e.Install, "lib/asterisk/modules"), filepath.Join(e.Install, "var/lib/asterisk"), filepath.Join(e.Install, "sbin")
	}
	files := map[string]string{
		"asterisk.conf": fmt.Sprintf(`[directories]
astetcdir => %[1]s/etc
astmoddir => %[2]s
astvarlibdir => %[1]s/lib
astdbdir => %[1]s/lib
astkeydir => %[1]s/lib
astdatadir => %[3]s
astagidir => %[1]s/agi
astspooldir => %[1]s/spool
astrundir => %[1]s/run
astlogdir => %[1]s/log
astsbindir => %[4]s

`, base, modules, varlib, sbin) + options,
		"pjsip.conf":   pjsip,
		"manager.conf": mgr,
		// What the lab does not use stays unloaded: it would only slow
		// the start or want what a namespace lacks.
		"modules.conf": `[modules]
autoload = yes
noload => chan_iax2.so
noload => chan_dahdi.so
noload => chan_unistim.so
noload => chan_skinny.so
noload => chan_mgcp.so
noload => res_ari.so
noload => res_stasis.so
noload => res_hep.so
noload => res_hep_pjsip.so
noload => res_hep_rtcp.so
noload => res_config_pgsql.so
noload => cdr_pgsql.so
noload => cel_pgsql.so
noload => res_phoneprov.so
noload => res_pjsip_phoneprov_provider.so
noload => res_http_websocket.so
noload => res_pjsip_transport_websocket.so
noload => res_prometheus.so
noload => res_pjsip_outbound_registration.so
`,
		"logger.conf": "[general]\n[logfiles]\nmessages => notice,warning,error\n",
		// The fan-phone template's context: extension 60XX rings endpoint
		// 60XX.
		"extensions.conf": "[from-phones]\nexten => _60XX,1,Dial(PJSIP/${EXTEN})\n same => n,Hangup()\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(body), 0o644); err != nil {
			return "", err
		}
	}
	return filepath.Join(etc, "asterisk.conf"), nil
}

var sectionRE = regexp.MustCompile(`^\[([^\]]+)\](\(([^)]*)\))?`)

// labPJSIP keeps of the shipped pjsip.conf its [global], its transports
// and its templates (the example phone goes), and adds the lab's
// endpoints on the fan-phone templates.
func labPJSIP(shipped string, eps []Endpoint) (string, error) {
	type sect struct {
		head     string
		lines    []string
		template bool
		typ      string
	}
	var sects []*sect
	var pre []string
	for _, l := range strings.Split(shipped, "\n") {
		t := strings.TrimSpace(l)
		if m := sectionRE.FindStringSubmatch(t); m != nil {
			sects = append(sects, &sect{head: l, template: strings.Contains(m[3], "!")})
			continue
		}
		if len(sects) == 0 {
			pre = append(pre, l)
			continue
		}
		s := sects[len(sects)-1]
		s.lines = append(s.lines, l)
		if k, v, ok := strings.Cut(strings.SplitN(t, ";", 2)[0], "="); ok && strings.TrimSpace(k) == "type" {
			s.typ = strings.TrimSpace(v)
		}
	}
	var b strings.Builder
	b.WriteString(strings.Join(pre, "\n"))
	found := map[string]bool{}
	for _, s := range sects {
		name := sectionRE.FindStringSubmatch(strings.TrimSpace(s.head))[1]
		if !s.template && s.typ != "global" && s.typ != "transport" {
			continue
		}
		if s.template {
			found[name] = true
		}
		b.WriteString("\n" + s.head + "\n" + strings.Join(s.lines, "\n"))
	}
	for _, t := range shippedTemplates {
		if !found[t] {
			return "", fmt.Errorf("shipped pjsip.conf has no template [%s](!) for the lab's endpoints", t)
		}
	}
	b.WriteString("\n; The lab's phones.\n")
	for _, e := range eps {
		fmt.Fprintf(&b, "[%s](fan-phone)\nauth = %s\naors = %s\n", e.User, e.User, e.User)
		if e.Anchored {
			b.WriteString("direct_media = no\n")
		}
		fmt.Fprintf(&b, "[%s](fan-phone-auth)\nusername = %s\npassword = %s\n[%s](fan-phone-aor)\n\n", e.User, e.User, e.Password, e.User)
	}
	return b.String(), nil
}

// PBXConfig says how StartPBX runs a node's PBX.
type PBXConfig struct {
	Kind PBX
	// BinDir holds fan-pbxstandin; Asterisk is the Asterisk install.
	BinDir, Asterisk string
	// Shipped is deploy/asterisk (found above the working directory when
	// empty).
	Shipped   string
	Endpoints []Endpoint
	// Dir is where each node's configuration, database and control
	// socket go (Dir/<node>-asterisk).
	Dir         string
	StandInArgs []string
}

// ProcName is the name StartPBX gives the PBX's process.
func (c PBXConfig) ProcName() string {
	if c.Kind == PBXAsterisk {
		return "asterisk"
	}
	return "fan-pbxstandin"
}

// StartPBX writes node's Asterisk configuration (once: a PBX started
// again finds its database as it left it) and starts the PBX on node of
// l, returning once its AMI accepts connections (AMI on 127.0.0.1:5038,
// user fan with the lab's secret, as the stack's services expect).
func StartPBX(ctx context.Context, l *netlab.Lab, node string, c PBXConfig) (*netlab.Proc, error) {
	h, err := l.Host(node)
	if err != nil {
		return nil, err
	}
	base := filepath.Join(c.Dir, node+"-asterisk")
	conf := filepath.Join(base, "etc", "asterisk.conf")
	if _, err := os.Stat(conf); err != nil {
		shipped := c.Shipped
		if shipped == "" {
			if shipped, err = FindShippedAsterisk(); err != nil {
				return nil, err
			}
		}
		install := ""
		if c.Kind == PBXAsterisk {
			install = c.Asterisk
		}
		if conf, err = WriteAsteriskEtc(base, AsteriskEtc{Shipped: shipped, Install: install, NodeAddr: h.Addr.Addr(),
			Floating: l.FloatingIP().Addr(), AMISecret: amiSecret, Endpoints: c.Endpoints}); err != nil {
			return nil, fmt.Errorf("asterisk configuration for %s: %w", node, err)
		}
	}
	var argv []string
	within := 10 * time.Second
	switch c.Kind {
	case PBXStandIn:
		control := filepath.Join(c.Dir, node+"-ami.sock")
		_ = os.Remove(control)
		argv = append([]string{filepath.Join(c.BinDir, "fan-pbxstandin"), "-node", node, "-etc", filepath.Dir(conf), "-registrar",
			"-control", control}, c.StandInArgs...)
	case PBXAsterisk:
		if c.Asterisk == "" {
			return nil, errors.New("PBX asterisk: no Asterisk install named")
		}
		argv = []string{filepath.Join(c.Asterisk, "sbin", "asterisk"), "-C", conf, "-f"}
		within = 60 * time.Second
	default:
		return nil, fmt.Errorf("PBX %q: not a PBX process", c.Kind)
	}
	p, err := l.Start(node, c.ProcName(), argv, []string{"FAN_LOG_LEVEL=debug"})
	if err != nil {
		return nil, err
	}
	if err := waitTCPOn(ctx, l, node, amiAddr, within); err != nil {
		return p, fmt.Errorf("pbx on %s: %w", node, err)
	}
	return p, nil
}

// startPBX starts node's PBX as the stack runs it.
func (s *Stack) startPBX(ctx context.Context, node string) error {
	c := s.pbxConfig()
	p, err := StartPBX(ctx, s.Lab, node, c)
	if p != nil {
		s.procs[node+"/"+c.ProcName()] = p
	}
	return err
}

func (s *Stack) pbxConfig() PBXConfig {
	return PBXConfig{Kind: s.opts.PBX, BinDir: s.opts.BinDir, Asterisk: s.opts.Asterisk, Shipped: s.opts.ShippedAsterisk,
		Endpoints: s.opts.Endpoints, Dir: s.dir, StandInArgs: s.opts.StandInArgs}
}

// pbxProc is the name of node's PBX process: the stand-in or Asterisk.
func (s *Stack) pbxProc(string) string { return s.pbxConfig().ProcName() }

// CrashPBX kills node's PBX process at once (kill -9 of the stand-in or
// of Asterisk): its SIP sockets close, AMI refuses connections, and every
// call it carried has lost its signalling. StartNode starts it again.
func (s *Stack) CrashPBX(node string) error {
	if s.opts.PBX == PBXKamailio {
		return errors.New("crash pbx: the stack runs no PBX process (Options.PBX)")
	}
	return s.KillService(node, s.pbxProc(node))
}

// AddressHolders lists the nodes whose eth0 carries the floating address.
func (s *Stack) AddressHolders(ctx context.Context) ([]string, error) {
	var out []string
	for _, n := range s.Lab.Nodes() {
		b, err := s.Lab.Exec(ctx, n.Name, "ip", "-o", "addr", "show", "dev", "eth0")
		if err != nil {
			return nil, err
		}
		if strings.Contains(string(b), " "+s.Lab.FloatingIP().Addr().String()+"/") {
			out = append(out, n.Name)
		}
	}
	return out, nil
}

// WaitHolder waits until node alone holds the floating address and its
// PBX answers AMI.
func (s *Stack) WaitHolder(ctx context.Context, node string, within time.Duration) error {
	return poll.Until(ctx, within, node+" holding the floating address alone", func() error {
		h, err := s.AddressHolders(ctx)
		if err != nil {
			return fmt.Errorf("holders: %w", err)
		}
		if len(h) != 1 || h[0] != node {
			return fmt.Errorf("holders %v", h)
		}
		return nil
	})
}

// PBXChannels asks node's PBX over AMI how many channels and calls it has
// up (`core show channels count`, as fan's prober does).
func (s *Stack) PBXChannels(ctx context.Context, node string) (channels, calls int, err error) {
	return PBXChannels(ctx, s.Lab, node)
}

// PBXChannels asks the PBX on node of l (one StartPBX started, or the
// stack's AMI peer) how many channels and calls it has up.
func PBXChannels(ctx context.Context, l *netlab.Lab, node string) (channels, calls int, err error) {
	var out string
	err = l.Do(node, func() error {
		var err error
		out, err = amiCommand(ctx, amiAddr, amiUser, amiSecret, "core show channels count")
		return err
	})
	if err != nil {
		return 0, 0, fmt.Errorf("ami on %s: %w", node, err)
	}
	m := regexp.MustCompile(`(\d+) active channels?`).FindStringSubmatch(out)
	c := regexp.MustCompile(`(\d+) active calls?`).FindStringSubmatch(out)
	if m == nil || c == nil {
		return 0, 0, fmt.Errorf("ami on %s: core show channels count: %q", node, out)
	}
	channels, _ = strconv.Atoi(m[1])
	calls, _ = strconv.Atoi(c[1])
	return channels, calls, nil
}

// amiCommand logs in (events off), runs one CLI command and returns the
// answer's text.
func amiCommand(ctx context.Context, addr, user, secret, command string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil {
		return "", fmt.Errorf("banner: %w", err)
	}
	readMsg := func() (string, error) {
		var b strings.Builder
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return b.String(), err
			}
			if l == "\r\n" {
				if b.Len() == 0 {
					continue
				}
				return b.String(), nil
			}
			b.WriteString(l)
		}
	}
	fmt.Fprintf(c, "Action: Login\r\nUsername: %s\r\nSecret: %s\r\nEvents: off\r\nActionID: l\r\n\r\n", user, secret)
	for {
		msg, err := readMsg()
		if err != nil {
			return "", fmt.Errorf("login: %w", err)
		}
		if strings.Contains(msg, "ActionID: l") {
			if !strings.Contains(msg, "Response: Success") {
				return "", fmt.Errorf("login: %s", msg)
			}
			break
		}
	}
	fmt.Fprintf(c, "Action: Command\r\nCommand: %s\r\nActionID: c\r\n\r\n", command)
	for {
		msg, err := readMsg()
		if err != nil {
			return "", fmt.Errorf("%s: %w", command, err)
		}
		if strings.Contains(msg, "ActionID: c") {
			return msg, nil
		}
	}
}
