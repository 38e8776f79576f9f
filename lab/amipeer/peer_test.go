package amipeer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	testUser   = "fan"
	testSecret = "s3cret"
)

func startPeer(t *testing.T, cfg Config) *Peer {
	t.Helper()
	if cfg.Username == "" {
		cfg.Username, cfg.Secret = testUser, testSecret
	}
	p, err := Start(cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// rawConn is a test client speaking bytes, so responses are compared with
// the facts file exactly, CR LF included.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) send(lines ...string) {
	r.t.Helper()
	msg := strings.Join(lines, "\r\n") + "\r\n\r\n"
	if _, err := io.WriteString(r.c, msg); err != nil {
		r.t.Fatalf("send: %v", err)
	}
}

// read returns the next whole message, blank line included, or fails the
// test if none arrives within timeout.
func (r *rawConn) read(timeout time.Duration) string {
	r.t.Helper()
	msg, err := r.tryRead(timeout)
	if err != nil {
		r.t.Fatalf("read: %v (got %q)", err, msg)
	}
	return msg
}

func (r *rawConn) tryRead(timeout time.Duration) (string, error) {
	_ = r.c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = r.c.SetReadDeadline(time.Time{}) }()
	var b strings.Builder
	for {
		line, err := r.br.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\r\n" {
			return b.String(), nil
		}
	}
}

func (r *rawConn) banner() {
	r.t.Helper()
	_ = r.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	line, err := r.br.ReadString('\n')
	_ = r.c.SetReadDeadline(time.Time{})
	if err != nil || line != "Asterisk Call Manager/11.0.0\r\n" {
		r.t.Fatalf("banner = %q, %v", line, err)
	}
}

func (r *rawConn) login() {
	r.t.Helper()
	r.banner()
	r.send("Action: Login", "ActionID: l1", "Username: "+testUser, "Secret: "+testSecret, "Events: off")
	if got, want := r.read(2*time.Second), msg("Response: Success", "ActionID: l1", "Message: Authentication accepted"); got != want {
		r.t.Fatalf("login:\n got %q\nwant %q", got, want)
	}
}

// expectEOF asserts the peer closed the connection.
func (r *rawConn) expectEOF(timeout time.Duration) {
	r.t.Helper()
	got, err := r.tryRead(timeout)
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		r.t.Fatalf("want the peer to close, got %q, %v", got, err)
	}
}

// expectSilence asserts nothing arrives for d.
func (r *rawConn) expectSilence(d time.Duration) {
	r.t.Helper()
	got, err := r.tryRead(d)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || got != "" {
		r.t.Fatalf("want silence, got %q, %v", got, err)
	}
}

// msg builds the expected wire form of one message from facts-file lines.
func msg(lines ...string) string { return strings.Join(lines, "\r\n") + "\r\n\r\n" }

