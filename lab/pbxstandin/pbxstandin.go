// Package pbxstandin is the compose lab's STAND-IN for an Asterisk node. It
// is not a PBX: it answers what fan asks a PBX and what a phone's first
// packets ask, and nothing more. It runs the AMI peer (package amipeer, byte
// for byte what Asterisk 22 answers) and a minimal SIP responder over UDP
// that answers OPTIONS and REGISTER with 200 OK and names the node in a
// Server-Node header, so a client can see which node answered the floating
// IP. An operator switches it between normal, frozen (a deadlocked Asterisk:
// AMI accepts TCP and never answers, SIP is silent) and dead (a crashed
// Asterisk: AMI refuses connections, SIP ports are closed) over a unix
// control socket. With Config.Registrar its SIP side is a registrar as
// Asterisk 22's is (registrar.go), Originate reaches registered phones,
// and it is a back-to-back user agent as Asterisk 22 is with
// `Dial(PJSIP/${EXTEN})` (b2bua.go): a phone's INVITE to another AOR
// becomes a second dialog to that AOR's contact, the two are bridged when
// it answers, re-INVITEd to direct media (the endpoints' direct_media,
// Config.NoDirectMedia) or relayed through the stand-in's RTP sockets
// (media.go), a BYE or CANCEL is carried to the other side, a request in
// a dialog it does not know is answered 481, and the AMI peer raises the
// call's events and answers Getvar, CoreShowChannels and BridgeList as
// Asterisk does (lab/amipeer/calls.go; docs/asterisk22.md, "Calls: a
// B2BUA, its dialogs and its AMI events"). Dead is a kill -9 for calls
// too: no SIP, no RTP relayed, every call forgotten without a word;
// frozen relays nothing and answers nothing until it thaws.
package pbxstandin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/lab/ctlsock"
)

// Mode is how the stand-in behaves.
type Mode string

// Modes.
const (
	Normal Mode = "normal"
	Frozen Mode = "frozen"
	Dead   Mode = "dead"
)

// ParseMode accepts the names of the Mode constants.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Normal, Frozen, Dead:
		return m, nil
	}
	return "", fmt.Errorf("pbxstandin: unknown mode %q (normal, frozen, dead)", s)
}

// Config configures a stand-in.
type Config struct {
	// Node names the node in every SIP answer (Server-Node header).
	Node string
	// SIP lists UDP addresses to answer on (host:port). A floating address
	// the node does not hold yet binds only with net.ipv4.ip_nonlocal_bind=1,
	// as Asterisk is run in hot standby.
	SIP []string
	// AMI configures the AMI peer (Addr, Username, Secret at least).
	AMI amipeer.Config
	// Registrar, when set, makes the SIP side a registrar as Asterisk 22's
	// is (registrar.go): REGISTER stores the contact in the AMI peer's
	// AstDB and raises its ContactStatus events, and Originate
	// PJSIP/<aor> sends an INVITE to the AOR's contacts. Without it a
	// REGISTER is answered 200 and forgotten.
	Registrar *amipeer.RegistrarConfig
	// NoDirectMedia gives every endpoint AMI.Endpoints does not list
	// direct_media = no; a listed endpoint has its own setting.
	NoDirectMedia bool
	Logger        *slog.Logger
}

// PBX is a running stand-in.
type PBX struct {
	cfg Config
	log *slog.Logger
	ami *amipeer.Peer

	mu    sync.Mutex
	mode  Mode
	conns []*net.UDPConn
	wg    sync.WaitGroup

	dial dialing
	// calls is the B2BUA (b2bua.go), with the registrar.
	calls *b2bua
}

// Start starts the AMI peer and the SIP responder in Normal mode.
func Start(cfg Config) (*PBX, error) {
	if cfg.Node == "" {
		return nil, errors.New("pbxstandin: node name required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.AMI.Logger = cfg.Logger.With("component", "ami")
	if cfg.AMI.SystemName == "" {
		cfg.AMI.SystemName = cfg.Node
	}
	ami, err := amipeer.Start(cfg.AMI)
	if err != nil {
		return nil, fmt.Errorf("pbxstandin: %w", err)
	}
	cfg.SIP = append([]string(nil), cfg.SIP...)
	p := &PBX{cfg: cfg, log: cfg.Logger, ami: ami, mode: Normal}
	if cfg.Registrar != nil {
		ami.EnableRegistrar(*cfg.Registrar)
		ami.SetDialer(p.Dial)
		p.calls = newB2BUA(p)
		ami.OnHangup(p.calls.amiHangup)
	}
	p.mu.Lock()
	err = p.openSIP()
	p.mu.Unlock()
	if err != nil {
		if p.calls != nil {
			p.calls.close()
		}
		ami.Close()
		return nil, err
	}
	return p, nil
}

// AMI is the stand-in's AMI peer (its AstDB, its registrar).
func (p *PBX) AMI() *amipeer.Peer { return p.ami }

// AMIAddr is where the AMI peer listens.
func (p *PBX) AMIAddr() string { return p.ami.Addr() }

// SIPAddrs are the bound SIP addresses (useful with port 0); empty while dead.
func (p *PBX) SIPAddrs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, len(p.conns))
	for i, c := range p.conns {
		out[i] = c.LocalAddr().String()
	}
	return out
}

