package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files")

var (
	goldenTime = time.Date(2026, 11, 30, 2, 30, 0, 0, time.UTC)
	goldenSrc  = Source{Service: "arbiter", Node: "ctl1"}
	intp       = func(v int) *int { return &v }
	strp       = func(v string) *string { return &v }
)

// sampleSet holds one valid payload of every type; TestGoldenCoversEveryType
// fails when a type is added without one. Test files for payloads defined
// in their own files add theirs with addSamples in an init.
var sampleSet = map[Type]Payload{}

func addSamples(m map[Type]Payload) {
	for k, v := range m {
		sampleSet[k] = v
	}
}

func samples() map[Type]Payload { return sampleSet }

func init() {
	addSamples(map[Type]Payload{
		TypeProbeResult: ProbeResult{Check: "pbx", Kind: "ami", Target: "127.0.0.1:5038", TargetNode: "n1", Role: RoleSelf,
			OK: false, DurationMS: 200, Error: "action Command: deadline exceeded", ErrorClass: ErrorTimeout, At: goldenTime},
		TypeHealthTransition: HealthTransition{Check: "pbx", TargetNode: "n1", Role: RoleSelf, From: HealthUp, To: HealthDown,
			Reason: "3 consecutive failures (fall 3)", Consecutive: 3, Rise: 2, Fall: 3,
			Evidence: []Evidence{{At: goldenTime, OK: false, DurationMS: 200, Error: "timeout", ErrorClass: ErrorTimeout}}},
		TypeNodeHeartbeat: NodeHeartbeat{Node: "n1", Seq: 42, IntervalMS: 2000, CPUPercent: 3.5, MemAvailableBytes: 1 << 30,
			MemTotalBytes: 4 << 30, Load1: 0.25, UptimeSeconds: 3600, ActiveChannels: intp(2), ActiveCalls: intp(1), Version: "0.1.0",
			Checks:        map[string]CheckState{"pbx": {TargetNode: "n1", Role: RoleSelf, Health: HealthUp, Since: goldenTime}},
			PBXSystemName: strp("pbx")},
		TypeArbiterDecision: ArbiterDecision{Group: "pbx", Action: ActionFailover, From: "n1", To: "n2",
			Reason:   "holder n1 down (pbx), n2 healthy; n1 had 3 calls up by its calls summary: 2 to carry across, 1 lost (1 anchored)",
			CausedBy: []string{"0193a1b2-0000-7000-8000-000000000001", "0193a1b2-0000-7000-8000-000000000004"},
			Commands: []string{"0193a1b2-0000-7000-8000-000000000002"},
			Trigger:  TriggerEvent, Input: "0193a1b2-0000-7000-8000-000000000001",
			Calls: &HolderCalls{Node: "n1", Summary: "0193a1b2-0000-7000-8000-000000000004", At: goldenTime, Channels: 7, CarriedChannels: 4,
				Calls: 3, Carriable: 2, Anchored: 1}},
		TypeClaimIP: ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{"198.51.100.10/24"}, NotAfter: goldenTime.Add(10 * time.Second),
			PreviousHolder: "n1", PreviousHolderFenced: true, AfterReleases: []string{"0193a1b2-0000-7000-8000-000000000003"}},
		TypeReleaseIP: ReleaseIP{Group: "pbx", Node: "n1", Addresses: []string{"198.51.100.10/24"}, NotAfter: goldenTime.Add(10 * time.Second),
			Reason: "failover to n2"},
		TypeAnswerPBX: AnswerPBX{Group: "pbx", Node: "n2", Mode: AnswerReload, Modules: []string{"res_pjsip.so"}, NotAfter: goldenTime.Add(10 * time.Second)},
		TypeCommandResult: CommandResult{CommandID: "0193a1b2-0000-7000-8000-000000000002", CommandType: TypeClaimIP, Node: "n2", Group: "pbx",
			Outcome: OutcomeApplied, Steps: []Step{{Name: "received", At: goldenTime}, {Name: "address_added", At: goldenTime.Add(time.Millisecond), ElapsedMS: 1}},
			Calls: &CallsAdoption{Adopted: 3, NotAdopted: map[string]int{NotAdoptedAnchored: 1, NotAdoptedIncomplete: 1}, From: []string{"n1"}}},
		TypeFailbackPermit: FailbackPermit{Group: "pbx", Window: "nightly", ValidFrom: goldenTime, ValidUntil: goldenTime.Add(time.Minute)},
		TypeReplicationStatus: ReplicationStatus{Node: "n1", Peer: "n2", Tree: "/etc/asterisk", Files: 12, Bytes: 4096, DurationMS: 35,
			LagMS: 120, CaughtUp: true},
		TypeServiceAnnounce: ServiceAnnounce{Service: "prober", Node: "n1", Version: "0.1.0", State: ServiceStarted},
	})
}

