package ami

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/amipeer"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

const (
	user   = "fan"
	secret = "s3cret"
)

func startPeer(t *testing.T, cfg amipeer.Config) *amipeer.Peer {
	t.Helper()
	cfg.Username, cfg.Secret = user, secret
	p, err := amipeer.Start(cfg)
	if err != nil {
		t.Fatalf("amipeer.Start: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func cfgFor(p *amipeer.Peer) Config {
	return Config{Addr: p.Addr(), Username: user, Secret: secret}
}

func dial(t *testing.T, cfg Config) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestLoginAndActions(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	c := dial(t, cfgFor(p))
	r, err := c.Action(ctxFor(t, 2*time.Second), "Ping")
	if err != nil {
		t.Fatal(err)
	}
	if !r.Success() || r.Field("Ping") != "Pong" || !strings.HasPrefix(r.Field("ActionID"), "fan-") {
		t.Errorf("Ping: %q", r.String())
	}
	// Login said Events: off, as the client asks by default.
	acts := p.Actions()
	if acts[0].Name != "Login" || acts[0].Field("Events") != "off" || acts[0].Field("Username") != user {
		t.Errorf("login sent as %+v", acts[0])
	}
	if acts[1].Field("ActionID") != r.Field("ActionID") {
		t.Errorf("ActionID sent %q, answered %q", acts[1].Field("ActionID"), r.Field("ActionID"))
	}
	// Unknown action: an Error Response, not a Go error.
	r, err = c.Action(ctxFor(t, 2*time.Second), "Bogus")
	if err != nil || r.Success() || !strings.HasPrefix(r.Message(), "Invalid/unknown command: Bogus.") {
		t.Errorf("Bogus: %q, %v", r.String(), err)
	}
	if _, err := c.Action(ctxFor(t, time.Second), "Ping", F("X", "a\r\nAction: Logoff")); err == nil {
		t.Error("a value with CR LF was sent")
	}
}

// FullyBooted in the login answer's segment: with events on, the
// event that shares the login's segment reaches Events.
func TestFullyBootedNotLost(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	cfg := cfgFor(p)
	cfg.Events = true
	c := dial(t, cfg)
	select {
	case ev := <-c.Events():
		if ev.Name() != "FullyBooted" || ev.Field("Status") != "Fully Booted" {
			t.Errorf("first event %q", ev.String())
		}
	case <-ctxFor(t, 2*time.Second).Done():
		t.Fatal("FullyBooted never arrived")
	}
	if got := p.Actions()[0].Field("Events"); got != "" {
		t.Errorf("Login carried Events: %q with Config.Events set", got)
	}
}

// Trap 1: a wrong secret is answered after Asterisk's 1 s sleep. It must be
// ErrAuth, not a timeout.
func TestWrongSecretIsErrAuthNotTimeout(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{}) // 1 s, as Asterisk
	cfg := cfgFor(p)
	cfg.Secret = "wrong"
	start := time.Now()
	_, err := Dial(ctxFor(t, 5*time.Second), cfg, nil)
	elapsed := time.Since(start)
	if !errors.Is(err, ErrAuth) || errors.Is(err, ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want ErrAuth only", err)
	}
	if Classify(err) != events.ErrorAuth {
		t.Errorf("Classify = %q", Classify(err))
	}
	if elapsed < 900*time.Millisecond || elapsed > 2*time.Second {
		t.Errorf("answered after %v, want about 1 s", elapsed)
	}
}

// A login deadline shorter than the auth delay is a timeout, not ErrAuth:
// the two stay distinguishable in both directions.
func TestLoginTimeoutShorterThanAuthDelay(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	cfg := cfgFor(p)
	cfg.Secret, cfg.LoginTimeout = "wrong", 200*time.Millisecond
	_, err := Dial(ctxFor(t, 5*time.Second), cfg, nil)
	if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrAuth) || Classify(err) != events.ErrorTimeout {
		t.Fatalf("err = %v (class %s), want timeout", err, Classify(err))
	}
}

