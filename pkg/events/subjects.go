package events

import (
	"fmt"
	"regexp"
)

// Roots of the three subject trees. They are exported for stream configuration
// and permissions; code that publishes or subscribes uses the functions below.
const (
	EventRoot   = "fan.evt"
	CommandRoot = "fan.cmd"
	LeaseRoot   = "fan.lease"
)

var tokenPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidToken checks that a name (cluster, node, group, check, service) can be
// used as one subject token: no dots, wildcards or spaces. Configuration
// loaders call it so that a bad name fails at start-up, not at publish time.
func ValidToken(field, v string) error {
	if v == "" {
		return fmt.Errorf("%w: %s", ErrMissingField, field)
	}
	if !tokenPattern.MatchString(v) {
		return fmt.Errorf("%w: %s %q must match %s", ErrInvalidField, field, v, tokenPattern)
	}
	return nil
}

// AllEvents matches every audited event of every cluster (the audit
// stream's subjects); live state is under LiveStateRoot.
func AllEvents() string { return EventRoot + ".>" }

// ClusterEvents matches every audited event of one cluster.
func ClusterEvents(cluster string) string { return EventRoot + "." + cluster + ".>" }

// AllCommands matches every command of every cluster (the command stream's subjects).
func AllCommands() string { return CommandRoot + ".>" }

// ClusterCommands matches every command of one cluster.
func ClusterCommands(cluster string) string { return CommandRoot + "." + cluster + ".>" }

// AllLeases matches every lease subject.
func AllLeases() string { return LeaseRoot + ".>" }

// ProbeResultSubject carries raw results of one node's prober: live state,
// kept in the live stream.
func ProbeResultSubject(cluster, node string) string {
	return LiveStateRoot + "." + cluster + ".probe." + node + ".result"
}

// HealthSubject carries one node's prober's health transitions.
func HealthSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".probe." + node + ".health"
}

// AllHealth matches the health transitions of every node in a cluster.
func AllHealth(cluster string) string { return EventRoot + "." + cluster + ".probe.*.health" }

// HeartbeatSubject carries one node's heartbeats: live state, kept in the
// live stream.
func HeartbeatSubject(cluster, node string) string {
	return LiveStateRoot + "." + cluster + ".node." + node + ".heartbeat"
}

// AllHeartbeats matches the heartbeats of every node in a cluster.
func AllHeartbeats(cluster string) string {
	return LiveStateRoot + "." + cluster + ".node.*.heartbeat"
}

// DecisionSubject carries the arbiter's decisions for one group.
func DecisionSubject(cluster, group string) string {
	return EventRoot + "." + cluster + ".arbiter." + group + ".decision"
}

// CommandResultSubject carries the outcome of commands seen by one node's executor.
func CommandResultSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".exec." + node + ".result"
}

// AllCommandResults matches every executor's results in a cluster.
func AllCommandResults(cluster string) string { return EventRoot + "." + cluster + ".exec.*.result" }

// PermitSubject carries failback-permitted ticks for one group.
func PermitSubject(cluster, group string) string {
	return EventRoot + "." + cluster + ".sched." + group + ".permit"
}

// AllPermits matches every failback permit in a cluster.
func AllPermits(cluster string) string { return EventRoot + "." + cluster + ".sched.*.permit" }

// ReplicationSubject carries one node's replication reports.
func ReplicationSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".repl." + node + ".status"
}

// AllReplication matches every node's replication reports in a cluster.
func AllReplication(cluster string) string { return EventRoot + "." + cluster + ".repl.*.status" }

// AnnounceSubject carries a service instance's start and stop.
func AnnounceSubject(cluster, service, node string) string {
	return EventRoot + "." + cluster + ".svc." + service + "." + node + ".announce"
}

// Command verbs, the last token of a command subject.
const (
	VerbClaim   = "claim"
	VerbRelease = "release"
	VerbAnswer  = "answer"
)

// CommandSubject addresses one command verb to one node's executor.
func CommandSubject(cluster, node, verb string) string {
	return CommandRoot + "." + cluster + "." + node + "." + verb
}

// NodeCommands matches every command for one node: the filter of that node's
// executor consumer. Filters of different nodes never overlap, which the
// work-queue stream requires.
func NodeCommands(cluster, node string) string {
	return CommandRoot + "." + cluster + "." + node + ".>"
}

// LeaseSubject is a leadership lease. It lives in the command stream so that a
// command can be made conditional on the lease's last sequence (server-side fencing).
func LeaseSubject(cluster, name string) string {
	return LeaseRoot + "." + cluster + "." + name
}

// Subject returns the subject an envelope is published on, derived from its
// payload so that publishers never choose one by hand.
func Subject(e Envelope, p Payload) string {
	return p.subject(e)
}
