package check

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/ami"
)

// coreStatusEvery is how stale the CoreStatus figures may get. CoreStatus is
// not asked on every run: `core show channels count`, asked every run, is the
// health question, it goes through the same manager session and
// needs the same live core, so a second round trip per run adds cost, not
// evidence. What CoreStatus adds is figures (core calls, start-up time),
// which only leave the prober in raw results (rate-limited, 10 s by default)
// and are the same on every run in between; a restart that would reset them
// also ends the session, and the first run on a new session asks again.
const coreStatusEvery = 10 * time.Second

// AMI asks Asterisk `core show channels count` on every run, and CoreStatus
// on the first run of each session and then every coreStatusEvery, over one
// persistent AMI session: questions only a live Asterisk core can answer
// (a deadlocked core accepts the connection and never replies).
// Healthy only when each action asked
// answers Success with output that parses; anything else, or no answer
// before the deadline, is a failure.
//
// The login runs in the background with its own deadline (LoginTimeout,
// above Asterisk's one-second wait before "Authentication failed"), never
// under a probe's deadline: with a 150 ms probe, a login bounded by the probe
// would turn every wrong password into a timeout. While the first login
// after a (re)connect is in flight a run has no verdict; once a login has
// failed, runs report that failure (auth, refused, timeout) until a login
// succeeds.
type AMI struct {
	cfg ami.Config
	log *slog.Logger

	ctx    context.Context // cancelled by Close: ends a login in flight
	cancel context.CancelFunc

	mu       sync.Mutex
	cur      *ami.Client
	dialing  chan struct{} // non-nil while a login is in flight; closed when it ends
	lastErr  error         // why the last login failed; nil after a success or a drop
	failures int
	nextDial time.Time
	closed   bool
	wg       sync.WaitGroup

	// The latest CoreStatus, from session statusOf, taken at statusAt.
	smu      sync.Mutex
	status   ami.CoreStatus
	statusOf *ami.Client
	statusAt time.Time
	// The systemname session settingsOf reported (nil: it refused to say).
	systemName *string
	settingsOf *ami.Client
}

// NewAMI prepares the check; it dials on the first run and again after the
// connection ends.
func NewAMI(cfg ami.Config, log *slog.Logger) *AMI {
	ctx, cancel := context.WithCancel(context.Background())
	return &AMI{cfg: cfg, log: log, ctx: ctx, cancel: cancel}
}

func (a *AMI) Kind() string   { return "ami" }
func (a *AMI) Target() string { return a.cfg.Addr }

func (a *AMI) Run(ctx context.Context) Result {
	start := time.Now()
	c, err := a.client(ctx)
	if c == nil && err == nil {
		return Result{At: start, Duration: time.Since(start), NoVerdict: true}
	}
	if err != nil {
		return finishAMI(start, err)
	}
	st, err := a.coreStatus(ctx, c, start)
	if err != nil {
		return finishAMI(start, err)
	}
	counts, err := c.CoreShowChannelsCount(ctx)
	if err != nil {
		return finishAMI(start, err)
	}
	r := finishAMI(start, nil)
	r.SystemName = a.settings(ctx, c)
	r.Figures = map[string]float64{
		"active_channels":      float64(counts.Channels),
		"active_calls":         float64(counts.Calls),
		"calls_processed":      float64(counts.Processed),
		"core_current_calls":   float64(st.CurrentCalls),
		"core_processed_calls": float64(st.ProcessedCalls),
	}
	if !st.Startup.IsZero() {
		r.Figures["pbx_uptime_seconds"] = time.Since(st.Startup).Seconds()
	}
	return r
}

// coreStatus asks CoreStatus when this session has not been asked yet or
// the last answer is coreStatusEvery old, else returns that answer. A failed
// CoreStatus fails the run and is asked again on the next.
func (a *AMI) coreStatus(ctx context.Context, c *ami.Client, now time.Time) (ami.CoreStatus, error) {
	a.smu.Lock()
	st, fresh := a.status, a.statusOf == c && now.Sub(a.statusAt) < coreStatusEvery
	a.smu.Unlock()
	if fresh {
		return st, nil
	}
	st, err := c.CoreStatus(ctx)
	a.smu.Lock()
	defer a.smu.Unlock()
	if err != nil {
		a.statusOf = nil
		return st, err
	}
	a.status, a.statusOf, a.statusAt = st, c, now
	return st, nil
}