// Trap 3, at the banner: the peer accepts TCP and says nothing.
func TestFrozenAtBannerIsLoginTimeout(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	if err := p.SetMode(amipeer.ModeFrozen); err != nil {
		t.Fatal(err)
	}
	cfg := cfgFor(p)
	cfg.LoginTimeout = 300 * time.Millisecond
	start := time.Now()
	_, err := Dial(ctxFor(t, 5*time.Second), cfg, nil)
	if !errors.Is(err, ErrTimeout) || Classify(err) != events.ErrorTimeout {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if e := time.Since(start); e < 250*time.Millisecond || e > time.Second {
		t.Errorf("gave up after %v, want about 300 ms", e)
	}
	// The ctx deadline wins when it is shorter than LoginTimeout.
	cfg.LoginTimeout = 5 * time.Second
	start = time.Now()
	if _, err := Dial(ctxFor(t, 200*time.Millisecond), cfg, nil); !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if e := time.Since(start); e > time.Second {
		t.Errorf("ctx deadline ignored: %v", e)
	}
}

// Trap 3, after login: a deadlocked PBX answers nothing; the action ends at
// its deadline with ErrTimeout, never hangs.
func TestFrozenPeerActionTimesOut(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	c := dial(t, cfgFor(p))
	if err := p.SetMode(amipeer.ModeFrozen); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := c.CoreShowChannelsCount(ctxFor(t, 300*time.Millisecond))
	e := time.Since(start)
	if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || Classify(err) != events.ErrorTimeout {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if e < 250*time.Millisecond || e > 800*time.Millisecond {
		t.Errorf("returned after %v, want about 300 ms", e)
	}
	// When the deadlock clears, the late answer is discarded and the next
	// action gets its own.
	if err := p.SetMode(amipeer.ModeNormal); err != nil {
		t.Fatal(err)
	}
	r, err := c.Action(ctxFor(t, 2*time.Second), "CoreSettings")
	if err != nil || r.Field("AsteriskVersion") != "22.10.1" {
		t.Fatalf("after thaw: %q, %v", r.String(), err)
	}
}

func TestDeadPeerIsRefused(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	if err := p.SetMode(amipeer.ModeDead); err != nil {
		t.Fatal(err)
	}
	_, err := Dial(ctxFor(t, 2*time.Second), cfgFor(p), nil)
	if !errors.Is(err, ErrRefused) || Classify(err) != events.ErrorRefused {
		t.Fatalf("Dial: %v, want ErrRefused", err)
	}
	s := NewSession(cfgFor(p), nil)
	defer s.Close()
	start := time.Now()
	_, err = s.Action(ctxFor(t, 300*time.Millisecond), "Ping")
	if !errors.Is(err, ErrRefused) || Classify(err) != events.ErrorRefused {
		t.Fatalf("Session: %v (class %s), want refused", err, Classify(err))
	}
	if e := time.Since(start); e > time.Second {
		t.Errorf("Session took %v", e)
	}
}

// An open connection whose peer dies: waiting actions fail with ErrClosed
// at once instead of running into their deadline.
func TestPeerDiesUnderAction(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	c := dial(t, cfgFor(p))
	_ = p.SetMode(amipeer.ModeFrozen)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Action(ctxFor(t, 5*time.Second), "Ping")
		errc <- err
	}()
	if _, err := p.WaitAction(ctxFor(t, 2*time.Second), func(a amipeer.Action) bool { return a.Name == "Ping" }); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_ = p.SetMode(amipeer.ModeDead)
	err := <-errc
	if !errors.Is(err, ErrClosed) || time.Since(start) > time.Second {
		t.Fatalf("err = %v after %v, want ErrClosed quickly", err, time.Since(start))
	}
	<-c.Done()
	if _, err := c.Action(ctxFor(t, time.Second), "Ping"); !errors.Is(err, ErrClosed) {
		t.Errorf("action on a dead client: %v", err)
	}
}

// Trap 4: the session dials again after the peer drops it.
func TestSessionReconnects(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	s := NewSession(cfgFor(p), nil)
	defer s.Close()
	if _, err := s.Action(ctxFor(t, 2*time.Second), "Ping"); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	first := s.cur
	s.mu.Unlock()

	p.DropSessions()
	<-first.Done() // the client noticed
	r, err := s.Action(ctxFor(t, 2*time.Second), "Ping")
	if err != nil || !r.Success() {
		t.Fatalf("after drop: %v", err)
	}

	// Dead for a while, then back: actions fail as refused, then work again.
	_ = p.SetMode(amipeer.ModeDead)
	s.mu.Lock()
	second := s.cur
	s.mu.Unlock()
	<-second.Done()
	if _, err := s.Action(ctxFor(t, 200*time.Millisecond), "Ping"); Classify(err) != events.ErrorRefused {
		t.Fatalf("while dead: %v", err)
	}
	_ = p.SetMode(amipeer.ModeNormal)
	if _, err := s.CoreShowChannelsCount(ctxFor(t, 5*time.Second)); err != nil {
		t.Fatalf("after restart: %v", err)
	}
	logins := 0
	for _, a := range p.Actions() {
		if a.Name == "Login" {
			logins++
		}
	}
	if logins != 3 {
		t.Errorf("%d logins, want 3 (one per connection)", logins)
	}
}

// Trap 2, the big one: a burst of events while nobody reads them must not
// cost the response that follows them in the stream.
func TestEventBurstDoesNotLoseResponse(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	cfg := cfgFor(p)
	cfg.Events, cfg.EventBuffer = true, 4
	c := dial(t, cfg)
	const burst = 300
	for i := range burst {
		if n := p.Emit(amipeer.Field{Name: "Event", Value: "VarSet"}, amipeer.Field{Name: "Privilege", Value: "dialplan,all"},
			amipeer.Field{Name: "Value", Value: fmt.Sprint(i)}); n != 1 {
			t.Fatalf("Emit reached %d sessions", n)
		}
	}
	// The caller never reads Events (a slow consumer); the Ping answer is
	// behind 300 events in the stream.
	r, err := c.Action(ctxFor(t, 3*time.Second), "Ping")
	if err != nil || r.Field("Ping") != "Pong" {
		t.Fatalf("Ping behind a burst: %q, %v", r.String(), err)
	}
	// FullyBooted + 300 events, the first 4 kept and the rest counted:
	// none lost however late the reader ran.
	if n := len(c.Events()); n != 4 {
		t.Fatalf("%d events buffered, want 4", n)
	}
	if first := <-c.Events(); first.Name() != "FullyBooted" {
		t.Errorf("first event %q, want FullyBooted", first.String())
	}
	if got, want := c.DroppedEvents(), uint64(burst+1-4); got != want {
		t.Errorf("dropped %d events, want %d", got, want)
	}
}

// Many goroutines on one connection: each gets its own answer.
func TestConcurrentActionsMatchedByActionID(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	c := dial(t, cfgFor(p))
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := ctxFor(t, 5*time.Second)
			key, val := fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)
			if r, err := c.Action(ctx, "DBPut", F("Family", "t"), F("Key", key), F("Val", val)); err != nil || !r.Success() {
				errs <- fmt.Errorf("DBPut %d: %q %v", i, r.String(), err)
				return
			}
			r, err := c.Action(ctx, "DBGet", F("Family", "t"), F("Key", key))
			if err != nil || len(r.Events()) != 1 || r.Events()[0].Field("Val") != val {
				errs <- fmt.Errorf("DBGet %d: %q %v", i, r.String(), err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestDBGetTreeCollectsList(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	contact := `{"endpoint":"6001","uri":"sip:6001@127.0.0.1:5370","expiration_time":"1796000734"}`
	p.DBPut("registrar", "contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f", contact)
	p.DBPut("registrar", "contact/6002;@ff", "{}")
	p.DBPut("other", "x", "y")
	c := dial(t, cfgFor(p))
	r, err := c.Action(ctxFor(t, 2*time.Second), "DBGetTree", F("Family", "registrar"))
	if err != nil || !r.Success() {
		t.Fatalf("DBGetTree: %q %v", r.String(), err)
	}
	evs := r.Events()
	if len(evs) != 2 || evs[0].Name() != "DBGetTreeResponse" ||
		evs[0].Field("Key") != "/registrar/contact/6001;@1af1a3a283d770c64aeed4e8e68d1b9f" || evs[0].Field("Val") != contact {
		t.Fatalf("items: %v", evs)
	}
	if done, ok := r.Complete(); !ok || done.Name() != "DBGetTreeComplete" || done.Field("ListItems") != "2" {
		t.Errorf("complete: %q %v", done.String(), ok)
	}
	// An empty tree is a start and a Complete with no items.
	r, err = c.Action(ctxFor(t, 2*time.Second), "DBGetTree", F("Family", "nothing"))
	if done, ok := r.Complete(); err != nil || len(r.Events()) != 0 || !ok || done.Field("ListItems") != "0" {
		t.Errorf("empty tree: %q %v", r.String(), err)
	}
}

func TestFailingIsUnhealthy(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	c := dial(t, cfgFor(p))
	if err := p.SetMode(amipeer.ModeFailing); err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 3*time.Second)
	_, err := c.CoreShowChannelsCount(ctx)
	var ae *ActionError
	if !errors.Is(err, ErrUnhealthy) || !errors.As(err, &ae) || ae.Message != "Command output follows" || Classify(err) != events.ErrorUnhealth {
		t.Errorf("channels count: %v", err)
	}
	if _, err := c.CoreStatus(ctx); Classify(err) != events.ErrorUnhealth {
		t.Errorf("CoreStatus: %v", err)
	}
	if err := c.Reload(ctx, "res_pjsip.so"); Classify(err) != events.ErrorUnhealth {
		t.Errorf("Reload: %v", err)
	}
}

// "Command output follows" proves nothing: an Error that says it is unhealthy.
func TestCommandErrorWithOutputIsUnhealthy(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	c := dial(t, cfgFor(p))
	r, err := c.Action(ctxFor(t, 2*time.Second), "Command", F("Command", "pjsip reload"))
	if err != nil || r.Success() || r.Message() != "Command output follows" ||
		len(r.Outputs()) != 1 || !strings.HasPrefix(r.Outputs()[0], "No such command 'pjsip reload'") {
		t.Fatalf("pjsip reload: %q %v", r.String(), err)
	}
}

func TestCoreShowChannelsCountParses(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{Figures: amipeer.Figures{Channels: 4, Calls: 2, Processed: 17}})
	s := NewSession(cfgFor(p), nil)
	defer s.Close()
	cc, err := s.CoreShowChannelsCount(ctxFor(t, 2*time.Second))
	if err != nil || cc != (ChannelCounts{Channels: 4, Calls: 2, Processed: 17}) {
		t.Fatalf("got %+v, %v", cc, err)
	}
	p.SetFigures(amipeer.Figures{Channels: 1, Calls: 1, Processed: 1}) // singular wording
	cc, err = s.CoreShowChannelsCount(ctxFor(t, 2*time.Second))
	if err != nil || cc != (ChannelCounts{1, 1, 1}) {
		t.Fatalf("singular: %+v, %v", cc, err)
	}
	st, err := s.CoreStatus(ctxFor(t, 2*time.Second))
	if err != nil || st.CurrentCalls != 1 || st.ProcessedCalls != 1 || st.Startup.IsZero() || time.Since(st.Startup) > time.Minute {
		t.Fatalf("CoreStatus: %+v, %v", st, err)
	}
}

func TestParseChannelsCount(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lines []string
		want  ChannelCounts
		ok    bool
	}{
		{[]string{"0 active channels", "0 active calls", "0 calls processed"}, ChannelCounts{}, true},
		{[]string{"12 active channels", "6 active calls", "1 call processed"}, ChannelCounts{12, 6, 1}, true},
		{[]string{""}, ChannelCounts{}, false},
		{[]string{"0 active channels", "0 active calls"}, ChannelCounts{}, false},
		{[]string{"No such command 'core show channels count'"}, ChannelCounts{}, false},
		{[]string{"x active channels", "0 active calls", "0 calls processed"}, ChannelCounts{}, false},
		{[]string{"99999999999999999999 active channels", "0 active calls", "0 calls processed"}, ChannelCounts{}, false},
		{[]string{"1 active channel", "1 active call", "7 calls processed"}, ChannelCounts{1, 1, 7}, true},
		{[]string{"Output: x", "3 active channels", "2 active calls", "9 calls processed", ""}, ChannelCounts{3, 2, 9}, true},
		{[]string{" 1 active channels", "1 active calls", "1 calls processed"}, ChannelCounts{}, false},
		{[]string{"1 active channels ", "1 active calls", "1 calls processed"}, ChannelCounts{}, false},
		{[]string{"1  active channels", "1 active calls", "1 calls processed"}, ChannelCounts{}, false},
		{[]string{"1 active channelss", "1 active calls", "1 calls processed"}, ChannelCounts{}, false},
	} {
		got, err := ParseChannelsCount(tc.lines)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("%q: %+v %v", tc.lines, got, err)
		}
		if !tc.ok && (!errors.Is(err, ErrProtocol) || Classify(err) != events.ErrorProtocol) {
			t.Errorf("%q: err %v, want ErrProtocol", tc.lines, err)
		}
	}
}

