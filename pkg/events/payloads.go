package events

import (
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/google/uuid"
)

// Event and command types. The string is the wire name; never reuse one.
const (
	TypeProbeResult       Type = "probe.result"
	TypeHealthTransition  Type = "health.transition"
	TypeNodeHeartbeat     Type = "node.heartbeat"
	TypeArbiterDecision   Type = "arbiter.decision"
	TypeClaimIP           Type = "command.claim_ip"
	TypeReleaseIP         Type = "command.release_ip"
	TypeAnswerPBX         Type = "command.answer_pbx"
	TypeCommandResult     Type = "command.result"
	TypeFailbackPermit    Type = "failback.permit"
	TypeReplicationStatus Type = "replication.status"
	TypeServiceAnnounce   Type = "service.announce"
)

// Health is the state of one check (or quorum group) as the prober sees it.
type Health string

const (
	HealthUnknown Health = "unknown"
	HealthUp      Health = "up"
	HealthDown    Health = "down"
)

func (h Health) valid() bool { return h == HealthUnknown || h == HealthUp || h == HealthDown }

// Role says what a check looks at, relative to the node running it. The
// arbiter reads peer checks to tell a dead node from one cut off from the bus.
type Role string

const (
	RoleSelf Role = "self"
	RolePeer Role = "peer"
	RoleVIP  Role = "vip"
)

func (r Role) valid() bool { return r == RoleSelf || r == RolePeer || r == RoleVIP }

// ErrorClass lets consumers tell kinds of failure apart without parsing text:
// a wrong AMI password must never look like a timeout.
type ErrorClass string

const (
	ErrorTimeout  ErrorClass = "timeout"
	ErrorRefused  ErrorClass = "refused"
	ErrorAuth     ErrorClass = "auth"
	ErrorProtocol ErrorClass = "protocol"
	ErrorUnhealth ErrorClass = "unhealthy" // the peer answered, and the answer means "not healthy"
	ErrorOther    ErrorClass = "other"
)

// ProbeResult is one run of one check.
type ProbeResult struct {
	Check      string             `json:"check"`
	Kind       string             `json:"kind"`
	Target     string             `json:"target"`
	TargetNode string             `json:"target_node"`
	Role       Role               `json:"role"`
	OK         bool               `json:"ok"`
	DurationMS float64            `json:"duration_ms"`
	Error      string             `json:"error,omitempty"`
	ErrorClass ErrorClass         `json:"error_class,omitempty"`
	Figures    map[string]float64 `json:"figures,omitempty"`
	At         time.Time          `json:"at"`
}

func (ProbeResult) EventType() Type    { return TypeProbeResult }
func (ProbeResult) SchemaVersion() int { return 1 }
func (p ProbeResult) subject(e Envelope) string {
	return ProbeResultSubject(e.Cluster, e.Source.Node)
}

func (p ProbeResult) Validate() error {
	if err := ValidToken("check", p.Check); err != nil {
		return err
	}
	if err := ValidToken("target_node", p.TargetNode); err != nil {
		return err
	}
	if p.Kind == "" {
		return fmt.Errorf("%w: kind", ErrMissingField)
	}
	if !p.Role.valid() {
		return fmt.Errorf("%w: role %q", ErrInvalidField, p.Role)
	}
	if p.At.IsZero() {
		return fmt.Errorf("%w: at", ErrMissingField)
	}
	if !p.OK && p.Error == "" {
		return fmt.Errorf("%w: error (a failed result must say why)", ErrMissingField)
	}
	if err := firstErr(
		textIn("kind", p.Kind, MaxShortLen),
		textIn("target", p.Target, MaxTextLen),
		textIn("error", p.Error, MaxTextLen),
		textIn("error_class", string(p.ErrorClass), MaxShortLen),
		floatIn("duration_ms", p.DurationMS, 0, MaxDurationMS),
		listIn("figures", len(p.Figures), MaxListLen),
	); err != nil {
		return err
	}
	for k, v := range p.Figures {
		if err := firstErr(textIn("figures key", k, MaxShortLen), floatIn("figures["+k+"]", v, -math.MaxFloat64, math.MaxFloat64)); err != nil {
			return err
		}
	}
	return nil
}