// TestExchangesByteForByte replays each exchange of docs/asterisk22.md.
func TestExchangesByteForByte(t *testing.T) {
	p := startPeer(t, Config{})
	p.DBPut("registrar", "contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f", `{"endpoint":"6001","uri":"sip:6001@127.0.0.1:5370"}`)
	r := dialRaw(t, p.Addr())
	r.login()

	cases := []struct {
		name string
		send []string
		want string
	}{
		{"pjsip reload is an Error that says output follows",
			[]string{"Action: Command", "ActionID: c1", "Command: pjsip reload"},
			msg("Response: Error", "ActionID: c1", "Message: Command output follows",
				"Output: No such command 'pjsip reload' (type 'core show help pjsip reload' for other possible commands)")},
		{"Reload res_pjsip.so", []string{"Action: Reload", "ActionID: r1", "Module: res_pjsip.so"},
			msg("Response: Success", "ActionID: r1", "Message: Module Reloaded")},
		{"Reload unknown module", []string{"Action: Reload", "ActionID: r2", "Module: res_nothing.so"},
			msg("Response: Error", "ActionID: r2", "Message: No such module")},
		{"core reload", []string{"Action: Command", "ActionID: c2", "Command: core reload"},
			msg("Response: Success", "ActionID: c2", "Message: Command output follows", "Output: ")},
		{"unknown action", []string{"Action: Bogus", "ActionID: b1"},
			msg("Response: Error", "ActionID: b1", "Message: Invalid/unknown command: Bogus. Use Action: ListCommands to show available commands.")},
		{"core show channels count", []string{"Action: Command", "ActionID: 2", "Command: core show channels count"},
			msg("Response: Success", "ActionID: 2", "Message: Command output follows",
				"Output: 0 active channels", "Output: 0 active calls", "Output: 0 calls processed")},
		{"CoreSettings", []string{"Action: CoreSettings", "ActionID: s1"},
			msg("Response: Success", "ActionID: s1", "AMIversion: 11.0.0", "AsteriskVersion: 22.10.1", "SystemName: ",
				"CoreMaxCalls: 0", "CoreMaxLoadAvg: 0.000000", "CoreRunUser: root", "CoreRunGroup: root",
				"CoreMaxFilehandles: 0", "CoreRealTimeEnabled: No", "CoreCDRenabled: Yes", "CoreHTTPenabled: No",
				"SoundsSearchCustomDir: No")},
		{"DBPut", []string{"Action: DBPut", "ActionID: p1", "Family: registrar", "Key: contact/6002", "Val: {\"a\":1}"},
			msg("Response: Success", "ActionID: p1", "Message: Updated database successfully")},
		{"DBGetTree", []string{"Action: DBGetTree", "ActionID: t1", "Family: registrar"},
			msg("Response: Success", "ActionID: t1", "EventList: start", "Message: Result will follow") +
				msg("Event: DBGetTreeResponse", "Key: /registrar/contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f",
					`Val: {"endpoint":"6001","uri":"sip:6001@127.0.0.1:5370"}`, "ActionID: t1") +
				msg("Event: DBGetTreeResponse", "Key: /registrar/contact/6002", `Val: {"a":1}`, "ActionID: t1") +
				msg("Event: DBGetTreeComplete", "ActionID: t1", "EventList: Complete", "ListItems: 2")},
		{"DBGetTree empty family", []string{"Action: DBGetTree", "ActionID: t2", "Family: nothing"},
			msg("Response: Success", "ActionID: t2", "EventList: start", "Message: Result will follow") +
				msg("Event: DBGetTreeComplete", "ActionID: t2", "EventList: Complete", "ListItems: 0")},
		{"DBGet", []string{"Action: DBGet", "ActionID: g1", "Family: registrar", "Key: contact/6002"},
			msg("Response: Success", "ActionID: g1", "EventList: start", "Message: Result will follow") +
				msg("Event: DBGetResponse", "Family: registrar", "Key: contact/6002", `Val: {"a":1}`, "ActionID: g1") +
				msg("Event: DBGetComplete", "ActionID: g1", "EventList: Complete", "ListItems: 1")},
		{"DBDel", []string{"Action: DBDel", "ActionID: d1", "Family: registrar", "Key: contact/6002"},
			msg("Response: Success", "ActionID: d1", "Message: Key deleted successfully")},
		{"DBGet missing", []string{"Action: DBGet", "ActionID: g2", "Family: registrar", "Key: contact/6002"},
			msg("Response: Error", "ActionID: g2", "Message: Database entry not found")},
		{"no ActionID, no ActionID line", []string{"Action: Reload", "Module: res_pjsip.so"},
			msg("Response: Success", "Message: Module Reloaded")},
	}
	for _, tc := range cases {
		r.send(tc.send...)
		var got strings.Builder
		for got.Len() < len(tc.want) {
			got.WriteString(r.read(2 * time.Second))
		}
		if got.String() != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got.String(), tc.want)
		}
	}

	r.send("Action: Ping", "ActionID: p1")
	if got := r.read(2 * time.Second); !regexp.MustCompile(`^Response: Success\r\nActionID: p1\r\nPing: Pong\r\nTimestamp: \d{10}\.\d{6}\r\n\r\n$`).MatchString(got) {
		t.Errorf("Ping: %q", got)
	}
	r.send("Action: CoreStatus", "ActionID: 3")
	if got := r.read(2 * time.Second); !regexp.MustCompile(`^Response: Success\r\nActionID: 3\r\n` +
		`CoreStartupDate: \d{4}-\d\d-\d\d\r\nCoreStartupTime: \d\d:\d\d:\d\d\r\n` +
		`CoreReloadDate: \d{4}-\d\d-\d\d\r\nCoreReloadTime: \d\d:\d\d:\d\d\r\n` +
		`CoreCurrentCalls: 0\r\nCoreProcessedCalls: 0\r\n\r\n$`).MatchString(got) {
		t.Errorf("CoreStatus: %q", got)
	}
	r.send("Action: Logoff", "ActionID: o1")
	if got, want := r.read(2*time.Second), msg("Response: Goodbye", "ActionID: o1", "Message: Thanks for all the fish."); got != want {
		t.Errorf("Logoff:\n got %q\nwant %q", got, want)
	}
	r.expectEOF(2 * time.Second)
}

