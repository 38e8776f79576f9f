package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func init() {
	addSamples(map[Type]Payload{
		TypeCallsSummary: CallsSummary{Node: "n1", Group: "pbx", Holder: true, Epoch: 7, IntervalMS: 2000, Channels: 7,
			CarriedChannels: 4, Calls: 3, Carriable: 2, Anchored: 1, At: goldenTime,
			TimersEndpoints: intp(2), TimersSample: []string{"6001", "6002"}, TransportsRead: true,
			ContactNodeAddress: []string{"transport-node"}, MediaAddressRewritten: []string{"transport-float"}},
	})
}

// sampleCall is a direct-media call between two phones as Asterisk 22.10.1
// answered the Getvar reads of its two legs (the caller's leg first).
func sampleCall() CallRecord {
	return CallRecord{Cluster: "lab", Group: "pbx", Node: "n1", ID: "6bf9994c-1e0b-41d8-ac66-babd3c7480fa",
		Legs: []CallLeg{
			{Channel: "PJSIP/6001-00000002", Endpoint: "6001", CallID: "1-11834@198.51.100.50",
				LocalTag: "30f6512e-3669-4ba0-8332-0674ee38451b", RemoteTag: "11834SIPpTag001",
				LocalURI: "<sip:6002@198.51.100.10>", RemoteURI: "<sip:6001@198.51.100.50>",
				RemoteTarget: "sip:6001@198.51.100.50:5061", RemoteAddr: "198.51.100.50:5061", Transport: "udp"},
			{Channel: "PJSIP/6002-00000003", Endpoint: "6002", CallID: "050ef79c-961f-4982-bae8-f312e1997fe0",
				LocalTag: "762076f3-78ad-468e-85ce-2a314cd04a13", RemoteTag: "9378SIPpTag012",
				LocalURI: "<sip:6001@198.51.100.10>", RemoteURI: "<sip:6002@198.51.100.51>",
				RemoteTarget: "sip:6002@198.51.100.51:5062;transport=UDP", Transport: "udp"},
		},
		Media: MediaDirect, AnsweredAt: goldenTime, DirectSince: goldenTime.Add(2 * time.Millisecond), UpdatedAt: goldenTime.Add(3 * time.Millisecond)}
}

// sampleKept is the same call adopted by n2.
func sampleKept() CallRecord {
	r := sampleCall()
	r.Node, r.Kept, r.KeptSince, r.AdoptedFrom = "n2", true, goldenTime.Add(time.Minute), "n1"
	r.Legs = append([]CallLeg(nil), r.Legs...)
	r.Legs[0].CSeq, r.Legs[1].CSeq = 1<<30, 1<<30
	return r
}

// TestCallRecordGolden pins the wire form of a record in the bucket (it
// travels in no envelope); -update rewrites the files.
func TestCallRecordGolden(t *testing.T) {
	incomplete := sampleCall()
	incomplete.ID = "0c6b7e1a-5d1f-4c55-9d0e-8d1bd2f4f3c1"
	incomplete.Media, incomplete.DirectSince = MediaAnchored, time.Time{}
	incomplete.Legs = []CallLeg{incomplete.Legs[0], {Channel: "Local/6100@from-phones-00000000;2"}}
	incomplete.Incomplete = "legs[1] Local/6100@from-phones-00000000;2 is not a PJSIP channel"
	for name, r := range map[string]CallRecord{"calls.record": sampleCall(), "calls.record.kept": sampleKept(), "calls.record.incomplete": incomplete} {
		t.Run(name, func(t *testing.T) {
			b, err := r.Encode()
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := json.Indent(&out, b, "", "  "); err != nil {
				t.Fatal(err)
			}
			out.WriteByte('\n')
			path := filepath.Join("testdata", name+".golden.json")
			if *update {
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("read golden (run go test -update): %v", err)
			}
			if !bytes.Equal(out.Bytes(), want) {
				t.Fatalf("wire form of %s changed:\n got: %s\nwant: %s", name, out.Bytes(), want)
			}
			got, err := DecodeCallRecord(want)
			if err != nil {
				t.Fatalf("decode golden: %v", err)
			}
			again, _ := got.Encode()
			if !bytes.Equal(again, b) {
				t.Fatalf("round trip:\n got: %s\nwant: %s", again, b)
			}
		})
	}
	if !sampleCall().Carriable() || !sampleKept().Carriable() {
		t.Error("a complete direct-media record is not carriable")
	}
	if incomplete.Carriable() || incomplete.Complete() == nil {
		t.Error("a record with a Local leg is carriable")
	}
	anchored := sampleCall()
	anchored.Media = MediaAnchored
	if anchored.Complete() != nil || anchored.Carriable() {
		t.Error("an anchored record: complete, and not carriable")
	}
}

