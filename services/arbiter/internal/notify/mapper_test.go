package notify

import (
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// trail builds envelopes as their producers would.
type trail struct {
	t *testing.T
	m *Mapper
}

func (tr trail) feed(service, node string, p events.Decoded, opts ...events.Option) (events.Envelope, []Event) {
	tr.t.Helper()
	env, err := events.New(events.Source{Service: service, Node: node}, "lab", p, opts...)
	if err != nil {
		tr.t.Fatal(err)
	}
	return env, tr.m.Map(env, p)
}

func (tr trail) move(action events.Action, from, to, prev string, epoch uint64) (claim events.Envelope, decision events.Envelope) {
	tr.t.Helper()
	cl := events.ClaimIP{Group: "pbx", Node: to, Addresses: []string{"198.51.100.10/24"}, NotAfter: time.Now().Add(time.Minute), PreviousHolder: prev}
	cenv, err := events.New(events.Source{Service: "arbiter", Node: "ctl"}, "lab", cl, events.WithEpoch(epoch))
	if err != nil {
		tr.t.Fatal(err)
	}
	denv, out := tr.feed("arbiter", "ctl", &events.ArbiterDecision{Group: "pbx", Action: action, From: from, To: to, Reason: string(action) + " to " + to,
		CausedBy: []string{cenv.ID}, Commands: []string{cenv.ID}}, events.WithEpoch(epoch))
	if len(out) != 0 {
		tr.t.Fatalf("a move decision told %+v", out)
	}
	tr.m.Map(cenv, &cl)
	return cenv, denv
}

func (tr trail) result(cmd events.Envelope, typ events.Type, node string, outcome events.Outcome) []Event {
	tr.t.Helper()
	r := events.CommandResult{CommandID: cmd.ID, CommandType: typ, Node: node, Group: "pbx", Outcome: outcome}
	if outcome != events.OutcomeApplied && outcome != events.OutcomeDuplicate {
		r.Error = "no"
	}
	_, out := tr.feed("ipmover", node, &r, events.CausedBy(cmd), events.WithEpoch(cmd.Epoch))
	return out
}

// resultUndecided feeds an applied claim's result whose decision is never
// read: nothing is told until decisionWait has passed.
func (tr trail) resultUndecided(cmd events.Envelope, node string) []Event {
	tr.t.Helper()
	if out := tr.result(cmd, events.TypeClaimIP, node, events.OutcomeApplied); len(out) != 0 {
		tr.t.Fatalf("told %+v before its decision", out)
	}
	if out := tr.m.Flush(); len(out) != 0 {
		tr.t.Fatalf("flushed %+v before decisionWait", out)
	}
	tr.m.now = func() time.Time { return time.Now().Add(decisionWait) }
	defer func() { tr.m.now = time.Now }()
	return tr.m.Flush()
}

// The arbiter publishes a claim at once and its decision through its
// outbox: a result read before the decision waits for it, and is told
// with its reason when it comes.
func TestHolderChangeWaitsForItsDecision(t *testing.T) {
	tr := trail{t: t, m: NewMapper("lab", []Group{{Name: "pbx", Nodes: []string{"n1", "n2"}, HealthCheck: "pbx", Holder: "n1"}})}
	cl := events.ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{"198.51.100.10/24"}, NotAfter: time.Now().Add(time.Minute)}
	cenv, _ := tr.feed("arbiter", "ctl", &cl, events.WithEpoch(4))
	if out := tr.result(cenv, events.TypeClaimIP, "n2", events.OutcomeApplied); len(out) != 0 {
		t.Fatalf("told %+v before its decision", out)
	}
	denv, out := tr.feed("arbiter", "ctl", &events.ArbiterDecision{Group: "pbx", Action: events.ActionFailover, From: "n1", To: "n2",
		Reason: "n1 down", CausedBy: []string{cenv.ID}, Commands: []string{cenv.ID}}, events.WithEpoch(4))
	if len(out) != 1 || out[0].Kind != KindHolderChange || out[0].Reason != "n1 down" || out[0].Decision != denv.ID ||
		out[0].Previous != "n1" || out[0].Holder != "n2" {
		t.Fatalf("decision told %+v", out)
	}
	tr.m.now = func() time.Time { return time.Now().Add(decisionWait) }
	if out := tr.m.Flush(); len(out) != 0 {
		t.Fatalf("told again at the flush: %+v", out)
	}
}