// Evidence is one result that contributed to a transition.
type Evidence struct {
	At         time.Time  `json:"at"`
	OK         bool       `json:"ok"`
	DurationMS float64    `json:"duration_ms"`
	Error      string     `json:"error,omitempty"`
	ErrorClass ErrorClass `json:"error_class,omitempty"`
}

// HealthTransition is a check (or quorum group) crossing rise or fall.
// Evidence holds the consecutive results that caused it, oldest first.
type HealthTransition struct {
	Check       string     `json:"check"`
	TargetNode  string     `json:"target_node"`
	Role        Role       `json:"role"`
	From        Health     `json:"from"`
	To          Health     `json:"to"`
	Reason      string     `json:"reason"`
	Consecutive int        `json:"consecutive"`
	Rise        int        `json:"rise"`
	Fall        int        `json:"fall"`
	Evidence    []Evidence `json:"evidence"`
}

func (HealthTransition) EventType() Type    { return TypeHealthTransition }
func (HealthTransition) SchemaVersion() int { return 1 }
func (h HealthTransition) subject(e Envelope) string {
	return HealthSubject(e.Cluster, e.Source.Node)
}

func (h HealthTransition) Validate() error {
	if err := ValidToken("check", h.Check); err != nil {
		return err
	}
	if err := ValidToken("target_node", h.TargetNode); err != nil {
		return err
	}
	if !h.Role.valid() {
		return fmt.Errorf("%w: role %q", ErrInvalidField, h.Role)
	}
	if !h.From.valid() || !h.To.valid() || h.From == h.To {
		return fmt.Errorf("%w: transition %q -> %q", ErrInvalidField, h.From, h.To)
	}
	if h.Rise < 1 || h.Fall < 1 {
		return fmt.Errorf("%w: rise and fall must be at least 1", ErrInvalidField)
	}
	if len(h.Evidence) == 0 {
		return fmt.Errorf("%w: evidence", ErrMissingField)
	}
	if err := firstErr(
		intIn("rise", h.Rise, 1, MaxRiseFall),
		intIn("fall", h.Fall, 1, MaxRiseFall),
		intIn("consecutive", h.Consecutive, 0, MaxCount),
		listIn("evidence", len(h.Evidence), MaxRiseFall),
		textIn("reason", h.Reason, MaxTextLen),
	); err != nil {
		return err
	}
	for _, ev := range h.Evidence {
		if err := firstErr(textIn("evidence error", ev.Error, MaxTextLen), floatIn("evidence duration_ms", ev.DurationMS, 0, MaxDurationMS)); err != nil {
			return err
		}
	}
	return nil
}

// CheckState is the level-triggered view of one check inside a heartbeat, so
// a consumer that missed a transition converges on the next heartbeat.
type CheckState struct {
	TargetNode string `json:"target_node"`
	Role       Role   `json:"role"`
	Health     Health `json:"health"`
	// Since is when the check entered this state; SinceEvent is the
	// transition that put it there (empty while unknown).
	Since      time.Time `json:"since"`
	SinceEvent string    `json:"since_event,omitempty"`
}

// NodeHeartbeat is a node's host telemetry plus the prober's current view.
type NodeHeartbeat struct {
	Node              string                `json:"node"`
	Seq               uint64                `json:"seq"`
	IntervalMS        int64                 `json:"interval_ms"`
	CPUPercent        float64               `json:"cpu_percent"`
	MemAvailableBytes uint64                `json:"mem_available_bytes"`
	MemTotalBytes     uint64                `json:"mem_total_bytes"`
	Load1             float64               `json:"load1"`
	UptimeSeconds     float64               `json:"uptime_seconds"`
	ActiveChannels    *int                  `json:"active_channels,omitempty"`
	ActiveCalls       *int                  `json:"active_calls,omitempty"`
	Version           string                `json:"version"`
	Checks            map[string]CheckState `json:"checks,omitempty"`
	// PBXSystemName is the node's Asterisk systemname (asterisk.conf; AMI
	// CoreSettings' SystemName) as the prober last read it, "" when
	// Asterisk has none; absent while the prober has not read it (no AMI
	// check, no right to ask, an older prober). Every PBX node of a group
	// must have the same: registrations carried between nodes name it
	// (fanctl doctor compares them).
	PBXSystemName *string `json:"pbx_system_name,omitempty"`
}

