package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// MaxEncodedSize bounds an encoded envelope. Evidence lists and replication
// reports are the largest payloads; anything bigger is a bug or an attack,
// and the decoder refuses it before parsing.
const MaxEncodedSize = 64 << 10

// Type names a payload kind on the wire. A breaking change to a payload gets
// a new schema version, never a silent change of meaning under the same one.
type Type string

// Source says which service on which node produced an event.
type Source struct {
	Service string `json:"service"`
	Node    string `json:"node"`
}

// Envelope is the versioned wrapper every event and command travels in.
// ID is a UUID v7 (time-ordered) and doubles as the JetStream Nats-Msg-Id,
// so a re-published event is de-duplicated by the server.
type Envelope struct {
	ID            string          `json:"id"`
	Type          Type            `json:"type"`
	Version       int             `json:"version"`
	Time          time.Time       `json:"time"`
	Source        Source          `json:"source"`
	Cluster       string          `json:"cluster"`
	CausationID   string          `json:"causation_id,omitempty"`
	CorrelationID string          `json:"correlation_id,omitempty"`
	Epoch         uint64          `json:"epoch,omitempty"`
	Data          json.RawMessage `json:"data"`
}

// Payload is implemented by every event and command body.
type Payload interface {
	EventType() Type
	// SchemaVersion is the version this build writes and accepts.
	SchemaVersion() int
	// Validate reports the first missing or malformed required field.
	Validate() error
	// subject seals the interface: only this package defines payloads, and
	// each one knows the one subject it travels on.
	subject(e Envelope) string
}

// epochCarrier marks payloads whose envelope must carry an epoch (commands).
type epochCarrier interface {
	requiresEpoch()
}

// Option adjusts an envelope being built by New.
type Option func(*Envelope)

// CausedBy links the new event to the event that caused it, and keeps the
// correlation id of the chain (or starts it at the cause).
func CausedBy(cause Envelope) Option {
	return func(e *Envelope) {
		e.CausationID = cause.ID
		e.CorrelationID = cause.CorrelationID
		if e.CorrelationID == "" {
			e.CorrelationID = cause.ID
		}
	}
}

// CausedByID links to a cause known only by id, for example one of several
// causes listed inside the payload.
func CausedByID(causationID, correlationID string) Option {
	return func(e *Envelope) {
		e.CausationID = causationID
		e.CorrelationID = correlationID
		if e.CorrelationID == "" {
			e.CorrelationID = causationID
		}
	}
}

// WithEpoch stamps the fencing epoch (the arbiter leader's term).
func WithEpoch(epoch uint64) Option { return func(e *Envelope) { e.Epoch = epoch } }

// At sets the event time; tests use it, and so does the arbiter's decision
// core, so that a decision is stamped with the core's clock (a replay feeds
// it the same). Other services let New use the clock.
func At(t time.Time) Option { return func(e *Envelope) { e.Time = t } }

// WithID fixes the envelope id; golden tests use it, services never do.
func WithID(id string) Option { return func(e *Envelope) { e.ID = id } }

// New wraps a payload in a fresh envelope with a UUID v7 id. It validates the
// payload so that nothing invalid is ever published.
func New(src Source, cluster string, p Payload, opts ...Option) (Envelope, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return Envelope{}, fmt.Errorf("new event id: %w", err)
	}
	data, err := json.Marshal(p)
	if err != nil {
		return Envelope{}, fmt.Errorf("encode %s: %w", p.EventType(), err)
	}
	e := Envelope{
		ID:      id.String(),
		Type:    p.EventType(),
		Version: p.SchemaVersion(),
		Time:    time.Now().UTC(),
		Source:  src,
		Cluster: cluster,
		Data:    data,
	}
	for _, o := range opts {
		o(&e)
	}
	if err := e.validateHeader(); err != nil {
		return Envelope{}, err
	}
	if err := p.Validate(); err != nil {
		return Envelope{}, fmt.Errorf("%s: %w", p.EventType(), err)
	}
	if _, ok := p.(epochCarrier); ok && e.Epoch == 0 {
		return Envelope{}, fmt.Errorf("%s: %w: epoch", p.EventType(), ErrMissingField)
	}
	return e, nil
}

// Encode renders the envelope as JSON, refusing anything over MaxEncodedSize.
func (e Envelope) Encode() ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode envelope %s: %w", e.ID, err)
	}
	if len(b) > MaxEncodedSize {
		return nil, fmt.Errorf("encode envelope %s: %w (%d bytes)", e.ID, ErrTooLarge, len(b))
	}
	return b, nil
}

// Sentinel errors let callers branch on why a message was refused.
var (
	ErrTooLarge       = errors.New("events: event larger than the size limit")
	ErrUnknownType    = errors.New("events: unknown event type")
	ErrUnknownVersion = errors.New("events: unsupported schema version")
	ErrMissingField   = errors.New("events: missing required field")
	ErrInvalidField   = errors.New("events: invalid field")
)

func (e Envelope) validateHeader() error {
	id, err := uuid.Parse(e.ID)
	if err != nil {
		return fmt.Errorf("%w: id %q: %v", ErrInvalidField, e.ID, err)
	}
	if id.Version() != 7 {
		return fmt.Errorf("%w: id %q is not a UUID v7", ErrInvalidField, e.ID)
	}
	if e.Type == "" {
		return fmt.Errorf("%w: type", ErrMissingField)
	}
	if e.Version <= 0 {
		return fmt.Errorf("%w: version", ErrMissingField)
	}
	if e.Time.IsZero() {
		return fmt.Errorf("%w: time", ErrMissingField)
	}
	if err := ValidToken("source.service", e.Source.Service); err != nil {
		return err
	}
	if err := ValidToken("source.node", e.Source.Node); err != nil {
		return err
	}
	if err := ValidToken("cluster", e.Cluster); err != nil {
		return err
	}
	for name, v := range map[string]string{"causation_id": e.CausationID, "correlation_id": e.CorrelationID} {
		if v == "" {
			continue
		}
		if _, err := uuid.Parse(v); err != nil {
			return fmt.Errorf("%w: %s %q", ErrInvalidField, name, v)
		}
	}
	return nil
}

// Command is implemented by every command payload: fenced by the envelope's
// epoch and valid until its deadline.
type Command interface {
	Payload
	Deadline() time.Time
	// Target names the group the command is about and the node whose
	// executor carries it out.
	Target() (group, node string)
	requiresEpoch()
}
