package events

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// AstDB changes as they happen. The holder's replicator follows its
// Asterisk's registrations (AMI ContactStatus events, each contact then read
// with DBGet) and publishes each change, or the few that came within a
// moment, to every other node's replicator at once, on core NATS: a
// registration reaches the standby in milliseconds, and nothing is stored
// (2,000 phones re-registering every few minutes would be hundreds of
// megabytes a day in a stream). A delta lost on the way (a target
// disconnected, or slow) shows as a gap in the holder's sequence; the
// target then asks the holder for a reconcile: a full manifest through the
// object store, which also comes on its own every reconcile interval.
// Deltas delete only what Asterisk itself reported gone; every other
// deletion comes with a manifest, where the target can tell a wiped
// database from phones unregistering.

// ReplRoot starts the replicators' core NATS subjects.
const ReplRoot = "fan.repl"

// AstDBDeltaSubject carries the AstDB changes node's replicator publishes
// while it holds its group.
func AstDBDeltaSubject(cluster, node string) string {
	return ReplRoot + "." + cluster + "." + node + ".astdb"
}

// AllAstDBDeltas matches every node's AstDB changes in a cluster.
func AllAstDBDeltas(cluster string) string { return ReplRoot + "." + cluster + ".*.astdb" }

// AstDBResyncSubject is where node's replicator takes requests for a
// reconcile (a fresh manifest) from a target that missed changes.
func AstDBResyncSubject(cluster, node string) string {
	return ReplRoot + "." + cluster + "." + node + ".resync"
}

// Bounds of a delta: one core NATS message, well under a server's default
// max_payload (1 MiB). A holder splits a larger set of changes.
const (
	MaxAstDBDelta   = 512 << 10
	MaxAstDBChanges = 1024
	// MaxAstDBKey and MaxAstDBValue bound one key ("family/key") and one
	// value; a PJSIP contact is well under 1 KiB.
	MaxAstDBKey   = 1024
	MaxAstDBValue = 16 << 10
)

// AstDBCause says how the holder learned of a delta's changes.
type AstDBCause string

const (
	// AstDBReported: Asterisk reported them (a ContactStatus event).
	AstDBReported AstDBCause = "reported"
	// AstDBReconciled: a re-read of the whole family found them, though
	// nothing reported them (events lost, or a change Asterisk does not
	// report).
	AstDBReconciled AstDBCause = "reconciled"
	// AstDBPolled: a family Asterisk reports no changes of, read on an
	// interval.
	AstDBPolled AstDBCause = "polled"
)

func (c AstDBCause) valid() bool {
	return c == AstDBReported || c == AstDBReconciled || c == AstDBPolled
}

// AstDBChange is one key's new value, or its deletion.
type AstDBChange struct {
	Key     string `json:"key"` // "family/key", as in a manifest
	Value   string `json:"value,omitempty"`
	Deleted bool   `json:"deleted,omitempty"`
}

// AstDBDelta is a batch of changes of one AstDB tree, read by the holder
// in one go. Seq orders a holder's deltas (from its clock, never going
// back, so a restarted holder continues above its last one); Prev is the
// Seq of the delta it published before, so a target sees a gap. A
// manifest names the last Seq it includes (its as_of).
type AstDBDelta struct {
	Node    string        `json:"node"` // the holder; its subject's node
	Group   string        `json:"group"`
	Tree    string        `json:"tree"`
	Epoch   uint64        `json:"epoch"`
	Seq     uint64        `json:"seq"`
	Prev    uint64        `json:"prev,omitempty"`
	Cause   AstDBCause    `json:"cause"`
	At      time.Time     `json:"at"` // when the holder read the changes
	Changes []AstDBChange `json:"changes"`
}