func (NodeHeartbeat) EventType() Type    { return TypeNodeHeartbeat }
func (NodeHeartbeat) SchemaVersion() int { return 1 }
func (h NodeHeartbeat) subject(e Envelope) string {
	return HeartbeatSubject(e.Cluster, h.Node)
}

func (h NodeHeartbeat) Validate() error {
	if err := ValidToken("node", h.Node); err != nil {
		return err
	}
	if h.IntervalMS <= 0 {
		return fmt.Errorf("%w: interval_ms", ErrMissingField)
	}
	if h.Version == "" {
		return fmt.Errorf("%w: version", ErrMissingField)
	}
	if err := firstErr(
		ValidHeartbeatInterval(h.IntervalMS),
		floatIn("cpu_percent", h.CPUPercent, 0, 100),
		floatIn("load1", h.Load1, 0, MaxCount),
		floatIn("uptime_seconds", h.UptimeSeconds, 0, 100*365*24*3600),
		textIn("version", h.Version, MaxShortLen),
		listIn("checks", len(h.Checks), MaxListLen),
	); err != nil {
		return err
	}
	if h.PBXSystemName != nil {
		if err := textIn("pbx_system_name", *h.PBXSystemName, MaxShortLen); err != nil {
			return err
		}
	}
	if h.MemTotalBytes > 0 && h.MemAvailableBytes > h.MemTotalBytes {
		return fmt.Errorf("%w: mem_available_bytes %d above mem_total_bytes %d", ErrInvalidField, h.MemAvailableBytes, h.MemTotalBytes)
	}
	for f, v := range map[string]*int{"active_channels": h.ActiveChannels, "active_calls": h.ActiveCalls} {
		if v != nil {
			if err := intIn(f, *v, 0, MaxCount); err != nil {
				return err
			}
		}
	}
	for name, c := range h.Checks {
		if err := ValidToken("checks key", name); err != nil {
			return err
		}
		if !c.Health.valid() || !c.Role.valid() {
			return fmt.Errorf("%w: checks[%s]", ErrInvalidField, name)
		}
	}
	return nil
}

// Action is what the arbiter decided for a group.
type Action string

const (
	ActionPlace      Action = "place"      // first holder for a group that had none
	ActionFailover   Action = "failover"   // holder lost, another node takes over
	ActionFailback   Action = "failback"   // back to the preferred node inside a window
	ActionSwitchover Action = "switchover" // operator-requested move
	ActionRetry      Action = "retry"      // a claim failed or timed out: next candidate
	ActionHold       Action = "hold"       // decided not to move, and why
)

func (a Action) valid() bool {
	switch a {
	case ActionPlace, ActionFailover, ActionFailback, ActionSwitchover, ActionRetry, ActionHold:
		return true
	}
	return false
}

// ArbiterDecision records a decision and the events that caused it, so any
// move can be explained after the fact.
type ArbiterDecision struct {
	Group    string   `json:"group"`
	Action   Action   `json:"action"`
	From     string   `json:"from,omitempty"`
	To       string   `json:"to,omitempty"`
	Reason   string   `json:"reason"`
	CausedBy []string `json:"caused_by"`
	Commands []string `json:"commands,omitempty"`
	// NeedsHuman marks a decision the arbiter cannot resolve on its own
	// (a group frozen after too many moves, or a dead holder in a frozen
	// group): alerting keys on it.
	NeedsHuman bool `json:"needs_human,omitempty"`
	// Forced marks a failback made with calls still up because the window
	// was about to close and the policy says force.
	Forced bool `json:"forced,omitempty"`
	// Trigger and Input say what the arbiter was doing when it decided, so
	// that `fanctl replay` can give its decision core the same inputs at
	// the same moments (the envelope's time is the core's clock): Input is
	// the id of the last stored event the arbiter had read, and Trigger
	// whether it was handling that event or acting on something else.
	Trigger Trigger `json:"trigger,omitempty"`
	Input   string  `json:"input,omitempty"`
	// InputAudit and InputLive are the last events the arbiter had read
	// from the audit stream and from the live stream (heartbeats): it
	// reads the two at once, in no common order, so the replay needs its
	// place in each. Input is the later of the two.
	InputAudit string `json:"input_audit,omitempty"`
	InputLive  string `json:"input_live,omitempty"`
	// Calls is, for a move away from a holder (From), the calls it had up
	// by its last calls summary heard since it took the group: how many a
	// new holder may carry across and how many the move ends. Absent when
	// no summary of it was heard (no replicator records its calls). The
	// summary is also in CausedBy.
	Calls *HolderCalls `json:"calls,omitempty"`
}