// settings returns the systemname Asterisk reports (CoreSettings), asked
// once per session, after the health questions and only with time left in
// the run: it never decides the verdict. A refusal (the user may not ask:
// CoreSettings needs write class system or reporting) is logged once per
// session and leaves the name unknown; a timeout is asked again next run.
func (a *AMI) settings(ctx context.Context, c *ami.Client) *string {
	a.smu.Lock()
	name, asked := a.systemName, a.settingsOf == c
	a.smu.Unlock()
	if asked || ctx.Err() != nil {
		return name
	}
	resp, err := c.Action(ctx, "CoreSettings")
	if err != nil {
		return nil
	}
	name = nil
	if resp.Success() {
		n := resp.Field("SystemName")
		name = &n
	} else {
		a.log.Warn("ami: CoreSettings refused, the systemname goes unreported (manager.conf: write = system)",
			"addr", a.cfg.Addr, "message", resp.Message())
	}
	a.smu.Lock()
	a.systemName, a.settingsOf = name, c
	a.smu.Unlock()
	return name
}

func finishAMI(start time.Time, err error) Result {
	r := Result{At: start, Duration: time.Since(start), OK: err == nil, Err: err}
	if err != nil {
		r.Class = ami.Classify(err)
	}
	return r
}

// client returns a logged-in connection; (nil, nil) means a first login is
// still in flight when ctx ends.
func (a *AMI) client(ctx context.Context) (*ami.Client, error) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, fmt.Errorf("ami check %s: %w", a.cfg.Addr, ami.ErrClosed)
	}
	if a.cur != nil {
		select {
		case <-a.cur.Done():
			a.log.Info("ami connection lost, logging in again", "addr", a.cfg.Addr, "err", a.cur.Err())
			_ = a.cur.Close()
			a.cur = nil
			// Counted as a failure by the action that saw it end; the login
			// that follows starts with no verdict of its own.
			a.lastErr = nil
		default:
			c := a.cur
			a.mu.Unlock()
			return c, nil
		}
	}
	if a.dialing == nil {
		if wait := time.Until(a.nextDial); wait > 0 {
			err := a.lastErr
			a.mu.Unlock()
			return nil, fmt.Errorf("ami check: retrying in %v: %w", wait.Round(time.Millisecond), err)
		}
		a.dialing = make(chan struct{})
		a.wg.Add(1)
		go a.dial(a.dialing)
	}
	wait := a.dialing
	a.mu.Unlock()

	select {
	case <-wait:
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.cur != nil {
			return a.cur, nil
		}
		return nil, a.lastErr
	case <-ctx.Done():
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.lastErr != nil {
			return nil, fmt.Errorf("ami check: login in progress, last attempt: %w", a.lastErr)
		}
		return nil, nil
	}
}

func (a *AMI) dial(done chan struct{}) {
	defer a.wg.Done()
	c, err := ami.Dial(a.ctx, a.cfg, a.log)
	a.mu.Lock()
	defer a.mu.Unlock()
	defer close(done)
	a.dialing = nil
	if err == nil && a.closed {
		_ = c.Close()
		err = fmt.Errorf("ami check %s: %w", a.cfg.Addr, ami.ErrClosed)
	}
	if err != nil {
		a.failures++
		a.lastErr = err
		a.nextDial = time.Now().Add(ami.Backoff(a.failures))
		if !errors.Is(err, ami.ErrClosed) || !a.closed {
			a.log.Warn("ami login failed", "addr", a.cfg.Addr, "attempt", a.failures, "class", ami.Classify(err), "err", err)
		}
		return
	}
	if a.failures > 0 {
		a.log.Info("ami logged in again", "addr", a.cfg.Addr, "failed_attempts", a.failures)
	}
	a.cur, a.failures, a.lastErr, a.nextDial = c, 0, nil, time.Time{}
}

// Connected reports whether the check holds a logged-in connection now.
func (a *AMI) Connected() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cur == nil {
		return false
	}
	select {
	case <-a.cur.Done():
		return false
	default:
		return true
	}
}

// Close ends the connection and any login in flight.
func (a *AMI) Close() error {
	a.mu.Lock()
	a.closed = true
	c := a.cur
	a.cur = nil
	a.mu.Unlock()
	a.cancel()
	a.wg.Wait()
	if c != nil {
		return c.Close()
	}
	return nil
}