func TestCallKeys(t *testing.T) {
	id := sampleCall().ID
	for got, want := range map[string]string{
		CallKey("lab", "pbx", "n1", id): "calls.lab.pbx.n1." + id,
		KeptKey("lab", "pbx", "n2", id): "kept.lab.pbx.n2." + id,
		GroupCallKeys("lab", "pbx"):     "calls.lab.pbx.*.*",
		GroupKeptKeys("lab", "pbx"):     "kept.lab.pbx.*.*",
		NodeCallKeys("lab", "n1"):       "calls.lab.*.n1.*",
		NodeKeptKeys("lab", "n2"):       "kept.lab.*.n2.*",
		ClusterCallKeys("lab"):          "calls.lab.>",
		ClusterKeptKeys("lab"):          "kept.lab.>",
	} {
		if got != want {
			t.Errorf("key %q, want %q", got, want)
		}
	}
	for _, k := range []string{CallKey("lab", "pbx", "n1", id), KeptKey("lab", "pbx", "n2", id)} {
		if !SubjectMatches(GroupCallKeys("lab", "pbx"), k) && !SubjectMatches(GroupKeptKeys("lab", "pbx"), k) {
			t.Errorf("%s matches neither group filter", k)
		}
	}
	p, err := ParseCallKey(CallKey("lab", "pbx", "n1", id))
	if err != nil || p != (CallKeyParts{Kind: CallKeyCalls, Cluster: "lab", Group: "pbx", Node: "n1", ID: id}) {
		t.Fatalf("parse: %+v %v", p, err)
	}
	for _, bad := range []string{"", "calls.lab.pbx.n1", "calls.lab.pbx.n1.a.b", "other.lab.pbx.n1.x", "calls.lab.pbx..x", "kept.lab.pbx.n1.*", "calls.lab.pbx.n 1.x"} {
		if _, err := ParseCallKey(bad); err == nil {
			t.Errorf("key %q parsed", bad)
		}
	}
	if err := VerifyCallKey(CallKey("lab", "pbx", "n1", id), sampleCall()); err != nil {
		t.Errorf("a record under its own key: %v", err)
	}
	if err := VerifyCallKey(KeptKey("lab", "pbx", "n2", id), sampleKept()); err != nil {
		t.Errorf("a kept record under its own key: %v", err)
	}
	// The key is the writer's identity: a record claiming anything else is
	// refused.
	for name, key := range map[string]string{
		"another node's key":  CallKey("lab", "pbx", "n2", id),
		"another group":       CallKey("lab", "other", "n1", id),
		"another cluster":     CallKey("c2", "pbx", "n1", id),
		"another id":          CallKey("lab", "pbx", "n1", "x"),
		"under a kept key":    KeptKey("lab", "pbx", "n1", id),
		"kept under calls":    CallKey("lab", "pbx", "n2", id),
		"not a key of a call": "calls.lab.pbx",
	} {
		r := sampleCall()
		if name == "kept under calls" {
			r = sampleKept()
		}
		if err := VerifyCallKey(key, r); err == nil {
			t.Errorf("%s: %s accepted", name, key)
		} else if name != "not a key of a call" && !errors.Is(err, ErrSubjectMismatch) {
			t.Errorf("%s: want ErrSubjectMismatch, got %v", name, err)
		}
	}
}