// Mode reports the current mode.
func (p *PBX) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// SetMode switches both faces of the stand-in at once.
func (p *PBX) SetMode(m Mode) error {
	if _, err := ParseMode(string(m)); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if m == p.mode {
		return nil
	}
	amiMode := map[Mode]amipeer.Mode{Normal: amipeer.ModeNormal, Frozen: amipeer.ModeFrozen, Dead: amipeer.ModeDead}[m]
	if err := p.ami.SetMode(amiMode); err != nil {
		return fmt.Errorf("pbxstandin: ami %s: %w", m, err)
	}
	switch {
	case m == Dead:
		p.closeSIP()
		if p.calls != nil {
			// A kill -9: every call is gone, nobody is told.
			p.calls.reset()
		}
	case p.mode == Dead:
		if err := p.openSIP(); err != nil {
			return err
		}
	}
	p.log.Info("mode changed", "from", p.mode, "to", m)
	p.mode = m
	return nil
}

// Close stops everything.
func (p *PBX) Close() {
	p.mu.Lock()
	p.closeSIP()
	p.mu.Unlock()
	if p.calls != nil {
		p.calls.close()
	}
	p.ami.Close()
}

// openSIP binds every SIP address; p.mu is held.
func (p *PBX) openSIP() error {
	for i, a := range p.cfg.SIP {
		ua, err := net.ResolveUDPAddr("udp", a)
		if err != nil {
			p.closeSIP()
			return fmt.Errorf("pbxstandin: sip address %q: %w", a, err)
		}
		c, err := net.ListenUDP("udp", ua)
		if err != nil {
			p.closeSIP()
			return fmt.Errorf("pbxstandin: sip listen %s (a floating address needs net.ipv4.ip_nonlocal_bind=1): %w", a, err)
		}
		// Keep the port chosen for ":0", so the stand-in comes back on the
		// same address after Dead.
		p.cfg.SIP[i] = c.LocalAddr().String()
		p.conns = append(p.conns, c)
		p.wg.Add(1)
		go p.serveSIP(c)
	}
	p.transportsChanged()
	return nil
}

// transportsChanged tells the B2BUA which sockets it may send from; p.mu
// is held.
func (p *PBX) transportsChanged() {
	if p.calls != nil {
		p.calls.setTransports(transportsFor(p.conns, p.cfg.AMI.Transports))
	}
}

// closeSIP closes the sockets and waits for their readers; p.mu is held.
func (p *PBX) closeSIP() {
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.wg.Wait()
	p.transportsChanged()
}

func (p *PBX) serveSIP(c *net.UDPConn) {
	defer p.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := c.ReadFromUDP(buf)
		if err != nil {
			return
		}
		if p.frozen() {
			continue
		}
		if p.calls != nil && !isRegister(buf[:n]) && p.calls.handle(c, buf[:n], from) {
			continue
		}
		if p.handleResponse(buf[:n], from) || p.handleRegister(c, buf[:n], from) {
			continue
		}
		if resp := Respond(buf[:n], p.cfg.Node); resp != nil {
			if _, err := c.WriteToUDP(resp, from); err != nil {
				p.log.Warn("sip reply", "to", from.String(), "err", err)
			}
		}
	}
}

// frozen is read without p.mu: SetMode holds it while closing sockets,
// whose readers must not block on it.
func (p *PBX) frozen() bool { return p.ami.Mode() == amipeer.ModeFrozen }

// ControlUsage lists the control commands.
const ControlUsage = "normal | frozen | dead | status"

// Exec runs one control command and returns its reply.
func Exec(p *PBX, cmd string) (string, error) {
	switch cmd = strings.TrimSpace(cmd); cmd {
	case "status":
		b, _ := json.Marshal(map[string]any{"node": p.cfg.Node, "mode": p.Mode(), "sip": p.SIPAddrs(), "ami": p.AMIAddr()})
		return string(b) + "\n", nil
	default:
		m, err := ParseMode(cmd)
		if err != nil {
			return "", fmt.Errorf("%w; commands: %s", err, ControlUsage)
		}
		if err := p.SetMode(m); err != nil {
			return "", err
		}
		return "ok " + string(m) + "\n", nil
	}
}

// ListenControl serves control commands on a unix socket in lab/ctlsock's
// protocol (ctlsock.Call is its client). It is reached with `docker compose
// exec` in the lab, where no shell exists.
func ListenControl(ctx context.Context, p *PBX, path string) (func(), error) {
	if err := os.MkdirAll(dirOf(path), 0o755); err != nil {
		return nil, fmt.Errorf("pbxstandin: control dir: %w", err)
	}
	_ = os.Remove(path) // a socket left by an earlier run
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("pbxstandin: control listen %s: %w", path, err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			line, _ := bufio.NewReader(c).ReadString('\n')
			reply, err := Exec(p, line)
			if err != nil {
				reply = ctlsock.ErrorPrefix + err.Error() + "\n"
			}
			_, _ = io.WriteString(c, reply)
			c.Close()
		}
	}()
	stop := func() { ln.Close(); wg.Wait() }
	go func() { <-ctx.Done(); stop() }()
	return stop, nil
}

func dirOf(path string) string {
	if i := strings.LastIndexByte(path, '/'); i > 0 {
		return path[:i]
	}
	return "."
}
