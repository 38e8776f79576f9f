package statuspage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/fanpbx/fan/cmd/internal/statuspage"
	"github.com/fanpbx/fan/pkg/events"
	"github.com/fanpbx/fan/pkg/platform/bus"
	"github.com/fanpbx/fan/pkg/platform/bus/bustest"
	"github.com/fanpbx/fan/pkg/platform/waittest"
)

// knownTrail is a week of a group's life, published as the services
// publish it, with what the charts must draw from it.
type knownTrail struct {
	// Moves24h and Moves7d are the moves on each strip.
	Moves24h, Moves7d int
	// Failovers are the failover decisions, oldest first, and TotalMS
	// their times from the first failing probe to pbx_answering.
	Failovers []string
	TotalMS   []int
	// Switchover is the operator's move, a mark on both strips.
	Switchover string
	// Channels is n1's active channels in its last heartbeat.
	Channels int
}

// publishKnownTrail publishes, in the order the bus would have stored
// them: n1 placed 3 days ago; a failover to n2 30 hours ago (probes failing
// from the fault on, the verdict 400 ms later, the decision 2 ms after,
// Asterisk answering on n2 12 ms after that); an operator's switchover back
// to n1 two hours ago, pinning it; a failover to n2 an hour ago (600, 1 and
// 20 ms; its decision cites the group check's transition, whose cause, the
// member's, holds the probes), which ends the pin; and the nodes'
// heartbeats.
func (p *page) publishKnownTrail(now time.Time) knownTrail {
	p.t.Helper()
	ctx := context.Background()
	exec := map[string]*bus.Bus{}
	for _, n := range []string{"n1", "n2"} {
		exec[n] = bustest.Connect(p.t, p.srv, bus.Identity{Cluster: "lab", Service: "ipmover", Node: n})
	}
	emit := func(b *bus.Bus, pl events.Payload, at time.Time, opts ...events.Option) events.Envelope {
		p.t.Helper()
		env, err := b.Emit(ctx, pl, append(opts, events.At(at), events.WithEpoch(1))...)
		if err != nil {
			p.t.Fatal(err)
		}
		return env
	}
	var tr knownTrail
	claims := 0
	// move publishes a decision, its claim's id, and the claim's result on
	// to, answering answerAfter after the decision.
	move := func(action events.Action, from, to string, at time.Time, answerAfter time.Duration, causes ...string) events.Envelope {
		claims++
		claimID := fmt.Sprintf("0193a1b2-0000-7000-8000-%012x", 0xc1a100+claims)
		if len(causes) == 0 {
			causes = []string{"0193a1b2-0000-7000-8000-00000000cafe"}
		}
		d := emit(p.arb, events.ArbiterDecision{Group: "pbx", Action: action, From: from, To: to, Reason: string(action) + " to " + to,
			CausedBy: causes, Commands: []string{claimID}}, at)
		received := at.Add(3 * time.Millisecond)
		answered := at.Add(answerAfter)
		emit(exec[to], events.CommandResult{CommandID: claimID, CommandType: events.TypeClaimIP, Node: to, Group: "pbx", Outcome: events.OutcomeApplied,
			Steps: []events.Step{{Name: "received", At: received}, {Name: "address_added", At: answered.Add(-time.Millisecond),
				ElapsedMS: float64(answered.Add(-time.Millisecond).Sub(received).Microseconds()) / 1000},
				{Name: "pbx_answering", At: answered, ElapsedMS: float64(answered.Sub(received).Microseconds()) / 1000},
				{Name: "pbx_verified", At: answered.Add(time.Millisecond), ElapsedMS: float64(answered.Add(time.Millisecond).Sub(received).Microseconds()) / 1000}}},
			answered.Add(2*time.Millisecond))
		return d
	}
	// failover: the holder's probes fail from fault on, every step apart,
	// three in a row make the verdict; the decision decide later; Asterisk
	// answers act after it.
	// With grouped, the decision cites a group check's transition caused
	// by the member's, as a prober with a group check publishes them: the
	// group's evidence is the members' state at the verdict, the probes
	// are in the member's.
	failover := func(from, to string, fault time.Time, step, decide, act time.Duration, grouped bool) {
		verdict := fault.Add(2 * step)
		t := emit(p.probes[from], events.HealthTransition{Check: "ami", TargetNode: from, Role: events.RoleSelf, From: events.HealthUp,
			To: events.HealthDown, Reason: "3 consecutive failures", Consecutive: 3, Rise: 2, Fall: 3,
			Evidence: []events.Evidence{{At: fault, Error: "refused", ErrorClass: events.ErrorRefused},
				{At: fault.Add(step), Error: "refused", ErrorClass: events.ErrorRefused},
				{At: verdict, Error: "refused", ErrorClass: events.ErrorRefused}}}, verdict)
		if grouped {
			t = emit(p.probes[from], events.HealthTransition{Check: "asterisk", TargetNode: from, Role: events.RoleSelf, From: events.HealthUp,
				To: events.HealthDown, Reason: "0 of 1 up, need 1: ami down", Consecutive: 1, Rise: 1, Fall: 1,
				Evidence: []events.Evidence{{At: verdict, Error: "ami is down"}}}, verdict, events.CausedBy(t))
		}
		d := move(events.ActionFailover, from, to, verdict.Add(decide), act, t.ID)
		tr.Failovers = append(tr.Failovers, d.ID)
		tr.TotalMS = append(tr.TotalMS, int((2*step + decide + act).Milliseconds()))
	}
	move(events.ActionPlace, "", "n1", now.Add(-72*time.Hour), 10*time.Millisecond)
	failover("n1", "n2", now.Add(-30*time.Hour), 200*time.Millisecond, 2*time.Millisecond, 12*time.Millisecond, false)
	sw := move(events.ActionSwitchover, "n2", "n1", now.Add(-2*time.Hour), 15*time.Millisecond)
	tr.Switchover = sw.ID
	pin := events.PinFacts{Node: "n1", Operator: "alice", Reason: "back after the test", RequestID: "0193a1b2-0000-7000-8000-0000000000a1",
		ActionID: "0193a1b2-0000-7000-8000-0000000000a2", Since: now.Add(-2 * time.Hour)}
	emit(p.arb, events.GroupPin{Group: "pbx", Stage: events.PinStarted, PinFacts: pin, Why: "switchover by alice", CausedBy: []string{sw.ID}}, pin.Since)
	failover("n1", "n2", now.Add(-time.Hour), 300*time.Millisecond, time.Millisecond, 20*time.Millisecond, true)
	emit(p.arb, events.GroupPin{Group: "pbx", Stage: events.PinEnded, End: events.PinFailed, PinFacts: pin, Why: "n1 failed",
		CausedBy: []string{tr.Failovers[1]}}, now.Add(-time.Hour+601*time.Millisecond))
	tr.Moves24h, tr.Moves7d = 2, 4
	tr.Channels = 2
	for _, n := range []string{"n1", "n2"} {
		ch := 0
		if n == "n1" {
			ch = tr.Channels
		}
		for i := 3; i >= 0; i-- {
			c := ch
			if i > 0 {
				c = ch + i // more calls earlier in the hour
			}
			emit(p.probes[n], events.NodeHeartbeat{Node: n, Seq: uint64(10 - i), IntervalMS: 1000, Version: "test", ActiveChannels: &c,
				CPUPercent: 12.5 + float64(i), MemTotalBytes: 8 << 30, MemAvailableBytes: 6 << 30}, now.Add(-time.Duration(i)*10*time.Minute))
		}
	}
	return tr
}

