package chaos

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanpbx/fan/lab/prereq"
	"github.com/fanpbx/fan/lab/stack"
	"github.com/fanpbx/fan/pkg/events"
)

func TestGenerateIsReproducibleAndValid(t *testing.T) {
	lim := DefaultLimits()
	for seed := uint64(1); seed <= 200; seed++ {
		a := Generate(seed, 10*time.Minute, lim)
		if !reflect.DeepEqual(a, Generate(seed, 10*time.Minute, lim)) {
			t.Fatalf("seed %d: two schedules differ", seed)
		}
		if len(a) == 0 {
			t.Fatalf("seed %d: empty schedule for 10 minutes", seed)
		}
		if err := Check(a, lim); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		var used time.Duration
		for _, f := range a {
			used += f.Gap + f.Hold + lim.Settle
		}
		if used > 10*time.Minute {
			t.Fatalf("seed %d: schedule needs %v, more than the run", seed, used)
		}
	}
	if reflect.DeepEqual(Generate(1, 10*time.Minute, lim), Generate(2, 10*time.Minute, lim)) {
		t.Fatal("seeds 1 and 2 gave the same schedule")
	}
}

// Over many seeds every kind, every killable service and both node roles
// come up: a generator that never faulted the holder would pass every run.
func TestGenerateCoversEveryFault(t *testing.T) {
	seen := map[string]bool{}
	for seed := uint64(1); seed <= 50; seed++ {
		for _, f := range Generate(seed, 10*time.Minute, DefaultLimits()) {
			seen[string(f.Kind)+"/"+string(f.Target)+"/"+f.Service] = true
		}
	}
	want := []string{"nats-restart/ctl/"}
	for _, k := range []Kind{PBXFreeze, LinkCut, NATSPartition} {
		want = append(want, string(k)+"/holder/", string(k)+"/standby/")
	}
	for _, s := range NodeServices {
		want = append(want, "kill-service/holder/"+s, "kill-service/standby/"+s)
	}
	for _, s := range ControlServices {
		want = append(want, "kill-service/ctl/"+s)
	}
	for _, w := range want {
		if !seen[w] {
			t.Errorf("no schedule in 50 seeds contains %s", w)
		}
	}
}

// On a three-server bus the NATS faults hit one server: its kill -9 and
// its routes cut, on the holder's, the standby's and the witness's host.
// A schedule written by hand reads back what Fault.String prints, gap
// included, and is refused where a generated one would be.
func TestParseSchedule(t *testing.T) {
	lim := DefaultLimits()
	lim.ServerFaults = true
	gen := Generate(7, 5*time.Minute, lim)
	var parts []string
	for _, f := range gen {
		parts = append(parts, fmt.Sprintf("%s gap=%v", f, f.Gap))
	}
	got, err := ParseSchedule(strings.Join(parts, "; "), lim)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, gen) {
		t.Fatalf("read back\n%v\nwant\n%v", got, gen)
	}
	got, err = ParseSchedule("nats-kill standby hold=1s; kill-service holder fan-prober hold=2s gap=5s", lim)
	want := []Fault{{Kind: NATSKill, Target: Standby, Hold: time.Second, Gap: lim.Gap[0]},
		{Kind: KillService, Target: Holder, Service: "fan-prober", Hold: 2 * time.Second, Gap: 5 * time.Second}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, %v; want %v", got, err, want)
	}
	single := DefaultLimits()
	for name, text := range map[string]string{
		"empty":             " ; ",
		"hold out of range": "link-cut holder hold=1m",
		"gap too short":     "link-cut holder hold=3s gap=1s",
		"unknown setting":   "link-cut holder hold=3s wait=1s",
		"bad duration":      "link-cut holder hold=three",
		"no target":         "link-cut hold=3s",
		"service on ctl":    "kill-service ctl fan-prober hold=1s",
	} {
		if _, err := ParseSchedule(text, lim); err == nil {
			t.Errorf("%s: %q accepted", name, text)
		}
	}
	if _, err := ParseSchedule("nats-kill standby hold=1s", single); err == nil {
		t.Error("a server fault accepted for a one-server bus")
	}
}

