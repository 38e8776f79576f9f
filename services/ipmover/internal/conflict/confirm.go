// Package conflict decides what a holder does when another MAC uses one of
// its floating addresses: keep it only if it can confirm that its claim is
// the arbiter's current one, otherwise yield, and report either way.
//
// Yielding is the safe default. Two holders answering ARP for one address
// split the phones between two PBXs (invariant 1 in docs/invariants.md:
// calls set up on the wrong one are lost when it yields later); no holder
// for a moment is repaired by the arbiter's next claim.
package conflict

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/fanpbx/fan/pkg/events"
)

// Claim is what this node holds for one group.
type Claim struct {
	Group string
	// Epoch is the epoch of the claim applied (or, after a restart, of the
	// arbiter state that named this node holder).
	Epoch uint64
	// CommandID is the claim command applied; empty after a restore.
	CommandID string
}

// Verdict is the answer to "is my claim current?".
type Verdict struct {
	Confirmed   bool
	Holder      string // as the arbiter's state names it, if read
	HolderEpoch uint64
	Reason      string
	// ReadErr is set when the state could not be read at all: the answer
	// is "cannot tell", which a conflict treats as not confirmed (yield)
	// and a re-sync as "leave it as it is and retry".
	ReadErr error
}

// ReadKey reads one key of the state bucket. A missing key is (nil, nil).
type ReadKey func(ctx context.Context, key string) ([]byte, error)

// Confirmer checks a claim against the arbiter leader's state in the KV
// bucket. It reads GroupStatus first: it is the published contract and
// names the confirmed holder. While a move is in flight GroupStatus names
// no holder (the arbiter has not yet seen the claim's result), which is
// exactly when the old holder's last announcement can cross the new
// holder's first; so it then reads the arbiter's own state, which is
// written before any command leaves and names the outstanding claim.
//
// A KV read can be stale (a minority server answers Get without quorum);
// staleness can only make an old holder believe it still holds, and the new
// holder then confirms too. The arbiter's release to the old holder, and
// the reconnect re-sync, end that; the invariant's written bound is in the
// README.
type Confirmer struct {
	Cluster string
	Node    string
	Read    ReadKey
}

// arbiterState is the part of the arbiter's persisted state (decide.State
// in services/arbiter) a holder needs. Decoded leniently: an unknown shape
// reads as "nothing confirmed", which yields.
type arbiterState struct {
	Epoch  uint64 `json:"epoch"`
	Groups []struct {
		Name   string `json:"name"`
		Holder string `json:"holder"`
		Claim  *struct {
			CommandID string `json:"command_id"`
			Node      string `json:"node"`
		} `json:"claim"`
	} `json:"groups"`
}

// Confirm reports whether c is the arbiter's current claim for its group.
// Any read error is "not confirmed": a holder cut off from the bus yields
// on conflict.
func (cf Confirmer) Confirm(ctx context.Context, c Claim) Verdict {
	b, err := cf.Read(ctx, events.GroupStatusKey(cf.Cluster, c.Group))
	if err != nil {
		return Verdict{Reason: fmt.Sprintf("cannot read group status: %v", err), ReadErr: err}
	}
	if b != nil {
		var gs events.GroupStatus
		if err := json.Unmarshal(b, &gs); err != nil {
			return Verdict{Reason: fmt.Sprintf("cannot decode group status: %v", err)}
		}
		v := Verdict{Holder: gs.Holder, HolderEpoch: gs.Epoch}
		switch {
		case gs.Holder == cf.Node:
			v.Confirmed = true
			v.Reason = fmt.Sprintf("arbiter names %s holder at epoch %d", cf.Node, gs.Epoch)
			return v
		case gs.Holder != "":
			v.Reason = fmt.Sprintf("arbiter names %s holder at epoch %d", gs.Holder, gs.Epoch)
			return v
		case gs.Epoch < c.Epoch:
			// Written by an older leader than the one that sent our claim:
			// says nothing about it. The arbiter state below might.
		}
	}

	b, err = cf.Read(ctx, events.ArbiterStateKey(cf.Cluster))
	if err != nil {
		return Verdict{Reason: fmt.Sprintf("cannot read arbiter state: %v", err), ReadErr: err}
	}
	if b == nil {
		return Verdict{Reason: "no holder in the arbiter's state"}
	}
	var st arbiterState
	if err := json.Unmarshal(b, &st); err != nil {
		return Verdict{Reason: fmt.Sprintf("cannot decode arbiter state: %v", err)}
	}
	for _, g := range st.Groups {
		if g.Name != c.Group {
			continue
		}
		v := Verdict{Holder: g.Holder, HolderEpoch: st.Epoch}
		switch {
		case st.Epoch < c.Epoch:
			v.Reason = fmt.Sprintf("arbiter state is from epoch %d, older than our claim's %d", st.Epoch, c.Epoch)
		case g.Holder == cf.Node:
			v.Confirmed, v.Reason = true, fmt.Sprintf("arbiter state names %s holder at epoch %d", cf.Node, st.Epoch)
		case g.Claim != nil && g.Claim.Node == cf.Node && (c.CommandID == "" || g.Claim.CommandID == c.CommandID):
			v.Confirmed, v.Reason = true, fmt.Sprintf("our claim %s is the arbiter's outstanding claim at epoch %d", g.Claim.CommandID, st.Epoch)
		case g.Claim != nil:
			v.Reason = fmt.Sprintf("the arbiter's outstanding claim is %s on %s", g.Claim.CommandID, g.Claim.Node)
		case g.Holder != "":
			v.Reason = fmt.Sprintf("arbiter state names %s holder", g.Holder)
		default:
			v.Reason = "arbiter state names no holder and no claim"
		}
		return v
	}
	return Verdict{Reason: fmt.Sprintf("group %s not in the arbiter's state", c.Group)}
}