// A bridge's id becomes a key's last token: Asterisk's UUIDs as they are,
// anything else hashed, never a dot, wildcard or space in a key.
func TestCallIDForBridge(t *testing.T) {
	uuid := "6bf9994c-1e0b-41d8-ac66-babd3c7480fa"
	if got := CallIDForBridge(uuid); got != uuid {
		t.Errorf("Asterisk's bridge id %s became %s", uuid, got)
	}
	seen := map[string]string{}
	for _, b := range []string{"my.bridge", "a b", "*", ">", "", strings.Repeat("x", 65), "conf.1", "conf.2", "b-x\r\n"} {
		id := CallIDForBridge(b)
		if err := ValidToken("id", id); err != nil {
			t.Errorf("bridge %q: id %q is not a token: %v", b, id, err)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("bridges %q and %q share id %s", b, other, id)
		}
		seen[id] = b
		if CallIDForBridge(b) != id {
			t.Errorf("bridge %q: id not stable", b)
		}
		if _, err := ParseCallKey(CallKey("lab", "pbx", "n1", id)); err != nil {
			t.Errorf("bridge %q: key of %s: %v", b, id, err)
		}
	}
}

// A record is read by another node and turned into SIP requests: whatever
// could write a header, pass the bounds or mislead the keeper is refused;
// an incomplete record is valid but not complete.
func TestCallRecordRefused(t *testing.T) {
	if err := sampleCall().Validate(); err != nil {
		t.Fatalf("good record refused: %v", err)
	}
	cases := map[string]func(r *CallRecord){
		"no cluster":               func(r *CallRecord) { r.Cluster = "" },
		"a dot in the id":          func(r *CallRecord) { r.ID = "a.b" },
		"a wildcard node":          func(r *CallRecord) { r.Node = "*" },
		"unknown media":            func(r *CallRecord) { r.Media = "relayed" },
		"one leg":                  func(r *CallRecord) { r.Legs = r.Legs[:1] },
		"three legs":               func(r *CallRecord) { r.Legs = append(r.Legs, r.Legs[0]) },
		"a leg without a channel":  func(r *CallRecord) { r.Legs[1].Channel = "" },
		"a line break in a tag":    func(r *CallRecord) { r.Legs[0].RemoteTag = "x\r\nVia: SIP/2.0/UDP evil" },
		"a NUL in the call-id":     func(r *CallRecord) { r.Legs[1].CallID = "a\x00b" },
		"a line break in a target": func(r *CallRecord) { r.Legs[1].RemoteTarget = "sip:a@b\nRoute: <sip:evil>" },
		"a huge uri":               func(r *CallRecord) { r.Legs[0].RemoteURI = "<sip:" + strings.Repeat("a", MaxSIPField) + "@b>" },
		"tcp":                      func(r *CallRecord) { r.Legs[0].Transport = "tcp" },
		"kept without kept_since":  func(r *CallRecord) { r.Kept = true },
		"adopted from a wildcard":  func(r *CallRecord) { r.AdoptedFrom = ">" },
		"a huge reason":            func(r *CallRecord) { r.Incomplete = strings.Repeat("x", MaxSIPField+1) },
	}
	for name, mutate := range cases {
		r := sampleCall()
		r.Legs = append([]CallLeg(nil), r.Legs...)
		mutate(&r)
		err := r.Validate()
		if !errors.Is(err, ErrInvalidField) && !errors.Is(err, ErrMissingField) && !errors.Is(err, ErrTooLarge) {
			t.Errorf("%s: want a refusal, got %v", name, err)
		}
		if _, err := r.Encode(); err == nil {
			t.Errorf("%s: encoded", name)
		}
		if b, merr := json.Marshal(r); merr == nil {
			if _, err := DecodeCallRecord(b); err == nil {
				t.Errorf("%s: decoded", name)
			}
		}
	}
	// Valid but incomplete: the keeper leaves it, and says why.
	for name, mutate := range map[string]func(r *CallRecord){
		"no remote tag":     func(r *CallRecord) { r.Legs[1].RemoteTag = "" },
		"no call-id":        func(r *CallRecord) { r.Legs[0].CallID = "" },
		"no remote target":  func(r *CallRecord) { r.Legs[0].RemoteTarget = "" },
		"transport unknown": func(r *CallRecord) { r.Legs[1].Transport = "" },
		"said so": func(r *CallRecord) {
			r.Incomplete = "Getvar CHANNEL(pjsip,call-id) on PJSIP/6002-00000003: No such channel"
		},
		"empty leg but name": func(r *CallRecord) { r.Legs[1] = CallLeg{Channel: "IAX2/trunk-1"} },
	} {
		r := sampleCall()
		r.Legs = append([]CallLeg(nil), r.Legs...)
		mutate(&r)
		if err := r.Validate(); err != nil {
			t.Errorf("%s: an incomplete record is valid, got %v", name, err)
		}
		if err := r.Complete(); !errors.Is(err, ErrMissingField) {
			t.Errorf("%s: Complete = %v, want ErrMissingField", name, err)
		}
		if r.Carriable() {
			t.Errorf("%s: carriable", name)
		}
	}
	// The size bound: fields each within MaxSIPField can still make a
	// record over MaxCallRecord, which is refused whole.
	big := sampleCall()
	big.Legs = append([]CallLeg(nil), big.Legs...)
	for i := range big.Legs {
		l := &big.Legs[i]
		fill := strings.Repeat("u", MaxSIPField-10)
		l.LocalURI, l.RemoteURI, l.RemoteTarget, l.CallID, l.LocalTag, l.RemoteTag, l.Channel, l.Endpoint =
			"<sip:"+fill+">", "<sip:"+fill+">", "sip:"+fill, fill, fill, fill, fill, fill
	}
	if err := big.Validate(); err != nil {
		t.Fatalf("every field within bounds: %v", err)
	}
	if _, err := big.Encode(); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a record over %d bytes: want ErrTooLarge, got %v", MaxCallRecord, err)
	}
	if _, err := DecodeCallRecord([]byte(`{"pad":"` + strings.Repeat("x", MaxCallRecord) + `"}`)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("decode of an oversized record: want ErrTooLarge, got %v", err)
	}
	if _, err := DecodeCallRecord([]byte(`{"cluster":`)); !errors.Is(err, ErrInvalidField) {
		t.Errorf("decode of a torn record: want ErrInvalidField, got %v", err)
	}
}

