package events

import (
	"errors"
	"slices"
	"testing"
)

// TestEveryTypeHasItsStream: each type's subject is stored by exactly one
// stream, the live one for live state and the audit one for the rest, and
// no subject of one stream is caught by the other's subjects.
func TestEveryTypeHasItsStream(t *testing.T) {
	for typ, p := range samples() {
		env := Envelope{Cluster: "c1", Source: Source{Service: "x", Node: "n1"}}
		subj := Subject(env, p)
		got, err := StreamOf(subj)
		if err != nil {
			t.Errorf("%s (%s): %v", typ, subj, err)
			continue
		}
		want := EventsStream
		if IsLive(typ) {
			want = LiveStream
		}
		if got != want {
			t.Errorf("%s (%s): stored in %s, want %s", typ, subj, got, want)
		}
		inAudit := slices.ContainsFunc(AuditStreamSubjects(), func(s string) bool { return SubjectMatches(s, subj) }) ||
			SubjectMatches(AllCommands(), subj)
		inLive := slices.ContainsFunc(LiveStreamSubjects(), func(s string) bool { return SubjectMatches(s, subj) })
		if inAudit == inLive || inLive != IsLive(typ) {
			t.Errorf("%s (%s): audit stream catches it %v, live stream %v", typ, subj, inAudit, inLive)
		}
	}
	for _, typ := range []Type{TypeHealthTransition, TypeArbiterDecision, TypeCommandResult, TypeFailbackPermit,
		TypeOperatorAction, TypeNodePresence, TypeReplicationStatus, TypeReplicationAlarm} {
		if IsLive(typ) {
			t.Errorf("%s explains a move: it belongs in the audit stream", typ)
		}
	}
	// Beacons are core NATS only: neither stream may store them.
	for _, s := range append(AuditStreamSubjects(), LiveStreamSubjects()...) {
		if SubjectMatches(s, BeaconSubject("c1", "n1")) || SubjectMatches(s, ArbiterPresenceSubject("c1", "a1")) {
			t.Errorf("stream subject %s would store presence beacons", s)
		}
	}
	for _, bad := range []string{"fan.live.c1.n1", "$KV.fan_state.x", "fan", "other.evt.x"} {
		if _, err := StreamOf(bad); !errors.Is(err, ErrInvalidField) {
			t.Errorf("StreamOf(%q) = %v, want ErrInvalidField", bad, err)
		}
	}
	if s, _ := StreamOf(ClusterCommands("c1")); s != EventsStream {
		t.Errorf("commands are read from the audit stream's copy, got %s", s)
	}
	if !slices.Contains(LedStreams(), LiveStream) {
		t.Errorf("the live stream's leader is not kept: %v", LedStreams())
	}
}

// TestLiveStreamReaders: the roles that read heartbeats may read the live
// stream; a prober (which only publishes) may not, and nobody but the admin
// may purge it.
func TestLiveStreamReaders(t *testing.T) {
	perms := permIdentities(t)
	create := jsAPI + ".CONSUMER.CREATE." + LiveStream + ".x." + AllHeartbeats("c1")
	for key, want := range map[string]bool{"arbiter@ctl1": true, "operator@alice": true, "auditor@bob": true,
		"prober@n1": false, "ipmover@n1": false, "replicator@n1": false} {
		if got := perms[key].Publish.Allows(create); got != want {
			t.Errorf("%s may read the live stream: %v, want %v", key, got, want)
		}
	}
	for key, p := range perms {
		if roleOf(key) != RoleAdmin && p.Publish.Allows(jsAPI+".STREAM.PURGE."+LiveStream) {
			t.Errorf("%s may purge the live stream", key)
		}
	}
}
