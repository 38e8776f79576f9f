package statuspage

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/cmd/internal/view"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
)

// EventView is one line of the timeline.
type EventView struct {
	ID      string      `json:"id"`
	Time    time.Time   `json:"time"`
	Type    events.Type `json:"type"`
	Cluster string      `json:"cluster"`
	Source  string      `json:"source"`
	Summary string      `json:"summary"`
	Epoch   uint64      `json:"epoch,omitempty"`
	// Causes are the events it names as causes: what explain walks.
	Causes []string `json:"causes,omitempty"`
	// Decision marks the arbiter's decisions and planned-move stages.
	Decision   bool `json:"decision,omitempty"`
	NeedsHuman bool `json:"needs_human,omitempty"`
}

func eventView(env events.Envelope, p events.Payload) EventView {
	v := EventView{ID: env.ID, Time: env.Time, Type: env.Type, Cluster: env.Cluster,
		Source: env.Source.Service + "@" + env.Source.Node, Summary: view.Summary(p), Epoch: env.Epoch, Causes: view.Causes(env, p)}
	switch d := p.(type) {
	case *events.ArbiterDecision:
		v.Decision, v.NeedsHuman = true, d.NeedsHuman
	case *events.PlannedMove, *events.GroupPin, *events.LeadersHold:
		v.Decision = true
	}
	return v
}

// Snapshot is what the page shows at the top: every group, its nodes and
// their checks, the situation lines and the failback windows.
type Snapshot struct {
	// Now is the page server's clock, so the browser says "ago" from it.
	Now    time.Time             `json:"now"`
	Groups []GroupView           `json:"groups"`
	Notes  []string              `json:"notes"`
	Plans  []events.SchedulePlan `json:"plans"`
	// Holds are the operators' leaders holds in force (fanctl leaders hold).
	Holds []events.LeadersHoldRecord `json:"holds"`
	// TimelineMax is how many events the timeline keeps.
	TimelineMax int `json:"timeline_max"`
	// Error says why the status could not be read (the bus is away).
	Error string `json:"error,omitempty"`
}

// GroupView is one group's status record and its nodes in priority order.
type GroupView struct {
	Cluster string             `json:"cluster"`
	Status  events.GroupStatus `json:"status"`
	Nodes   []NodeView         `json:"nodes"`
}

// NodeView is one node of a group as the arbiter sees it, when the bus
// last stored its heartbeat, and the checks every prober reports on it.
type NodeView struct {
	Name string `json:"name"`
	events.NodeStatus
	LastHeard time.Time   `json:"last_heard,omitzero"`
	Checks    []CheckView `json:"checks"`
	// Calls is the holder's latest calls summary of the group (what it has
	// up, what a move would carry across, the settings that keep calls
	// from surviving), with CallsAt when the bus stored it; absent for
	// the other nodes, and when the holder's replicator records no calls.
	Calls   *events.CallsSummary `json:"calls,omitempty"`
	CallsAt time.Time            `json:"calls_at,omitzero"`
}

// CheckView is one check's state as the latest heartbeat of the prober
// that runs it says.
type CheckView struct {
	Check      string        `json:"check"`
	Prober     string        `json:"prober"`
	Role       events.Role   `json:"role"`
	Health     events.Health `json:"health"`
	Since      time.Time     `json:"since,omitzero"`
	SinceEvent string        `json:"since_event,omitempty"`
}