// Trigger is what made the arbiter's decision core decide.
type Trigger string

const (
	TriggerEvent    Trigger = "event"    // handling the decision's Input
	TriggerTick     Trigger = "tick"     // its own clock (timeouts, silence, stability)
	TriggerBeacon   Trigger = "beacon"   // a presence beacon (core NATS: never stored)
	TriggerOperator Trigger = "operator" // an operator action (the OperatorAction it cites)
	TriggerTakeover Trigger = "takeover" // a new leader re-issuing a claim its predecessor never sent
)

func (ArbiterDecision) EventType() Type    { return TypeArbiterDecision }
func (ArbiterDecision) SchemaVersion() int { return 1 }
func (d ArbiterDecision) subject(e Envelope) string {
	return DecisionSubject(e.Cluster, d.Group)
}

func (d ArbiterDecision) Validate() error {
	if err := ValidToken("group", d.Group); err != nil {
		return err
	}
	if !d.Action.valid() {
		return fmt.Errorf("%w: action %q", ErrInvalidField, d.Action)
	}
	if d.Reason == "" {
		return fmt.Errorf("%w: reason", ErrMissingField)
	}
	if len(d.CausedBy) == 0 {
		return fmt.Errorf("%w: caused_by (every decision names its causes)", ErrMissingField)
	}
	if err := firstErr(
		textIn("reason", d.Reason, MaxTextLen),
		textIn("input", d.Input, MaxTextLen),
		listIn("caused_by", len(d.CausedBy), MaxListLen),
		listIn("commands", len(d.Commands), MaxListLen),
		textIn("from", d.From, MaxShortLen),
		textIn("to", d.To, MaxShortLen),
	); err != nil {
		return err
	}
	if d.Action != ActionHold {
		if err := ValidToken("to", d.To); err != nil {
			return err
		}
	}
	if d.Calls != nil {
		return d.Calls.Validate()
	}
	return nil
}

// ClaimIP tells a node's executor to take the group's addresses.
type ClaimIP struct {
	Group     string    `json:"group"`
	Node      string    `json:"node"`
	Addresses []string  `json:"addresses"` // prefixes, e.g. 198.51.100.10/24 or 2001:db8::10/64
	NotAfter  time.Time `json:"not_after"`
	// PreviousHolder, when fenced, is known not to answer any more, so the
	// executor may claim even if that node's MAC still answers ARP.
	PreviousHolder       string `json:"previous_holder,omitempty"`
	PreviousHolderFenced bool   `json:"previous_holder_fenced,omitempty"`
	// AfterReleases are the ids of releases sent in the same decision to
	// nodes still heard on the bus. They run on other nodes' executors, in
	// parallel with this claim: the executor waits (bounded) for their
	// results before taking the address, so that a node that is alive and
	// about to let go is never still answering when the claimant announces.
	AfterReleases []string `json:"after_releases,omitempty"`
}

func (ClaimIP) EventType() Type    { return TypeClaimIP }
func (ClaimIP) SchemaVersion() int { return 1 }
func (ClaimIP) requiresEpoch()     {}

// Deadline is when the command stops being valid; executors refuse it after.
func (c ClaimIP) Deadline() time.Time { return c.NotAfter }

