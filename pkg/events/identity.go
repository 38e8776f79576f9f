package events

import (
	"errors"
	"fmt"
)

// Identity on the bus comes from the subject. The server's permissions let
// each identity (a node's services, the arbiter, an operator) publish only
// its own subjects, so the subject an event arrived on is the one thing a
// publisher cannot choose freely. The envelope and payload are whatever the
// publisher wrote; VerifySubject makes sure they say the same thing as the
// subject, so that a consumer that checks it may trust the node names in
// them as far as it trusts the server's permissions.

// ErrSubjectMismatch means an event (or request) arrived on a subject that
// does not match what its envelope and payload say. Consumers drop it.
var ErrSubjectMismatch = errors.New("events: subject does not match the event")

// Reasons a consumer gives for refusing a message, for the
// fan_events_refused_total{reason} counter and the refusal's log line.
const (
	RefusedUndecodable = "undecodable"      // not a valid envelope and payload
	RefusedSubject     = "subject_mismatch" // decoded, but the subject says otherwise
	RefusedNotCommand  = "not_command"      // an event on a command subject
)

// nodeVoice is implemented by payloads that only the named node's own
// services publish, about that node: their envelope's source must be that
// node. Payloads that a service elsewhere legitimately publishes for a node
// (a multi-site executor's results, heartbeats relayed by the arbiter's HTTP
// endpoint) do not implement it: for them the subject's node, bound by
// permissions, is the identity.
type nodeVoice interface {
	voiceOf(e Envelope) string
}

func (p ProbeResult) voiceOf(e Envelope) string       { return e.Source.Node }
func (h HealthTransition) voiceOf(e Envelope) string  { return e.Source.Node }
func (a ServiceAnnounce) voiceOf(Envelope) string     { return a.Node }
func (r ReplicationStatus) voiceOf(Envelope) string   { return r.Node }
func (a ReplicationApplied) voiceOf(Envelope) string  { return a.Node }
func (a ReplicationAlarm) voiceOf(Envelope) string    { return a.Node }
func (c ReplicationConflict) voiceOf(Envelope) string { return c.Node }
func (c AddressConflict) voiceOf(Envelope) string     { return c.Node }

// voiceOf of a DNS executor's correction is its source's: it corrects a
// server for the site the name points at, as its results do, and the
// subject's site is bound by permissions (the sites it executes for).
func (c AddressCorrection) voiceOf(e Envelope) string {
	if len(c.DNS) > 0 {
		return e.Source.Node
	}
	return c.Node
}

// VerifySubject checks that subject, the subject an event arrived on, is the
// one its envelope and payload derive (so the type, cluster, group and node
// they name are the subject's), and that events only a node's own services
// publish come from that node (source.node is the subject's node, and a
// self check speaks about its own node only). p is the payload Decode
// returned for env. The error wraps ErrSubjectMismatch.
func VerifySubject(subject string, env Envelope, p Payload) error {
	if p == nil {
		return fmt.Errorf("%w: %s on %s has no payload", ErrSubjectMismatch, env.Type, subject)
	}
	if p.EventType() != env.Type {
		return fmt.Errorf("%w: envelope type %s carries a %s payload", ErrSubjectMismatch, env.Type, p.EventType())
	}
	if want := p.subject(env); subject != want {
		return fmt.Errorf("%w: %s %s arrived on %s, its envelope and payload belong on %s", ErrSubjectMismatch, env.Type, env.ID, subject, want)
	}
	if v, ok := p.(nodeVoice); ok {
		if n := v.voiceOf(env); n != env.Source.Node {
			return fmt.Errorf("%w: %s %s speaks for node %s but its source is node %s", ErrSubjectMismatch, env.Type, env.ID, n, env.Source.Node)
		}
	}
	switch v := p.(type) {
	case *HealthTransition:
		return selfCheck(env, v.Role, v.TargetNode)
	case HealthTransition:
		return selfCheck(env, v.Role, v.TargetNode)
	case *ProbeResult:
		return selfCheck(env, v.Role, v.TargetNode)
	case ProbeResult:
		return selfCheck(env, v.Role, v.TargetNode)
	case *NodeHeartbeat:
		return heartbeatSource(env, v)
	case NodeHeartbeat:
		return heartbeatSource(env, &v)
	case *ServiceAnnounce:
		return announceSource(env, v)
	case ServiceAnnounce:
		return announceSource(env, &v)
	}
	return nil
}

// RelayService is the only service that may publish a heartbeat for a node
// other than its own (the arbiter's HTTP heartbeat endpoint, for nodes that
// cannot reach the bus).
const RelayService = "arbiter"

func heartbeatSource(env Envelope, hb *NodeHeartbeat) error {
	if hb.Node != env.Source.Node && env.Source.Service != RelayService {
		return fmt.Errorf("%w: heartbeat %s for node %s from %s on node %s (only the node itself or the arbiter's relay)", ErrSubjectMismatch, env.ID, hb.Node, env.Source.Service, env.Source.Node)
	}
	return nil
}

func announceSource(env Envelope, a *ServiceAnnounce) error {
	if a.Service != env.Source.Service {
		return fmt.Errorf("%w: announce %s of service %s from service %s", ErrSubjectMismatch, env.ID, a.Service, env.Source.Service)
	}
	return nil
}

func selfCheck(env Envelope, role Role, target string) error {
	if role == RoleSelf && target != env.Source.Node {
		return fmt.Errorf("%w: %s %s from node %s is a self check about node %s", ErrSubjectMismatch, env.Type, env.ID, env.Source.Node, target)
	}
	return nil
}

// DecodeFrom decodes an event that arrived on subject and verifies that the
// subject matches it (VerifySubject). Every consumer reads events through it.
func DecodeFrom(subject string, b []byte) (Envelope, Decoded, error) {
	env, p, err := Decode(b)
	if err != nil {
		return env, nil, err
	}
	if err := VerifySubject(subject, env, p); err != nil {
		return env, nil, err
	}
	return env, p, nil
}

// RefusalReason classifies a DecodeFrom error for counters and logs.
func RefusalReason(err error) string {
	if errors.Is(err, ErrSubjectMismatch) {
		return RefusedSubject
	}
	return RefusedUndecodable
}

// VerifyBeacon checks that a presence beacon arrived on its own node's
// beacon subject.
func VerifyBeacon(cluster, subject string, b Beacon) error {
	if want := BeaconSubject(cluster, b.Node); subject != want {
		return fmt.Errorf("%w: beacon of node %s arrived on %s, not %s", ErrSubjectMismatch, b.Node, subject, want)
	}
	return nil
}
