package events

import "fmt"

// Replication events beyond ReplicationStatus. The replicator on a target
// confirms what it applied with ReplicationApplied; the source turns those
// confirmations into ReplicationStatus reports (CaughtUp), so "caught up" is
// never claimed for a peer that has not applied the files itself.
const (
	TypeReplicationApplied  Type = "replication.applied"
	TypeReplicationAlarm    Type = "replication.alarm"
	TypeReplicationConflict Type = "replication.conflict"
)

func init() {
	register(TypeReplicationApplied, func() Decoded { return &ReplicationApplied{} })
	register(TypeReplicationAlarm, func() Decoded { return &ReplicationAlarm{} })
	register(TypeReplicationConflict, func() Decoded { return &ReplicationConflict{} })
}

// Object-store buckets of the replicator. They are part of the operator-facing
// contract (permissions, `nats object ls`), so they never change.
const (
	// ReplBlobBucket holds file contents named by their SHA-256, so content
	// already stored is never sent again.
	ReplBlobBucket = "fan_repl_blobs"
	// ReplManifestBucket holds each source's manifest of each tree.
	ReplManifestBucket = "fan_repl_manifests"
)

// ReplManifestName names the manifest one node publishes for one tree of a
// group while it holds that group.
func ReplManifestName(cluster, group, tree, node string) string {
	return "manifest." + cluster + "." + group + "." + tree + "." + node
}

// ReplicationApplied is a target's confirmation that it applied (or failed to
// apply) one manifest of a source. Its envelope carries the source's epoch.
type ReplicationApplied struct {
	Node       string  `json:"node"`   // the target that applied
	Source     string  `json:"source"` // the holder whose manifest it was
	Group      string  `json:"group"`
	Tree       string  `json:"tree"`
	Epoch      uint64  `json:"epoch"`
	Generation uint64  `json:"generation"`
	Digest     string  `json:"digest"` // of the manifest's entries
	Files      int64   `json:"files"`  // files and links written
	Bytes      int64   `json:"bytes"`  // bytes written
	Deleted    int64   `json:"deleted"`
	Conflicts  int64   `json:"conflicts,omitempty"`
	DurationMS float64 `json:"duration_ms"`
	// Error is set when the manifest was not (fully) applied; the target
	// then does not hold everything of the tree.
	Error string `json:"error,omitempty"`
	// Missing lists content hashes the target could not fetch, so the source
	// can send them again.
	Missing []string `json:"missing,omitempty"`
}

func (ReplicationApplied) EventType() Type    { return TypeReplicationApplied }
func (ReplicationApplied) SchemaVersion() int { return 1 }
func (a ReplicationApplied) subject(e Envelope) string {
	return ReplicationAppliedSubject(e.Cluster, a.Node)
}

func (a ReplicationApplied) Validate() error {
	for f, v := range map[string]string{"node": a.Node, "source": a.Source, "group": a.Group, "tree": a.Tree} {
		if err := ValidToken(f, v); err != nil {
			return err
		}
	}
	if a.Epoch == 0 || a.Generation == 0 {
		return fmt.Errorf("%w: epoch and generation", ErrMissingField)
	}
	if a.Digest == "" {
		return fmt.Errorf("%w: digest", ErrMissingField)
	}
	if a.Files < 0 || a.Bytes < 0 || a.Deleted < 0 || a.Conflicts < 0 {
		return fmt.Errorf("%w: negative counts", ErrInvalidField)
	}
	return textIn("digest", a.Digest, MaxShortLen)
}

// AlarmReason says why replication stopped and waits for a human.
type AlarmReason string

const (
	// AlarmSafetyValve: a pass would delete more than the allowed share of
	// the target's files; nothing was applied.
	AlarmSafetyValve AlarmReason = "safety_valve"
	// AlarmSourceMissing: the source tree's root does not exist (unmounted?).
	AlarmSourceMissing AlarmReason = "source_missing"
	// AlarmSourceEmpty: the source tree became empty after holding files;
	// it is not published, so no target deletes anything.
	AlarmSourceEmpty AlarmReason = "source_empty"
)

func (r AlarmReason) valid() bool {
	return r == AlarmSafetyValve || r == AlarmSourceMissing || r == AlarmSourceEmpty
}