// Target is the command's group and executing node.
func (c ClaimIP) Target() (group, node string) { return c.Group, c.Node }
func (c ClaimIP) subject(e Envelope) string {
	return CommandSubject(e.Cluster, c.Node, VerbClaim)
}
func (c ClaimIP) Validate() error {
	if err := validateAddressCommand(c.Group, c.Node, c.Addresses, c.NotAfter); err != nil {
		return err
	}
	if err := listIn("after_releases", len(c.AfterReleases), MaxListLen); err != nil {
		return err
	}
	for _, id := range c.AfterReleases {
		if _, err := uuid.Parse(id); err != nil {
			return fmt.Errorf("%w: after_releases %q", ErrInvalidField, id)
		}
	}
	return nil
}

// ReleaseIP tells a node's executor to give the group's addresses up.
type ReleaseIP struct {
	Group     string    `json:"group"`
	Node      string    `json:"node"`
	Addresses []string  `json:"addresses"`
	NotAfter  time.Time `json:"not_after"`
	Reason    string    `json:"reason,omitempty"`
}

func (ReleaseIP) EventType() Type    { return TypeReleaseIP }
func (ReleaseIP) SchemaVersion() int { return 1 }
func (ReleaseIP) requiresEpoch()     {}

// Deadline is when the command stops being valid; executors refuse it after.
func (c ReleaseIP) Deadline() time.Time { return c.NotAfter }

// Target is the command's group and executing node.
func (c ReleaseIP) Target() (group, node string) { return c.Group, c.Node }
func (c ReleaseIP) subject(e Envelope) string {
	return CommandSubject(e.Cluster, c.Node, VerbRelease)
}
func (c ReleaseIP) Validate() error {
	if err := textIn("reason", c.Reason, MaxTextLen); err != nil {
		return err
	}
	return validateAddressCommand(c.Group, c.Node, c.Addresses, c.NotAfter)
}

func validateAddressCommand(group, node string, addrs []string, notAfter time.Time) error {
	if err := ValidToken("group", group); err != nil {
		return err
	}
	if err := ValidToken("node", node); err != nil {
		return err
	}
	if len(addrs) == 0 {
		return fmt.Errorf("%w: addresses", ErrMissingField)
	}
	if err := listIn("addresses", len(addrs), MaxListLen); err != nil {
		return err
	}
	for _, a := range addrs {
		if _, err := netip.ParsePrefix(a); err != nil {
			return fmt.Errorf("%w: address %q: %v", ErrInvalidField, a, err)
		}
	}
	if notAfter.IsZero() {
		return fmt.Errorf("%w: not_after (every command has a deadline)", ErrMissingField)
	}
	return nil
}

// AnswerMode is how a node makes its PBX answer on a claimed address.
type AnswerMode string

const (
	AnswerHot     AnswerMode = "hot"     // already bound through ip_nonlocal_bind: nothing to do
	AnswerReload  AnswerMode = "reload"  // AMI Reload of the configured modules
	AnswerRestart AnswerMode = "restart" // restart the PBX service
)

func (m AnswerMode) valid() bool { return m == AnswerHot || m == AnswerReload || m == AnswerRestart }

// AnswerPBX asks a node to make its PBX answer on the group's addresses
// (after a claim that did not already do so).
type AnswerPBX struct {
	Group    string     `json:"group"`
	Node     string     `json:"node"`
	Mode     AnswerMode `json:"mode"`
	Modules  []string   `json:"modules,omitempty"`
	NotAfter time.Time  `json:"not_after"`
}

func (AnswerPBX) EventType() Type    { return TypeAnswerPBX }
func (AnswerPBX) SchemaVersion() int { return 1 }
func (AnswerPBX) requiresEpoch()     {}

// Deadline is when the command stops being valid; executors refuse it after.
func (c AnswerPBX) Deadline() time.Time { return c.NotAfter }

// Target is the command's group and executing node.
func (c AnswerPBX) Target() (group, node string) { return c.Group, c.Node }
func (c AnswerPBX) subject(e Envelope) string {
	return CommandSubject(e.Cluster, c.Node, VerbAnswer)
}

