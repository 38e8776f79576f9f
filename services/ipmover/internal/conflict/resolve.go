package conflict

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/services/ipmover/internal/announce"
)

// Holdings is what the resolver needs from the executor.
type Holdings interface {
	// Holding returns the claim under which ip is held now, if it is.
	Holding(ip netip.Addr) (Claim, bool)
	// Yield stops holding the group: its addresses come off the interface.
	Yield(ctx context.Context, group string) error
	// Reassert announces the group's addresses again (a fresh burst), so
	// neighbours that followed the other MAC come back.
	Reassert(ctx context.Context, group string) error
}

// Config configures a Resolver.
type Config struct {
	Node   string
	OwnMAC string
	// Confirm checks a claim; Confirmer.Confirm in production.
	Confirm func(context.Context, Claim) Verdict
	// Report receives every conflict and what was done about it.
	Report func(events.AddressConflict)
	// Timeout bounds one confirmation (a KV read or two). A holder whose
	// bus is slow yields rather than leaving two holders for long.
	Timeout time.Duration
	// MinInterval is how long after resolving a group's conflict further
	// frames for it are ignored: the other side's burst (5 packets) must
	// not cost five KV reads and five re-announcements.
	MinInterval time.Duration
	Logger      *slog.Logger
}

// Resolver turns ARP sightings into keep-or-yield decisions, one at a time
// per group, off the reading goroutine.
type Resolver struct {
	cfg  Config
	h    Holdings
	log  *slog.Logger
	wg   sync.WaitGroup
	mu   sync.Mutex
	busy map[string]bool
	last map[string]time.Time
}

// NewResolver returns a Resolver. Zero durations take 1 s each.
func NewResolver(h Holdings, cfg Config) *Resolver {
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.MinInterval <= 0 {
		cfg.MinInterval = time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Resolver{cfg: cfg, h: h, log: log.With("component", "conflict"), busy: map[string]bool{}, last: map[string]time.Time{}}
}

// Seen handles one sighting. It returns at once; resolution runs in the
// background (Wait waits for it).
func (r *Resolver) Seen(ctx context.Context, s announce.Seen) {
	c, ok := r.h.Holding(s.IP)
	if !ok {
		return
	}
	r.mu.Lock()
	if r.busy[c.Group] || s.At.Sub(r.last[c.Group]) < r.cfg.MinInterval {
		r.mu.Unlock()
		return
	}
	r.busy[c.Group] = true
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.resolve(ctx, c, s)
		r.mu.Lock()
		r.busy[c.Group] = false
		r.last[c.Group] = time.Now()
		r.mu.Unlock()
	}()
}

// Wait waits for resolutions in flight.
func (r *Resolver) Wait() { r.wg.Wait() }

func (r *Resolver) resolve(ctx context.Context, c Claim, s announce.Seen) {
	log := r.log.With("group", c.Group, "address", s.IP, "other_mac", s.MAC.String())
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	v := r.cfg.Confirm(cctx, c)
	cancel()
	ev := events.AddressConflict{
		Group: c.Group, Node: r.cfg.Node, Address: s.IP.String(), OwnMAC: r.cfg.OwnMAC, OtherMAC: s.MAC.String(),
		Epoch: c.Epoch, Holder: v.Holder, HolderEpoch: v.HolderEpoch, DetectedAt: s.At,
	}
	// The decision is taken on a context of its own: a yield must complete
	// even while the service is stopping (the stop releases anyway).
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if v.Confirmed {
		ev.Action, ev.Reason = events.ConflictKept, v.Reason
		if err := r.h.Reassert(actx, c.Group); err != nil {
			ev.Reason += "; re-announcing failed: " + err.Error()
		}
		log.Warn("address conflict: claim confirmed, keeping and re-announcing", "reason", v.Reason)
	} else {
		ev.Action, ev.Reason = events.ConflictYielded, v.Reason
		if err := r.h.Yield(actx, c.Group); err != nil {
			ev.Reason += "; yielding failed: " + err.Error()
			log.Error("address conflict: yield failed", "err", err)
		}
		log.Warn("address conflict: claim not confirmed, yielded", "reason", v.Reason)
	}
	if r.cfg.Report != nil {
		r.cfg.Report(ev)
	}
}