func TestHolderChanges(t *testing.T) {
	tr := trail{t: t, m: NewMapper("lab", []Group{{Name: "pbx", Nodes: []string{"n1", "n2", "n3"}, HealthCheck: "pbx"}})}
	c1, _ := tr.move(events.ActionPlace, "", "n1", "", 3)
	out := tr.result(c1, events.TypeClaimIP, "n1", events.OutcomeApplied)
	if len(out) != 1 || out[0].Holder != "n1" || out[0].Previous != "" || out[0].Epoch != 3 || out[0].Action != events.ActionPlace {
		t.Fatalf("placement told %+v", out)
	}
	if out := tr.result(c1, events.TypeClaimIP, "n1", events.OutcomeDuplicate); len(out) != 0 {
		t.Fatalf("a duplicate told %+v", out)
	}
	// Failover to n2, whose claim fails; then n3 takes it: one holder
	// change, from n1 (not from the failed claimant).
	c2, _ := tr.move(events.ActionFailover, "n1", "n2", "n1", 4)
	if out := tr.result(c2, events.TypeClaimIP, "n2", events.OutcomeFailed); len(out) != 0 {
		t.Fatalf("a failed claim told %+v", out)
	}
	c3, d3 := tr.move(events.ActionRetry, "n2", "n3", "n1", 4)
	out = tr.result(c3, events.TypeClaimIP, "n3", events.OutcomeApplied)
	if len(out) != 1 || out[0].Holder != "n3" || out[0].Previous != "n1" || out[0].Decision != d3.ID || out[0].Reason != "retry to n3" {
		t.Fatalf("retry told %+v", out)
	}
	// n3 released (switchover back to n1): the next holder change names n3.
	c4, _ := tr.move(events.ActionSwitchover, "n3", "n1", "n3", 5)
	rel, _ := events.New(events.Source{Service: "arbiter", Node: "ctl"}, "lab", events.ReleaseIP{Group: "pbx", Node: "n3",
		Addresses: []string{"198.51.100.10/24"}, NotAfter: time.Now().Add(time.Minute)}, events.WithEpoch(5))
	if out := tr.result(rel, events.TypeReleaseIP, "n3", events.OutcomeApplied); len(out) != 0 {
		t.Fatalf("a release told %+v", out)
	}
	out = tr.result(c4, events.TypeClaimIP, "n1", events.OutcomeApplied)
	if len(out) != 1 || out[0].Previous != "n3" || out[0].Epoch != 5 {
		t.Fatalf("switchover told %+v", out)
	}
}

// A mapper started after the move knows the previous holder from the
// claim; an event of another cluster or group is ignored.
func TestHolderChangeFromTheClaimAlone(t *testing.T) {
	tr := trail{t: t, m: NewMapper("lab", []Group{{Name: "pbx", Nodes: []string{"n1", "n2"}, HealthCheck: "pbx"}})}
	cl := events.ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{"198.51.100.10/24"}, NotAfter: time.Now().Add(time.Minute), PreviousHolder: "n1"}
	cenv, _ := tr.feed("arbiter", "ctl", &cl, events.WithEpoch(9))
	out := tr.resultUndecided(cenv, "n2")
	if len(out) != 1 || out[0].Previous != "n1" || out[0].Epoch != 9 || out[0].Reason != "" {
		t.Fatalf("told %+v", out)
	}
	// Seeded with the holder the group status names, a result alone
	// (claim and decision not read) still names the previous holder.
	seeded := trail{t: t, m: NewMapper("lab", []Group{{Name: "pbx", Nodes: []string{"n1", "n2"}, HealthCheck: "pbx", Holder: "n1"}})}
	out = seeded.resultUndecided(cenv, "n2")
	if len(out) != 1 || out[0].Previous != "n1" || out[0].Holder != "n2" {
		t.Fatalf("seeded mapper told %+v", out)
	}
	other := NewMapper("other", []Group{{Name: "pbx", Nodes: []string{"n2"}, HealthCheck: "pbx"}})
	if out := other.Map(cenv, &cl); len(out) != 0 {
		t.Fatalf("another cluster's event told %+v", out)
	}
}

func TestHealthOfTheGroupsChecks(t *testing.T) {
	tr := trail{t: t, m: NewMapper("lab", []Group{
		{Name: "pbx", Nodes: []string{"n1", "n2"}, HealthCheck: "pbx", PeerChecks: []string{"peer_sip"}},
		{Name: "dns", Nodes: []string{"site1"}, HealthCheck: "pbx", HealthFrom: map[string]HealthSource{"site1": {Observer: "mon", Check: "site1_dns"}}},
	})}
	ev := []events.Evidence{{At: time.Now(), OK: true}}
	h := func(node, check, target string, role events.Role) []Event {
		_, out := tr.feed("prober", node, &events.HealthTransition{Check: check, TargetNode: target, Role: role, From: events.HealthUnknown,
			To: events.HealthUp, Reason: "rose", Rise: 1, Fall: 1, Evidence: ev})
		return out
	}
	for _, c := range []struct {
		name                  string
		node, check, target   string
		role                  events.Role
		wantGroup, wantTarget string
	}{
		{"member's health check", "n1", "pbx", "n1", events.RoleSelf, "pbx", "n1"},
		{"another self check", "n1", "disk", "n1", events.RoleSelf, "", ""},
		{"a listed peer check", "n2", "peer_sip", "n1", events.RolePeer, "pbx", "n1"},
		{"an unlisted peer check", "n2", "peer_ami", "n1", events.RolePeer, "", ""},
		{"a non-member", "n9", "pbx", "n9", events.RoleSelf, "", ""},
		{"the observer's check of a prober-less member", "mon", "site1_dns", "site1", events.RolePeer, "dns", "site1"},
	} {
		out := h(c.node, c.check, c.target, c.role)
		switch {
		case c.wantGroup == "" && len(out) != 0:
			t.Errorf("%s: told %+v", c.name, out)
		case c.wantGroup != "" && (len(out) != 1 || out[0].Group != c.wantGroup || out[0].Node != c.wantTarget || out[0].Observer != c.node || out[0].Health != events.HealthUp):
			t.Errorf("%s: told %+v, want one for %s about %s", c.name, out, c.wantGroup, c.wantTarget)
		}
	}
}