func (c AnswerPBX) Validate() error {
	if err := ValidToken("group", c.Group); err != nil {
		return err
	}
	if err := ValidToken("node", c.Node); err != nil {
		return err
	}
	if !c.Mode.valid() {
		return fmt.Errorf("%w: mode %q", ErrInvalidField, c.Mode)
	}
	if c.NotAfter.IsZero() {
		return fmt.Errorf("%w: not_after", ErrMissingField)
	}
	if err := listIn("modules", len(c.Modules), 64); err != nil {
		return err
	}
	for _, m := range c.Modules {
		if err := textIn("module", m, MaxShortLen); err != nil {
			return err
		}
	}
	return nil
}

// Outcome is what an executor did with a command.
type Outcome string

const (
	OutcomeApplied    Outcome = "applied"
	OutcomeDuplicate  Outcome = "duplicate"   // already applied: acknowledged, nothing done
	OutcomeStaleEpoch Outcome = "stale_epoch" // older than an epoch already seen: refused
	OutcomeExpired    Outcome = "expired"     // past its deadline: refused
	OutcomeFailed     Outcome = "failed"
)

func (o Outcome) valid() bool {
	switch o {
	case OutcomeApplied, OutcomeDuplicate, OutcomeStaleEpoch, OutcomeExpired, OutcomeFailed:
		return true
	}
	return false
}

// Step is one timed stage of carrying out a command.
type Step struct {
	Name      string    `json:"name"`
	At        time.Time `json:"at"`
	ElapsedMS float64   `json:"elapsed_ms"` // since the command was received
}

// CommandResult reports the outcome of one command. Its envelope's causation
// id is the command's id.
type CommandResult struct {
	CommandID   string  `json:"command_id"`
	CommandType Type    `json:"command_type"`
	Node        string  `json:"node"`
	Group       string  `json:"group"`
	Outcome     Outcome `json:"outcome"`
	Error       string  `json:"error,omitempty"`
	Steps       []Step  `json:"steps,omitempty"`
	// Calls is what an applied claim did with the group's calls in
	// progress (adopted, not adopted and why), when the IP executor keeps
	// calls; nil otherwise.
	Calls *CallsAdoption `json:"calls,omitempty"`
	// DNS is, for a DNS executor with one primary per site, what each
	// authoritative server serves after the command (dns.go); nil otherwise.
	DNS []DNSServerState `json:"dns,omitempty"`
}

func (CommandResult) EventType() Type    { return TypeCommandResult }
func (CommandResult) SchemaVersion() int { return 1 }
func (r CommandResult) subject(e Envelope) string {
	return CommandResultSubject(e.Cluster, r.Node)
}

func (r CommandResult) Validate() error {
	if r.CommandID == "" {
		return fmt.Errorf("%w: command_id", ErrMissingField)
	}
	switch r.CommandType {
	case TypeClaimIP, TypeReleaseIP, TypeAnswerPBX:
	default:
		return fmt.Errorf("%w: command_type %q", ErrInvalidField, r.CommandType)
	}
	if err := ValidToken("node", r.Node); err != nil {
		return err
	}
	if err := ValidToken("group", r.Group); err != nil {
		return err
	}
	if !r.Outcome.valid() {
		return fmt.Errorf("%w: outcome %q", ErrInvalidField, r.Outcome)
	}
	if r.Outcome != OutcomeApplied && r.Outcome != OutcomeDuplicate && r.Error == "" {
		return fmt.Errorf("%w: error (a refused or failed command must say why)", ErrMissingField)
	}
	if err := firstErr(
		textIn("command_id", r.CommandID, MaxShortLen),
		textIn("error", r.Error, MaxTextLen),
		listIn("steps", len(r.Steps), MaxListLen),
	); err != nil {
		return err
	}
	for _, st := range r.Steps {
		if err := firstErr(textIn("step name", st.Name, MaxShortLen), floatIn("step elapsed_ms", st.ElapsedMS, 0, MaxDurationMS)); err != nil {
			return err
		}
	}
	if err := validateDNSStates(r.DNS); err != nil {
		return err
	}
	if r.Calls != nil {
		return r.Calls.Validate()
	}
	return nil
}

// FailbackPermit says failback is allowed for a group until ValidUntil.
type FailbackPermit struct {
	Group      string    `json:"group"`
	Window     string    `json:"window"`
	ValidFrom  time.Time `json:"valid_from"`
	ValidUntil time.Time `json:"valid_until"`
}

