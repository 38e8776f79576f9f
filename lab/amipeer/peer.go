// Package amipeer is an in-repo stand-in for Asterisk's manager interface
// (AMI). It answers the way a real Asterisk 22 does, byte for byte as
// written down in docs/asterisk22.md, because Asterisk itself is not
// packaged for the systems fan is tested on.
//
// Beyond the happy path it reproduces the failures a PBX health check has to
// survive: a refused port (ModeDead), a deadlocked Asterisk that accepts TCP
// and never answers (ModeFrozen), one that answers every useful question with
// an error (ModeFailing) and one that answers late (ModeSlow). Modes switch
// while sessions are open, every action received is recorded for tests to
// assert on, and a small in-memory AstDB backs the DB* actions.
package amipeer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Mode is how the peer behaves; see the Mode constants.
type Mode string

const (
	// ModeNormal answers like a healthy Asterisk 22.
	ModeNormal Mode = "normal"
	// ModeDead closes the listener (connections are refused) and every open
	// session, like a stopped Asterisk.
	ModeDead Mode = "dead"
	// ModeFrozen accepts TCP connections and answers nothing, not even the
	// banner: a deadlocked or stopped (SIGSTOP) Asterisk. Every action that
	// arrives meanwhile is recorded (Actions, WaitAction) but not answered;
	// all of them are answered in order once the peer leaves this mode, as
	// a deadlock that resolves would, and none takes effect if it dies.
	ModeFrozen Mode = "frozen"
	// ModeFailing answers Command, CoreStatus and Reload with Response: Error.
	ModeFailing Mode = "failing"
	// ModeSlow waits the slow delay (SetSlowDelay) before every response.
	ModeSlow Mode = "slow"
)

// ParseMode accepts the names of the Mode constants.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeNormal, ModeDead, ModeFrozen, ModeFailing, ModeSlow:
		return m, nil
	}
	return "", fmt.Errorf("amipeer: unknown mode %q (normal, dead, frozen, failing, slow)", s)
}

// ErrClosed is returned by operations on a closed peer.
var ErrClosed = errors.New("amipeer: peer closed")

// Figures are the numbers `core show channels count` and CoreStatus report.
type Figures struct {
	Channels  int `json:"channels"`
	Calls     int `json:"calls"`
	Processed int `json:"processed"`
}

// Field is one header of an AMI message, in the order it was received.
type Field struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// Action is one action message as the peer received it.
type Action struct {
	Session int       `json:"session"` // numbered from 1 in accept order
	Time    time.Time `json:"time"`
	Name    string    `json:"name"`   // the Action header
	Fields  []Field   `json:"fields"` // every header, Action included
}

// Field returns the first value of the named header (case-insensitive, as
// Asterisk matches them), or "".
func (a Action) Field(name string) string {
	for _, f := range a.Fields {
		if strings.EqualFold(f.Name, name) {
			return f.Value
		}
	}
	return ""
}

// Config configures a peer. Only Username and Secret are required.
type Config struct {
	// Addr is the TCP listen address; default "127.0.0.1:0". The port chosen
	// is kept, so the peer comes back on the same address after ModeDead.
	Addr     string
	Username string
	Secret   string
	// AuthFailDelay is how long a wrong login waits before the error, as
	// Asterisk sleeps one second; 0 means 1 s, negative means no delay.
	AuthFailDelay time.Duration
	// SlowDelay is the ModeSlow delay until SetSlowDelay changes it; 0 means 500 ms.
	SlowDelay time.Duration
	// Figures are the initial channel and call counts.
	Figures Figures
	// Modules are the names Reload accepts (".so" optional); nil means a
	// typical PJSIP system's set.
	Modules []string
	// SystemName is reported by CoreSettings; Asterisk's default is empty.
	SystemName string
	// Users are manager.conf users beside Username, each with its read and
	// write classes (rights.go); Username has every right.
	Users []User
	// Transports and Endpoints are the PJSIP objects `pjsip show
	// transports`, PJSIPShowEndpoints and PJSIPShowEndpoint report
	// (pjsip.go).
	Transports []Transport
	Endpoints  []Endpoint
	// Logger receives debug lines per action and info lines per mode change;
	// nil discards them.
	Logger *slog.Logger
}