func TestCallsSummary(t *testing.T) {
	s := samples()[TypeCallsSummary].(CallsSummary)
	if got := Subject(goldenEnvelope(t, s), s); got != "fan.state.lab.calls.n1.summary" {
		t.Fatalf("subject %q", got)
	}
	if !SubjectMatches(AllCallsSummaries("lab"), CallsSummarySubject("lab", "n2")) || !IsLive(TypeCallsSummary) {
		t.Fatal("summaries are live state, one subject per node")
	}
	if st, err := StreamOf(CallsSummarySubject("lab", "n1")); err != nil || st != LiveStream {
		t.Fatalf("stored in %q (%v), want %s", st, err, LiveStream)
	}
	for name, mutate := range map[string]func(*CallsSummary){
		"no node":                       func(s *CallsSummary) { s.Node = "" },
		"no time":                       func(s *CallsSummary) { s.At = time.Time{} },
		"no interval":                   func(s *CallsSummary) { s.IntervalMS = 0 },
		"counts that do not add up":     func(s *CallsSummary) { s.Anchored = 0 },
		"more carried than carriable":   func(s *CallsSummary) { s.CarriedChannels = 6 },
		"more calls than channels":      func(s *CallsSummary) { s.Channels = 5 },
		"negative":                      func(s *CallsSummary) { s.Channels, s.Unrecorded, s.Calls = -1, -1, 2 },
		"beyond what a node can report": func(s *CallsSummary) { s.Channels = MaxCount + 1 },
		"a sample without the count":    func(s *CallsSummary) { s.TimersEndpoints = nil },
		"too long a sample":             func(s *CallsSummary) { s.TimersSample = make([]string, MaxCallsSample+1) },
		"negative timers":               func(s *CallsSummary) { s.TimersEndpoints = intp(-1) },
		"transports not read":           func(s *CallsSummary) { s.TransportsRead = false },
		"a name with a line break":      func(s *CallsSummary) { s.ContactNodeAddress = []string{"t\r\nX-Evil: 1"} },
		"an empty name":                 func(s *CallsSummary) { s.MediaAddressRewritten = []string{""} },
	} {
		c := s
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: validated", name)
		}
	}
	// Only the node's own replicator speaks for its calls.
	env := goldenEnvelope(t, s)
	env.Source = Source{Service: "replicator", Node: "n2"}
	if err := VerifySubject(CallsSummarySubject("lab", "n1"), env, &s); !errors.Is(err, ErrSubjectMismatch) {
		t.Errorf("n1's summary from n2: %v", err)
	}
}