func TestGenerateServerFaults(t *testing.T) {
	lim := DefaultLimits()
	lim.ServerFaults = true
	seen := map[string]bool{}
	for seed := uint64(1); seed <= 50; seed++ {
		s := Generate(seed, 10*time.Minute, lim)
		if err := Check(s, lim); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for _, f := range s {
			seen[string(f.Kind)+"/"+string(f.Target)] = true
		}
	}
	for _, k := range []Kind{NATSKill, RoutePartition} {
		for _, tg := range []Target{Holder, Standby, Control} {
			if !seen[string(k)+"/"+string(tg)] {
				t.Errorf("no schedule in 50 seeds contains %s on %s", k, tg)
			}
		}
	}
	for _, k := range []Kind{NATSRestart, NATSPartition} {
		for w := range seen {
			if strings.HasPrefix(w, string(k)+"/") {
				t.Errorf("a three-server schedule contains %s", w)
			}
		}
	}
	if err := Check([]Fault{{Kind: NATSKill, Target: Control, Gap: lim.Gap[0], Hold: time.Second}}, DefaultLimits()); err == nil {
		t.Error("a server fault passed the check of a single-server schedule")
	}
}

func TestCheckRefusesBrokenSchedules(t *testing.T) {
	lim := DefaultLimits()
	ok := Fault{Kind: PBXFreeze, Target: Holder, Gap: 5 * time.Second, Hold: 3 * time.Second}
	for name, f := range map[string]Fault{
		"no settle time":        {Kind: PBXFreeze, Target: Holder, Gap: time.Second, Hold: 3 * time.Second},
		"hold too long":         {Kind: LinkCut, Target: Holder, Gap: 5 * time.Second, Hold: time.Minute},
		"node fault on ctl":     {Kind: LinkCut, Target: Control, Gap: 5 * time.Second, Hold: 3 * time.Second},
		"arbiter on a node":     {Kind: KillService, Target: Holder, Service: "fan-arbiter", Gap: 5 * time.Second, Hold: time.Second},
		"ipmover on ctl":        {Kind: KillService, Target: Control, Service: "fan-ipmover", Gap: 5 * time.Second, Hold: time.Second},
		"nats restart on node":  {Kind: NATSRestart, Target: Standby, Gap: 5 * time.Second, Hold: time.Second},
		"unknown kind":          {Kind: "meteor", Target: Holder, Gap: 5 * time.Second, Hold: time.Second},
		"service on a non-kill": {Kind: PBXFreeze, Target: Holder, Service: "fan-prober", Gap: 5 * time.Second, Hold: 3 * time.Second},
	} {
		if err := Check([]Fault{ok, f}, lim); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if err := Check([]Fault{ok}, lim); err != nil {
		t.Fatal(err)
	}
}

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// A dual round that began a moment before a heal (its answers came after
// it: the cut node could not answer before) is excused like the rounds
// after it.
func TestDualRoundSpanningTheHealIsExcused(t *testing.T) {
	a, b := "02:fa:00:00:00:11", "02:fa:00:00:00:12"
	healed := at(100).Add(300 * time.Microsecond)
	sends := []time.Time{at(80), at(100), at(120)}
	sg := []Sighting{
		{At: at(81), MAC: a, Answer: true},
		{At: at(101), MAC: a, Answer: true}, {At: at(102), MAC: b, Answer: true},
		{At: at(121), MAC: a, Answer: true}, {At: at(122), MAC: b, Answer: true},
	}
	rs := Rounds(sends, sg, ARPInterval)
	_, counted := DualEpisodes(rs, []Window{HealWindow(healed, PartitionBound, "link-cut on n2")})
	if counted != 0 {
		t.Fatalf("counted %v against the invariant for rounds answered after the heal", counted)
	}
	// Without the heal nothing is excused: the check still bites.
	if _, counted := DualEpisodes(rs, nil); counted != 2*ARPInterval {
		t.Fatalf("counted %v with no heal, want two rounds", counted)
	}
}

func TestRoundsAndDualAccounting(t *testing.T) {
	var sends []time.Time
	for ms := 0; ms < 400; ms += 20 {
		sends = append(sends, at(ms))
	}
	a, b := "02:fa:00:00:00:11", "02:fa:00:00:00:12"
	sg := []Sighting{
		{At: at(1), MAC: a, Answer: true},
		// Rounds 60, 80, 100: both answer (one episode of 3 rounds).
		{At: at(61), MAC: a, Answer: true}, {At: at(62), MAC: b, Answer: true},
		{At: at(81), MAC: b, Answer: true}, {At: at(85), MAC: a, Answer: true},
		{At: at(101), MAC: a, Answer: true}, {At: at(119), MAC: b, Answer: true},
		// Round 120: the same MAC twice is one holder.
		{At: at(121), MAC: b, Answer: true}, {At: at(122), MAC: b, Answer: true},
		// Round 200: a passive announcement from a next to b's answer is
		// not an answer.
		{At: at(201), MAC: b, Answer: true}, {At: at(202), MAC: a},
		// Round 300: a second episode.
		{At: at(301), MAC: b, Answer: true}, {At: at(302), MAC: a, Answer: true},
	}
	rs := Rounds(sends, sg, 20*time.Millisecond)
	if got := rs[3].MACs; len(got) != 2 {
		t.Fatalf("round 60: %v", got)
	}
	eps, counted := DualEpisodes(rs, nil)
	if len(eps) != 2 || eps[0].Rounds != 3 || eps[0].Length != 60*time.Millisecond || eps[1].Length != 20*time.Millisecond {
		t.Fatalf("episodes %+v", eps)
	}
	if counted != 80*time.Millisecond || eps[0].Counted != 60*time.Millisecond {
		t.Fatalf("counted %v", counted)
	}
	if !reflect.DeepEqual(eps[0].MACs, []string{a, b}) {
		t.Fatalf("macs %v", eps[0].MACs)
	}

	// A heal at 70 ms excuses up to 70 ms + bound: the first episode's time
	// from 70 on and nothing of the second when the bound ends before it.
	allowed := []Window{{From: at(70), To: at(70).Add(100 * time.Millisecond)}}
	eps, counted = DualEpisodes(rs, allowed)
	if eps[0].Counted != 10*time.Millisecond || eps[1].Counted != 20*time.Millisecond || counted != 30*time.Millisecond {
		t.Fatalf("with window: %+v total %v", eps, counted)
	}
	// Overlapping windows are not subtracted twice.
	allowed = append(allowed, Window{From: at(60), To: at(120)}, Window{From: at(290), To: at(400)})
	if _, counted = DualEpisodes(rs, allowed); counted != 0 {
		t.Fatalf("all excused, counted %v", counted)
	}
}

func TestPartitionBoundDerivation(t *testing.T) {
	// The constant is the sum in its comment; a changed input must show up
	// here and in the README together.
	if PartitionBound != 7*time.Second {
		t.Fatalf("PartitionBound = %v, README says 7s", PartitionBound)
	}
	if OutageBound != 6125*time.Millisecond {
		t.Fatalf("OutageBound = %v, README says 6.125s", OutageBound)
	}
}

func TestOutagesCountOnlyWhileANodeIsHealthy(t *testing.T) {
	var ps []Probe
	for ms := 0; ms <= 1000; ms += 10 {
		// No answer from 210 to 690; no probe at all from 750 to 890 (the
		// observer stalled: not an outage).
		if ms > 740 && ms < 900 {
			continue
		}
		ps = append(ps, Probe{Sent: at(ms), Answered: ms <= 200 || ms >= 700})
	}
	outs := Outages(ps, at(0), at(1000), 50*time.Millisecond, nil)
	if len(outs) != 1 || outs[0].Start != at(200) || outs[0].FirstMissed != at(210) || outs[0].End != at(700) || outs[0].Counted != 500*time.Millisecond {
		t.Fatalf("outages %+v", outs)
	}
	// n1 down 100..600, n2 down 300..900: nobody healthy 300..600.
	per := map[string][]Window{
		"n1": {{From: at(100), To: at(400)}, {From: at(350), To: at(600)}},
		"n2": {{From: at(300), To: at(900)}},
	}
	none := AllUnhealthy([]string{"n1", "n2"}, per)
	if len(none) != 1 || none[0].From != at(300) || none[0].To != at(600) {
		t.Fatalf("all unhealthy %+v", none)
	}
	outs = Outages(ps, at(0), at(1000), 50*time.Millisecond, none)
	if outs[0].Counted != 200*time.Millisecond {
		t.Fatalf("counted %v, want 500 ms minus the 300 ms nobody was healthy", outs[0].Counted)
	}
	if l, _ := Longest(outs); l.Counted != 200*time.Millisecond {
		t.Fatalf("longest %+v", l)
	}
	// Unanswered probes up to the end of the run are an outage up to the end.
	tail := append(slices.Clone(ps[:5]), Probe{Sent: at(60)})
	outs = Outages(tail, at(0), at(1000), 50*time.Millisecond, nil)
	if l, _ := Longest(outs); l.Start != at(40) || l.End != at(1000) {
		t.Fatalf("trailing outage %+v", l)
	}
}

func ev(t *testing.T, id string, epoch uint64, p events.Payload, cause string) stack.Event {
	t.Helper()
	return stack.Event{Env: events.Envelope{ID: id, Type: p.EventType(), Epoch: epoch, CausationID: cause}, Payload: p}
}

func TestStaleEpochs(t *testing.T) {
	res := func(cmd string, n string, o events.Outcome) *events.CommandResult {
		return &events.CommandResult{CommandID: cmd, CommandType: events.TypeClaimIP, Node: n, Group: "pbx", Outcome: o}
	}
	trail := []stack.Event{
		ev(t, "c1", 3, &events.ClaimIP{Group: "pbx", Node: "n1"}, ""),
		ev(t, "r1", 3, res("c1", "n1", events.OutcomeApplied), "c1"),
		ev(t, "c2", 5, &events.ClaimIP{Group: "pbx", Node: "n2"}, ""),
		ev(t, "r2", 5, res("c2", "n2", events.OutcomeApplied), "c2"),
		// An old leader's command refused: fencing, not a violation.
		ev(t, "r3", 4, res("c0", "n2", events.OutcomeStaleEpoch), "c0"),
		// Applied although epoch 5 was applied before: a violation. Its
		// result carries no epoch; the command's is found by id.
		ev(t, "c4", 4, &events.ReleaseIP{Group: "pbx", Node: "n1"}, ""),
		ev(t, "r4", 0, res("c4", "n1", events.OutcomeApplied), "c4"),
		// Same epoch again is fine; a duplicate is not an execution.
		ev(t, "r5", 5, res("c5", "n1", events.OutcomeApplied), "c5"),
		ev(t, "r6", 2, res("c1", "n1", events.OutcomeDuplicate), "c1"),
		// No epoch anywhere: unknown, not guessed.
		ev(t, "r7", 0, res("c9", "n1", events.OutcomeApplied), "c9"),
	}
	r := StaleEpochs(trail)
	if r.Refused != 1 || r.Applied != 5 || r.MaxEpoch != 5 || r.Unknown != 1 {
		t.Fatalf("report %+v", r)
	}
	if len(r.Stale) != 1 || r.Stale[0].CommandID != "c4" || r.Stale[0].Epoch != 4 || r.Stale[0].MaxEarlier != 5 {
		t.Fatalf("stale %+v", r.Stale)
	}
}

func TestARPFrames(t *testing.T) {
	mac, _ := net.ParseMAC("02:fa:00:00:00:50")
	f := request(mac, netip.MustParseAddr("198.51.100.50"), netip.MustParseAddr("198.51.100.10"))
	p, err := parseARP(f)
	if err != nil {
		t.Fatal(err)
	}
	if p.Op != opRequest || p.SHA.String() != mac.String() || p.SPA.String() != "198.51.100.50" || p.TPA.String() != "198.51.100.10" ||
		p.EthDst.String() != "ff:ff:ff:ff:ff:ff" || p.THA.String() != "00:00:00:00:00:00" {
		t.Fatalf("parsed %+v", p)
	}
	if _, err := parseARP(f[:30]); err == nil {
		t.Fatal("short frame accepted")
	}
	g := append([]byte(nil), f...)
	g[12], g[13] = 0x08, 0x00 // IPv4, not ARP
	if _, err := parseARP(g); err == nil {
		t.Fatal("non-ARP frame accepted")
	}
}

// TestChaosShortRun is a real run in namespaces. It is not part of
// `make test` (minutes long): FAN_CHAOS=1 FAN_BIN=dir go test -run ShortRun -v ./chaos
// (FAN_CHAOS_DURATION, FAN_CHAOS_SEED to choose).
func TestChaosShortRun(t *testing.T) {
	if os.Getenv("FAN_CHAOS") == "" {
		t.Skip("set FAN_CHAOS=1 (and FAN_BIN) for a real chaos run")
	}
	stack.RequireLab(t)
	bin := stack.BinDirForTest(t)
	if _, err := exec.LookPath("iptables"); err != nil {
		prereq.SkipOrFail(t, "iptables is not installed")
	}
	d := 2 * time.Minute
	if s := os.Getenv("FAN_CHAOS_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			t.Fatal(err)
		}
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("FAN_CHAOS_SEED"); s != "" {
		if err := json.Unmarshal([]byte(s), &seed); err != nil {
			t.Fatal(err)
		}
	}
	abs, _ := filepath.Abs(bin)
	var out strings.Builder
	res, err := Run(t.Context(), Config{BinDir: abs, Duration: d, Seed: seed, Out: &out})
	t.Log(out.String())
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	t.Log(res.Line())
	for _, e := range res.Episodes {
		t.Logf("dual episode %+v", e)
	}
	for _, v := range res.Violations {
		t.Errorf("seed %d: %s", seed, v)
	}
}
