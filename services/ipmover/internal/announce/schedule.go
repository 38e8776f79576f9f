package announce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync/atomic"
	"time"
)

// Config is the announcement schedule for one address. The defaults follow
// keepalived (garp_master_repeat 5, garp_master_delay 5 s) and
// IPaddr2 (arp_count 5, arp_interval 200 ms), plus a refresh every 60 s,
// a third of the usual 300 s switch FDB ageing, which neither does by
// default and which MetalLB users found they needed (metallb#2910).
type Config struct {
	// FirstCount packets FirstInterval apart, the first one at once.
	FirstCount    int
	FirstInterval time.Duration
	// SecondCount packets SecondInterval apart, starting SecondDelay after
	// the first packet: catches a switch port or neighbour that came back
	// after the first burst (STP, a rebooting router). 0 disables.
	SecondDelay    time.Duration
	SecondCount    int
	SecondInterval time.Duration
	// Refresh is the period of refreshes after the bursts, while the
	// address is held. A refresh is a request and a reply for IPv4 (one
	// of each, so devices that honour only one kind are refreshed every
	// period) and one advertisement for IPv6. 0 disables.
	Refresh time.Duration
}

// DefaultConfig is 5 packets 200 ms apart, 5 more after 5 s, then a
// refresh every 60 s. To change one field, start from DefaultConfig: zero
// values mean "none", not "default".
func DefaultConfig() Config {
	return Config{
		FirstCount:     5,
		FirstInterval:  200 * time.Millisecond,
		SecondDelay:    5 * time.Second,
		SecondCount:    5,
		SecondInterval: 200 * time.Millisecond,
		Refresh:        60 * time.Second,
	}
}

// Validate rejects schedules that make no sense.
func (c Config) Validate() error {
	switch {
	case c.FirstCount < 1:
		return errors.New("announce: first burst needs at least one packet (the critical-path one)")
	case c.FirstInterval < 0, c.SecondDelay < 0, c.SecondInterval < 0, c.Refresh < 0:
		return errors.New("announce: negative interval")
	case c.SecondCount < 0:
		return errors.New("announce: negative second burst count")
	case c.FirstCount > 1 && c.FirstInterval == 0, c.SecondCount > 1 && c.SecondInterval == 0:
		return errors.New("announce: burst packets need an interval between them")
	}
	return nil
}

// burstOffsets are when each burst packet goes out, relative to the first,
// in order. Offsets are from the start rather than from the previous
// packet so that a slow send does not push the whole schedule back.
func (c Config) burstOffsets() []time.Duration {
	out := make([]time.Duration, 0, c.FirstCount+c.SecondCount)
	for i := range c.FirstCount {
		out = append(out, time.Duration(i)*c.FirstInterval)
	}
	for i := range c.SecondCount {
		out = append(out, c.SecondDelay+time.Duration(i)*c.SecondInterval)
	}
	// A second burst configured to start inside the first is merged in time order.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// Transmitter sends single announcement packets; *Link is the real one.
type Transmitter interface {
	SendGARP(ip netip.Addr, reply bool) error
	SendNA(ip netip.Addr) error
}

// Announcer runs announcement schedules over a Transmitter.
type Announcer struct {
	tx     Transmitter
	cfg    Config
	log    *slog.Logger
	active atomic.Int64
	runs   atomic.Uint64
}

// New returns an Announcer. A zero Config means DefaultConfig.
func New(tx Transmitter, cfg Config, log *slog.Logger) (*Announcer, error) {
	if cfg == (Config{}) {
		cfg = DefaultConfig()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Announcer{tx: tx, cfg: cfg, log: log.With("component", "announce")}, nil
}

// Config returns the schedule in use.
func (a *Announcer) Config() Config { return a.cfg }

// Active is the number of schedules running now.
func (a *Announcer) Active() int { return int(a.active.Load()) }

// Started is the number of schedules started so far.
func (a *Announcer) Started() uint64 { return a.runs.Load() }

// Start announces ip. The first packet is sent before Start returns,
// because it is on the failover critical path; the rest of the schedule runs
// in the background until ctx is done or stop is called. stop waits for the
// schedule to end, so after it returns nothing more is sent.
//
// If the first packet cannot be sent Start returns the error and no
// schedule: the caller (the reconcile loop) retries on its next pass rather
// than trusting a schedule that may never have reached anyone.
func (a *Announcer) Start(ctx context.Context, ip netip.Addr) (stop func(), err error) {
	ip = ip.Unmap()
	if !ip.IsValid() {
		return nil, fmt.Errorf("announce: invalid address")
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := a.send(ip, 0); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	a.runs.Add(1)
	a.active.Add(1)
	go func() {
		defer close(done)
		defer a.active.Add(-1)
		a.run(ctx, ip, start)
	}()
	return func() { cancel(); <-done }, nil
}

// send sends packet number seq of a schedule. IPv4 alternates request and
// reply, because some devices honour only one of them (kube-vip#80,
// resource-agents PR #977) and we cannot know which the LAN has.
func (a *Announcer) send(ip netip.Addr, seq int) error {
	if ip.Is4() {
		return a.tx.SendGARP(ip, seq%2 == 1)
	}
	return a.tx.SendNA(ip)
}

func (a *Announcer) run(ctx context.Context, ip netip.Addr, start time.Time) {
	log := a.log.With("address", ip)
	offsets := a.cfg.burstOffsets()
	seq := 1
	for _, off := range offsets[1:] {
		if !sleepUntil(ctx, start.Add(off)) {
			return
		}
		if err := a.send(ip, seq); err != nil {
			log.Warn("announcement not sent", "seq", seq, "err", err)
		}
		seq++
	}
	if a.cfg.Refresh <= 0 {
		return
	}
	last := start.Add(offsets[len(offsets)-1])
	for n := 1; ; n++ {
		if !sleepUntil(ctx, last.Add(time.Duration(n)*a.cfg.Refresh)) {
			return
		}
		kinds := 1
		if ip.Is4() {
			kinds = 2
			seq += seq % 2 // each refresh starts with a request
		}
		for range kinds {
			if err := a.send(ip, seq); err != nil {
				log.Warn("refresh announcement not sent", "seq", seq, "err", err)
			}
			seq++
		}
	}
}

// sleepUntil waits for t and reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
