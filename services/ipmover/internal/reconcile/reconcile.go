// Package reconcile keeps the interface's floating addresses equal to what
// this node has been told to hold, level-triggered: it compares desired
// state with the addresses actually present, periodically and whenever the
// address watcher says something changed, and corrects the difference.
//
// Edge-triggered handling (act once per command) is not enough: an address
// can vanish under us (an operator, a DHCP client or NetworkManager flushing
// the interface, a link bounce) and then nobody answers for it although the
// arbiter believes we do (UCarp#26, vip-manager's applyLoop). Likewise an
// address we should not hold must go, or there are two holders.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// Addresses is what the loop needs from the address manager (*vip.Manager).
type Addresses interface {
	// Replace adds p, or refreshes it if present.
	Replace(p netip.Prefix) error
	// Delete removes p; absent is not an error.
	Delete(p netip.Prefix) error
	// Present returns those of want that are on the interface and usable.
	Present(want []netip.Prefix) ([]netip.Prefix, error)
}

// Announcer is what the loop needs from the announcer (*announce.Announcer).
type Announcer interface {
	// Start sends the first announcement for ip before returning and runs
	// the rest of the schedule until stop is called. On error there is no
	// schedule to stop.
	Start(ctx context.Context, ip netip.Addr) (stop func(), err error)
}

// Kind says what a Change did.
type Kind string

const (
	Added   Kind = "added"   // put on because it is desired
	Readded Kind = "readded" // was held, vanished, put back and re-announced
	Removed Kind = "removed" // present but not desired, taken off
	// Announced: held and present, announced anew (a new claim of an
	// address already there, or Reannounce after a conflict).
	Announced Kind = "announced"
	Failed    Kind = "failed" // an add, delete or first announcement failed; Err says which
)

// Cause says why the loop made a change.
type Cause string

const (
	// Desired: desired state was set (SetDesired, ReleaseAll) and the
	// change carries it out; it is the work of whoever set it (a command,
	// a policy, a re-sync), which reports it.
	Desired Cause = "desired"
	// Drift: desired state was unchanged and the interface had moved away
	// from it; the change is a correction the loop made on its own.
	Drift Cause = "drift"
)

// Change is one correction the loop made (or failed to make).
type Change struct {
	Kind   Kind
	Prefix netip.Prefix
	Group  string // the group that most recently listed Prefix
	Cause  Cause
	Err    error
	At     time.Time
	// AnnouncedAt is when the first announcement of a new schedule had
	// been sent (zero if none was started by this change).
	AnnouncedAt time.Time
}

// DefaultPeriod is how often the loop re-reads the interface without a
// watcher signal. The watcher makes corrections near-immediate; the period
// bounds the damage if a netlink notification is lost.
const DefaultPeriod = 2 * time.Second

// Config configures a Loop. The zero value works.
type Config struct {
	// Period between passes; DefaultPeriod when zero.
	Period time.Duration
	// Changed, if set, triggers a pass on every value (the vip watcher).
	Changed <-chan struct{}
	// OnChange receives every change, outside the loop's lock, in order.
	// It must not block for long: it runs on the reconcile path.
	OnChange func(Change)
	Logger   *slog.Logger
}

type group struct {
	prefixes []netip.Prefix
	hold     bool
}

// Loop is the reconcile loop.
type Loop struct {
	addrs Addresses
	ann   Announcer
	cfg   Config
	log   *slog.Logger
	kick  chan struct{}

	mu        sync.Mutex // held for a whole pass, so passes never interleave
	groups    map[string]group
	owner     map[netip.Prefix]string // every prefix ever listed, to its latest group
	installed map[netip.Prefix]bool   // present at the end of the last pass
	fresh     map[netip.Prefix]bool   // newly claimed: announce anew even if present
	stops     map[netip.Prefix]func() // running announcement schedules
	// ordered holds the prefixes whose desired state was set since the
	// last pass: that pass's changes to them have Cause Desired.
	ordered map[netip.Prefix]bool
}