func goldenEnvelope(t *testing.T, p Payload) Envelope {
	t.Helper()
	opts := []Option{WithID("0193a1b2-0000-7000-8000-0000000000aa"), At(goldenTime),
		CausedByID("0193a1b2-0000-7000-8000-000000000001", "0193a1b2-0000-7000-8000-000000000000")}
	if _, ok := p.(epochCarrier); ok {
		opts = append(opts, WithEpoch(7))
	}
	e, err := New(goldenSrc, "lab", p, opts...)
	if err != nil {
		t.Fatalf("New(%s): %v", p.EventType(), err)
	}
	return e
}

func TestGoldenCoversEveryType(t *testing.T) {
	s := samples()
	for _, typ := range Types() {
		if _, ok := s[typ]; !ok {
			t.Errorf("type %s has no golden sample", typ)
		}
	}
}

// TestGolden pins the wire form of every type: a change shows up in review as
// a changed testdata file. Run with -update to accept it.
func TestGolden(t *testing.T) {
	for typ, p := range samples() {
		t.Run(string(typ), func(t *testing.T) {
			e := goldenEnvelope(t, p)
			got, err := json.MarshalIndent(e, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, '\n')
			path := filepath.Join("testdata", string(typ)+".golden.json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run go test -update): %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("wire form of %s changed:\n got: %s\nwant: %s", typ, got, want)
			}
			// The golden file must decode back to an equal payload.
			env, dp, err := Decode(want)
			if err != nil {
				t.Fatalf("decode golden: %v", err)
			}
			if env.ID != e.ID || env.Type != typ || env.CausationID != e.CausationID {
				t.Fatalf("envelope round trip: %+v", env)
			}
			reenc, _ := json.Marshal(dp)
			orig, _ := json.Marshal(p)
			if !bytes.Equal(reenc, orig) {
				t.Fatalf("payload round trip:\n got: %s\nwant: %s", reenc, orig)
			}
		})
	}
}

func TestNewAssignsV7AndLinksCauses(t *testing.T) {
	cause, err := New(goldenSrc, "lab", samples()[TypeHealthTransition])
	if err != nil {
		t.Fatal(err)
	}
	if cause.CorrelationID != "" {
		t.Fatalf("a root event has no correlation id, got %q", cause.CorrelationID)
	}
	d, err := New(goldenSrc, "lab", samples()[TypeArbiterDecision], CausedBy(cause))
	if err != nil {
		t.Fatal(err)
	}
	if d.CausationID != cause.ID || d.CorrelationID != cause.ID {
		t.Fatalf("decision should name its cause and start the chain at it: %+v", d)
	}
	c, err := New(goldenSrc, "lab", samples()[TypeClaimIP], CausedBy(d), WithEpoch(3))
	if err != nil {
		t.Fatal(err)
	}
	if c.CausationID != d.ID || c.CorrelationID != cause.ID {
		t.Fatalf("command should keep the chain's correlation id: %+v", c)
	}
	if d.ID >= c.ID {
		t.Fatalf("UUID v7 ids must sort by time: %s then %s", d.ID, c.ID)
	}
}

func TestSubjectsFollowPayload(t *testing.T) {
	s := samples()
	cases := map[Type]string{
		TypeProbeResult:       "fan.state.lab.probe.ctl1.result",
		TypeHealthTransition:  "fan.evt.lab.probe.ctl1.health",
		TypeNodeHeartbeat:     "fan.state.lab.node.n1.heartbeat",
		TypeArbiterDecision:   "fan.evt.lab.arbiter.pbx.decision",
		TypeClaimIP:           "fan.cmd.lab.n2.claim",
		TypeReleaseIP:         "fan.cmd.lab.n1.release",
		TypeAnswerPBX:         "fan.cmd.lab.n2.answer",
		TypeCommandResult:     "fan.evt.lab.exec.n2.result",
		TypeFailbackPermit:    "fan.evt.lab.sched.pbx.permit",
		TypeReplicationStatus: "fan.evt.lab.repl.n1.status",
		TypeServiceAnnounce:   "fan.evt.lab.svc.prober.n1.announce",
	}
	for typ, want := range cases {
		p := s[typ]
		if got := Subject(goldenEnvelope(t, p), p); got != want {
			t.Errorf("%s: subject %q, want %q", typ, got, want)
		}
	}
	if !strings.HasPrefix(NodeCommands("lab", "n2"), "fan.cmd.lab.n2.") {
		t.Errorf("node command filter %q", NodeCommands("lab", "n2"))
	}
}