// TestCallsPermissions: a node's replicator writes only its node's calls
// keys, a node's ipmover only its node's kept keys; the ipmovers, the
// arbiter and the people read every record of their cluster; a replicator
// reads its node's calls records and every kept record of its cluster
// (what a call it still has after a planned move became); nobody else
// writes or reads them. The admin alone may do anything.
func TestCallsPermissions(t *testing.T) {
	perms := permIdentities(t)
	id := sampleCall().ID
	st := KVStreamName(CallsBucket)
	readers := map[BusRole]bool{RoleIPMover: true, RoleArbiter: true, RoleOperator: true, RoleAuditor: true, RoleViewer: true, RoleAdmin: true}
	for key, p := range perms {
		role := roleOf(key)
		own := strings.TrimPrefix(key, string(role)+"@")
		for _, n := range []string{"n1", "n2"} {
			want := role == RoleAdmin || (role == RoleReplicator && n == own)
			if got := p.Publish.Allows(KVSubject(CallsBucket, CallKey("c1", "pbx", n, id))); got != want {
				t.Errorf("%s writes %s's call record: %v, want %v", key, n, got, want)
			}
			want = role == RoleAdmin || (role == RoleIPMover && n == own)
			if got := p.Publish.Allows(KVSubject(CallsBucket, KeptKey("c1", "pbx", n, id))); got != want {
				t.Errorf("%s writes %s's kept record: %v, want %v", key, n, got, want)
			}
			want = readers[role] || (role == RoleReplicator && n == own)
			if got := p.Publish.Allows("$JS.API.DIRECT.GET." + st + "." + KVSubject(CallsBucket, CallKey("c1", "pbx", n, id))); got != want {
				t.Errorf("%s reads %s's call record: %v, want %v", key, n, got, want)
			}
			if got := p.Publish.Allows("$JS.API.CONSUMER.CREATE." + st + ".w1." + KVSubject(CallsBucket, NodeCallKeys("c1", n))); got != want {
				t.Errorf("%s watches %s's call records: %v, want %v", key, n, got, want)
			}
		}
		keptReader := readers[role] || role == RoleReplicator
		if got := p.Publish.Allows("$JS.API.CONSUMER.CREATE." + st + ".w1." + KVSubject(CallsBucket, GroupKeptKeys("c1", "pbx"))); got != keptReader {
			t.Errorf("%s watches the group's kept records: %v, want %v", key, got, keptReader)
		}
		for _, n := range []string{"n1", "n2"} {
			if got := p.Publish.Allows("$JS.API.DIRECT.GET." + st + "." + KVSubject(CallsBucket, KeptKey("c1", "pbx", n, id))); got != keptReader {
				t.Errorf("%s reads %s's kept record: %v, want %v", key, n, got, keptReader)
			}
		}
		// A replicator reads no other node's calls records, whatever the
		// filter: the group's (every node's) is past its own.
		if role == RoleReplicator {
			if p.Publish.Allows("$JS.API.CONSUMER.CREATE." + st + ".w1." + KVSubject(CallsBucket, GroupCallKeys("c1", "pbx"))) {
				t.Errorf("%s watches every node's call records", key)
			}
		}
		// Nothing that reads past a filter: another cluster, a consumer
		// without a filter, a get by sequence.
		for _, s := range []string{
			"$JS.API.CONSUMER.CREATE." + st + ".w1." + KVSubject(CallsBucket, ClusterCallKeys("c2")),
			"$JS.API.CONSUMER.CREATE." + st + ".w1." + KVSubject(CallsBucket, ClusterKeptKeys("c2")),
			"$JS.API.DIRECT.GET." + st + "." + KVSubject(CallsBucket, KeptKey("c2", "pbx", "n1", id)),
			"$JS.API.CONSUMER.CREATE." + st + ".w1." + KVSubject(CallsBucket, ">"),
			"$JS.API.CONSUMER.CREATE." + st + ".w1",
			"$JS.API.CONSUMER.CREATE." + st,
			"$JS.API.DIRECT.GET." + st,
			"$JS.API.STREAM.MSG.GET." + st,
			"$JS.API.STREAM.PURGE." + st,
			KVSubject(CallsBucket, CallKey("c2", "pbx", "n1", id)),
		} {
			if role != RoleAdmin && p.Publish.Allows(s) {
				t.Errorf("%s may publish %s", key, s)
			}
		}
	}
	if !perms["replicator@n1"].Publish.Allows(CallsSummarySubject("c1", "n1")) || perms["replicator@n1"].Publish.Allows(CallsSummarySubject("c1", "n2")) {
		t.Error("a replicator publishes its own node's calls summary, and only that")
	}
}