// New returns a Loop over the given address manager and announcer.
func New(addrs Addresses, ann Announcer, cfg Config) *Loop {
	if cfg.Period <= 0 {
		cfg.Period = DefaultPeriod
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Loop{
		addrs:     addrs,
		ann:       ann,
		cfg:       cfg,
		log:       log.With("component", "reconcile"),
		kick:      make(chan struct{}, 1),
		groups:    map[string]group{},
		owner:     map[netip.Prefix]string{},
		installed: map[netip.Prefix]bool{},
		fresh:     map[netip.Prefix]bool{},
		stops:     map[netip.Prefix]func(){},
		ordered:   map[netip.Prefix]bool{},
	}
}

// SetDesired records what this node should do with group's addresses: hold
// them, or not. Prefixes a group listed before but no longer lists stay
// managed, so they are removed rather than orphaned. Taking a group into
// hold (a new claim) re-announces its addresses even if they are already
// present, since neighbours may still point at another node.
//
// SetDesired does not touch the interface; it wakes Run. A caller on the
// failover critical path calls Reconcile next to apply it at once.
func (l *Loop) SetDesired(groupName string, prefixes []string, hold bool) error {
	if err := l.setDesired(groupName, prefixes, hold); err != nil {
		return err
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return nil
}

// SetDesiredFor is SetDesired for a caller that runs Apply itself right
// after (a claim on the failover path): it does not wake Run, whose pass
// would otherwise race Apply to add and announce the address and leave the
// caller without the changes it reports timings from.
func (l *Loop) SetDesiredFor(groupName string, prefixes []string, hold bool) error {
	return l.setDesired(groupName, prefixes, hold)
}

func (l *Loop) setDesired(groupName string, prefixes []string, hold bool) error {
	ps := make([]netip.Prefix, 0, len(prefixes))
	for _, s := range prefixes {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("reconcile: group %s: %w", groupName, err)
		}
		ps = append(ps, p)
	}
	l.mu.Lock()
	prev := l.groups[groupName]
	l.groups[groupName] = group{prefixes: ps, hold: hold}
	// Prefixes the group listed before are ordered too: they go.
	for _, p := range prev.prefixes {
		l.ordered[p] = true
	}
	for _, p := range ps {
		l.ordered[p] = true
	}
	for _, p := range ps {
		l.owner[p] = groupName
		if hold && (!prev.hold || !slices.Contains(prev.prefixes, p)) {
			l.fresh[p] = true
		}
	}
	l.mu.Unlock()
	return nil
}

// Held returns the managed prefixes that are desired and were present at
// the end of the last pass, sorted.
func (l *Loop) Held() []netip.Prefix {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []netip.Prefix
	for p, ok := range l.installed {
		if ok && l.desired(p) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

// desired reports whether any group holding p lists it. Caller holds mu.
func (l *Loop) desired(p netip.Prefix) bool {
	for _, g := range l.groups {
		if g.hold && slices.Contains(g.prefixes, p) {
			return true
		}
	}
	return false
}

// managed lists every prefix any group has listed, sorted. Caller holds mu.
func (l *Loop) managed() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(l.owner))
	for p := range l.owner {
		out = append(out, p)
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Run reconciles now, then every Period and on every Changed signal or
// SetDesired, until ctx is done. Announcement schedules end with it.
func (l *Loop) Run(ctx context.Context) error { return l.RunTurning(ctx, func() {}) }

// RunTurning is Run, calling turned before every pass, so a supervisor (the
// systemd watchdog) can tell a loop that turns from one that is stuck.
func (l *Loop) RunTurning(ctx context.Context, turned func()) error {
	defer l.stopAllAnnouncements()
	t := time.NewTicker(l.cfg.Period)
	defer t.Stop()
	changed := l.cfg.Changed
	for {
		turned()
		if err := l.Reconcile(ctx); err != nil && ctx.Err() == nil {
			l.log.Warn("reconcile pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-l.kick:
		case _, ok := <-changed:
			if !ok {
				l.log.Warn("address watcher stopped; relying on the period alone")
				changed = nil
			}
		}
	}
}

// Reconcile runs one pass now, in the caller's goroutine, and returns once
// the interface matches desired state (or with the errors met on the way,
// which are also reported as Failed changes).
func (l *Loop) Reconcile(ctx context.Context) error {
	_, err := l.Apply(ctx)
	return err
}

// Apply is Reconcile returning the changes made, so a claim can report
// when its address went on and when its first announcement left.
func (l *Loop) Apply(ctx context.Context) ([]Change, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	changes, err := l.pass()
	l.mu.Unlock()
	l.report(changes)
	return changes, err
}

// Reannounce makes the next pass start a fresh announcement schedule for
// every held address of group, as after a conflict this node won: the
// neighbours that followed the other MAC must be told again.
func (l *Loop) Reannounce(groupName string) {
	l.mu.Lock()
	if g, ok := l.groups[groupName]; ok && g.hold {
		for _, p := range g.prefixes {
			l.fresh[p] = true
		}
	}
	l.mu.Unlock()
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// pass compares and corrects. Caller holds mu.
func (l *Loop) pass() ([]Change, error) {
	want := l.managed()
	if len(want) == 0 {
		return nil, nil
	}
	present, err := l.addrs.Present(want)
	if err != nil {
		return nil, fmt.Errorf("reconcile: read addresses: %w", err)
	}
	have := make(map[netip.Prefix]bool, len(present))
	for _, p := range present {
		have[p] = true
	}
	var (
		changes []Change
		errs    []error
	)
	note := func(k Kind, p netip.Prefix, err error) {
		cause := Drift
		if l.ordered[p] {
			cause = Desired
		}
		changes = append(changes, Change{Kind: k, Prefix: p, Group: l.owner[p], Cause: cause, Err: err, At: time.Now()})
		if err != nil {
			errs = append(errs, err)
		}
	}
	// The order is carried out (or reported failed) by this pass; from the
	// next one on, a difference is drift again.
	defer clear(l.ordered)
	for _, p := range want {
		switch d, h := l.desired(p), have[p]; {
		case d && !h:
			kind := Added
			if l.installed[p] {
				kind = Readded
			}
			l.stopAnnouncement(p)
			if err := l.addrs.Replace(p); err != nil {
				l.installed[p] = false
				note(Failed, p, fmt.Errorf("reconcile: add %s: %w", p, err))
				continue
			}
			l.installed[p] = true
			note(kind, p, nil)
			delete(l.fresh, p)
			if err := l.startAnnouncement(p); err != nil {
				note(Failed, p, err)
			} else {
				changes[len(changes)-1].AnnouncedAt = time.Now()
			}
		case d && h:
			l.installed[p] = true
			if l.stops[p] == nil || l.fresh[p] {
				l.stopAnnouncement(p)
				delete(l.fresh, p)
				if err := l.startAnnouncement(p); err != nil {
					note(Failed, p, err)
				} else {
					note(Announced, p, nil)
					changes[len(changes)-1].AnnouncedAt = changes[len(changes)-1].At
				}
			}
		case !d && h:
			l.stopAnnouncement(p)
			if err := l.addrs.Delete(p); err != nil {
				note(Failed, p, fmt.Errorf("reconcile: remove %s: %w", p, err))
				continue
			}
			l.installed[p] = false
			note(Removed, p, nil)
		default:
			l.stopAnnouncement(p)
			l.installed[p] = false
		}
	}
	return changes, errors.Join(errs...)
}

// ReleaseAll gives up every managed address: no group is held any more,
// announcements stop and every managed prefix is deleted. Used on SIGTERM
// and when the node must stop answering. Deletion is attempted for every
// prefix even when reading the interface fails, because leaving an address
// behind is what creates a second holder.
func (l *Loop) ReleaseAll(ctx context.Context) error {
	l.mu.Lock()
	for name, g := range l.groups {
		g.hold = false
		l.groups[name] = g
	}
	clear(l.fresh)
	clear(l.ordered)
	l.stopAllAnnouncementsLocked()
	want := l.managed()
	present, perr := l.addrs.Present(want)
	var (
		changes []Change
		errs    []error
	)
	if perr != nil {
		errs = append(errs, fmt.Errorf("reconcile: read addresses: %w", perr))
		present = want
	}
	for _, p := range want {
		if ctx.Err() != nil {
			errs = append(errs, fmt.Errorf("reconcile: release interrupted before %s: %w", p, ctx.Err()))
			break
		}
		wasThere := slices.Contains(present, p)
		if err := l.addrs.Delete(p); err != nil {
			err = fmt.Errorf("reconcile: release %s: %w", p, err)
			errs = append(errs, err)
			changes = append(changes, Change{Kind: Failed, Prefix: p, Group: l.owner[p], Cause: Desired, Err: err, At: time.Now()})
			continue
		}
		l.installed[p] = false
		if wasThere {
			changes = append(changes, Change{Kind: Removed, Prefix: p, Group: l.owner[p], Cause: Desired, At: time.Now()})
		}
	}
	l.mu.Unlock()
	l.report(changes)
	return errors.Join(errs...)
}

func (l *Loop) report(changes []Change) {
	for _, c := range changes {
		if c.Err != nil {
			l.log.Warn("reconcile", "kind", c.Kind, "address", c.Prefix, "group", c.Group, "err", c.Err)
		} else {
			l.log.Info("reconcile", "kind", c.Kind, "address", c.Prefix, "group", c.Group)
		}
		if l.cfg.OnChange != nil {
			l.cfg.OnChange(c)
		}
	}
}

// startAnnouncement starts a fresh schedule for p. Caller holds mu.
func (l *Loop) startAnnouncement(p netip.Prefix) error {
	// Schedules belong to the loop and end through their stop function,
	// not with whichever command's context happened to start them.
	stop, err := l.ann.Start(context.Background(), p.Addr())
	if err != nil {
		// No schedule: the next pass sees none running and tries again.
		return fmt.Errorf("reconcile: announce %s: %w", p, err)
	}
	l.stops[p] = stop
	return nil
}

// stopAnnouncement stops p's schedule, if any. Caller holds mu.
func (l *Loop) stopAnnouncement(p netip.Prefix) {
	if stop := l.stops[p]; stop != nil {
		stop()
		delete(l.stops, p)
	}
}

func (l *Loop) stopAllAnnouncements() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopAllAnnouncementsLocked()
}

func (l *Loop) stopAllAnnouncementsLocked() {
	for p := range l.stops {
		l.stopAnnouncement(p)
	}
}