// TestHistoryAPI: api/history draws the known trail: the holders, the
// moves within each range, the failovers' times and the nodes' channels.
func TestHistoryAPI(t *testing.T) {
	p := startPage(t, statuspageConfig())
	now := time.Now()
	tr := p.publishKnownTrail(now)
	var h struct {
		Groups []struct {
			Group    string `json:"group"`
			Segments []struct {
				Node string    `json:"node"`
				To   time.Time `json:"to"`
			} `json:"segments"`
			Moves []struct {
				ID string    `json:"id"`
				At time.Time `json:"at"`
			} `json:"moves"`
			Pins []struct {
				Node string        `json:"node"`
				End  events.PinEnd `json:"end"`
			} `json:"pins"`
			Failovers []struct {
				ID         string  `json:"id"`
				TotalMS    float64 `json:"total_ms"`
				DetectMS   float64 `json:"detect_ms"`
				ActMS      float64 `json:"act_ms"`
				FaultKnown bool    `json:"fault_known"`
				AnsweredBy string  `json:"answered_by"`
			} `json:"failovers"`
		} `json:"groups"`
		Nodes []struct {
			Node string `json:"node"`
			Last struct {
				Channels *int `json:"channels"`
			} `json:"last"`
			Points []struct{} `json:"points"`
		} `json:"nodes"`
	}
	waitJSON(t, p, "api/history", &h, func() bool {
		if len(h.Groups) != 1 || len(h.Groups[0].Failovers) != 2 || len(h.Groups[0].Pins) != 1 || h.Groups[0].Pins[0].End == "" || len(h.Nodes) != 2 {
			return false
		}
		// Every node's heartbeats of the trail have reached the page.
		for _, n := range h.Nodes {
			if len(n.Points) < 4 {
				return false
			}
		}
		return true
	})
	g := h.Groups[0]
	if len(g.Moves) != tr.Moves7d || len(g.Segments) != 4 || g.Segments[3].Node != "n2" || !g.Segments[3].To.IsZero() {
		t.Errorf("moves %d (want %d), segments %+v", len(g.Moves), tr.Moves7d, g.Segments)
	}
	for i, f := range g.Failovers {
		if f.ID != tr.Failovers[i] || int(f.TotalMS+0.5) != tr.TotalMS[i] || !f.FaultKnown || f.AnsweredBy != "pbx_answering" {
			t.Errorf("failover %d: %+v, want %s in %d ms", i, f, tr.Failovers[i], tr.TotalMS[i])
		}
	}
	if g.Pins[0].Node != "n1" || g.Pins[0].End != events.PinFailed {
		t.Errorf("pin %+v", g.Pins[0])
	}
	for _, n := range h.Nodes {
		want := 0
		if n.Node == "n1" {
			want = tr.Channels
		}
		if n.Last.Channels == nil || *n.Last.Channels != want || len(n.Points) < 4 {
			t.Errorf("node %s: last channels %v, %d points", n.Node, n.Last.Channels, len(n.Points))
		}
	}
}

func statuspageConfig() statuspage.Config { return statuspage.Config{} }

// waitJSON reads rel (with the token) into v until ok says it is complete.
func waitJSON(t *testing.T, p *page, rel string, v any, ok func() bool) {
	t.Helper()
	waittest.Succeeds(t, 15*time.Second, rel+" answering what the test waits for", func() error {
		resp := p.get(rel, bearer(testToken))
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode == http.StatusOK && json.Unmarshal(body, v) == nil && ok() {
			return nil
		}
		return fmt.Errorf("%s %v\n%s", resp.Status, err, body)
	})
}
