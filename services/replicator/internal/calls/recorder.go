// Package calls records the calls this node's Asterisk has up, so that the
// node taking the group over after an unplanned failover can carry the
// ones that survive the PBX (pkg/events calls.go). It follows Asterisk's
// call events over its own AMI session (a queue apart from the
// registrations'), reads each bridged PJSIP leg's dialog and media with
// Getvar, and keeps one record per call in the bucket events.CallsBucket
// under events.CallKey while the call lasts. It reconciles its records
// with Asterisk's channels (CoreShowChannels) at start, on every new AMI
// connection or lost event, and every reconcile interval, and restates
// what it knows as an events.CallsSummary, which a planned move reads.
//
// Only the group's holder records calls it has not recorded yet: a node
// that does not hold the group is not where phones call, and its records
// would not be adopted. A node that stops holding while calls are up on it
// (a planned move) keeps the records it has while Asterisk keeps those
// calls, and deletes each when its call ends there: the new holder reads
// them to adopt the calls, and must not find them gone.
package calls

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Defaults and fixed timings.
const (
	DefaultReconcile    = 30 * time.Second
	DefaultSummaryEvery = 2 * time.Second
	// refreshEvery rewrites a record that has not changed, well within the
	// bucket's age (bus.CallsMaxAge), so a long call's record never ages
	// out while it lasts.
	refreshEvery = time.Hour
	// readers and writers bound the calls read and the records written
	// at once.
	readers = 4
	writers = 8
	// actionTimeout bounds one call's reads; snapshotTimeout one
	// reconcile's read of every channel.
	actionTimeout   = 3 * time.Second
	snapshotTimeout = 10 * time.Second
	// tick is how often due work (media re-reads, retries) is looked for.
	tick = 50 * time.Millisecond
	// eventBatch bounds the events taken between two looks at other work.
	eventBatch = 1024
)

// mediaSteps are when, after a call is read with its media through
// Asterisk, the media is read again: Asterisk re-INVITEs both phones to
// direct media within tens of milliseconds of the bridge (observed on
// Asterisk 22), so most calls are direct at their first read, and the few
// that go direct later are seen within a second of it. After the last
// step, the media is read again with every reconcile, and soon after a
// Hold or Unhold.
var mediaSteps = []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 4 * time.Second}

// afterHold is when a call's media is read again after a Hold or Unhold.
var afterHold = []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}

// Config is what a recorder needs.
type Config struct {
	Cluster, Group, Node string
	// AMI reaches this node's Asterisk; Events follows its call events
	// (a session of its own, logged in for EventMask, filtered to
	// EventNames).
	AMI    Actioner
	Events EventSource
	// Reconcile is how often every channel is read again, and every
	// call's media; 0 means DefaultReconcile.
	Reconcile time.Duration
	// SummaryEvery is how often the summary is restated; 0 means
	// DefaultSummaryEvery.
	SummaryEvery time.Duration
	// MaxCalls bounds the records this node keeps; 0 means
	// events.MaxCallsPerNode.
	MaxCalls int
	// OrphanGrace is how long a call a planned move left on this node is
	// left up when no node keeps it, from the moment the group status names
	// another holder; 0 means DefaultOrphanGrace.
	OrphanGrace time.Duration
	// Publish sends a summary (the service's outbox); nil sends none.
	Publish func(events.CallsSummary)
	// Now is the clock (tests); nil means time.Now.
	Now func() time.Time
}

// Recorder records this node's calls.
type Recorder struct {
	cfg Config
	bus *bus.Bus
	log *slog.Logger
	m   *metrics

	model *model
	calls map[string]*call // by bridge
	byKey map[string]*call // the same, by record key
	slots map[string]*slot // by key: what this node wants in the bucket
	// found are the records on the bus at start, until they are matched
	// with Asterisk's calls.
	found map[string]events.CallRecord
	kv    jetstream.KeyValue
	role  events.GroupStatus

	// plannedAt is the clock's time (unix nanoseconds) of the loop's last
	// plan pass: a test that proves nothing was started (a hang-up) waits
	// for a pass past the moment it would have been, not for a time it
	// guesses the loop takes.
	plannedAt atomic.Int64

	live        int  // keys with a record wanted
	matched     bool // the records found at start were matched with Asterisk's calls
	dirty       bool // the model changed since the calls were synced with it
	current     bool // reconciled since the last gap, and answering
	reconciling bool
	again       string // a reconcile's cause asked for while one runs
	reconAt     time.Time
	reconFails  int
	pinging     bool
	reading     int
	writing     int
	dropped     uint64
	lastRefused time.Time

	settings        settings
	settingsDue     bool // a reconcile succeeded since the settings were last read
	settingsReading bool

	// What a planned move left here (moved.go): since when the group
	// status names another holder; the kept records of the moved calls'
	// ids, by id (current once the watch's first values are in).
	otherSince  time.Time
	keptView    map[string]map[string]bool
	keptCurrent bool
	watchStop   context.CancelFunc
	watchGen    int
	keptFails   int
	hanging     int

	wg      sync.WaitGroup
	roleCh  chan events.GroupStatus
	snapCh  chan snapResult
	readCh  chan readResult
	mediaCh chan mediaResult
	writeCh chan writeResult
	pingCh  chan error
	kvCh    chan kvResult

	settingsCh chan settingsResult
	keptCh     chan keptUpdate
	verifyCh   chan verifyResult
	hangCh     chan hangResult
}