// Validate checks a delta before anything of it is applied: a key or value
// that would break the AMI action it is sent in (a line break, a NUL) is
// refused, as in a manifest, and only reported changes may delete.
func (d AstDBDelta) Validate() error {
	for f, v := range map[string]string{"node": d.Node, "group": d.Group, "tree": d.Tree} {
		if err := ValidToken(f, v); err != nil {
			return err
		}
	}
	if d.Epoch == 0 || d.Seq == 0 {
		return fmt.Errorf("%w: epoch and seq", ErrMissingField)
	}
	if d.Prev >= d.Seq {
		return fmt.Errorf("%w: prev %d not below seq %d", ErrInvalidField, d.Prev, d.Seq)
	}
	if !d.Cause.valid() {
		return fmt.Errorf("%w: cause %q", ErrInvalidField, d.Cause)
	}
	if len(d.Changes) == 0 || len(d.Changes) > MaxAstDBChanges {
		return fmt.Errorf("%w: %d changes (1..%d)", ErrInvalidField, len(d.Changes), MaxAstDBChanges)
	}
	seen := make(map[string]bool, len(d.Changes))
	for _, c := range d.Changes {
		if err := ValidAstDBKey(c.Key); err != nil {
			return err
		}
		if seen[c.Key] {
			return fmt.Errorf("%w: key %.80q twice", ErrInvalidField, c.Key)
		}
		seen[c.Key] = true
		if c.Deleted && (c.Value != "" || d.Cause != AstDBReported) {
			return fmt.Errorf("%w: deletion of %.80q with a value or not reported by Asterisk", ErrInvalidField, c.Key)
		}
		if len(c.Value) > MaxAstDBValue || strings.ContainsAny(c.Value, "\r\n\x00") {
			return fmt.Errorf("%w: value of %.80q (at most %d bytes, no line break or NUL)", ErrInvalidField, c.Key, MaxAstDBValue)
		}
	}
	return nil
}

// ValidAstDBKey checks a "family/key" path: both parts present, no line
// break or NUL, at most MaxAstDBKey bytes.
func ValidAstDBKey(k string) error {
	fam, rest, ok := strings.Cut(k, "/")
	if !ok || fam == "" || rest == "" || len(k) > MaxAstDBKey || strings.ContainsAny(k, "\r\n\x00") || strings.ContainsAny(fam, " ") {
		return fmt.Errorf("%w: AstDB key %.80q", ErrInvalidField, k)
	}
	return nil
}

// Encode renders the delta, refusing one over MaxAstDBDelta.
func (d AstDBDelta) Encode() ([]byte, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxAstDBDelta {
		return nil, fmt.Errorf("astdb delta: %w: %d bytes", ErrTooLarge, len(b))
	}
	return b, nil
}

// DecodeAstDBDelta parses and validates a delta.
func DecodeAstDBDelta(data []byte) (AstDBDelta, error) {
	var d AstDBDelta
	if len(data) > MaxAstDBDelta {
		return d, fmt.Errorf("astdb delta: %w", ErrTooLarge)
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return d, fmt.Errorf("astdb delta: %w: %v", ErrInvalidField, err)
	}
	if err := d.Validate(); err != nil {
		return d, fmt.Errorf("astdb delta: %w", err)
	}
	return d, nil
}

// VerifyAstDBDelta checks that a delta arrived on its holder's own subject:
// only that node's replicator may publish there.
func VerifyAstDBDelta(cluster, subject string, d AstDBDelta) error {
	if want := AstDBDeltaSubject(cluster, d.Node); subject != want {
		return fmt.Errorf("%w: astdb delta of node %s arrived on %s, not %s", ErrSubjectMismatch, d.Node, subject, want)
	}
	return nil
}

// AstDBResync asks a holder for a reconcile of one tree: the asking
// target's last delta is After, and it missed some after it. The holder
// answers at once (an empty reply) and publishes a manifest soon after; it
// trusts the request with nothing but that.
type AstDBResync struct {
	Node  string `json:"node"` // the target asking
	Group string `json:"group"`
	Tree  string `json:"tree"`
	After uint64 `json:"after,omitempty"`
}