func TestLoginWithoutEventsOffSendsFullyBooted(t *testing.T) {
	p := startPeer(t, Config{})
	r := dialRaw(t, p.Addr())
	r.banner()
	r.send("Action: Login", "ActionID: l1", "Username: "+testUser, "Secret: "+testSecret)
	if got, want := r.read(2*time.Second), msg("Response: Success", "ActionID: l1", "Message: Authentication accepted"); got != want {
		t.Fatalf("login: %q", got)
	}
	got := r.read(2 * time.Second)
	if !regexp.MustCompile(`^Event: FullyBooted\r\nPrivilege: system,all\r\nUptime: \d+\r\nLastReload: \d+\r\nStatus: Fully Booted\r\n\r\n$`).MatchString(got) {
		t.Fatalf("FullyBooted: %q", got)
	}
}

func TestWrongSecretWaitsThenFailsAndCloses(t *testing.T) {
	p := startPeer(t, Config{}) // default delay: 1 s, like Asterisk
	r := dialRaw(t, p.Addr())
	r.banner()
	start := time.Now()
	r.send("Action: Login", "Username: "+testUser, "Secret: wrong")
	got := r.read(3 * time.Second)
	elapsed := time.Since(start)
	if want := msg("Response: Error", "Message: Authentication failed"); got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	if elapsed < 950*time.Millisecond || elapsed > 1500*time.Millisecond {
		t.Errorf("auth failure after %v, want about 1 s", elapsed)
	}
	r.expectEOF(2 * time.Second)
}

func TestAuthFailDelayConfigurable(t *testing.T) {
	p := startPeer(t, Config{AuthFailDelay: 100 * time.Millisecond})
	r := dialRaw(t, p.Addr())
	r.banner()
	start := time.Now()
	r.send("Action: Login", "ActionID: l9", "Username: nobody", "Secret: "+testSecret)
	if got, want := r.read(2*time.Second), msg("Response: Error", "ActionID: l9", "Message: Authentication failed"); got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	if e := time.Since(start); e < 90*time.Millisecond || e > 700*time.Millisecond {
		t.Errorf("auth failure after %v, want about 100 ms", e)
	}
}

func TestPermissionDeniedBeforeLogin(t *testing.T) {
	p := startPeer(t, Config{})
	r := dialRaw(t, p.Addr())
	r.banner()
	r.send("Action: Ping", "ActionID: x1")
	if got, want := r.read(2*time.Second), msg("Response: Error", "ActionID: x1", "Message: Permission denied"); got != want {
		t.Fatalf("got %q want %q", got, want)
	}
	r.send("Action: Login", "ActionID: l1", "Username: "+testUser, "Secret: "+testSecret, "Events: off")
	if got := r.read(2 * time.Second); !strings.Contains(got, "Authentication accepted") {
		t.Fatalf("login after denial: %q", got)
	}
}

func TestDeadRefusesAndClosesSessions(t *testing.T) {
	p := startPeer(t, Config{})
	r := dialRaw(t, p.Addr())
	r.login()
	if err := p.SetMode(ModeDead); err != nil {
		t.Fatal(err)
	}
	r.expectEOF(2 * time.Second)
	_, err := net.DialTimeout("tcp", p.Addr(), time.Second)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while dead: %v, want connection refused", err)
	}
	if err := p.SetMode(ModeNormal); err != nil {
		t.Fatal(err)
	}
	r2 := dialRaw(t, p.Addr())
	r2.login()
}

func TestFrozenAnswersNothingUntilThawed(t *testing.T) {
	p := startPeer(t, Config{})
	old := dialRaw(t, p.Addr())
	old.login()
	if err := p.SetMode(ModeFrozen); err != nil {
		t.Fatal(err)
	}
	// A new connection is accepted but gets no banner; what it sends
	// arrives all the same.
	fresh := dialRaw(t, p.Addr())
	fresh.send("Action: Login", "ActionID: f0", "Username: "+testUser, "Secret: "+testSecret, "Events: off")
	// Every action an existing session sends is received (and recorded),
	// not only the first, and none is answered.
	old.send("Action: Ping", "ActionID: f1")
	old.send("Action: DBPut", "ActionID: f2", "Family: f", "Key: k", "Val: v")
	old.send("Action: Ping", "ActionID: f3")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, id := range []string{"f0", "f1", "f2", "f3"} {
		if _, err := p.WaitAction(ctx, func(a Action) bool { return a.Field("ActionID") == id }); err != nil {
			t.Fatalf("action %s while frozen: %v", id, err)
		}
	}
	fresh.expectSilence(200 * time.Millisecond)
	old.expectSilence(200 * time.Millisecond)
	if db := p.DB(); len(db) != 0 {
		t.Errorf("DBPut applied while frozen: %v", db)
	}

	if err := p.SetMode(ModeNormal); err != nil {
		t.Fatal(err)
	}
	fresh.banner()
	if got := fresh.read(2 * time.Second); !strings.HasPrefix(got, "Response: Success\r\nActionID: f0\r\n") {
		t.Fatalf("the fresh session's login after thaw: %q", got)
	}
	for _, want := range []string{"Response: Success\r\nActionID: f1\r\nPing: Pong\r\n",
		"Response: Success\r\nActionID: f2\r\n", "Response: Success\r\nActionID: f3\r\nPing: Pong\r\n"} {
		if got := old.read(2 * time.Second); !strings.HasPrefix(got, want) {
			t.Fatalf("after thaw: %q, want it to start %q", got, want)
		}
	}
	if got := p.DB()["/f/k"]; got != "v" {
		t.Errorf("DBPut after thaw: %v", p.DB())
	}
}