// Logoff's Goodbye comes right before the peer closes; it must still be
// delivered as the answer, not lost to the end of the connection.
func TestLogoffAnswerBeforeClose(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	for range 20 {
		c := dial(t, cfgFor(p))
		r, err := c.Action(ctxFor(t, 2*time.Second), "Logoff")
		if err != nil || r.Field("Response") != "Goodbye" || r.Message() != "Thanks for all the fish." {
			t.Fatalf("Logoff: %q, %v", r.String(), err)
		}
		<-c.Done()
	}
}

func TestReload(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	c := dial(t, cfgFor(p))
	ctx := ctxFor(t, 2*time.Second)
	if err := c.Reload(ctx, "res_pjsip.so"); err != nil {
		t.Fatalf("Reload res_pjsip.so: %v", err)
	}
	if _, err := p.WaitAction(ctx, func(a amipeer.Action) bool {
		return a.Name == "Reload" && a.Field("Module") == "res_pjsip.so"
	}); err != nil {
		t.Fatal(err)
	}
	err := c.Reload(ctx, "res_nothing.so")
	var ae *ActionError
	if !errors.As(err, &ae) || ae.Message != "No such module" || Classify(err) != events.ErrorUnhealth {
		t.Fatalf("unknown module: %v", err)
	}
	if err := c.Reload(ctx, ""); err != nil {
		t.Fatalf("Reload everything: %v", err)
	}
}

