package keeper

import (
	"encoding/json"
	"maps"
	"testing"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// stored is rec as it sits in the calls bucket under its kind's key.
func stored(kind string, rec events.CallRecord) Stored {
	b, err := json.Marshal(rec)
	if err != nil {
		panic(err)
	}
	key := events.CallKey(rec.Cluster, rec.Group, rec.Node, rec.ID)
	if kind == "kept" {
		key = events.KeptKey(rec.Cluster, rec.Group, rec.Node, rec.ID)
	}
	return Stored{Key: key, Value: b}
}

func plan(records ...Stored) Plan {
	return PlanAdoption(PlanInput{Cluster: "lab", Group: "pbx", Node: "n2", Records: records, Now: t0.Add(time.Minute)})
}

func TestAdoptADirectCall(t *testing.T) {
	p := plan(stored("calls", callRecord("c1")))
	if len(p.Adopt) != 1 || p.Report.Adopted != 1 || p.Report.NotAdopted != nil || len(p.Report.From) != 1 || p.Report.From[0] != "n1" {
		t.Fatalf("plan %+v", p)
	}
	k := p.Adopt[0]
	if k.Node != "n2" || !k.Kept || !k.KeptSince.Equal(t0.Add(time.Minute)) || k.AdoptedFrom != "n1" || k.ID != "c1" {
		t.Fatalf("kept record %+v", k)
	}
	if err := k.Validate(); err != nil {
		t.Fatal(err)
	}
	for i, l := range k.Legs {
		if l.CSeq != CSeqBase {
			t.Fatalf("leg %d CSeq %d, want %d", i, l.CSeq, CSeqBase)
		}
	}
	// The origin's record is untouched (a copy was made).
	if callRecord("c1").Legs[0].CSeq != 0 {
		t.Fatal("fixture changed")
	}
}

// Why a call is not adopted, one reason each, counted; nothing else stops
// the others from being adopted.
func TestNotAdoptedReasons(t *testing.T) {
	anchored := callRecord("anch")
	anchored.Media = events.MediaAnchored
	oneLeg := callRecord("oneleg")
	oneLeg.Legs = oneLeg.Legs[:1]
	noTag := callRecord("notag")
	noTag.Legs[1].RemoteTag = ""
	flagged := callRecord("flagged")
	flagged.Incomplete = "legs[1] Local/6100@from-phones-00000000;2 is not a PJSIP channel"
	noTransport := callRecord("notransport")
	noTransport.Legs[0].Transport = ""
	tcp := callRecord("tcp")
	tcp.Legs[0].Transport = "tcp"
	loop := callRecord("loop")
	loop.Legs[1].RemoteTarget, loop.Legs[1].RemoteAddr = "sip:6002@127.0.0.1:5064", ""
	named := callRecord("named")
	named.Legs[1].RemoteTarget, named.Legs[1].RemoteAddr = "sip:6002@phone-b.example", ""
	injected := callRecord("inj")
	injected.Legs[1].RemoteURI = "sip:6002@198.51.100.22\r\nX-Evil: 1"
	noCSeq := callRecord("nocseq")
	noCSeq.Legs[0].CSeq = maxCSeq
	sameDialog := callRecord("same")
	sameDialog.Legs[1] = sameDialog.Legs[0]
	wrongKey := stored("calls", callRecord("wk"))
	wrongKey.Key = events.CallKey("lab", "pbx", "n3", "wk") // n3 writing a record that says n1
	otherGroup := callRecord("og")
	otherGroup.Group = "other"
	p := plan(stored("calls", callRecord("ok")), stored("calls", anchored), stored("calls", oneLeg), stored("calls", noTag),
		stored("calls", flagged), stored("calls", noTransport),
		stored("calls", tcp), stored("calls", loop), stored("calls", named), stored("calls", injected), stored("calls", noCSeq),
		stored("calls", sameDialog), wrongKey, stored("calls", otherGroup),
		Stored{Key: events.CallKey("lab", "pbx", "n1", "junk"), Value: []byte("{not json")},
		Stored{Key: events.CallKey("lab", "pbx", "n1", "big"), Value: make([]byte, events.MaxCallRecord+1)},
		Stored{Key: "calls.lab.pbx.n1", Value: []byte("{}")})
	want := map[string]int{events.NotAdoptedAnchored: 1, events.NotAdoptedIncomplete: 3,
		events.NotAdoptedInvalid: 12}
	if p.Report.Adopted != 1 || p.Adopt[0].ID != "ok" || !maps.Equal(p.Report.NotAdopted, want) {
		t.Fatalf("adopted %d (%v), not adopted %v; want 1 (ok), %v", p.Report.Adopted, p.Adopt, p.Report.NotAdopted, want)
	}
	if err := p.Report.Validate(); err != nil {
		t.Fatal(err)
	}
}

// A call this node's own PBX has up is left to it, whoever else has a
// record of it; this node's own kept records are taken up again.
func TestOwnCallsAndOwnKeptRecords(t *testing.T) {
	mine := callRecord("mine")
	mine.Node = "n2"
	keptElsewhere := keptRecord("mine")
	keptElsewhere.Node = "n3"
	ownKept := keptRecord("back")
	p := plan(stored("calls", mine), stored("kept", keptElsewhere), stored("kept", ownKept))
	if p.Report.Adopted != 1 || p.Adopt[0].ID != "back" || p.Report.NotAdopted != nil {
		t.Fatalf("plan %+v", p.Report)
	}
	again := p.Adopt[0]
	// Taken up again: first kept when and from whom it was, and a CSeq
	// above the one it wrote (it may have been used).
	if !again.KeptSince.Equal(ownKept.KeptSince) || again.AdoptedFrom != "n1" || again.Legs[0].CSeq != CSeqBase+1 {
		t.Fatalf("own kept record taken up as %+v", again)
	}
	if len(p.Report.From) != 0 {
		t.Fatalf("from %v: nothing came from another node", p.Report.From)
	}
}

// A call with its origin's record and a keeper's: the keeper's is adopted,
// with CSeqs above any written.
func TestChainedAdoption(t *testing.T) {
	byN3 := keptRecord("c1")
	byN3.Node, byN3.AdoptedFrom = "n3", "n1"
	byN3.Legs[1].CSeq = CSeqBase + 7
	p := plan(stored("calls", callRecord("c1")), stored("kept", byN3))
	if p.Report.Adopted != 1 || p.Report.From[0] != "n3" {
		t.Fatalf("plan %+v", p.Report)
	}
	k := p.Adopt[0]
	if k.AdoptedFrom != "n3" || k.Legs[0].CSeq != CSeqBase+1 || k.Legs[1].CSeq != CSeqBase+8 {
		t.Fatalf("adopted %+v (CSeqs %d %d)", k, k.Legs[0].CSeq, k.Legs[1].CSeq)
	}
	// Kept since its first adoption, whose lifetime goes on (KeepFor).
	if !k.KeptSince.Equal(byN3.KeptSince) || !k.UpdatedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("kept since %v, updated %v; want %v and the adoption's time", k.KeptSince, k.UpdatedAt, byN3.KeptSince)
	}
	// A keeper whose clock ran ahead cannot stretch the lifetime.
	ahead := byN3
	ahead.KeptSince = t0.Add(time.Hour)
	if k := plan(stored("kept", ahead)).Adopt[0]; !k.KeptSince.Equal(t0.Add(time.Minute)) {
		t.Fatalf("kept since %v, from a record saying %v", k.KeptSince, ahead.KeptSince)
	}
}

func TestAdoptionBound(t *testing.T) {
	in := PlanInput{Cluster: "lab", Group: "pbx", Node: "n2", Keeping: events.MaxCallsPerNode - 2, Now: t0,
		Records: []Stored{stored("calls", callRecord("a")), stored("calls", callRecord("b")), stored("calls", callRecord("c"))}}
	p := PlanAdoption(in)
	if p.Report.Adopted != 2 || p.Report.NotAdopted[events.NotAdoptedOverBound] != 1 {
		t.Fatalf("plan %+v", p.Report)
	}
}

func TestNextCSeq(t *testing.T) {
	for _, tc := range []struct {
		in, want uint32
		err      bool
	}{{0, CSeqBase, false}, {0x7fff + 100, CSeqBase, false}, {CSeqBase, CSeqBase + 1, false},
		{maxCSeq - 1, maxCSeq, false}, {maxCSeq, 0, true}, {1<<32 - 1, 0, true}} {
		got, err := nextCSeq(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("nextCSeq(%d) = %d, %v", tc.in, got, err)
		}
	}
}