// FuzzDecodeCallRecord: a record read from the bucket never panics the
// reader, and whatever it accepts encodes again to itself and holds no
// line break a keeper would put in a header.
func FuzzDecodeCallRecord(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "calls.record*.golden.json"))
	for _, p := range files {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeCallRecord(b)
		if err != nil {
			return
		}
		out, err := r.Encode()
		if err != nil {
			t.Fatalf("accepted record does not encode: %v", err)
		}
		r2, err := DecodeCallRecord(out)
		if err != nil {
			t.Fatalf("re-decode failed: %v", err)
		}
		again, _ := r2.Encode()
		if !bytes.Equal(again, out) {
			t.Fatalf("round trip changed the record:\n%s\n%s", out, again)
		}
		for _, l := range r.Legs {
			for _, f := range l.fields() {
				if strings.ContainsAny(f.v, "\r\n\x00") {
					t.Fatalf("accepted %s with a control character", f.name)
				}
			}
		}
	})
}

// TestHolderCalls: what a decision or a planned move carries of a
// holder's summary holds together as the summary does.
func TestHolderCalls(t *testing.T) {
	s := samples()[TypeCallsSummary].(CallsSummary)
	h := HolderCallsOf("0193a1b2-0000-7000-8000-000000000004", s)
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	if h.Calls != 3 || h.Carriable != 2 || h.Uncarried() != 3 || h.Node != "n1" || !h.At.Equal(s.At) {
		t.Fatalf("counts %+v, uncarried %d", h, h.Uncarried())
	}
	for name, mutate := range map[string]func(*HolderCalls){
		"no summary":                func(h *HolderCalls) { h.Summary = "" },
		"no node":                   func(h *HolderCalls) { h.Node = "" },
		"counts that do not add up": func(h *HolderCalls) { h.Anchored = 5 },
		"carried without a call":    func(h *HolderCalls) { h.CarriedChannels = 6 },
		"no time":                   func(h *HolderCalls) { h.At = time.Time{} },
	} {
		c := h
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: validated", name)
		}
		d := samples()[TypeArbiterDecision].(ArbiterDecision)
		d.Calls = &c
		if err := d.Validate(); err == nil {
			t.Errorf("%s: a decision carrying it validated", name)
		}
	}
}