// buildSnapshot composes the snapshot from the status records and plans
// the hub holds and the live stream's latest heartbeats, with what
// fanctl status computes (view).
func buildSnapshot(ctx context.Context, b *bus.Bus, records []view.Keyed[events.GroupStatus], plans []events.SchedulePlan,
	holds []view.Keyed[events.LeadersHoldRecord], now time.Time) Snapshot {
	beats := view.Heartbeats(ctx, b, records)
	heard := view.LastHeard(records, beats)
	calls := view.CallsSummaries(ctx, b, records)
	snap := Snapshot{Now: now, Groups: []GroupView{}, Plans: plans}
	groups := make([]events.GroupStatus, 0, len(records))
	for _, r := range records {
		g := r.Value
		groups = append(groups, g)
		cluster := view.ClusterOfKey(r.Key)
		gv := GroupView{Cluster: cluster, Status: g}
		for _, n := range view.NodesByPriority(g) {
			nv := NodeView{Name: n, NodeStatus: g.Nodes[n], LastHeard: view.Seen(g, heard, n), Checks: []CheckView{}}
			if h, ok := calls[view.HeardKey(cluster, n)]; ok && n == g.Holder && h.Summary.Group == g.Group {
				nv.Calls, nv.CallsAt = h.Summary, h.At
			}
			for _, prober := range view.NodesByPriority(g) {
				h, ok := beats[view.HeardKey(cluster, prober)]
				if !ok {
					continue
				}
				for name, c := range h.Beat.Checks {
					if c.TargetNode == n {
						nv.Checks = append(nv.Checks, CheckView{Check: name, Prober: prober, Role: c.Role, Health: c.Health,
							Since: c.Since, SinceEvent: c.SinceEvent})
					}
				}
			}
			sort.Slice(nv.Checks, func(i, j int) bool {
				a, b := nv.Checks[i], nv.Checks[j]
				if a.Prober != b.Prober {
					return a.Prober < b.Prober
				}
				return a.Check < b.Check
			})
			gv.Nodes = append(gv.Nodes, nv)
		}
		snap.Groups = append(snap.Groups, gv)
	}
	snap.Notes = append(view.Notes(groups, heard, now), view.CallNotes(records, calls, now)...)
	snap.Notes = append(snap.Notes, view.HoldNotes(holds, now)...)
	snap.Holds = []events.LeadersHoldRecord{}
	for _, h := range holds {
		if h.Value.InForce(now) {
			snap.Holds = append(snap.Holds, h.Value)
		}
	}
	sort.Strings(snap.Notes)
	if snap.Notes == nil {
		snap.Notes = []string{}
	}
	if snap.Plans == nil {
		snap.Plans = []events.SchedulePlan{}
	}
	return snap
}

// message is one server-sent event.
type message struct {
	event string
	data  []byte
}

// client is one open live stream. Its channel is closed when the hub drops
// it (too slow to keep up, or the hub stops); the browser reconnects and
// is sent the whole timeline again.
type client struct {
	ch chan message
}

// clientQueue is how many messages a client may fall behind by.
const clientQueue = 256

// hub reads the bus once for every browser: the audit stream for the
// timeline (bus.Watch) and the state bucket's status records and plans
// (bus.WatchKV), and passes both on to every open live stream.
type hub struct {
	b       *bus.Bus
	cluster string
	cfg     Config
	log     *slog.Logger

	refresh chan struct{}

	// hist is what the page's charts draw (history.go).
	hist *history

	mu     sync.Mutex
	ring   []message // the timeline, oldest first, at most cfg.TimelineMax
	status map[string]events.GroupStatus
	plans  map[string]events.SchedulePlan
	holds  map[string]events.LeadersHoldRecord
	// statusHeard is set once the state bucket's watch has delivered a
	// group status: until then an empty status map means "not read yet",
	// not "no arbiter has written one" (the watch's consumer waits for the
	// NATS meta leader, which may be moving while the page starts).
	statusHeard bool
	snap        *message
	clients     map[*client]struct{}
	stopped     bool
}

func newHub(b *bus.Bus, cluster string, cfg Config, log *slog.Logger) *hub {
	return &hub{b: b, cluster: cluster, cfg: cfg, log: log, refresh: make(chan struct{}, 1), hist: newHistory(),
		status: map[string]events.GroupStatus{}, plans: map[string]events.SchedulePlan{}, holds: map[string]events.LeadersHoldRecord{},
		clients: map[*client]struct{}{}}
}