// ReplicationAlarm is raised when replication of a tree stops for a human.
type ReplicationAlarm struct {
	Node        string      `json:"node"` // the node that stopped
	Source      string      `json:"source,omitempty"`
	Group       string      `json:"group"`
	Tree        string      `json:"tree"`
	Reason      AlarmReason `json:"reason"`
	Deletes     int64       `json:"deletes,omitempty"`
	TargetFiles int64       `json:"target_files,omitempty"`
	MaxShare    float64     `json:"max_share,omitempty"`
	Message     string      `json:"message"`
}

func (ReplicationAlarm) EventType() Type    { return TypeReplicationAlarm }
func (ReplicationAlarm) SchemaVersion() int { return 1 }
func (a ReplicationAlarm) subject(e Envelope) string {
	return ReplicationAlarmSubject(e.Cluster, a.Node)
}

func (a ReplicationAlarm) Validate() error {
	for f, v := range map[string]string{"node": a.Node, "group": a.Group, "tree": a.Tree} {
		if err := ValidToken(f, v); err != nil {
			return err
		}
	}
	if !a.Reason.valid() {
		return fmt.Errorf("%w: reason %q", ErrInvalidField, a.Reason)
	}
	if a.Message == "" {
		return fmt.Errorf("%w: message", ErrMissingField)
	}
	if a.Deletes < 0 || a.TargetFiles < 0 {
		return fmt.Errorf("%w: negative counts", ErrInvalidField)
	}
	return firstErr(textIn("message", a.Message, MaxTextLen), floatIn("max_share", a.MaxShare, 0, 1))
}

// ConflictFile is one local file a target replaced or removed although
// replication had not put it there; it was kept at PreservedAs.
type ConflictFile struct {
	Path        string `json:"path"`
	Reason      string `json:"reason"` // "local_only" or "modified_locally"
	PreservedAs string `json:"preserved_as"`
}

// MaxConflictsListed bounds the files one ReplicationConflict lists; Count
// still says how many there were.
const MaxConflictsListed = 100

// ReplicationConflict reports local changes on a target that the source's
// state overrode in one pass, and where the local versions were kept.
type ReplicationConflict struct {
	Node   string         `json:"node"`
	Source string         `json:"source"`
	Group  string         `json:"group"`
	Tree   string         `json:"tree"`
	Count  int64          `json:"count"`
	Files  []ConflictFile `json:"files"`
}

func (ReplicationConflict) EventType() Type    { return TypeReplicationConflict }
func (ReplicationConflict) SchemaVersion() int { return 1 }
func (c ReplicationConflict) subject(e Envelope) string {
	return ReplicationConflictSubject(e.Cluster, c.Node)
}

func (c ReplicationConflict) Validate() error {
	for f, v := range map[string]string{"node": c.Node, "source": c.Source, "group": c.Group, "tree": c.Tree} {
		if err := ValidToken(f, v); err != nil {
			return err
		}
	}
	if c.Count < 1 || len(c.Files) == 0 {
		return fmt.Errorf("%w: files", ErrMissingField)
	}
	if len(c.Files) > MaxConflictsListed || int64(len(c.Files)) > c.Count {
		return fmt.Errorf("%w: files lists %d of count %d (at most %d)", ErrInvalidField, len(c.Files), c.Count, MaxConflictsListed)
	}
	for _, f := range c.Files {
		if err := firstErr(textIn("files path", f.Path, 4096), textIn("files preserved_as", f.PreservedAs, 4096), textIn("files reason", f.Reason, MaxShortLen)); err != nil {
			return err
		}
	}
	return nil
}

// ReplicationAppliedSubject carries one target's confirmations.
func ReplicationAppliedSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".repl." + node + ".applied"
}

// AllReplicationApplied matches every target's confirmations in a cluster.
func AllReplicationApplied(cluster string) string {
	return EventRoot + "." + cluster + ".repl.*.applied"
}

// ReplicationAlarmSubject carries one node's replication alarms.
func ReplicationAlarmSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".repl." + node + ".alarm"
}

// ReplicationConflictSubject carries one node's replication conflicts.
func ReplicationConflictSubject(cluster, node string) string {
	return EventRoot + "." + cluster + ".repl." + node + ".conflict"
}
