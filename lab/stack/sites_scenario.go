package stack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/poll"
)

// Reporter receives a scenario's timeline: lines stamped with when they
// happened (the lab's own observations and the trail's events), and the
// moment of the fault, from which a printer may count. Its methods are
// called from more than one goroutine at once.
type Reporter interface {
	Fault(at time.Time)
	Line(at time.Time, who, text string)
}

// SitesReport is what the sites scenario saw, for the end-to-end test's
// assertions and the demo's figures.
type SitesReport struct {
	CheckBudget, TTL, Resync time.Duration

	FaultAt time.Time
	// Failover is the arbiter's decision to move the name to site B, its
	// claim's result (one state per DNS server), and when each was stored.
	Failover, Failback             *events.ArbiterDecision
	FailoverAt, FailbackAt         time.Time
	FailoverResult, FailbackResult *events.CommandResult
	// ClientOnB is when the client's resolver first answered site B's
	// address after the fault; ClientOnA the same for site A after the
	// failback window opened.
	ClientOnB, ClientOnA time.Time

	RestoreAt time.Time
	// Realigned is the DNS executor's correction of site A's server once
	// it answered again; AServesB when the witness, asking that server
	// directly, first saw site B's address.
	Realigned   *events.AddressCorrection
	RealignedAt time.Time
	AServesB    time.Time
	// SiteAUpAt is when the observer called site A up again; EarlyFailback
	// is any failback decided before the window opened.
	SiteAUpAt     time.Time
	EarlyFailback *events.ArbiterDecision
	WindowAt      time.Time
	// Trail is every event followed, in arrival order.
	Trail []Event
}

// FaultToClient is the fault to the client's first answer from site B.
func (r SitesReport) FaultToClient() time.Duration { return r.ClientOnB.Sub(r.FaultAt) }

// trail collects the events a follower hands it and wakes waiters.
type trail struct {
	mu      sync.Mutex
	evs     []Event
	changed chan struct{}
}

func newTrail() *trail { return &trail{changed: make(chan struct{})} }

func (t *trail) add(e Event) {
	t.mu.Lock()
	t.evs = append(t.evs, e)
	close(t.changed)
	t.changed = make(chan struct{})
	t.mu.Unlock()
}

// wait returns the first event after index from (in arrival order) that
// matches, and its index.
func (t *trail) wait(ctx context.Context, within time.Duration, what string, from int, match func(Event) bool) (Event, int, error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		t.mu.Lock()
		for i := from; i < len(t.evs); i++ {
			if match(t.evs[i]) {
				e := t.evs[i]
				t.mu.Unlock()
				return e, i, nil
			}
		}
		ch := t.changed
		t.mu.Unlock()
		select {
		case <-ctx.Done():
			return Event{}, 0, fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-ch:
		}
	}
}

func (t *trail) all() []Event {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.evs)
}

func (t *trail) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.evs)
}

// resultOf finds the result of the decision's last command (its claim).
func resultOf(d *events.ArbiterDecision) func(Event) bool {
	return func(e Event) bool {
		r, ok := e.Payload.(*events.CommandResult)
		return ok && len(d.Commands) > 0 && r.CommandID == d.Commands[len(d.Commands)-1]
	}
}

func decision(group string, action events.Action, to string) func(Event) bool {
	return func(e Event) bool {
		d, ok := e.Payload.(*events.ArbiterDecision)
		return ok && d.Group == group && d.Action == action && (to == "" || d.To == to) && len(d.Commands) > 0
	}
}

