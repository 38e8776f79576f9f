// Package notify tells the outside world what fan did: on every holder
// change, every health transition of a group's check and every decision
// that needs a human, it runs the configured commands (argv, no shell; the
// event as JSON on stdin and as FAN_* environment variables, like
// keepalived's notify scripts) and POSTs the configured webhooks (signed
// with HMAC-SHA256, retried with backoff).
//
// It runs off the decision path: events come from its own watch of the
// audit stream, each hook has its own bounded queue (the oldest event is
// dropped when it is full) and its own worker, so a hook that hangs holds up
// only its own later events, and only until its timeout kills it. Only the
// replica holding the arbiter lease runs hooks; see Notifier.
package notify

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/fanpbx/fan/pkg/events"
)

// Kind is what an event tells (FAN_EVENT).
type Kind string

const (
	// KindHolderChange is told when a node confirmed it took a group's addresses.
	KindHolderChange Kind = "holder_change"
	// KindHealth is told when a check the group decides on changed state on a node.
	KindHealth Kind = "health"
	// KindNeedsHuman is told when the arbiter decided it cannot resolve the group alone.
	KindNeedsHuman Kind = "needs_human"
	// KindPin is told when an operator's pin of a group starts or ends
	// (Stage started or ended; End how).
	KindPin Kind = "pin"
	// KindLeadersHold is told when an operator's hold of the raft leaders
	// starts or ends; it is the cluster's (Group empty), so every hook that
	// takes the kind hears it, whatever its groups.
	KindLeadersHold Kind = "leaders_hold"
	// KindPlanned is told at each stage of a planned move (a switchover or
	// a standby waiting for calls to end): waiting, moved, gave_up,
	// cancelled, overridden.
	KindPlanned Kind = "planned"
)

// Kinds are every kind, the default of a hook's events.
var Kinds = []Kind{KindHolderChange, KindHealth, KindNeedsHuman, KindPin, KindLeadersHold, KindPlanned}

// Event is what a hook is told: the JSON on a command's stdin and a
// webhook's body, and the FAN_* variables of a command's environment.
// It is the hooks' interface: fields are only ever added.
type Event struct {
	// ID is the fan event it reports (envelope id: claim result, health
	// transition, decision). The same event notified twice (a new leader
	// catching up) carries the same id: receivers dedupe on it and Group
	// (a transition of a check two groups decide on is told for each).
	ID      string    `json:"id"`
	Kind    Kind      `json:"event"`
	Time    time.Time `json:"time"`
	Cluster string    `json:"cluster"`
	Group   string    `json:"group"`
	// Node is the node the event is about: the new holder, the node whose
	// check changed, or the node the decision names.
	Node string `json:"node,omitempty"`
	// Holder is the group's holder after the event, as far as the
	// notifier has read (empty: none, or not known yet); Previous the one
	// before a holder change.
	Holder   string `json:"holder,omitempty"`
	Previous string `json:"previous,omitempty"`
	// Epoch is the arbiter's lease term the event happened under.
	Epoch  uint64        `json:"epoch,omitempty"`
	Reason string        `json:"reason,omitempty"`
	Action events.Action `json:"action,omitempty"`
	// Decision is the arbiter decision behind it (fanctl explain <id>).
	Decision string `json:"decision,omitempty"`
	// Health events: the check, its new and former state, and the node
	// whose prober judged it (a peer check runs on another node).
	Check      string        `json:"check,omitempty"`
	Health     events.Health `json:"health,omitempty"`
	HealthFrom events.Health `json:"health_from,omitempty"`
	Observer   string        `json:"observer,omitempty"`
	// Pins, leaders holds and planned moves: the stage, how it ended (a
	// pin, a hold), who asked, since and until when (a pin's or hold's
	// end; a planned move's deadline), and the hold's NATS server.
	Stage    string    `json:"stage,omitempty"`
	End      string    `json:"end,omitempty"`
	Operator string    `json:"operator,omitempty"`
	Since    time.Time `json:"since,omitzero"`
	Until    time.Time `json:"until,omitzero"`
	Server   string    `json:"server,omitempty"`
}

// JSON is the event as hooks read it.
func (e Event) JSON() []byte {
	b, _ := json.Marshal(e) // plain strings and numbers: cannot fail
	return b
}

// Env is the event as FAN_* variables (every one set, empty when the
// event has no such field, so a script never reads one left over from
// its own environment).
func (e Event) Env() []string {
	epoch := ""
	if e.Epoch != 0 {
		epoch = strconv.FormatUint(e.Epoch, 10)
	}
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	vars := [][2]string{
		{"FAN_EVENT", string(e.Kind)}, {"FAN_EVENT_ID", e.ID}, {"FAN_TIME", e.Time.UTC().Format(time.RFC3339Nano)},
		{"FAN_CLUSTER", e.Cluster}, {"FAN_GROUP", e.Group}, {"FAN_NODE", e.Node},
		{"FAN_HOLDER", e.Holder}, {"FAN_PREVIOUS", e.Previous}, {"FAN_EPOCH", epoch},
		{"FAN_REASON", e.Reason}, {"FAN_ACTION", string(e.Action)}, {"FAN_DECISION", e.Decision},
		{"FAN_CHECK", e.Check}, {"FAN_HEALTH", string(e.Health)}, {"FAN_HEALTH_FROM", string(e.HealthFrom)},
		{"FAN_OBSERVER", e.Observer},
		{"FAN_STAGE", e.Stage}, {"FAN_END", e.End}, {"FAN_OPERATOR", e.Operator},
		{"FAN_SINCE", stamp(e.Since)}, {"FAN_UNTIL", stamp(e.Until)}, {"FAN_SERVER", e.Server},
	}
	out := make([]string, len(vars))
	for i, v := range vars {
		// A NUL cannot be passed in the environment (execve); text from
		// the bus is bounded but may hold one.
		out[i] = v[0] + "=" + strings.ReplaceAll(v[1], "\x00", "")
	}
	return out
}