func (FailbackPermit) EventType() Type    { return TypeFailbackPermit }
func (FailbackPermit) SchemaVersion() int { return 1 }
func (p FailbackPermit) subject(e Envelope) string {
	return PermitSubject(e.Cluster, p.Group)
}

func (p FailbackPermit) Validate() error {
	if err := ValidToken("group", p.Group); err != nil {
		return err
	}
	if p.Window == "" {
		return fmt.Errorf("%w: window", ErrMissingField)
	}
	if p.ValidFrom.IsZero() || !p.ValidUntil.After(p.ValidFrom) {
		return fmt.Errorf("%w: valid_from must precede valid_until", ErrInvalidField)
	}
	if span := p.ValidUntil.Sub(p.ValidFrom); span > MaxPermitSpan {
		return fmt.Errorf("%w: permit valid for %v, at most %v", ErrInvalidField, span, MaxPermitSpan)
	}
	return textIn("window", p.Window, MaxShortLen)
}

// ReplicationStatus reports a replication pass from one node to a peer.
type ReplicationStatus struct {
	Node       string  `json:"node"`
	Peer       string  `json:"peer"`
	Tree       string  `json:"tree"`
	Files      int64   `json:"files"`
	Bytes      int64   `json:"bytes"`
	DurationMS float64 `json:"duration_ms"`
	LagMS      float64 `json:"lag_ms"`
	CaughtUp   bool    `json:"caught_up"`
	Error      string  `json:"error,omitempty"`
	// Optional, added by the replicator: the group whose holder is Node,
	// the manifest generation the peer confirmed, and how many entries
	// that pass deleted on the peer.
	Group      string `json:"group,omitempty"`
	Generation uint64 `json:"generation,omitempty"`
	Deleted    int64  `json:"deleted,omitempty"`
}

func (ReplicationStatus) EventType() Type    { return TypeReplicationStatus }
func (ReplicationStatus) SchemaVersion() int { return 1 }
func (r ReplicationStatus) subject(e Envelope) string {
	return ReplicationSubject(e.Cluster, r.Node)
}

func (r ReplicationStatus) Validate() error {
	if err := ValidToken("node", r.Node); err != nil {
		return err
	}
	if err := ValidToken("peer", r.Peer); err != nil {
		return err
	}
	if r.Tree == "" {
		return fmt.Errorf("%w: tree", ErrMissingField)
	}
	if r.Files < 0 || r.Bytes < 0 || r.Deleted < 0 {
		return fmt.Errorf("%w: negative counts", ErrInvalidField)
	}
	return firstErr(
		textIn("tree", r.Tree, MaxShortLen),
		textIn("error", r.Error, MaxTextLen),
		floatIn("duration_ms", r.DurationMS, 0, MaxDurationMS),
		floatIn("lag_ms", r.LagMS, -MaxLagMS, MaxLagMS),
	)
}

// ServiceState is a service instance's lifecycle stage.
type ServiceState string

const (
	ServiceStarted  ServiceState = "started"
	ServiceStopping ServiceState = "stopping"
)

// ServiceAnnounce is published when a service instance starts and stops.
type ServiceAnnounce struct {
	Service string       `json:"service"`
	Node    string       `json:"node"`
	Version string       `json:"version"`
	State   ServiceState `json:"state"`
}

func (ServiceAnnounce) EventType() Type    { return TypeServiceAnnounce }
func (ServiceAnnounce) SchemaVersion() int { return 1 }
func (a ServiceAnnounce) subject(e Envelope) string {
	return AnnounceSubject(e.Cluster, a.Service, a.Node)
}

func (a ServiceAnnounce) Validate() error {
	if err := ValidToken("service", a.Service); err != nil {
		return err
	}
	if err := ValidToken("node", a.Node); err != nil {
		return err
	}
	if a.Version == "" {
		return fmt.Errorf("%w: version", ErrMissingField)
	}
	if err := textIn("version", a.Version, MaxShortLen); err != nil {
		return err
	}
	if a.State != ServiceStarted && a.State != ServiceStopping {
		return fmt.Errorf("%w: state %q", ErrInvalidField, a.State)
	}
	return nil
}