func TestFailingAnswersErrors(t *testing.T) {
	p := startPeer(t, Config{})
	r := dialRaw(t, p.Addr())
	r.login()
	if err := p.SetMode(ModeFailing); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		send []string
		want string
	}{
		{[]string{"Action: Command", "ActionID: c1", "Command: core show channels count"},
			msg("Response: Error", "ActionID: c1", "Message: Command output follows", "Output: ")},
		{[]string{"Action: CoreStatus", "ActionID: s1"}, msg("Response: Error", "ActionID: s1", "Message: Asterisk is shutting down")},
		{[]string{"Action: Reload", "ActionID: r1", "Module: res_pjsip.so"}, msg("Response: Error", "ActionID: r1", "Message: Asterisk is shutting down")},
	} {
		r.send(tc.send...)
		if got := r.read(2 * time.Second); got != tc.want {
			t.Errorf("got %q want %q", got, tc.want)
		}
	}
	// Ping does not touch what is failing, as on a real Asterisk.
	r.send("Action: Ping", "ActionID: p1")
	if got := r.read(2 * time.Second); !strings.HasPrefix(got, "Response: Success") {
		t.Errorf("Ping while failing: %q", got)
	}
}

func TestSlowDelaysEachResponse(t *testing.T) {
	p := startPeer(t, Config{SlowDelay: 150 * time.Millisecond})
	r := dialRaw(t, p.Addr())
	r.login()
	if err := p.SetMode(ModeSlow); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		start := time.Now()
		r.send("Action: Ping", fmt.Sprintf("ActionID: s%d", i))
		r.read(2 * time.Second)
		if e := time.Since(start); e < 150*time.Millisecond {
			t.Errorf("response %d after %v, want at least 150 ms", i, e)
		}
	}
	p.SetSlowDelay(0)
	start := time.Now()
	r.send("Action: Ping", "ActionID: s9")
	r.read(2 * time.Second)
	if e := time.Since(start); e > 100*time.Millisecond {
		t.Errorf("response after SetSlowDelay(0) took %v", e)
	}
}

func TestFiguresAndSingular(t *testing.T) {
	p := startPeer(t, Config{Figures: Figures{Channels: 4, Calls: 2, Processed: 17}})
	r := dialRaw(t, p.Addr())
	r.login()
	r.send("Action: Command", "ActionID: c1", "Command: core show channels count")
	if got, want := r.read(2*time.Second), msg("Response: Success", "ActionID: c1", "Message: Command output follows",
		"Output: 4 active channels", "Output: 2 active calls", "Output: 17 calls processed"); got != want {
		t.Errorf("got %q want %q", got, want)
	}
	p.SetFigures(Figures{Channels: 1, Calls: 1, Processed: 1})
	r.send("Action: Command", "ActionID: c2", "Command: core show channels count")
	if got, want := r.read(2*time.Second), msg("Response: Success", "ActionID: c2", "Message: Command output follows",
		"Output: 1 active channel", "Output: 1 active call", "Output: 1 call processed"); got != want {
		t.Errorf("got %q want %q", got, want)
	}
}

func TestActionsRecorded(t *testing.T) {
	p := startPeer(t, Config{})
	r := dialRaw(t, p.Addr())
	r.login()
	r.send("Action: Reload", "ActionID: r1", "Module: res_pjsip.so")
	r.read(2 * time.Second)
	acts := p.Actions()
	if len(acts) != 2 || acts[0].Name != "Login" || acts[1].Name != "Reload" {
		t.Fatalf("actions: %+v", acts)
	}
	if a := acts[1]; a.Field("module") != "res_pjsip.so" || a.Session != 1 || a.Time.IsZero() ||
		a.Fields[0] != (Field{"Action", "Reload"}) {
		t.Errorf("reload recorded as %+v", a)
	}
}

