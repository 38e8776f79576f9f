package replay

import (
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// pinned renders a pin's start or end (events.GroupPin) as a Decision, with
// Pin set and "pin_started" or "pin_ended_<how>" as its Action, so that
// pins are compared as decisions are: their causes, their reasons.
func pinned(id string, at time.Time, epoch uint64, p events.GroupPin) Decision {
	action := "pin_" + string(p.Stage)
	if p.End != "" {
		action += "_" + string(p.End)
	}
	return Decision{ID: id, At: at, Epoch: epoch, Pin: true, ArbiterDecision: events.ArbiterDecision{
		Group: p.Group, Action: events.Action(action), To: p.Node, Reason: p.Why, CausedBy: p.CausedBy,
		Trigger: p.Trigger, Input: p.Input, InputAudit: p.InputAudit, InputLive: p.InputLive}}
}
