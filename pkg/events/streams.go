package events

import (
	"fmt"
	"strings"
)

// Where fan keeps its events. The audit stream keeps what explains a move
// (transitions, decisions, commands, results, permits, operator actions,
// presence flips, replication passes and alarms) for months; the live
// stream keeps the level-triggered state that is restated every second or
// so (heartbeats, raw probe results) for hours. Which stream an event goes
// to follows from its subject's root, so a reader never guesses.
//
// A decision may cite a heartbeat among its causes (the last one heard from
// a silent node, or the one that told the arbiter a check's state). Such a
// cause lives in the live stream only while that keeps it; the transition
// the heartbeat reported (CheckState.SinceEvent) is cited beside it and is
// in the audit stream, so `fanctl explain` always reaches the transition and
// its evidence, and shows the heartbeat too while the live stream holds it.

// LiveStateRoot starts the subjects of the live stream. It is apart from
// EventRoot so that the audit stream (EventRoot's subjects) and the live
// stream never share a subject, and apart from LiveRoot (presence beacons,
// core NATS only, never stored).
const LiveStateRoot = "fan.state"

// LiveStream is the stream of live state.
const LiveStream = "FAN_LIVE"

// AllLiveState matches every live-state subject of every cluster (the live
// stream's subjects).
func AllLiveState() string { return LiveStateRoot + ".>" }

// ClusterLiveState matches the live state of one cluster.
func ClusterLiveState(cluster string) string { return LiveStateRoot + "." + cluster + ".>" }

// liveTypes are the event types published under LiveStateRoot.
var liveTypes = map[Type]bool{TypeNodeHeartbeat: true, TypeProbeResult: true}

// IsLive reports whether events of type t go to the live stream (kept for
// hours) rather than the audit stream.
func IsLive(t Type) bool { return liveTypes[t] }

// StreamOf names the stream that stores a subject, or a filter of subjects
// under one root: the audit stream for events and (by its source) commands,
// the live stream for live state. Subjects of several roots, or of none fan
// stores, are an error.
func StreamOf(subject string) (string, error) {
	root, _, _ := strings.Cut(subject, ".")
	second := strings.SplitN(subject, ".", 3)
	if len(second) < 2 || root != "fan" {
		return "", fmt.Errorf("%w: subject %q is stored in no fan stream", ErrInvalidField, subject)
	}
	switch "fan." + second[1] {
	case EventRoot, CommandRoot:
		return EventsStream, nil
	case LiveStateRoot:
		return LiveStream, nil
	}
	return "", fmt.Errorf("%w: subject %q is stored in no fan stream", ErrInvalidField, subject)
}

// AuditStreamSubjects are the subjects the audit stream stores itself (it
// also sources every command from the command stream).
func AuditStreamSubjects() []string { return []string{AllEvents()} }

// LiveStreamSubjects are the subjects the live stream stores.
func LiveStreamSubjects() []string { return []string{AllLiveState()} }