func TestEmitReachesEventSessionsOnly(t *testing.T) {
	p := startPeer(t, Config{})
	quiet := dialRaw(t, p.Addr())
	quiet.login() // Events: off
	loud := dialRaw(t, p.Addr())
	loud.banner()
	loud.send("Action: Login", "Username: "+testUser, "Secret: "+testSecret)
	loud.read(2 * time.Second) // response
	loud.read(2 * time.Second) // FullyBooted
	if n := p.Emit(Field{"Event", "PeerStatus"}, Field{"Privilege", "system,all"}, Field{"PeerStatus", "Reachable"}); n != 1 {
		t.Fatalf("Emit reached %d sessions, want 1", n)
	}
	if got, want := loud.read(2*time.Second), msg("Event: PeerStatus", "Privilege: system,all", "PeerStatus: Reachable"); got != want {
		t.Errorf("got %q want %q", got, want)
	}
	quiet.expectSilence(100 * time.Millisecond)
}

// TestConcurrentSessions runs several sessions at once while the figures and
// modes change under them; with -race this checks the peer's locking.
func TestConcurrentSessions(t *testing.T) {
	p := startPeer(t, Config{})
	const sessions, rounds = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for s := range sessions {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			if _, err := br.ReadString('\n'); err != nil {
				errs <- err
				return
			}
			readMsg := func() (string, error) {
				var b strings.Builder
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return "", err
					}
					b.WriteString(line)
					if line == "\r\n" {
						return b.String(), nil
					}
				}
			}
			fmt.Fprintf(c, "Action: Login\r\nUsername: %s\r\nSecret: %s\r\nEvents: off\r\n\r\n", testUser, testSecret)
			if m, err := readMsg(); err != nil || !strings.Contains(m, "Authentication accepted") {
				errs <- fmt.Errorf("session %d login: %q %v", s, m, err)
				return
			}
			for i := range rounds {
				id := fmt.Sprintf("s%d-%d", s, i)
				fmt.Fprintf(c, "Action: Command\r\nActionID: %s\r\nCommand: core show channels count\r\n\r\n", id)
				m, err := readMsg()
				if err != nil || !strings.Contains(m, "ActionID: "+id+"\r\n") || !strings.Contains(m, "active channel") {
					errs <- fmt.Errorf("session %d round %d: %q %v", s, i, m, err)
					return
				}
			}
		}()
	}
	for i := range 50 {
		p.SetFigures(Figures{Channels: i, Calls: i / 2})
		_ = p.Status()
		_ = p.Actions()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := len(p.Actions()); got != sessions*(rounds+1) {
		t.Errorf("recorded %d actions, want %d", got, sessions*(rounds+1))
	}
}

func TestCloseEndsBlockedSessions(t *testing.T) {
	p, err := Start(Config{Username: testUser, Secret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	r := dialRaw(t, p.Addr())
	r.login()
	_ = p.SetMode(ModeFrozen)
	r.send("Action: Ping")
	done := make(chan struct{})
	go func() { _ = p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Close hung on a frozen session")
	}
	r.expectEOF(time.Second)
	if err := p.SetMode(ModeNormal); !errors.Is(err, ErrClosed) {
		t.Errorf("SetMode after Close: %v", err)
	}
}

func TestParseMode(t *testing.T) {
	for _, m := range []Mode{ModeNormal, ModeDead, ModeFrozen, ModeFailing, ModeSlow} {
		if got, err := ParseMode(string(m)); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %q, %v", m, got, err)
		}
	}
	if _, err := ParseMode("sleepy"); err == nil {
		t.Error("ParseMode accepted an unknown mode")
	}
}

// What a frozen peer received never takes effect if it dies instead of
// thawing.
func TestFrozenThenDeadDropsPendingActions(t *testing.T) {
	p := startPeer(t, Config{})
	r := dialRaw(t, p.Addr())
	r.login()
	_ = p.SetMode(ModeFrozen)
	r.send("Action: DBPut", "ActionID: p1", "Family: f", "Key: k", "Val: v")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := p.WaitAction(ctx, func(a Action) bool { return a.Name == "DBPut" }); err != nil {
		t.Fatal(err)
	}
	_ = p.SetMode(ModeDead)
	r.expectEOF(2 * time.Second)
	if db := p.DB(); len(db) != 0 {
		t.Errorf("DBPut applied by a dead peer: %v", db)
	}
}