// call is one bridge of two channels.
type call struct {
	bridge, id, key string
	legs            [2]string // unique ids, the caller's first
	names           [2]string
	found           time.Time

	reading   bool
	read      bool
	dialog    [2]legDialog
	readFails int
	readAt    time.Time

	direct       bool
	directSince  time.Time
	wentDirect   bool // its media went direct after its first read, not yet stored so
	mediaReading bool
	mediaAt      time.Time
	mediaPlan    []time.Duration

	refused bool
	// rec is what this node wants stored for the call, gen its slot's
	// generation for it; nil while it has none.
	rec      *events.CallRecord
	gen      uint64
	recorded bool // its first record was stored
	storedAt time.Time

	moved movedState
}

// slot is one key of the bucket this node writes: what it wants there
// (nil: nothing) and what the bus acknowledged.
type slot struct {
	want     []byte
	gen      uint64
	stored   uint64
	inflight bool
	retryAt  time.Time
	failures int
}

type snapResult struct {
	cause string
	chans []snapChannel
	err   error
}

type readResult struct {
	bridge string
	legs   [2]string
	dialog [2]legDialog
	err    error
}

type mediaResult struct {
	bridge string
	legs   [2]string
	direct bool
	err    error
}

type writeResult struct {
	key string
	gen uint64
	del bool
	err error
}

type kvResult struct {
	kv      jetstream.KeyValue
	records map[string]events.CallRecord
	err     error
}

// New makes a recorder; Run starts it.
func New(cfg Config, b *bus.Bus, reg prometheus.Registerer, log *slog.Logger) *Recorder {
	if cfg.Reconcile <= 0 {
		cfg.Reconcile = DefaultReconcile
	}
	if cfg.SummaryEvery <= 0 {
		cfg.SummaryEvery = DefaultSummaryEvery
	}
	if cfg.MaxCalls <= 0 {
		cfg.MaxCalls = events.MaxCallsPerNode
	}
	if cfg.OrphanGrace <= 0 {
		cfg.OrphanGrace = DefaultOrphanGrace
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Recorder{cfg: cfg, bus: b, log: log.With("component", "calls"), m: newMetrics(reg),
		model: newModel(), calls: map[string]*call{}, byKey: map[string]*call{}, slots: map[string]*slot{},
		roleCh: make(chan events.GroupStatus, 1), snapCh: make(chan snapResult, 1), readCh: make(chan readResult, readers),
		mediaCh: make(chan mediaResult, readers), writeCh: make(chan writeResult, writers), pingCh: make(chan error, 1),
		kvCh: make(chan kvResult, 1), settingsCh: make(chan settingsResult, 1),
		keptCh: make(chan keptUpdate, 64), verifyCh: make(chan verifyResult, readers), hangCh: make(chan hangResult, hangers)}
}

// Run records until ctx ends. It fails only when it cannot follow the
// group's status; Asterisk or the bucket being away is waited out.
func (r *Recorder) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	roleErr := make(chan error, 1)
	go func() {
		key := events.GroupStatusKey(r.cfg.Cluster, r.cfg.Group)
		roleErr <- r.bus.WatchKV(ctx, []string{key}, func(_ string, value []byte, deleted bool, _ uint64) {
			var gs events.GroupStatus
			if deleted || json.Unmarshal(value, &gs) != nil {
				return
			}
			select {
			case <-r.roleCh:
			default:
			}
			r.roleCh <- gs
		})
	}()
	r.spawn(func() { r.openBucket(ctx, 0) })
	r.askReconcile("start")

	t := time.NewTicker(tick)
	defer t.Stop()
	summary := time.NewTicker(r.cfg.SummaryEvery)
	defer summary.Stop()
	interval := time.NewTicker(r.cfg.Reconcile)
	defer interval.Stop()
	evs, gaps := r.cfg.Events.Events(), r.cfg.Events.Gaps()
	for {
		select {
		case <-ctx.Done():
			r.wg.Wait()
			return nil
		case err := <-roleErr:
			if ctx.Err() != nil {
				continue
			}
			return fmt.Errorf("calls: follow the group's status: %w", err)
		case gs := <-r.roleCh:
			r.setRole(gs)
		case ev := <-evs:
			r.onEvent(ev)
			r.drain(evs, eventBatch)
		case <-gaps:
			r.current = false
			r.askReconcile("gap")
		case res := <-r.snapCh:
			// The events queued before the answer came are older than it.
			r.drain(evs, 0)
			r.onSnapshot(res)
		case res := <-r.readCh:
			r.reading--
			r.onRead(res)
		case res := <-r.mediaCh:
			r.reading--
			r.onMedia(res)
		case res := <-r.writeCh:
			r.writing--
			r.onWrite(res)
		case res := <-r.kvCh:
			r.onBucket(ctx, res)
		case res := <-r.settingsCh:
			r.onSettings(res)
		case u := <-r.keptCh:
			r.onKept(u)
		case res := <-r.verifyCh:
			r.onVerify(res)
		case res := <-r.hangCh:
			r.onHangup(res)
		case err := <-r.pingCh:
			r.pinging = false
			r.onPing(err)
		case <-summary.C:
			r.countDropped()
			if r.current && !r.pinging {
				r.pinging = true
				r.spawn(func() { r.ping(ctx) })
			}
		case <-interval.C:
			r.askReconcile("interval")
			r.rereadMedia()
		case <-t.C:
		}
		r.plan(ctx)
	}
}