// A late answer (the caller gave up) never reaches the next caller.
func TestLateResponseDiscarded(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{SlowDelay: 200 * time.Millisecond})
	c := dial(t, cfgFor(p))
	_ = p.SetMode(amipeer.ModeSlow)
	if _, err := c.Action(ctxFor(t, 50*time.Millisecond), "Ping"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("want timeout, got %v", err)
	}
	p.SetSlowDelay(0)
	r, err := c.Action(ctxFor(t, 2*time.Second), "CoreSettings")
	if err != nil || r.Field("AMIversion") != "11.0.0" {
		t.Fatalf("got %q, %v (the late Ping answer?)", r.String(), err)
	}
}

func TestKeepaliveOn(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	c := dial(t, cfgFor(p))
	sc, err := c.raw.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var on int
	_ = sc.Control(func(fd uintptr) { on, err = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE) })
	if err != nil || on != 1 {
		t.Errorf("SO_KEEPALIVE = %d, %v", on, err)
	}
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	p := startPeer(t, amipeer.Config{})
	c := dial(t, cfgFor(p))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Action(ctx, "Ping")
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want events.ErrorClass
	}{
		{nil, ""},
		{fmt.Errorf("x: %w", ErrAuth), events.ErrorAuth},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), events.ErrorTimeout},
		{os.ErrDeadlineExceeded, events.ErrorTimeout},
		{syscall.ECONNREFUSED, events.ErrorRefused},
		{&ActionError{Action: "Reload", Message: "No such module"}, events.ErrorUnhealth},
		{fmt.Errorf("x: %w", ErrProtocol), events.ErrorProtocol},
		{fmt.Errorf("x: %w", ErrClosed), events.ErrorOther},
		{errors.New("boom"), events.ErrorOther},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// leaked lists goroutines still running code of this package.
