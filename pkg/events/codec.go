package events

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// registry maps each wire type to a constructor of its payload. The schema
// version each accepts is the payload's own SchemaVersion.
var registry = map[Type]func() Decoded{
	TypeProbeResult:       func() Decoded { return &ProbeResult{} },
	TypeHealthTransition:  func() Decoded { return &HealthTransition{} },
	TypeNodeHeartbeat:     func() Decoded { return &NodeHeartbeat{} },
	TypeArbiterDecision:   func() Decoded { return &ArbiterDecision{} },
	TypeClaimIP:           func() Decoded { return &ClaimIP{} },
	TypeReleaseIP:         func() Decoded { return &ReleaseIP{} },
	TypeAnswerPBX:         func() Decoded { return &AnswerPBX{} },
	TypeCommandResult:     func() Decoded { return &CommandResult{} },
	TypeFailbackPermit:    func() Decoded { return &FailbackPermit{} },
	TypeReplicationStatus: func() Decoded { return &ReplicationStatus{} },
	TypeServiceAnnounce:   func() Decoded { return &ServiceAnnounce{} },
}

// register adds payload types defined outside this file. Each file that
// defines new payloads registers them in its own init, so areas of the
// contract can grow without editing one shared table.
func register(t Type, mk func() Decoded) {
	if _, dup := registry[t]; dup {
		panic("events: type registered twice: " + string(t))
	}
	registry[t] = mk
}

// Types lists every registered type, for golden tests and documentation.
func Types() []Type {
	out := make([]Type, 0, len(registry))
	for t := range registry {
		out = append(out, t)
	}
	return out
}

// Decode parses and validates an encoded envelope and its payload.
//
// Unknown JSON fields are ignored on purpose: a producer may add an optional
// field without a version bump, and older consumers must keep working. What
// is refused: oversized input, an unknown type, a schema version this build
// does not speak, and missing or malformed required fields.
//
// The returned payload is a pointer to the concrete type (for example
// *ClaimIP); use a type switch.
func Decode(b []byte) (Envelope, Decoded, error) {
	if len(b) > MaxEncodedSize {
		return Envelope{}, nil, fmt.Errorf("decode: %w (%d > %d bytes)", ErrTooLarge, len(b), MaxEncodedSize)
	}
	var e Envelope
	if err := json.Unmarshal(b, &e); err != nil {
		return Envelope{}, nil, fmt.Errorf("decode envelope: %w", err)
	}
	mk, ok := registry[e.Type]
	if !ok {
		return e, nil, fmt.Errorf("decode %q: %w", e.Type, ErrUnknownType)
	}
	p := mk()
	if e.Version != p.SchemaVersion() {
		return e, nil, fmt.Errorf("decode %s v%d: %w (this build speaks v%d)", e.Type, e.Version, ErrUnknownVersion, p.SchemaVersion())
	}
	if err := e.validateHeader(); err != nil {
		return e, nil, fmt.Errorf("decode %s: %w", e.Type, err)
	}
	data := bytes.TrimSpace(e.Data)
	if len(data) == 0 || data[0] != '{' {
		return e, nil, fmt.Errorf("decode %s: %w: data must be an object", e.Type, ErrInvalidField)
	}
	if err := json.Unmarshal(data, p); err != nil {
		return e, nil, fmt.Errorf("decode %s data: %w", e.Type, err)
	}
	if err := p.Validate(); err != nil {
		return e, nil, fmt.Errorf("decode %s: %w", e.Type, err)
	}
	if _, ok := p.(epochCarrier); ok && e.Epoch == 0 {
		return e, nil, fmt.Errorf("decode %s: %w: epoch (commands are fenced)", e.Type, ErrMissingField)
	}
	return e, p, nil
}