// RunSitesScenario runs the sites lab's story and reports it as it goes:
// site A's uplink is cut (its web and DNS servers dark), the name moves to
// site B (A's server unreachable, B's updated), the client's resolver
// answers site B once its cache expires; site A comes back, its DNS
// server is brought in line at once, and the name moves back only once a
// failback window opens.
func RunSitesScenario(ctx context.Context, s *Sites, r Reporter) (rep SitesReport, err error) {
	rep = SitesReport{CheckBudget: s.Opts.CheckBudget(), TTL: s.Opts.TTL, Resync: s.Opts.Resync}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tr := newTrail()
	defer func() { rep.Trail = tr.all() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		_ = s.FollowEvents(ctx, func(e Event) {
			tr.add(e)
			if who, text, ok := SiteEventLine(e); ok {
				r.Line(e.Env.Time, who, text)
			}
		})
	})
	client := &clientWatch{}
	wg.Go(func() { client.run(ctx, s, r) })

	// Placed on site A, and site B eligible: a failover has somewhere to go.
	pe, _, err := tr.wait(ctx, 60*time.Second, "the name placed on site A", 0, decision(SitesGroup, events.ActionPlace, SiteA))
	if err != nil {
		return rep, err
	}
	if _, _, err := tr.wait(ctx, 30*time.Second, "the placement's result", 0, resultOf(pe.Payload.(*events.ArbiterDecision))); err != nil {
		return rep, err
	}
	if _, _, err := tr.wait(ctx, 30*time.Second, "site B up", 0, func(e Event) bool {
		h, ok := e.Payload.(*events.HealthTransition)
		return ok && h.TargetNode == SiteB && h.Check == "site_b_up" && h.To == events.HealthUp
	}); err != nil {
		return rep, err
	}
	if _, err := client.answered(ctx, 30*time.Second, sites[0].webIP, time.Time{}); err != nil {
		return rep, fmt.Errorf("the client never resolved site A: %w", err)
	}
	sleepCtx(ctx, time.Second)

	from := tr.len()
	rep.FaultAt = time.Now()
	r.Fault(rep.FaultAt)
	r.Line(rep.FaultAt, "lab", "FAULT: site A loses its uplink: its web server and its DNS server go dark from everywhere else")
	if err := s.CutSite(SiteA); err != nil {
		return rep, err
	}
	fe, _, err := tr.wait(ctx, 30*time.Second, "the failover to site B", from, decision(SitesGroup, events.ActionFailover, SiteB))
	if err != nil {
		return rep, err
	}
	rep.Failover, rep.FailoverAt = fe.Payload.(*events.ArbiterDecision), fe.Env.Time
	re, _, err := tr.wait(ctx, 30*time.Second, "the failover's result", from, resultOf(rep.Failover))
	if err != nil {
		return rep, err
	}
	rep.FailoverResult = re.Payload.(*events.CommandResult)
	on, err := client.answered(ctx, rep.CheckBudget+rep.TTL+30*time.Second, sites[1].webIP, rep.FaultAt)
	if err != nil {
		return rep, fmt.Errorf("the client never resolved site B: %w", err)
	}
	rep.ClientOnB = on
	r.Line(on, "lab", fmt.Sprintf("RESULT: the client's resolver answered site B %v after the fault (the checks' budget %v + the TTL %v = %v)",
		rep.FaultToClient().Round(time.Millisecond), rep.CheckBudget, rep.TTL, rep.CheckBudget+rep.TTL))

	sleepCtx(ctx, time.Second)
	from = tr.len()
	rep.RestoreAt = time.Now()
	r.Line(rep.RestoreAt, "lab", "site A's uplink is back: its DNS server answers again, still serving site A's address")
	if err := s.RestoreSite(SiteA); err != nil {
		return rep, err
	}
	var watchA sync.WaitGroup
	watchA.Go(func() {
		// Not finding it is no failure of its own: the realignment's
		// event below is what the scenario requires.
		var serial uint32
		if poll.Until(ctx, rep.Resync+20*time.Second, "site A's DNS server serving site B", func() error {
			ip, sn, err := s.ServerServes(SiteA, 300*time.Millisecond)
			if err != nil {
				return err
			}
			if ip != sites[1].webIP {
				return fmt.Errorf("it serves %s", ip)
			}
			serial = sn
			return nil
		}) == nil {
			rep.AServesB = time.Now()
			r.Line(rep.AServesB, "lab", fmt.Sprintf("site A's DNS server, asked directly from the witness, serves %s (site B) at serial %d, %v after the uplink came back",
				sites[1].webIP, serial, rep.AServesB.Sub(rep.RestoreAt).Round(time.Millisecond)))
		}
	})
	ce, _, err := tr.wait(ctx, rep.Resync+20*time.Second, "site A's DNS server brought in line", from, func(e Event) bool {
		c, ok := e.Payload.(*events.AddressCorrection)
		return ok && c.Kind == events.CorrectionDNSRealigned && len(c.DNS) > 0 && strings.HasPrefix(c.DNS[0].Server, sites[0].dnsIP.String()+":")
	})
	watchA.Wait()
	if err != nil {
		return rep, err
	}
	rep.Realigned, rep.RealignedAt = ce.Payload.(*events.AddressCorrection), ce.Env.Time
	ue, _, err := tr.wait(ctx, 30*time.Second, "site A up again", from, func(e Event) bool {
		h, ok := e.Payload.(*events.HealthTransition)
		return ok && h.TargetNode == SiteA && h.Check == "site_a_up" && h.To == events.HealthUp
	})
	if err != nil {
		return rep, err
	}
	rep.SiteAUpAt = ue.Env.Time
	// Long enough for a failback to be due but for the window: site A
	// stable for stable_for, past the hold-down.
	wait := max(s.Opts.StableFor, s.Opts.HoldDown) + 2*time.Second
	r.Line(time.Now(), "lab", fmt.Sprintf("site A is up and stable; no failback window is open: waiting %v for a failback that must not come", wait))
	sleepCtx(ctx, wait)
	for _, e := range tr.all()[from:] {
		if d, ok := e.Payload.(*events.ArbiterDecision); ok && d.Group == SitesGroup && d.Action == events.ActionFailback {
			rep.EarlyFailback = d
		}
	}
	from = tr.len()
	rep.WindowAt = time.Now()
	r.Line(rep.WindowAt, "lab", "an operator opens a failback window (a one-off window in the scheduler's file, reloaded with SIGHUP)")
	if err := s.OpenFailbackWindow("tonight"); err != nil {
		return rep, err
	}
	be, _, err := tr.wait(ctx, 30*time.Second, "the failback to site A", from, decision(SitesGroup, events.ActionFailback, SiteA))
	if err != nil {
		return rep, err
	}
	rep.Failback, rep.FailbackAt = be.Payload.(*events.ArbiterDecision), be.Env.Time
	bre, _, err := tr.wait(ctx, 30*time.Second, "the failback's result", from, resultOf(rep.Failback))
	if err != nil {
		return rep, err
	}
	rep.FailbackResult = bre.Payload.(*events.CommandResult)
	on, err = client.answered(ctx, rep.TTL+30*time.Second, sites[0].webIP, rep.WindowAt)
	if err != nil {
		return rep, fmt.Errorf("the client never resolved site A again: %w", err)
	}
	rep.ClientOnA = on
	r.Line(on, "lab", fmt.Sprintf("RESULT: the name is back on site A, %v after the window opened", on.Sub(rep.WindowAt).Round(time.Millisecond)))
	return rep, nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// clientWatch asks the client's resolver every 100 ms, as a phone or a