func leaked() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "fan/pkg/ami.(*") {
			out = append(out, g)
		}
	}
	return out
}

// Trap 5: Close releases every goroutine, in every state a connection can be
// left in. Not parallel, so other tests' connections do not count.
func TestNoGoroutineLeaks(t *testing.T) {
	p := startPeer(t, amipeer.Config{})
	ctx := ctxFor(t, 5*time.Second)

	c1, err := Dial(ctx, cfgFor(p), nil) // idle
	if err != nil {
		t.Fatal(err)
	}
	c2, err := Dial(ctx, cfgFor(p), nil) // dropped by the peer
	if err != nil {
		t.Fatal(err)
	}
	ev := cfgFor(p)
	ev.Events, ev.EventBuffer = true, 1
	c3, err := Dial(ctx, ev, nil) // events nobody reads
	if err != nil {
		t.Fatal(err)
	}
	p.Emit(amipeer.Field{Name: "Event", Value: "Test"})
	s := NewSession(cfgFor(p), nil)
	if _, err := s.Action(ctx, "Ping"); err != nil {
		t.Fatal(err)
	}
	bad := cfgFor(p)
	bad.Secret = "wrong"
	_ = p.SetMode(amipeer.ModeFrozen)
	frozenAct := make(chan error, 1)
	go func() {
		_, err := c1.Action(ctx, "Ping") // pending when Close comes
		frozenAct <- err
	}()
	if _, err := p.WaitAction(ctx, func(a amipeer.Action) bool { return a.Session == 1 && a.Name == "Ping" }); err != nil {
		t.Fatal(err)
	}
	bad.LoginTimeout = 100 * time.Millisecond
	if _, err := Dial(ctx, bad, nil); !errors.Is(err, ErrTimeout) {
		t.Fatalf("frozen login: %v", err)
	}
	// Close while the peer is still frozen: thawed, it would answer the
	// held Ping before Close could end it.
	_ = c1.Close()
	if err := <-frozenAct; !errors.Is(err, ErrClosed) {
		t.Errorf("pending action after Close: %v", err)
	}
	_ = p.SetMode(amipeer.ModeNormal)
	p.DropSessions()
	<-c2.Done()

	_ = c2.Close()
	_ = c3.Close()
	_ = s.Close()
	if _, err := s.Action(ctx, "Ping"); !errors.Is(err, ErrClosed) {
		t.Errorf("Action after Session.Close: %v", err)
	}

	// Goroutines end asynchronously.
	waittest.Succeeds(t, 3*time.Second, "the client's goroutines ended", func() error {
		if l := leaked(); len(l) > 0 {
			return fmt.Errorf("%d goroutines left:\n%s", len(l), strings.Join(l, "\n\n"))
		}
		return nil
	})
}