// auditSubjects are the timeline's subjects: the audit stream's events
// and the copies of commands.
func auditSubjects(cluster string) []string {
	if cluster == "" {
		return []string{events.AllEvents(), events.AllCommands()}
	}
	return []string{events.ClusterEvents(cluster), events.ClusterCommands(cluster)}
}

// historySubjects are what the charts read from the audit stream: the
// decisions, the executors' results, the health transitions and the pins.
func historySubjects(cluster string) []string {
	c := cluster
	if c == "" {
		c = "*"
	}
	return []string{events.DecisionSubject(c, "*"), events.AllCommandResults(c), events.AllHealth(c), events.PinSubject(c, "*")}
}

// holdKeys is the state-bucket key of the leaders hold of the page's
// cluster (of every cluster when it shows them all).
func holdKeys(cluster string) string {
	if cluster == "" {
		return events.LeadersHoldKey("*")
	}
	return events.LeadersHoldKey(cluster)
}

// run follows the bus until ctx ends, then drops every client.
func (h *hub) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(5)
	go func() {
		defer wg.Done()
		opts := bus.WatchOptions{Subjects: historySubjects(h.cluster), Since: time.Now().Add(-historySpan)}
		if err := h.b.Watch(ctx, opts, h.hist.onAudit); err != nil && ctx.Err() == nil {
			h.log.Error("status page: the history stopped", "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		c := h.cluster
		if c == "" {
			c = "*"
		}
		opts := bus.WatchOptions{Subjects: []string{events.AllHeartbeats(c)}, Since: time.Now().Add(-seriesSpan)}
		if err := h.b.Watch(ctx, opts, h.hist.onLive); err != nil && ctx.Err() == nil {
			h.log.Error("status page: the nodes' charts stopped", "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		opts := bus.WatchOptions{Subjects: auditSubjects(h.cluster), Since: time.Now().Add(-h.cfg.Timeline.D())}
		if err := h.b.Watch(ctx, opts, h.onEvent); err != nil && ctx.Err() == nil {
			h.log.Error("status page: the timeline stopped", "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		keys := []string{view.StatusFilter(h.cluster), view.ScheduleFilter(h.cluster), holdKeys(h.cluster)}
		if err := h.b.WatchKV(ctx, keys, h.onKey); err != nil && ctx.Err() == nil {
			h.log.Error("status page: the status stopped", "err", err)
		}
	}()
	go func() {
		defer wg.Done()
		t := time.NewTicker(h.cfg.Refresh.D())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-h.refresh:
			case <-t.C:
			}
			h.publishSnapshot(ctx)
		}
	}()
	<-ctx.Done()
	wg.Wait()
	h.mu.Lock()
	h.stopped = true
	for c := range h.clients {
		close(c.ch)
		delete(h.clients, c)
	}
	h.mu.Unlock()
}

func (h *hub) onEvent(env events.Envelope, p events.Decoded, _ uint64) {
	data, err := json.Marshal(eventView(env, p))
	if err != nil {
		h.log.Warn("status page: an event does not encode", "id", env.ID, "err", err)
		return
	}
	m := message{event: "event", data: data}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ring = append(h.ring, m)
	if over := len(h.ring) - h.cfg.TimelineMax; over > 0 {
		h.ring = append(h.ring[:0:0], h.ring[over:]...)
	}
	h.broadcastLocked(m)
}

func (h *hub) onKey(key string, value []byte, deleted bool, _ uint64) {
	h.mu.Lock()
	switch {
	case strings.HasPrefix(key, events.StateKeyPrefix+"."):
		h.statusHeard = true
		var g events.GroupStatus
		if deleted || json.Unmarshal(value, &g) != nil {
			delete(h.status, key)
		} else {
			h.status[key] = g
		}
	case strings.HasPrefix(key, "arbiter."):
		var r events.LeadersHoldRecord
		if deleted || json.Unmarshal(value, &r) != nil {
			delete(h.holds, key)
		} else {
			h.holds[key] = r
		}
	default:
		var p events.SchedulePlan
		if deleted || json.Unmarshal(value, &p) != nil {
			delete(h.plans, key)
		} else {
			h.plans[key] = p
		}
	}
	h.mu.Unlock()
	select {
	case h.refresh <- struct{}{}:
	default:
	}
}

// current is the latest snapshot; before the first one is made, one made now.
func (h *hub) current(ctx context.Context) []byte {
	h.mu.Lock()
	snap := h.snap
	h.mu.Unlock()
	if snap != nil {
		return snap.data
	}
	return h.publishSnapshot(ctx)
}

// publishSnapshot builds the snapshot from what the hub holds and sends it
// to every client.
func (h *hub) publishSnapshot(ctx context.Context) []byte {
	h.mu.Lock()
	keys := make([]string, 0, len(h.status))
	for k := range h.status {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	records := make([]view.Keyed[events.GroupStatus], 0, len(keys))
	for _, k := range keys {
		records = append(records, view.Keyed[events.GroupStatus]{Key: k, Value: h.status[k]})
	}
	pkeys := make([]string, 0, len(h.plans))
	for k := range h.plans {
		pkeys = append(pkeys, k)
	}
	sort.Strings(pkeys)
	plans := make([]events.SchedulePlan, 0, len(pkeys))
	for _, k := range pkeys {
		plans = append(plans, h.plans[k])
	}
	holds := make([]view.Keyed[events.LeadersHoldRecord], 0, len(h.holds))
	for k, r := range h.holds {
		holds = append(holds, view.Keyed[events.LeadersHoldRecord]{Key: k, Value: r})
	}
	sort.Slice(holds, func(i, j int) bool { return holds[i].Key < holds[j].Key })
	heard := h.statusHeard
	h.mu.Unlock()

	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var readErr error
	if len(records) == 0 && !heard {
		// The watch has not caught up: read the records as fanctl status
		// does rather than tell the operator no arbiter is leading.
		records, readErr = view.Records[events.GroupStatus](rctx, h.b, view.StatusFilter(h.cluster))
	}
	snap := buildSnapshot(rctx, h.b, records, plans, holds, time.Now())
	snap.TimelineMax = h.cfg.TimelineMax
	switch {
	case readErr != nil:
		snap.Error = fmt.Sprintf("the group status is not read yet: %v", readErr)
	case len(records) == 0:
		snap.Error = "no group status yet (is an arbiter leading?)"
	}
	data, err := json.Marshal(snap)
	if err != nil {
		h.log.Warn("status page: the status does not encode", "err", err)
		return []byte(`{"error":"the status does not encode"}`)
	}
	m := message{event: "status", data: data}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.snap = &m
	h.broadcastLocked(m)
	return data
}

// broadcastLocked queues m for every client; one that is too far behind is
// dropped rather than waited for.
func (h *hub) broadcastLocked(m message) {
	for c := range h.clients {
		select {
		case c.ch <- m:
		default:
			close(c.ch)
			delete(h.clients, c)
		}
	}
}

// join registers a client and returns what it is sent first: the latest
// snapshot and the timeline so far. ok is false when the hub has stopped
// or max clients are open.
func (h *hub) join() (c *client, backlog []message, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped || len(h.clients) >= h.cfg.MaxClients {
		return nil, nil, false
	}
	c = &client{ch: make(chan message, clientQueue)}
	h.clients[c] = struct{}{}
	if h.snap != nil {
		backlog = append(backlog, *h.snap)
	}
	backlog = append(backlog, h.ring...)
	return c, backlog, true
}

// leave unregisters a client that went away.
func (h *hub) leave(c *client) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.clients[c]; ok {
		close(c.ch)
		delete(h.clients, c)
	}
}