func TestDecodeRejects(t *testing.T) {
	valid := func() map[string]any {
		b, err := goldenEnvelope(t, samples()[TypeClaimIP]).Encode()
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	data := func(m map[string]any) map[string]any { return m["data"].(map[string]any) }
	cases := []struct {
		name   string
		mutate func(m map[string]any)
		want   error
	}{
		{"unknown type", func(m map[string]any) { m["type"] = "command.launch_missiles" }, ErrUnknownType},
		{"future version", func(m map[string]any) { m["version"] = 2 }, ErrUnknownVersion},
		{"id not uuid v7", func(m map[string]any) { m["id"] = "6ba7b810-9dad-11d1-80b4-00c04fd430c8" }, ErrInvalidField},
		{"missing id", func(m map[string]any) { delete(m, "id") }, ErrInvalidField},
		{"missing time", func(m map[string]any) { delete(m, "time") }, ErrMissingField},
		{"cluster with a dot", func(m map[string]any) { m["cluster"] = "a.b" }, ErrInvalidField},
		{"command without epoch", func(m map[string]any) { delete(m, "epoch") }, ErrMissingField},
		{"command without deadline", func(m map[string]any) { delete(data(m), "not_after") }, ErrMissingField},
		{"bad address", func(m map[string]any) { data(m)["addresses"] = []string{"198.51.100.300/24"} }, ErrInvalidField},
		{"node wildcard", func(m map[string]any) { data(m)["node"] = "*" }, ErrInvalidField},
		{"data not an object", func(m map[string]any) { m["data"] = "x" }, ErrInvalidField},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := valid()
			tc.mutate(m)
			b, _ := json.Marshal(m)
			_, _, err := Decode(b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Decode error %v, want %v", err, tc.want)
			}
		})
	}
	t.Run("too large", func(t *testing.T) {
		_, _, err := Decode(bytes.Repeat([]byte(" "), MaxEncodedSize+1))
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("unknown fields are tolerated", func(t *testing.T) {
		m := valid()
		m["added_later"] = true
		data(m)["optional_later"] = 1
		b, _ := json.Marshal(m)
		if _, _, err := Decode(b); err != nil {
			t.Fatalf("forward-compatible field refused: %v", err)
		}
	})
}

func TestNewRefusesInvalidPayloads(t *testing.T) {
	cases := []Payload{
		HealthTransition{Check: "pbx", TargetNode: "n1", Role: RoleSelf, From: HealthUp, To: HealthUp, Rise: 1, Fall: 1, Evidence: []Evidence{{}}},
		HealthTransition{Check: "pbx", TargetNode: "n1", Role: RoleSelf, From: HealthUp, To: HealthDown, Rise: 1, Fall: 1},
		ArbiterDecision{Group: "pbx", Action: ActionFailover, To: "n2", Reason: "x"},
		ProbeResult{Check: "pbx", Kind: "ami", TargetNode: "n1", Role: RoleSelf, OK: false, At: goldenTime},
		CommandResult{CommandID: "x", CommandType: TypeClaimIP, Node: "n1", Group: "g", Outcome: OutcomeFailed},
		FailbackPermit{Group: "pbx", Window: "w", ValidFrom: goldenTime, ValidUntil: goldenTime},
		ClaimIP{Group: "pbx", Node: "n2", Addresses: []string{"198.51.100.10/24"}, NotAfter: goldenTime.Add(10 * time.Second), AfterReleases: []string{"release-of-n1"}},
	}
	for _, p := range cases {
		if _, err := New(goldenSrc, "lab", p, WithEpoch(1)); err == nil {
			t.Errorf("New accepted invalid %s: %+v", p.EventType(), p)
		}
	}
	if _, err := New(goldenSrc, "lab", samples()[TypeReleaseIP]); !errors.Is(err, ErrMissingField) {
		t.Errorf("a command without an epoch must be refused, got %v", err)
	}
}