// Validate checks the request's names.
func (r AstDBResync) Validate() error {
	for f, v := range map[string]string{"node": r.Node, "group": r.Group, "tree": r.Tree} {
		if err := ValidToken(f, v); err != nil {
			return err
		}
	}
	return nil
}

// Encode renders the request.
func (r AstDBResync) Encode() ([]byte, error) { return json.Marshal(r) }

// DecodeAstDBResync parses and validates a request.
func DecodeAstDBResync(data []byte) (AstDBResync, error) {
	var r AstDBResync
	if len(data) > 4096 {
		return r, fmt.Errorf("astdb resync: %w", ErrTooLarge)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("astdb resync: %w: %v", ErrInvalidField, err)
	}
	if err := r.Validate(); err != nil {
		return r, fmt.Errorf("astdb resync: %w", err)
	}
	return r, nil
}

// TypeReplicationHeld is the wire name of ReplicationHeld.
const TypeReplicationHeld Type = "replication.held"

func init() {
	register(TypeReplicationHeld, func() Decoded { return &ReplicationHeld{} })
}

// MaxHeldListed bounds the keys one ReplicationHeld names; Held still says
// how many there were.
const MaxHeldListed = 20

// ReplicationHeld says that a target held back deletions of AstDB keys: a
// manifest of the holder lacks keys the target has, that Asterisk did not
// report gone and that have not expired, more of them than the safety
// share allows. That is what a wiped holder database looks like (an
// Asterisk restarted without its astdb.sqlite3), not phones unregistering
// (Asterisk reports those, and they are applied whatever their number).
// Everything else of the manifest, and every delta, is applied; the held
// keys stay until the holder has them again, or reports them gone, or
// they expire (Asterisk prunes expired contacts on every node).
type ReplicationHeld struct {
	Node       string  `json:"node"`   // the target holding them back
	Source     string  `json:"source"` // the holder whose manifest lacked them
	Group      string  `json:"group"`
	Tree       string  `json:"tree"`
	Held       int64   `json:"held"`        // deletions held back
	TargetKeys int64   `json:"target_keys"` // keys the target had
	MaxShare   float64 `json:"max_share"`
	// Until is when the last held contact expires on its own (zero when
	// some held key is not a contact with an expiry).
	Until   time.Time `json:"until,omitzero"`
	Keys    []string  `json:"keys,omitempty"` // up to MaxHeldListed of them
	Message string    `json:"message"`
}

func (ReplicationHeld) EventType() Type    { return TypeReplicationHeld }
func (ReplicationHeld) SchemaVersion() int { return 1 }
func (h ReplicationHeld) subject(e Envelope) string {
	return ReplicationHeldSubject(e.Cluster, h.Node)
}
func (h ReplicationHeld) voiceOf(Envelope) string { return h.Node }

func (h ReplicationHeld) Validate() error {
	for f, v := range map[string]string{"node": h.Node, "source": h.Source, "group": h.Group, "tree": h.Tree} {
		if err := ValidToken(f, v); err != nil {
			return err
		}
	}
	if h.Held < 1 || h.TargetKeys < h.Held {
		return fmt.Errorf("%w: held %d of %d keys", ErrInvalidField, h.Held, h.TargetKeys)
	}
	if len(h.Keys) > MaxHeldListed || int64(len(h.Keys)) > h.Held {
		return fmt.Errorf("%w: keys lists %d of %d held (at most %d)", ErrInvalidField, len(h.Keys), h.Held, MaxHeldListed)
	}
	for _, k := range h.Keys {
		if err := ValidAstDBKey(k); err != nil {
			return err
		}
	}
	if h.Message == "" {
		return fmt.Errorf("%w: message", ErrMissingField)
	}
	return firstErr(textIn("message", h.Message, MaxTextLen), floatIn("max_share", h.MaxShare, 0, 1))
}

// ReplicationHeldSubject carries one node's held-back deletions.
func ReplicationHeldSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".repl." + node + ".held"
}