// The bytes on the wire for an action: Action, ActionID, the fields in
// order, CR LF line ends and a blank line, as Asterisk's manager parses them.
func TestEncodeAction(t *testing.T) {
	for _, c := range []struct {
		name, id string
		fields   []Field
		want     string
	}{
		{"Ping", "fan-0a1b2c3d-1", nil, "Action: Ping\r\nActionID: fan-0a1b2c3d-1\r\n\r\n"},
		{"Command", "fan-0a1b2c3d-42", []Field{F("Command", "core show channels count")},
			"Action: Command\r\nActionID: fan-0a1b2c3d-42\r\nCommand: core show channels count\r\n\r\n"},
		{"Reload", "i", []Field{F("Module", "res_pjsip.so"), F("X", "")}, "Action: Reload\r\nActionID: i\r\nModule: res_pjsip.so\r\nX: \r\n\r\n"},
		{"Login", "", []Field{F("Username", "fan"), F("Secret", "s"), F("Events", "off")},
			"Action: Login\r\nUsername: fan\r\nSecret: s\r\nEvents: off\r\n\r\n"},
	} {
		if got := string(encodeAction(c.name, c.id, c.fields)); got != c.want {
			t.Errorf("encodeAction(%s) = %q, want %q", c.name, got, c.want)
		}
	}
}