// browser would, and records each change of answer.
type clientWatch struct {
	mu      sync.Mutex
	answers []clientAnswer
}

type clientAnswer struct {
	at   time.Time
	addr netip.Addr
}

func (c *clientWatch) run(ctx context.Context, s *Sites, r Reporter) {
	last := ""
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for ctx.Err() == nil {
		addr, ttl, err := s.Resolve(2 * time.Second)
		at := time.Now()
		now := "no answer from the resolver"
		if err == nil {
			now = fmt.Sprintf("%s A %s (%s)", SitesName, addr, orNone(SiteOfAddr(addr)))
			c.mu.Lock()
			c.answers = append(c.answers, clientAnswer{at, addr})
			c.mu.Unlock()
		}
		if now != last {
			if err == nil {
				r.Line(at, "client@c", fmt.Sprintf("%s, ttl %ds left", now, ttl))
			} else {
				r.Line(at, "client@c", now+": "+err.Error())
			}
			last = now
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// answered waits until the client got addr after since, and returns when
// it got it (the answer's own time, not when this noticed it).
func (c *clientWatch) answered(ctx context.Context, within time.Duration, addr netip.Addr, since time.Time) (time.Time, error) {
	var at time.Time
	err := poll.Until(ctx, within, "the client's resolver answering "+addr.String(), func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		var last *clientAnswer
		for i, a := range c.answers {
			if a.addr == addr && a.at.After(since) {
				at = a.at
				return nil
			}
			last = &c.answers[i]
		}
		if last == nil {
			return errors.New("no answer yet")
		}
		return fmt.Errorf("its last answer %s at %s", last.addr, last.at.Format("15:04:05.000"))
	})
	return at, err
}

func orNone(s string) string {
	if s == "" {
		return "no site"
	}
	return s
}

// SiteEventLine renders the events the sites scenario tells: the
// observer's health transitions, the arbiter's decisions and commands, the
// DNS executor's results (server by server) and corrections, failback
// permits. ok is false for the rest.
func SiteEventLine(e Event) (who, text string, ok bool) {
	who = e.Env.Source.Service + "@" + e.Env.Source.Node
	switch v := e.Payload.(type) {
	case *events.HealthTransition:
		return who, fmt.Sprintf("health.transition: %s %s %s->%s: %s", v.TargetNode, v.Check, v.From, v.To, short(v.Reason, 160)), true
	case *events.ArbiterDecision:
		if v.Action == events.ActionHold {
			return who, fmt.Sprintf("arbiter.decision: %s HOLD: %s", v.Group, short(v.Reason, 200)), true
		}
		return who, fmt.Sprintf("arbiter.decision: %s %s %s->%s: %s", v.Group, strings.ToUpper(string(v.Action)), orNone(v.From), v.To, short(v.Reason, 200)), true
	case *events.ClaimIP:
		return who, fmt.Sprintf("command.claim_ip: point %s at %s (from %s)", v.Group, v.Node, orNone(v.PreviousHolder)), true
	case *events.ReleaseIP:
		return who, fmt.Sprintf("command.release_ip: release %s on %s", v.Group, v.Node), true
	case *events.CommandResult:
		text := fmt.Sprintf("command.result: %s on %s %s", strings.TrimPrefix(string(v.CommandType), "command."), v.Node, v.Outcome)
		if v.Error != "" && len(v.DNS) == 0 {
			text += " (" + short(v.Error, 200) + ")"
		}
		for _, d := range v.DNS {
			text += "; " + DNSServerLine(d)
		}
		return who, text, true
	case *events.AddressCorrection:
		text := fmt.Sprintf("address.correction: %s", v.Kind)
		for _, d := range v.DNS {
			text += "; " + DNSServerLine(d)
		}
		if v.Reason != "" {
			text += " (" + short(v.Reason, 200) + ")"
		}
		return who, text, true
	case *events.FailbackPermit:
		return who, fmt.Sprintf("failback.permit: %s, window %s, until %s", v.Group, v.Window, v.ValidUntil.Format(time.TimeOnly)), true
	}
	return "", "", false
}

// DNSServerLine is one DNS server's state in a line.
func DNSServerLine(d events.DNSServerState) string {
	switch d.Outcome {
	case events.DNSUpdated, events.DNSAlreadyServed:
		return fmt.Sprintf("%s %s -> %s %s serial %d", d.Server, d.Outcome, d.Site, d.Records, d.Serial)
	}
	return fmt.Sprintf("%s %s (%s)", d.Server, d.Outcome, short(d.Error, 120))
}

func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