var defaultModules = []string{
	"res_pjsip.so", "chan_pjsip.so", "res_pjsip_session.so", "res_pjsip_registrar.so",
	"res_pjsip_outbound_registration.so", "app_voicemail.so", "pbx_config.so",
	"res_musiconhold.so", "cdr_csv.so",
}

// Peer is a running AMI test peer. It is safe for concurrent use.
type Peer struct {
	cfg     Config
	log     *slog.Logger
	addr    string
	started time.Time
	done    chan struct{} // closed by Close

	wg sync.WaitGroup // accept loops and sessions

	mu       sync.Mutex
	closed   bool
	mode     Mode
	changed  chan struct{} // closed and replaced on every mode change
	slow     time.Duration
	figures  Figures
	reloaded time.Time
	ln       net.Listener // nil while dead
	sessions map[*session]struct{}
	nextID   int
	actions  []Action
	recorded chan struct{} // closed and replaced on every recorded action
	db       map[string]string
	modules  map[string]bool
	reg      *registrar // registrar.go; nil until EnableRegistrar
	book     callBook   // calls.go: channels and bridges
	callq    callEvents // calls.go: their events, in order
	onHangup HangupHandler
}

// Start listens and serves until Close.
func Start(cfg Config) (*Peer, error) {
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1:0"
	}
	if cfg.AuthFailDelay == 0 {
		cfg.AuthFailDelay = time.Second
	}
	if cfg.SlowDelay <= 0 {
		cfg.SlowDelay = 500 * time.Millisecond
	}
	if cfg.Modules == nil {
		cfg.Modules = defaultModules
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("amipeer: listen %s: %w", cfg.Addr, err)
	}
	now := time.Now()
	p := &Peer{
		cfg:      cfg,
		log:      log,
		addr:     ln.Addr().String(),
		started:  now,
		done:     make(chan struct{}),
		mode:     ModeNormal,
		changed:  make(chan struct{}),
		slow:     cfg.SlowDelay,
		figures:  cfg.Figures,
		reloaded: now,
		sessions: map[*session]struct{}{},
		recorded: make(chan struct{}),
		db:       map[string]string{},
		modules:  map[string]bool{},
	}
	for _, m := range cfg.Modules {
		p.modules[strings.TrimSuffix(m, ".so")] = true
	}
	p.mu.Lock()
	p.serveLocked(ln)
	p.mu.Unlock()
	p.log.Info("amipeer listening", "addr", p.addr)
	return p, nil
}

// Addr is the address the peer listens on (host:port), also while dead.
func (p *Peer) Addr() string { return p.addr }

// Mode reports the current mode.
func (p *Peer) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// SetMode switches the mode; open sessions follow at once. Leaving ModeDead
// listens again on the same address, which can fail if something else took
// the port meanwhile.
func (p *Peer) SetMode(m Mode) error {
	if _, err := ParseMode(string(m)); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	old := p.mode
	switch {
	case m == ModeDead && old != ModeDead:
		_ = p.ln.Close()
		p.ln = nil
		for s := range p.sessions {
			_ = s.conn.Close()
		}
	case m != ModeDead && old == ModeDead:
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("amipeer: listen again on %s: %w", p.addr, err)
		}
		p.serveLocked(ln)
	}
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
	p.log.Info("amipeer mode", "from", old, "to", m)
	return nil
}

// SetSlowDelay sets the delay ModeSlow puts before each response.
func (p *Peer) SetSlowDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slow = d
}

// SetFigures sets what `core show channels count` and CoreStatus report
// beyond the peer's own channels and calls.
func (p *Peer) SetFigures(f Figures) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.figures = f
}

// Status is a snapshot of the peer for the control socket and tests.
type Status struct {
	Addr      string `json:"addr"`
	Mode      Mode   `json:"mode"`
	SlowDelay string `json:"slow_delay"`
	// Figures are what the peer reports now: its own channels and calls
	// and those SetFigures adds.
	Figures  Figures `json:"figures"`
	Sessions int     `json:"sessions"`
	Actions  int     `json:"actions"`
	DBKeys   int     `json:"db_keys"`
}

