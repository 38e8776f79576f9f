package events

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// honestSource is the source a well-behaved publisher of p would stamp: the
// node a node-bound payload speaks for (n1 for checks about n1), and the
// announcing service for an announcement.
func honestSource(p Payload) Source {
	src := Source{Service: "svc", Node: "ctl1"}
	if v, ok := p.(nodeVoice); ok {
		if n := v.voiceOf(Envelope{Source: Source{Node: "n1"}}); n != "" {
			src.Node = n
		}
	}
	switch v := p.(type) {
	case ServiceAnnounce:
		src.Service = v.Service
	case NodeHeartbeat:
		src.Node = v.Node
	}
	return src
}

func sampleEnvelope(t *testing.T, src Source, cluster string, p Payload) Envelope {
	t.Helper()
	var opts []Option
	if _, ok := p.(epochCarrier); ok {
		opts = append(opts, WithEpoch(7))
	}
	e, err := New(src, cluster, p, opts...)
	if err != nil {
		t.Fatalf("New(%s): %v", p.EventType(), err)
	}
	return e
}

// roundTrip encodes env and decodes it as a consumer would, from subject.
func roundTrip(t *testing.T, subject string, env Envelope) error {
	t.Helper()
	b, err := env.Encode()
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = DecodeFrom(subject, b)
	return err
}

// Every type is accepted on its own subject and refused on any other: the
// subject of another cluster, of another type's sample, or one token off.
func TestVerifySubjectEveryType(t *testing.T) {
	s := samples()
	for typ, p := range s {
		env := sampleEnvelope(t, honestSource(p), "lab", p)
		own := Subject(env, p)
		if err := roundTrip(t, own, env); err != nil {
			t.Errorf("%s on its own subject %s: %v", typ, own, err)
		}
		wrong := []string{own + ".x", strings.Replace(own, ".lab.", ".other.", 1), strings.TrimSuffix(own, own[strings.LastIndex(own, "."):])}
		for other, q := range s {
			if other != typ {
				wrong = append(wrong, Subject(sampleEnvelope(t, honestSource(q), "lab", q), q))
			}
		}
		for _, w := range wrong {
			if w == own {
				continue
			}
			if err := roundTrip(t, w, env); !errors.Is(err, ErrSubjectMismatch) {
				t.Errorf("%s on %s: %v, want a subject mismatch", typ, w, err)
			}
		}
	}
}

