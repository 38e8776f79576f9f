package keeper

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Stored is one record as read from the calls bucket: its key, value and
// revision.
type Stored struct {
	Key      string
	Value    []byte
	Revision uint64
}

// PlanInput is what a node taking a group knows when it adopts the group's
// calls.
type PlanInput struct {
	Cluster, Group string
	// Node is this node, the one adopting.
	Node string
	// Records are the group's records under events.GroupCallKeys and
	// events.GroupKeptKeys, as read.
	Records []Stored
	// Keeping is how many calls this node keeps already (other groups):
	// events.MaxCallsPerNode bounds them all.
	Keeping int
	Now     time.Time
}

// Plan is what to adopt, and the report of it.
type Plan struct {
	// Adopt are the records this node keeps, as it writes them under its
	// own kept key: Node, Kept, KeptSince (when the call was first kept, by
	// whichever node), AdoptedFrom, UpdatedAt and each leg's CSeq (the one
	// its BYE will carry) set.
	Adopt  []events.CallRecord
	Report events.CallsAdoption
}

// candidate is one decoded record of a call.
type candidate struct {
	kept bool // under a kept key
	node string
	rec  events.CallRecord
}

// PlanAdoption decides which of a group's calls this node adopts.
//
// Every node but this one may have left records: the node the group moves
// from (its calls), a node that kept them before it (its kept records,
// after an earlier failover), and, after a planned move, a node still alive
// whose PBX has the calls up. All of them are adopted alike: the floating
// address is here now, so the phones' in-dialog requests reach this node
// only, whoever still holds channels for the calls. A call this node's own
// PBX has up (a calls record of this node) is left to the PBX, and so is
// any other record of the same call: the PBX answers its dialogs itself.
// This node's own kept records (it kept the calls before a restart or a
// move away and back) are adopted again.
//
// When a call has several records (its origin's and one or more keepers'),
// the newest kept record is adopted, and each dialog's CSeq starts above
// the highest any of them wrote.
func PlanAdoption(in PlanInput) Plan {
	p := Plan{Report: events.CallsAdoption{NotAdopted: map[string]int{}}}
	own := map[string]bool{}
	byID := map[string][]candidate{}
	for _, s := range in.Records {
		c, ok := decode(in, s)
		if !ok {
			p.Report.NotAdopted[events.NotAdoptedInvalid]++
			continue
		}
		if !c.kept && c.node == in.Node {
			own[c.rec.ID] = true
			continue
		}
		byID[c.rec.ID] = append(byID[c.rec.ID], c)
	}
	from := map[string]bool{}
	for _, id := range slices.Sorted(maps.Keys(byID)) {
		if own[id] {
			continue
		}
		cands := byID[id]
		chosen := slices.MaxFunc(cands, func(a, b candidate) int {
			return cmp.Or(boolCmp(a.kept, b.kept), a.rec.UpdatedAt.Compare(b.rec.UpdatedAt), strings.Compare(b.node, a.node))
		})
		rec, reason := prepare(in, chosen, cands)
		if reason != "" {
			p.Report.NotAdopted[reason]++
			continue
		}
		if in.Keeping+len(p.Adopt) >= events.MaxCallsPerNode {
			p.Report.NotAdopted[events.NotAdoptedOverBound]++
			continue
		}
		p.Adopt = append(p.Adopt, rec)
		if chosen.node != in.Node {
			from[chosen.node] = true
		}
	}
	p.Report.Adopted = len(p.Adopt)
	p.Report.From = slices.Sorted(maps.Keys(from))
	if len(p.Report.NotAdopted) == 0 {
		p.Report.NotAdopted = nil
	}
	return p
}

func boolCmp(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// decode reads a stored record and checks it against its key: the key is
// what the bus's permissions bind to the writer's identity (a node writes
// only its own calls and kept keys), so a record naming another node, group
// or call than its key is refused (events.VerifyCallKey).
func decode(in PlanInput, s Stored) (candidate, bool) {
	k, err := events.ParseCallKey(s.Key)
	if err != nil || k.Cluster != in.Cluster || k.Group != in.Group {
		return candidate{}, false
	}
	rec, err := events.DecodeCallRecord(s.Value)
	if err != nil || events.VerifyCallKey(s.Key, rec) != nil {
		return candidate{}, false
	}
	return candidate{kept: k.Kind == events.CallKeyKept, node: k.Node, rec: rec}, true
}

// prepare checks the chosen record of a call and makes this node's kept
// record of it, or says why the call is not adopted.
func prepare(in PlanInput, chosen candidate, all []candidate) (events.CallRecord, string) {
	rec := chosen.rec
	if rec.Media == events.MediaAnchored {
		return rec, events.NotAdoptedAnchored
	}
	if rec.Complete() != nil {
		return rec, events.NotAdoptedIncomplete
	}
	if rec.Legs[0].CallID == rec.Legs[1].CallID && rec.Legs[0].LocalTag == rec.Legs[1].LocalTag {
		// One dialog twice: ending "the other side" would end the same one.
		return rec, events.NotAdoptedInvalid
	}
	rec.Legs = slices.Clone(rec.Legs)
	for i := range rec.Legs {
		highest := rec.Legs[i].CSeq
		for _, c := range all {
			for _, l := range c.rec.Legs {
				if l.CallID == rec.Legs[i].CallID && l.LocalTag == rec.Legs[i].LocalTag {
					highest = max(highest, l.CSeq)
				}
			}
		}
		cseq, err := nextCSeq(highest)
		if err != nil {
			return rec, events.NotAdoptedInvalid
		}
		if _, err := newLeg(rec.Legs[i], cseq); err != nil {
			return rec, events.NotAdoptedInvalid
		}
		rec.Legs[i].CSeq = cseq
	}
	switch {
	case !chosen.kept:
		// First kept now, from the record of the node that set it up.
		rec.KeptSince, rec.AdoptedFrom = in.Now, chosen.node
	case chosen.node != in.Node:
		// From another keeper: adopted from it, but kept since its first
		// adoption, which its lifetime is measured from (Config.KeepFor).
		rec.AdoptedFrom = chosen.node
	}
	// This node's own kept record keeps when and from whom it was first
	// adopted.
	rec.Node, rec.Kept, rec.UpdatedAt = in.Node, true, in.Now
	if rec.KeptSince.IsZero() || rec.KeptSince.After(in.Now) {
		// A kept record always says when (validated); one from a clock
		// ahead of this node's would stretch the call's lifetime.
		rec.KeptSince = in.Now
	}
	return rec, ""
}