// Status returns a snapshot of the peer's state.
func (p *Peer) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Status{Addr: p.addr, Mode: p.mode, SlowDelay: p.slow.String(), Figures: p.liveFiguresLocked(),
		Sessions: len(p.sessions), Actions: len(p.actions), DBKeys: len(p.db)}
}

// setFigures is what SetFigures last set.
func (p *Peer) setFigures() Figures {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.figures
}

// Sessions is the number of open TCP sessions (logged in or not).
func (p *Peer) Sessions() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sessions)
}

// DropSessions closes every open session without changing the mode, like
// an Asterisk restart seen from a client that reconnects quickly.
func (p *Peer) DropSessions() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.sessions {
		_ = s.conn.Close()
	}
}

// Actions returns a copy of every action received so far, in order.
func (p *Peer) Actions() []Action {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.actions)
}

// WaitAction blocks until an action for which match returns true has been
// received (including before the call), or ctx ends.
func (p *Peer) WaitAction(ctx context.Context, match func(Action) bool) (Action, error) {
	seen := 0
	for {
		p.mu.Lock()
		acts, next := p.actions[seen:], p.recorded
		seen = len(p.actions)
		p.mu.Unlock()
		for _, a := range acts {
			if match(a) {
				return a, nil
			}
		}
		select {
		case <-next:
		case <-ctx.Done():
			return Action{}, fmt.Errorf("amipeer: waiting for an action: %w", ctx.Err())
		case <-p.done:
			return Action{}, ErrClosed
		}
	}
}

// DBPut stores a value in the peer's AstDB, as `database put` would.
func (p *Peer) DBPut(family, key, value string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.db["/"+family+"/"+key] = value
}

// DB returns a copy of the AstDB, keyed by full key ("/family/key").
func (p *Peer) DB() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]string, len(p.db))
	for k, v := range p.db {
		out[k] = v
	}
	return out
}

// Emit sends an unsolicited event (fields in order, "Event" first) to every
// logged-in session that did not turn events off, and returns how many
// sessions it was written to. A session that cannot take it within a second
// is skipped.
func (p *Peer) Emit(fields ...Field) int {
	var b msgBuilder
	for _, f := range fields {
		b.field(f.Name, f.Value)
	}
	b.end()
	p.mu.Lock()
	targets := make([]*session, 0, len(p.sessions))
	for s := range p.sessions {
		if s.events.Load() && s.readable(fields) && s.wants(fields) {
			targets = append(targets, s)
		}
	}
	p.mu.Unlock()
	n := 0
	for _, s := range targets {
		if s.write(b.bytes(), time.Second) == nil {
			n++
		}
	}
	return n
}

// Close stops listening, ends every session and waits for all goroutines.
func (p *Peer) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for s := range p.sessions {
		_ = s.conn.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	p.log.Info("amipeer closed", "addr", p.addr)
	return nil
}

// serveLocked starts the accept loop for ln; p.mu is held, so Close cannot
// be between its check and wg.Wait.
func (p *Peer) serveLocked(ln net.Listener) {
	p.ln = ln
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			if p.closed || p.ln != ln {
				p.mu.Unlock()
				_ = c.Close()
				return
			}
			p.nextID++
			s := &session{id: p.nextID, conn: c}
			p.sessions[s] = struct{}{}
			p.wg.Add(1)
			p.mu.Unlock()
			go p.runSession(s)
		}
	}()
}

type session struct {
	id     int
	conn   net.Conn
	wmu    sync.Mutex
	events atomic.Bool // logged in with events on: Emit writes to it
	authed bool        // only the session goroutine touches it
	// rights is the logged-in user's read and write classes (rights.go).
	rights atomic.Pointer[sessionRights]
	// filter is what the session asked to receive (filter.go).
	filter atomic.Pointer[eventFilter]
}

// write sends one or more whole messages; the mutex keeps Emit's events from
// landing inside a response.
func (s *session) write(b []byte, timeout time.Duration) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if timeout > 0 {
		_ = s.conn.SetWriteDeadline(time.Now().Add(timeout))
		defer func() { _ = s.conn.SetWriteDeadline(time.Time{}) }()
	}
	_, err := s.conn.Write(b)
	return err
}

const banner = "Asterisk Call Manager/11.0.0\r\n"