func TestVerifySubjectNodes(t *testing.T) {
	s := samples()
	health := s[TypeHealthTransition].(HealthTransition) // self check of n1
	peer := health
	peer.Role, peer.Check = RolePeer, "peer_n1"
	hb := s[TypeNodeHeartbeat].(NodeHeartbeat)
	result := s[TypeCommandResult].(CommandResult) // node n2
	claim := s[TypeClaimIP].(ClaimIP)              // node n2
	announce := s[TypeServiceAnnounce].(ServiceAnnounce)
	repl := s[TypeReplicationStatus].(ReplicationStatus) // node n1
	conflict := s[TypeAddressConflict].(AddressConflict) // node n1
	prober := func(n string) Source { return Source{Service: "prober", Node: n} }
	cases := []struct {
		name    string
		src     Source
		p       Payload
		subject string
		ok      bool
	}{
		{"own health on own subject", prober("n1"), health, HealthSubject("lab", "n1"), true},
		{"n1's health on n2's subject", prober("n1"), health, HealthSubject("lab", "n2"), false},
		{"n2 says n1's self check is down", prober("n2"), health, HealthSubject("lab", "n2"), false},
		{"n2's peer check of n1", prober("n2"), peer, HealthSubject("lab", "n2"), true},
		{"probe result for n1 on n2's subject", prober("n1"), s[TypeProbeResult], ProbeResultSubject("lab", "n2"), false},
		{"heartbeat of n1 from n1", prober("n1"), hb, HeartbeatSubject("lab", "n1"), true},
		{"heartbeat of n1 from n2's prober", prober("n2"), hb, HeartbeatSubject("lab", "n1"), false},
		{"heartbeat of n1 on n2's subject", prober("n1"), hb, HeartbeatSubject("lab", "n2"), false},
		{"heartbeat of n1 relayed by the arbiter", Source{Service: RelayService, Node: "ctl1"}, hb, HeartbeatSubject("lab", "n1"), true},
		{"result of n2 on n2's subject", Source{Service: "ipmover", Node: "n2"}, result, CommandResultSubject("lab", "n2"), true},
		{"result of n2 on n1's subject", Source{Service: "ipmover", Node: "n1"}, result, CommandResultSubject("lab", "n1"), false},
		{"claim for n2 on n2's command subject", Source{Service: "arbiter", Node: "ctl1"}, claim, CommandSubject("lab", "n2", VerbClaim), true},
		{"claim for n2 on n1's command subject", Source{Service: "arbiter", Node: "ctl1"}, claim, CommandSubject("lab", "n1", VerbClaim), false},
		{"claim on the release subject", Source{Service: "arbiter", Node: "ctl1"}, claim, CommandSubject("lab", "n2", VerbRelease), false},
		{"announce from its service", Source{Service: "prober", Node: "n1"}, announce, AnnounceSubject("lab", "prober", "n1"), true},
		{"announce of the prober by another service", Source{Service: "ipmover", Node: "n1"}, announce, AnnounceSubject("lab", "prober", "n1"), false},
		{"announce of n1 from n2", Source{Service: "prober", Node: "n2"}, announce, AnnounceSubject("lab", "prober", "n1"), false},
		{"replication of n1 from n2", Source{Service: "replicator", Node: "n2"}, repl, ReplicationSubject("lab", "n1"), false},
		{"conflict of n1 from n2", Source{Service: "ipmover", Node: "n2"}, conflict, AddressConflictSubject("lab", "n1"), false},
	}
	for _, c := range cases {
		env := sampleEnvelope(t, c.src, "lab", c.p)
		err := roundTrip(t, c.subject, env)
		if c.ok && err != nil {
			t.Errorf("%s: refused: %v", c.name, err)
		}
		if !c.ok && !errors.Is(err, ErrSubjectMismatch) {
			t.Errorf("%s: %v, want a subject mismatch", c.name, err)
		}
	}
}

func TestVerifySubjectTypeAndReason(t *testing.T) {
	p := samples()[TypeNodeHeartbeat]
	env := sampleEnvelope(t, honestSource(p), "lab", p)
	if err := VerifySubject(HeartbeatSubject("lab", "n1"), env, &ReplicationStatus{Node: "n1"}); !errors.Is(err, ErrSubjectMismatch) {
		t.Errorf("payload of another type: %v", err)
	}
	if err := VerifySubject(HeartbeatSubject("lab", "n1"), env, nil); !errors.Is(err, ErrSubjectMismatch) {
		t.Errorf("no payload: %v", err)
	}
	if got := RefusalReason(VerifySubject("x", env, p)); got != RefusedSubject {
		t.Errorf("reason %q", got)
	}
	if _, _, err := DecodeFrom(HeartbeatSubject("lab", "n1"), []byte("{")); RefusalReason(err) != RefusedUndecodable {
		t.Errorf("undecodable: %v", err)
	}
}

func TestVerifyBeacon(t *testing.T) {
	b := Beacon{Node: "n1", Seq: 1, IntervalMS: 100, At: time.Now()}
	if err := VerifyBeacon("lab", BeaconSubject("lab", "n1"), b); err != nil {
		t.Errorf("own beacon: %v", err)
	}
	for _, s := range []string{BeaconSubject("lab", "n2"), BeaconSubject("other", "n1")} {
		if err := VerifyBeacon("lab", s, b); !errors.Is(err, ErrSubjectMismatch) {
			t.Errorf("n1's beacon on %s: %v", s, err)
		}
	}
}
