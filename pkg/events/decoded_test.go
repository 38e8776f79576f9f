package events

import (
	"reflect"
	"testing"
)

// Every registered payload decodes to a pointer, and only the pointer is a
// Decoded: a consumer that takes Decoded (the arbiter's core, the notifier's
// mapper) switches on *T, and a T value handed to it would match nothing.
// The compiler refuses that value; this test keeps the refusal true as
// payload types are added, since a decoded method on a value receiver
// would quietly let values back in.
func TestDecodedIsPointerOnly(t *testing.T) {
	decoded := reflect.TypeFor[Decoded]()
	for typ, mk := range registry {
		p := mk()
		rt := reflect.TypeOf(p)
		if rt.Kind() != reflect.Pointer {
			t.Errorf("%s: registered constructor returns %s, not a pointer", typ, rt)
			continue
		}
		if rt.Elem().Implements(decoded) {
			t.Errorf("%s: the value form %s implements Decoded; it must not", typ, rt.Elem())
		}
		if p.EventType() != typ {
			t.Errorf("%s: constructor returns a payload of type %s", typ, p.EventType())
		}
	}
}

// The pointer forms are what Decode returns, and they compile as Decoded.
// (A value, e.g. `var _ Decoded = ClaimIP{}`, does not compile: ClaimIP
// does not implement Decoded, its decoded method has a pointer receiver.)
var (
	_ Decoded = (*HealthTransition)(nil)
	_ Decoded = (*NodeHeartbeat)(nil)
	_ Decoded = (*CommandResult)(nil)
	_ Decoded = (*FailbackPermit)(nil)
	_ Decoded = (*ReplicationStatus)(nil)
	_ Decoded = (*CallsSummary)(nil)
	_ Decoded = (*ArbiterDecision)(nil)
	_ Decoded = (*ClaimIP)(nil)
	_ Decoded = (*GroupPin)(nil)
	_ Decoded = (*LeadersHold)(nil)
	_ Decoded = (*PlannedMove)(nil)
)