func (p *Peer) runSession(s *session) {
	defer func() {
		_ = s.conn.Close()
		p.mu.Lock()
		delete(p.sessions, s)
		p.mu.Unlock()
		p.wg.Done()
	}()
	log := p.log.With("session", s.id, "remote", s.conn.RemoteAddr().String())
	log.Debug("amipeer session opened")
	defer log.Debug("amipeer session closed")

	// The reader records every action as it arrives, frozen or not, so a
	// test sees what a client asked a frozen Asterisk: the bytes its kernel
	// would have buffered. Only the answers wait for a thaw.
	inbox := make(chan Action, inboxSize)
	stop := make(chan struct{})
	readerDone := make(chan struct{})
	go p.readSession(s, log, inbox, stop, readerDone)
	defer func() {
		_ = s.conn.Close()
		close(stop)
		<-readerDone
	}()

	if !p.awaitResponsive() {
		return
	}
	if s.write([]byte(banner), 0) != nil {
		return
	}
	for a := range inbox {
		if !p.awaitResponsive() {
			return
		}
		if !p.maybeSlow() {
			return
		}
		out, closeAfter := p.answer(s, a)
		if out != nil && s.write(out, 0) != nil {
			return
		}
		if closeAfter {
			return
		}
	}
}

// inboxSize is how many actions a session holds unanswered before its
// reader stops reading; past it the client's writes fill the socket's
// buffers and block, as they would against a frozen Asterisk.
const inboxSize = 1024

// readSession reads and records a session's actions and hands them to the
// session in order; it closes inbox when the connection ends.
func (p *Peer) readSession(s *session, log *slog.Logger, inbox chan<- Action, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	defer close(inbox)
	br := bufio.NewReader(s.conn)
	for {
		fields, err := readMessage(br)
		if err != nil {
			return
		}
		a := p.record(s.id, fields)
		log.Debug("amipeer action", "action", a.Name, "action_id", a.Field("ActionID"))
		select {
		case inbox <- a:
		case <-stop:
			return
		}
	}
}

// awaitResponsive holds a session while the peer is frozen; false means the
// peer closed or died meanwhile, and what the session received must not
// take effect (a DBPut sent to a frozen Asterisk that then died is lost).
func (p *Peer) awaitResponsive() bool {
	for {
		p.mu.Lock()
		mode, changed := p.mode, p.changed
		p.mu.Unlock()
		switch mode {
		case ModeDead:
			return false
		case ModeFrozen:
		default:
			return true
		}
		select {
		case <-changed:
		case <-p.done:
			return false
		}
	}
}

func (p *Peer) maybeSlow() bool {
	p.mu.Lock()
	mode, d := p.mode, p.slow
	p.mu.Unlock()
	if mode != ModeSlow {
		return true
	}
	return p.sleep(d)
}

// sleep waits d unless the peer closes first.
func (p *Peer) sleep(d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-p.done:
		return false
	}
}

func (p *Peer) record(session int, fields []Field) Action {
	a := Action{Session: session, Time: time.Now(), Fields: fields}
	a.Name = a.Field("Action")
	p.mu.Lock()
	p.actions = append(p.actions, a)
	close(p.recorded)
	p.recorded = make(chan struct{})
	p.mu.Unlock()
	return a
}

// maxLine bounds one header line; an AstDB value (a PJSIP contact) is well
// under 1 KiB, and a client sending more is broken.
const maxLine = 64 << 10

// readMessage reads header lines up to the blank line that ends a message.
// Blank lines before any header are skipped, as Asterisk does; a line
// without a colon is ignored.
func readMessage(br *bufio.Reader) ([]Field, error) {
	var fields []Field
	for {
		line, err := readLine(br)
		if err != nil {
			return nil, err
		}
		if line == "" {
			if len(fields) == 0 {
				continue
			}
			return fields, nil
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		fields = append(fields, Field{Name: strings.TrimSpace(name), Value: strings.TrimLeft(value, " \t")})
	}
}

func readLine(br *bufio.Reader) (string, error) {
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		buf = append(buf, chunk...)
		if len(buf) > maxLine {
			return "", fmt.Errorf("amipeer: line longer than %d bytes", maxLine)
		}
		if err == nil {
			break
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return "", err
		}
	}
	return strings.TrimRight(string(buf), "\r\n"), nil
}
